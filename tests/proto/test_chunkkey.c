/* Chunk keys (proto/chunkkey.c) against vectors computed independently by chunk_key_vectors.py
 * (xxhsum -H2 over preimages built from the spec), and the chain's properties. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunkkey.h"

static void hex16(const uint8_t k[DQ_CHUNK_KEY_BYTES], char out[33])
{
    for (int i = 0; i < DQ_CHUNK_KEY_BYTES; i++)
        sprintf(out + 2 * i, "%02x", k[i]);
}

Test(chunkkey, vectors)
{
    const char *path = getenv("DQ_CHUNK_VECTORS");
    cr_assert(path, "DQ_CHUNK_VECTORS names tests/proto/chunk_key_vectors.txt");
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    static char line[1 << 16];
    int nvec = 0, nkeys = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *ns = line, *ct = strchr(ns, '\t');
        cr_assert(ct);
        *ct++ = 0;
        char *toks = strchr(ct, '\t');
        cr_assert(toks);
        *toks++ = 0;
        char *keys = strchr(toks, '\t');
        cr_assert(keys);
        *keys++ = 0;
        uint32_t *tok = calloc(4096, sizeof *tok);
        size_t n = 0;
        for (char *p = toks; *p && n < 4096;) {
            tok[n++] = (uint32_t)strtoul(p, &p, 10);
            if (*p == ',')
                p++;
        }
        uint32_t chunk = (uint32_t)strtoul(ct, NULL, 10);
        uint8_t out[32 * DQ_CHUNK_KEY_BYTES];
        size_t got = dq_chunk_keys(ns, strlen(ns), NULL, tok, n, chunk, out, 32);
        cr_assert_eq(got, n / chunk, "%zu keys for %zu tokens of chunks of %u", got, n, chunk);
        char hex[33];
        char *want = strtok(keys, ",");
        for (size_t i = 0; i < got; i++, want = strtok(NULL, ",")) {
            cr_assert(want, "vector of ns '%s' has fewer keys than computed", ns);
            hex16(out + i * DQ_CHUNK_KEY_BYTES, hex);
            cr_assert_str_eq(hex, want, "ns '%s' chunk %zu", ns, i);
            nkeys++;
        }
        cr_assert_null(want, "vector of ns '%s' has more keys than computed", ns);
        free(tok);
        nvec++;
    }
    fclose(f);
    cr_assert_geq(nvec, 5);
    cr_assert_geq(nkeys, 8);
}

Test(chunkkey, chain)
{
    uint32_t tok[1000];
    for (uint32_t i = 0; i < 1000; i++)
        tok[i] = i * 2654435761u;
    uint8_t all[8 * 16], one[16], zero[16] = {0};
    /* 1000 tokens in chunks of 256: 3 full chunks; the partial one has no key */
    cr_assert_eq(dq_chunk_keys("m", 1, NULL, tok, 1000, 256, all, 8), 3);
    cr_assert_eq(dq_chunk_keys("m", 1, NULL, tok, 1000, 256, all, 2), 2);
    cr_assert_eq(dq_chunk_keys("m", 1, NULL, tok, 1000, 0, all, 8), 0);
    /* NULL parent is the zero parent; each key chains from the previous one */
    dq_chunk_key("m", 1, zero, tok, 256, one);
    cr_assert_arr_eq(one, all, 16);
    dq_chunk_key("m", 1, all, tok + 256, 256, one);
    cr_assert_arr_eq(one, all + 16, 16);
    /* keys from a parent continue a chain: the last two keys of the prompt from its first key */
    uint8_t rest[2 * 16];
    cr_assert_eq(dq_chunk_keys("m", 1, all, tok + 256, 744, 256, rest, 8), 2);
    cr_assert_arr_eq(rest, all + 16, 32);
    /* the namespace, the parent and every token change the key */
    dq_chunk_key("n", 1, NULL, tok, 256, one);
    cr_assert_arr_neq(one, all, 16);
    dq_chunk_key("m", 1, all + 16, tok, 256, one);
    cr_assert_arr_neq(one, all, 16);
    tok[255] ^= 1;
    dq_chunk_key("m", 1, NULL, tok, 256, one);
    cr_assert_arr_neq(one, all, 16);
    /* a shared prefix gives the same leading keys */
    uint8_t other[8 * 16];
    cr_assert_eq(dq_chunk_keys("m", 1, NULL, tok, 1000, 256, other, 8), 3);
    cr_assert_arr_neq(other, all, 16);
    tok[255] ^= 1;
    tok[700] ^= 1;
    cr_assert_eq(dq_chunk_keys("m", 1, NULL, tok, 1000, 256, other, 8), 3);
    cr_assert_arr_eq(other, all, 32);
    cr_assert_arr_neq(other + 32, all + 32, 16);
}

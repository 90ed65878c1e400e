/* KVQ toolbox, the optional lossless last stage (dquant/kvq.h section 1): length-limited Huffman
 * code lengths by package-merge (Larmore & Hirschberg 1990; optimal under the bound) and canonical
 * codes, MSB-first. */
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "kvq_internal.h"

#define HUFF_MAX_LEN 24
#define HUFF_MAX_SYMS 256

typedef struct pm_item {
    uint64_t w;
    int32_t a, b; /* leaf: a = symbol, b = −1; package: a, b index the level below */
} pm_item;

static void pm_count(pm_item *const *lists, uint32_t level, int32_t idx, uint8_t *lengths)
{
    const pm_item *it = &lists[level][idx];
    if (it->b < 0) {
        lengths[it->a]++;
        return;
    }
    pm_count(lists, level + 1, it->a, lengths);
    pm_count(lists, level + 1, it->b, lengths);
}

static int cmp_leaf(const void *x, const void *y)
{
    const pm_item *a = x, *b = y;
    if (a->w != b->w)
        return a->w < b->w ? -1 : 1;
    return a->a - b->a;
}

int dq_kvq_huffman_lengths(const uint64_t *freq, uint32_t count, uint32_t max_len, uint8_t *lengths, uint64_t *bits)
{
    DQ_RETURN_IF(!freq || !lengths || count == 0 || count > HUFF_MAX_SYMS, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(max_len == 0 || max_len > HUFF_MAX_LEN, DQ_INVALID_ARGUMENT);
    uint32_t m = 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (freq[i]) {
            m++;
            total += freq[i];
            /* package weights reach max_len · total: keep them in 64 bits */
            DQ_RETURN_IF(total >= (1ull << 58), DQ_INVALID_ARGUMENT);
        }
    }
    DQ_RETURN_IF(max_len < 32 && m > (1u << max_len), DQ_INVALID_ARGUMENT);
    memset(lengths, 0, count);
    if (m <= 1) {
        for (uint32_t i = 0; i < count; i++)
            if (freq[i])
                lengths[i] = 1;
        if (bits)
            *bits = total;
        return DQ_OK;
    }
    pm_item *leaves = malloc(m * sizeof *leaves);
    pm_item *lists[HUFF_MAX_LEN + 1] = {0};
    uint32_t len[HUFF_MAX_LEN + 1] = {0};
    int rc = DQ_NOMEM;
    if (!leaves)
        goto out;
    for (uint32_t i = 0, j = 0; i < count; i++)
        if (freq[i])
            leaves[j++] = (pm_item){freq[i], (int32_t)i, -1};
    qsort(leaves, m, sizeof *leaves, cmp_leaf);
    for (uint32_t l = 1; l <= max_len; l++)
        if (!(lists[l] = malloc(2 * m * sizeof(pm_item))))
            goto out;
    /* deepest level: the leaves; each level above merges the leaves with the pairs of the one below */
    memcpy(lists[max_len], leaves, m * sizeof *leaves);
    len[max_len] = m;
    for (uint32_t l = max_len - 1; l >= 1; l--) {
        const pm_item *below = lists[l + 1];
        const uint32_t npk = len[l + 1] / 2;
        uint32_t i = 0, p = 0, n = 0;
        while (i < m || p < npk) {
            const uint64_t pw = p < npk ? below[2 * p].w + below[2 * p + 1].w : 0;
            if (p >= npk || (i < m && leaves[i].w <= pw)) {
                lists[l][n++] = leaves[i++];
            } else {
                lists[l][n++] = (pm_item){pw, (int32_t)(2 * p), (int32_t)(2 * p + 1)};
                p++;
            }
        }
        len[l] = n;
    }
    /* the cheapest 2m − 2 items of the top level; each leaf occurrence is one bit of its length */
    for (uint32_t i = 0; i < 2 * m - 2; i++)
        pm_count(lists, 1, (int32_t)i, lengths);
    if (bits) {
        uint64_t b = 0;
        for (uint32_t i = 0; i < count; i++)
            b += freq[i] * lengths[i];
        *bits = b;
    }
    rc = DQ_OK;
out:
    free(leaves);
    for (uint32_t l = 1; l <= HUFF_MAX_LEN; l++)
        free(lists[l]);
    return rc;
}

/* Canonical code (deflate's order: shorter codes first, then by symbol): per length the number of
 * codes and the first code. DQ_INVALID_ARGUMENT for a length > 24 or a Kraft sum > 1. */
typedef struct canon {
    uint32_t cnt[HUFF_MAX_LEN + 1];
    uint32_t first[HUFF_MAX_LEN + 1];
    uint32_t reach[HUFF_MAX_LEN + 1]; /* prefixes of length l below reach[l] start some code */
    uint16_t sorted[HUFF_MAX_SYMS];   /* symbols by (length, symbol) */
} canon;

static int canon_build(const uint8_t *lengths, uint32_t count, canon *c)
{
    DQ_RETURN_IF(!lengths || count == 0 || count > HUFF_MAX_SYMS, DQ_INVALID_ARGUMENT);
    memset(c, 0, sizeof *c);
    uint64_t kraft = 0;
    for (uint32_t i = 0; i < count; i++) {
        DQ_RETURN_IF(lengths[i] > HUFF_MAX_LEN, DQ_INVALID_ARGUMENT);
        if (lengths[i]) {
            c->cnt[lengths[i]]++;
            kraft += 1ull << (HUFF_MAX_LEN - lengths[i]);
        }
    }
    DQ_RETURN_IF(kraft > (1ull << HUFF_MAX_LEN), DQ_INVALID_ARGUMENT);
    uint32_t code = 0, n = 0, maxl = 0;
    for (uint32_t l = 1; l <= HUFF_MAX_LEN; l++) {
        c->first[l] = code;
        code = (code + c->cnt[l]) << 1;
        for (uint32_t i = 0; i < count; i++)
            if (lengths[i] == l)
                c->sorted[n++] = (uint16_t)i;
        if (c->cnt[l])
            maxl = l;
    }
    /* canonical codes fill the left-aligned code space from 0 without gaps up to end */
    if (maxl) {
        const uint32_t end = c->first[maxl] + c->cnt[maxl];
        for (uint32_t l = 1; l <= maxl; l++)
            c->reach[l] = (end + (1u << (maxl - l)) - 1) >> (maxl - l);
    }
    return DQ_OK;
}

int dq_kvq_huffman_encode(const uint8_t *lengths, uint32_t count, const uint8_t *symbols, size_t nsym, uint8_t *out,
                          size_t cap, size_t *bits)
{
    canon c;
    DQ_FORWARD_IF_ERROR(canon_build(lengths, count, &c));
    DQ_RETURN_IF((!symbols && nsym) || (!out && cap), DQ_INVALID_ARGUMENT);
    uint32_t code[HUFF_MAX_SYMS];
    uint32_t next[HUFF_MAX_LEN + 1];
    memcpy(next, c.first, sizeof next);
    for (uint32_t i = 0; i < count; i++)
        if (lengths[i])
            code[i] = next[lengths[i]]++;
    size_t total = 0;
    for (size_t i = 0; i < nsym; i++) {
        DQ_RETURN_IF(symbols[i] >= count || lengths[symbols[i]] == 0, DQ_INVALID_ARGUMENT);
        total += lengths[symbols[i]];
    }
    DQ_RETURN_IF((total + 7) / 8 > cap, DQ_INVALID_ARGUMENT);
    if (cap)
        memset(out, 0, (total + 7) / 8);
    size_t pos = 0;
    for (size_t i = 0; i < nsym; i++) {
        const uint32_t l = lengths[symbols[i]], cd = code[symbols[i]];
        for (uint32_t b = l; b-- > 0; pos++)
            if (cd >> b & 1)
                out[pos >> 3] |= (uint8_t)(0x80u >> (pos & 7));
    }
    if (bits)
        *bits = total;
    return DQ_OK;
}

int dq_kvq_huffman_decode(const uint8_t *lengths, uint32_t count, const uint8_t *in, size_t bits, uint8_t *symbols,
                          size_t nsym)
{
    canon c;
    DQ_FORWARD_IF_ERROR(canon_build(lengths, count, &c));
    DQ_RETURN_IF((!in && bits) || (!symbols && nsym), DQ_INVALID_ARGUMENT);
    size_t pos = 0;
    for (size_t i = 0; i < nsym; i++) {
        /* codes of length l are first[l] .. first[l] + cnt[l] − 1, in sorted[] from index idx */
        uint32_t code = 0, idx = 0, l = 1;
        for (;; l++) {
            DQ_RETURN_IF(l > HUFF_MAX_LEN, DQ_CORRUPT); /* unreachable: reach[] stops it first */
            DQ_RETURN_IF(pos >= bits, DQ_TRUNCATED);
            code = code << 1 | (in[pos >> 3] >> (7 - (pos & 7)) & 1);
            pos++;
            if (code - c.first[l] < c.cnt[l] && code >= c.first[l]) {
                symbols[i] = (uint8_t)c.sorted[idx + code - c.first[l]];
                break;
            }
            DQ_RETURN_IF(code >= c.reach[l], DQ_CORRUPT); /* no code starts so */
            idx += c.cnt[l];
        }
    }
    DQ_RETURN_IF(pos != bits, DQ_CORRUPT); /* bits left over */
    return DQ_OK;
}

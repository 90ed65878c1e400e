/* Chunk keys: XXH3-128 over the chain described in chunkkey.h, streamed so that no input is copied. */
#include "chunkkey.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation per key */
#include <xxhash.h>

static void put_u32le(uint8_t b[4], uint32_t v)
{
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
    b[2] = (uint8_t)(v >> 16);
    b[3] = (uint8_t)(v >> 24);
}

void dq_chunk_key(const char *ns, size_t ns_len, const uint8_t *parent, const uint32_t *tokens, uint32_t n,
                  uint8_t out[DQ_CHUNK_KEY_BYTES])
{
    static const uint8_t zero[DQ_CHUNK_KEY_BYTES];
    XXH3_state_t st;
    uint8_t b[4];
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, "dqchunk1", 8);
    put_u32le(b, (uint32_t)ns_len);
    XXH3_128bits_update(&st, b, 4);
    XXH3_128bits_update(&st, ns, ns_len);
    XXH3_128bits_update(&st, parent ? parent : zero, DQ_CHUNK_KEY_BYTES);
    put_u32le(b, n);
    XXH3_128bits_update(&st, b, 4);
    /* token ids as u32 little endian, in blocks so a big-endian host hashes the same bytes */
    uint8_t blk[1024];
    for (uint32_t i = 0; i < n;) {
        uint32_t m = n - i < 256 ? n - i : 256;
        for (uint32_t j = 0; j < m; j++)
            put_u32le(blk + 4 * j, tokens[i + j]);
        XXH3_128bits_update(&st, blk, 4 * (size_t)m);
        i += m;
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out, c.digest, DQ_CHUNK_KEY_BYTES);
}

size_t dq_chunk_keys(const char *ns, size_t ns_len, const uint8_t *parent, const uint32_t *tokens, size_t ntokens,
                     uint32_t chunk_tokens, uint8_t *out, size_t max_keys)
{
    if (!chunk_tokens)
        return 0;
    size_t n = ntokens / chunk_tokens;
    if (n > max_keys)
        n = max_keys;
    const uint8_t *prev = parent;
    for (size_t i = 0; i < n; i++) {
        dq_chunk_key(ns, ns_len, prev, tokens + i * chunk_tokens, chunk_tokens, out + i * DQ_CHUNK_KEY_BYTES);
        prev = out + i * DQ_CHUNK_KEY_BYTES;
    }
    return n;
}

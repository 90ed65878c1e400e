/* The bytes are pinned: windows, BF16 tails and decodes (BF16, F32, F16) of fixed BF16 and F32
 * inputs, and the encoder's statistics, hash to the values below. They were computed with the
 * library of commit fb66e23, which the GPU kernels match byte for byte (checkcuda), and the CPU
 * speedups since left them unchanged. A change of the encoder's arithmetic, of the rounding of
 * the inputs or of the decoder shows up here first; if it is meant, the GPU kernels must change
 * with it and the values be updated. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/layer.h"
#include "dquant/profile.h"
#include "dquant/types.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t layer_hash(const char *profile, uint32_t kv_heads, uint32_t head_dim, uint64_t seed)
{
    dq_profile prof;
    cr_assert_eq(dq_profile_builtin(profile, kv_heads, head_dim, &prof), DQ_OK);
    dq_codec *c;
    dq_workspace *ws;
    cr_assert_eq(dq_codec_create(&prof, NULL, &c), DQ_OK);
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const uint32_t n = kv_heads * head_dim, W = prof.window;
    const size_t ntok = 3 * (size_t)W + 17;
    uint16_t *k = malloc(ntok * n * 2), *v = malloc(ntok * n * 2), *ob = malloc(ntok * n * 2);
    float *kf = malloc(ntok * n * 4), *vf = malloc(ntok * n * 4), *of = malloc(ntok * n * 4);
    cr_assert(k && v && ob && kf && vf && of);
    uint64_t z = seed;
    for (size_t i = 0; i < ntok * n; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        k[i] = dq_f32_to_bf16(((int32_t)(z >> 33) / 2147483648.0f) * 3.0f + (float)((i % n) % 7) * 0.5f);
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = dq_f32_to_bf16(((int32_t)(z >> 33) / 2147483648.0f) * 2.0f);
        /* f32 inputs: the same high halves, noise below (rounded to BF16 inside) */
        uint32_t u = (uint32_t)k[i] << 16 | (uint32_t)((i * 2654435761u >> 16) & 0xffffu);
        memcpy(&kf[i], &u, 4);
        u = (uint32_t)v[i] << 16 | (uint32_t)(i * 40503u & 0xffffu);
        memcpy(&vf[i], &u, 4);
    }
    uint64_t h = 1469598103934665603ull;
    dq_layer *l;
    cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
    dq_encode_stats st;
    memset(&st, 0, sizeof st);
    cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_BF16, ntok, &st), DQ_OK);
    const uint64_t stv[] = {st.streams,       st.retries,  st.fallbacks,        st.payload_bytes,
                            st.symbols_moved, st.max_move, st.max_payload_bytes};
    h = fnv(h, stv, sizeof stv);
    for (size_t w = 0; w < dq_layer_window_count(l); w++)
        h = fnv(h, dq_layer_window(l, w), dq_codec_window_bytes(c));
    dq_layer *l2;
    cr_assert_eq(dq_layer_create(c, &l2), DQ_OK);
    cr_assert_eq(dq_layer_append(l2, ws, kf, vf, DQ_DTYPE_F32, ntok, NULL), DQ_OK);
    for (size_t w = 0; w < dq_layer_window_count(l2); w++)
        h = fnv(h, dq_layer_window(l2, w), dq_codec_window_bytes(c));
    h = fnv(h, dq_layer_tail(l2, DQ_KIND_K), dq_layer_tail_tokens(l2) * n * 2);
    cr_assert_eq(dq_layer_decode(l2, ws, DQ_KIND_V, 0, ntok, ob, DQ_DTYPE_F16), DQ_OK);
    h = fnv(h, ob, ntok * n * 2);
    for (int kind = 0; kind < 2; kind++) {
        cr_assert_eq(dq_layer_decode(l, ws, (dq_kind)kind, 0, ntok, ob, DQ_DTYPE_BF16), DQ_OK);
        h = fnv(h, ob, ntok * n * 2);
        cr_assert_eq(dq_layer_decode(l, ws, (dq_kind)kind, 0, ntok, of, DQ_DTYPE_F32), DQ_OK);
        h = fnv(h, of, ntok * n * 4);
    }
    dq_layer_free(l);
    dq_layer_free(l2);
    free(k);
    free(v);
    free(ob);
    free(kf);
    free(vf);
    free(of);
    dq_workspace_free(ws);
    dq_codec_free(c);
    return h;
}

Test(golden, bytes_are_pinned)
{
    static const struct {
        const char *profile;
        uint32_t kv_heads, head_dim;
        uint64_t seed, want;
    } cases[] = {
        {"dq226", 8, 128, 12345, 0x9666b2dd7984c7e8ull}, {"dq226", 2, 64, 12346, 0x9f7fdd1d0adef0faull},
        {"dq226", 1, 128, 12347, 0x2e40b61b8362bd6full}, {"dq196", 8, 128, 12352, 0x4d88766c2cdb2676ull},
        {"dq196", 2, 64, 12353, 0x33e5d6abeb35d3ffull},  {"dq196", 1, 128, 12354, 0x4f589b300fb5bad6ull},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t h = layer_hash(cases[i].profile, cases[i].kv_heads, cases[i].head_dim, cases[i].seed);
        cr_expect_eq(h, cases[i].want, "%s %ux%u: %016llx, pinned %016llx", cases[i].profile, cases[i].kv_heads,
                     cases[i].head_dim, (unsigned long long)h, (unsigned long long)cases[i].want);
    }
}

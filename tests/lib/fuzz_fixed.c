/* Fuzz target for untrusted fixed-width window records (dq_profile_fixed: base-M packed
 * containers): whatever the bytes, no crash and no read outside the window, and every verdict agrees.
 *
 * Input: byte 0 picks a profile (bits 0-6, modulo the count; small windows so that inputs stay
 * short); the rest is one window record (zero-padded or cut to dq_codec_window_bytes, in a block of
 * exactly that size). Per record: dq_stream_decode_levels gives 0 or DQ_CORRUPT and levels below M,
 * dq_stream_decode the same code, and a valid container is canonical (packing its levels again gives
 * its bytes). dq_window_check is DQ_CORRUPT exactly when a record is (or an fp16 field is bad);
 * dq_hot_transcode reports DQ_CORRUPT exactly when a container is; for a window the check passes,
 * the hot window passes dq_hot_check and decodes bit for bit as the records do.
 *
 * Built as a libFuzzer target where clang supports -fsanitize=fuzzer, always with the replay driver
 * tests/support/fuzz_replay.c (tests/lib/corpus_fixed runs in plain CI), and with -DDQ_FUZZ_GEN as
 * the generator of that corpus (lib-gen-fixed-corpus DIR). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/dquant.h"
#include "dquant/hot.h"
#include "fuzz.h"

static const struct {
    uint32_t kv_heads, head_dim, mk, mv, window;
} fz[] = {
    {1, 32, 6, 3, 4},   /* fixed226's levels: groups of 5 in 13 and 8 bits */
    {2, 16, 7, 4, 2},   /* 7: groups of 8 in 23 bits; 4: plain 2-bit codes */
    {1, 16, 256, 2, 3}, /* byte codes, 1-bit codes */
    {1, 64, 5, 9, 4},   /* 5: groups of 3 in 7 bits with padding; 9: 2 in 7 */
    {2, 32, 32, 17, 2}, /* 5-bit codes; 17: groups of 7 in 29 bits */
};
#define FZ_N (sizeof fz / sizeof fz[0])

static dq_codec *codecs[FZ_N];

static void teardown(void)
{
    for (size_t i = 0; i < FZ_N; i++) {
        dq_codec_free(codecs[i]);
        codecs[i] = NULL;
    }
}

static void setup(void)
{
    if (codecs[0])
        return;
    atexit(teardown);
    for (size_t i = 0; i < FZ_N; i++) {
        dq_profile_params pp;
        dq_profile_params_default(&pp);
        pp.kv_heads = fz[i].kv_heads;
        pp.head_dim = fz[i].head_dim;
        pp.levels[0] = fz[i].mk;
        pp.levels[1] = fz[i].mv;
        pp.window = pp.residual = fz[i].window;
        pp.name = "fuzz";
        dq_profile p;
        FUZZ_CHECK(dq_profile_fixed_make(&pp, &p) == DQ_OK);
        FUZZ_CHECK(dq_codec_create(&p, NULL, &codecs[i]) == DQ_OK);
    }
}

/* The packing of dquant/profile.h written out: groups of k levels as Σ m_i M^i in w bits. */
static void repack(const uint8_t *lev, uint32_t n, uint32_t M, uint8_t *out, uint32_t C)
{
    uint32_t k, w;
    FUZZ_CHECK(dq_fixed_packing(n, M, &k, &w) == C);
    memset(out, 0, C);
    uint64_t bit = 0;
    for (uint32_t g = 0; g < n; g += k) {
        uint64_t v = 0;
        for (uint32_t i = k; i-- > 0;)
            v = v * M + (g + i < n ? lev[g + i] : 0);
        for (uint32_t b = 0; b < w; b++, bit++)
            if (v >> b & 1)
                out[bit / 8] |= (uint8_t)(1u << (bit % 8));
    }
}

static int bad_half(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    setup();
    const dq_codec *c = codecs[(data[0] & 0x7f) % FZ_N];
    const dq_profile *p = dq_codec_profile(c);
    const uint32_t n = dq_codec_stream_len(c), W = p->window;
    const size_t wb = dq_codec_window_bytes(c);
    uint8_t *win = calloc(1, wb); /* exact size: a sanitizer sees any overread */
    uint8_t *lev = malloc(n), *again = malloc(n), *pk = malloc(p->container_bytes[0] + p->container_bytes[1]);
    float *y = malloc(n * sizeof *y);
    FUZZ_CHECK(win && lev && again && pk && y);
    memcpy(win, data + 1, size - 1 < wb ? size - 1 : wb);

    int any_corrupt = 0, any_bad_field = bad_half((uint16_t)(win[0] | win[1] << 8));
    for (int kind = 0; kind < 2; kind++)
        for (uint32_t t = 0; t < W; t++) {
            const uint8_t *rec = dq_window_record(c, win, (dq_kind)kind, t);
            const int rc = dq_stream_decode_levels(c, (dq_kind)kind, rec, lev);
            FUZZ_CHECK(rc == DQ_OK || rc == DQ_CORRUPT);
            for (uint32_t j = 0; j < n; j++)
                FUZZ_CHECK(lev[j] < p->levels[kind]);
            FUZZ_CHECK(dq_stream_decode(c, (dq_kind)kind, rec, y) == rc);
            if (rc == DQ_OK) {
                repack(lev, n, p->levels[kind], pk, p->container_bytes[kind]);
                FUZZ_CHECK(memcmp(pk, rec + 4, p->container_bytes[kind]) == 0);
            }
            any_corrupt |= rc != DQ_OK;
            const uint16_t sh = (uint16_t)(rec[0] | rec[1] << 8), oh = (uint16_t)(rec[2] | rec[3] << 8);
            any_bad_field |= bad_half(sh) || bad_half(oh) || (sh & 0x8000u);
        }
    const int check = dq_window_check(c, win);
    FUZZ_CHECK(check == ((any_corrupt || any_bad_field) ? DQ_CORRUPT : DQ_OK));

    const size_t hb = dq_hot_window_bytes(c);
    uint8_t *hot = malloc(hb);
    FUZZ_CHECK(hot);
    const int tc = dq_hot_transcode(c, win, hot);
    FUZZ_CHECK(tc == (any_corrupt ? DQ_CORRUPT : DQ_OK));
    for (int kind = 0; kind < 2; kind++)
        for (uint32_t t = 0; t < W; t++) {
            FUZZ_CHECK(dq_hot_levels(c, hot, (dq_kind)kind, t, again) == DQ_OK);
            dq_stream_decode_levels(c, (dq_kind)kind, dq_window_record(c, win, (dq_kind)kind, t), lev);
            FUZZ_CHECK(memcmp(lev, again, n) == 0);
        }
    if (check == DQ_OK) {
        FUZZ_CHECK(dq_hot_check(c, hot, hb) == DQ_OK);
        dq_workspace *ws = NULL;
        FUZZ_CHECK(dq_workspace_create(c, &ws) == DQ_OK);
        float *a = malloc((size_t)W * n * sizeof *a), *b = malloc((size_t)W * n * sizeof *b);
        FUZZ_CHECK(a && b);
        for (int kind = 0; kind < 2; kind++) {
            const dq_kind kd = (dq_kind)kind;
            FUZZ_CHECK(dq_tokens_decode(c, ws, kd, kd == DQ_KIND_K ? dq_window_mean(c, win) : NULL,
                                        dq_window_record(c, win, kd, 0), dq_codec_record_bytes(c, kd), W, a,
                                        DQ_DTYPE_F32) == DQ_OK);
            FUZZ_CHECK(dq_hot_decode(c, ws, hot, kd, 0, W, b, DQ_DTYPE_F32) == DQ_OK);
            FUZZ_CHECK(memcmp(a, b, (size_t)W * n * sizeof *a) == 0);
        }
        free(a);
        free(b);
        dq_workspace_free(ws);
    }
    free(hot);
    free(win);
    free(lev);
    free(again);
    free(pk);
    free(y);
    return 0;
}

#ifdef DQ_FUZZ_GEN
/* The seed corpus: per profile a valid window of encoded tokens, then damaged copies (an
 * overflowed group, a padding bit, a flipped byte in each part, a negative scale, a cut). */
int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    setup();
    int fail = 0;
    for (uint8_t sel = 0; sel < FZ_N; sel++) {
        const dq_codec *c = codecs[sel];
        const dq_profile *p = dq_codec_profile(c);
        const uint32_t n = dq_codec_stream_len(c), W = p->window;
        const size_t wb = dq_codec_window_bytes(c);
        float *k = malloc((size_t)W * n * sizeof *k), *v = malloc((size_t)W * n * sizeof *v);
        uint8_t *win = malloc(wb), *d = malloc(wb);
        FUZZ_CHECK(k && v && win && d);
        uint64_t s = 0x5eedull + sel;
        for (size_t i = 0; i < (size_t)W * n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            k[i] = (float)((int64_t)(s >> 40) % 1000) / 250.0f + (float)(i % n % 5);
            v[i] = (float)((int64_t)(s >> 20 & 0xfffff) % 1000) / 300.0f;
        }
        dq_workspace *ws = NULL;
        FUZZ_CHECK(dq_workspace_create(c, &ws) == DQ_OK);
        FUZZ_CHECK(dq_window_encode(c, ws, k, v, DQ_DTYPE_F32, win, NULL) == DQ_OK);
        dq_workspace_free(ws);
        char name[64];
        snprintf(name, sizeof name, "valid-%u", sel);
        fail |= fuzz_write_seed(argv[1], name, sel, win, wb);
        const size_t krec = (size_t)(dq_window_record(c, win, DQ_KIND_K, 0) - win);
        const size_t vrec = (size_t)(dq_window_record(c, win, DQ_KIND_V, 0) - win);
        /* every bit of the first group of the first key and value containers */
        for (int kind = 0; kind < 2; kind++) {
            uint32_t kk, w;
            dq_fixed_packing(n, p->levels[kind], &kk, &w);
            memcpy(d, win, wb);
            uint8_t *rec = d + (kind ? vrec : krec);
            for (uint32_t b = 0; b < w; b++)
                rec[4 + b / 8] |= (uint8_t)(1u << (b % 8));
            snprintf(name, sizeof name, "group-%u-%d", sel, kind);
            fail |= fuzz_write_seed(argv[1], name, sel, d, wb);
            /* the last byte of the last container of the kind: padding or the last group */
            memcpy(d, win, wb);
            d[(kind ? wb : vrec) - 1] |= 0x80;
            snprintf(name, sizeof name, "tail-%u-%d", sel, kind);
            fail |= fuzz_write_seed(argv[1], name, sel, d, wb);
        }
        const size_t at[] = {1, krec + 1, krec + 5, vrec + 2, wb / 2, wb - 1};
        for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
            memcpy(d, win, wb);
            d[at[i]] ^= 0x40;
            snprintf(name, sizeof name, "flip-%u-%zu", sel, i);
            fail |= fuzz_write_seed(argv[1], name, sel, d, wb);
        }
        snprintf(name, sizeof name, "cut-%u", sel);
        fail |= fuzz_write_seed(argv[1], name, sel, win, wb / 3);
        free(k);
        free(v);
        free(win);
        free(d);
    }
    fail |= fuzz_write_seed(argv[1], "empty", 0, NULL, 0);
    return fail ? 1 : 0;
}
#endif

/* Fuzz target for untrusted fixed-width window records (dq_profile_fixed: base-M packed
 * containers): whatever the bytes, no crash and no read outside the window, and every verdict agrees.
 *
 * The driver is fuzz_window.c (input layout and the shared checks there; small windows so that
 * inputs stay short). This family's own: a valid container is canonical (packing its levels again
 * gives its bytes); the hot levels equal the records' levels for every window (corrupt groups
 * too); for a window the check passes, the hot window decodes bit for bit as the records do. Seeds
 * of its own: every bit of a first group set (its "tail" seeds set the last byte's top bit).
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
#include "fuzz_window.h"

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

/* A valid record's container is the packing of its levels. */
static void canonical(const dq_codec *c, int kind, const uint8_t *lev, const uint8_t *rec)
{
    const dq_profile *p = dq_codec_profile(c);
    const uint32_t C = p->container_bytes[kind];
    uint8_t *pk = malloc(C);
    FUZZ_CHECK(pk);
    repack(lev, dq_codec_stream_len(c), p->levels[kind], pk, C);
    FUZZ_CHECK(memcmp(pk, rec + 4, C) == 0);
    free(pk);
}

/* The hot window decodes bit for bit as the records do. */
static void hot_valid(const dq_codec *c, const uint8_t *win, size_t wb, const uint8_t *hot, size_t hb)
{
    (void)wb;
    (void)hb;
    const uint32_t n = dq_codec_stream_len(c), W = dq_codec_profile(c)->window;
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

/* Every bit of the first group of the first key and value containers. */
static int seeds(const char *dir, uint8_t sel, const dq_codec *c, const uint8_t *win, uint8_t *d, size_t krec,
                 size_t vrec)
{
    const dq_profile *p = dq_codec_profile(c);
    const uint32_t n = dq_codec_stream_len(c);
    const size_t wb = dq_codec_window_bytes(c);
    char name[64];
    int fail = 0;
    for (int kind = 0; kind < 2; kind++) {
        uint32_t kk, w;
        dq_fixed_packing(n, p->levels[kind], &kk, &w);
        memcpy(d, win, wb);
        uint8_t *rec = d + (kind ? vrec : krec);
        for (uint32_t b = 0; b < w; b++)
            rec[4 + b / 8] |= (uint8_t)(1u << (b % 8));
        snprintf(name, sizeof name, "group-%u-%d", sel, kind);
        fail |= fuzz_write_seed(dir, name, sel, d, wb);
    }
    return fail;
}

/* A byte in the key mean, two in the first key record, one in the first value record, the middle,
 * the last. */
static size_t flips(size_t krec, size_t vrec, size_t wb, size_t *at)
{
    const size_t a[] = {1, krec + 1, krec + 5, vrec + 2, wb / 2, wb - 1};
    memcpy(at, a, sizeof a);
    return sizeof a / sizeof *a;
}

static const fuzz_window_family family = {
    .count = FZ_N,
    .codecs = codecs,
    .setup = setup,
    .canonical = canonical,
    .hot_levels_always = true,
    .hot_valid = hot_valid,
    .seeds = seeds,
    .flips = flips,
    .tail_set = true, /* tail: padding or the last group */
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_window_run(&family, data, size);
}

#ifdef DQ_FUZZ_GEN
/* The seed corpus (fuzz_window_gen: a valid window per profile, then damaged copies). */
int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    return fuzz_window_gen(&family, argv[1]);
}
#endif

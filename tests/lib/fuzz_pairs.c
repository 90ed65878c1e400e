/* Fuzz target for untrusted format-version-2 window records (joint two-symbol rANS, rans2.h):
 * whatever the bytes, no crash and no read outside the window, and every verdict agrees.
 *
 * The driver is fuzz_window.c (input layout and the shared checks there; small windows so that
 * inputs stay short). This family's own: a valid container is canonical (encoding its levels again
 * gives its bytes); for a window the check passes, dq_hot_rebuild gives the window back byte for
 * byte. Seeds of its own: a zeroed rANS state (its "tail" seeds flip the last byte's top bit).
 *
 * Built as a libFuzzer target where clang supports -fsanitize=fuzzer, always with the replay driver
 * tests/support/fuzz_replay.c (tests/lib/corpus_pairs runs in plain CI), and with -DDQ_FUZZ_GEN as
 * the generator of that corpus (lib-gen-pairs-corpus DIR). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/dquant.h"
#include "dquant/hot.h"
#include "fuzz.h"
#include "fuzz_window.h"

static const struct {
    uint32_t kv_heads, head_dim, ck, cv, mk, mv, window;
} fz[] = {
    {1, 32, 0, 0, 0, 0, 4},    /* dq226p at n = 32 */
    {2, 16, 0, 0, 0, 0, 2},    /* dq196p at n = 32 */
    {1, 2, 6, 6, 8, 6, 3},     /* n = 2: one pair */
    {1, 64, 60, 16, 32, 2, 2}, /* 1024 pair symbols; M = 2 */
    {4, 16, 40, 20, 16, 3, 2},
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
        dq_profile p;
        if (fz[i].mk) {
            pp.container_bytes[0] = fz[i].ck;
            pp.container_bytes[1] = fz[i].cv;
            pp.levels[0] = fz[i].mk;
            pp.levels[1] = fz[i].mv;
        } else {
            FUZZ_CHECK(dq_profile_builtin(i == 0 ? "dq226p" : "dq196p", fz[i].kv_heads, fz[i].head_dim, &p) == DQ_OK);
            pp.container_bytes[0] = p.container_bytes[0];
            pp.container_bytes[1] = p.container_bytes[1];
            pp.levels[0] = p.levels[0];
            pp.levels[1] = p.levels[1];
        }
        pp.window = pp.residual = fz[i].window;
        pp.format_version = DQ_FORMAT_VERSION_PAIRS;
        pp.name = "fuzz";
        FUZZ_CHECK(dq_profile_make(&pp, &p) == DQ_OK);
        FUZZ_CHECK(dq_codec_create(&p, NULL, &codecs[i]) == DQ_OK);
    }
}

/* A valid record's container is the rANS coding of its levels. */
static void canonical(const dq_codec *c, int kind, const uint8_t *lev, const uint8_t *rec)
{
    const dq__kind_tables *kt = &c->kt[kind];
    const uint32_t n = dq_codec_stream_len(c);
    uint8_t *scratch = malloc(n), *enc = malloc(kt->container);
    FUZZ_CHECK(scratch && enc);
    FUZZ_CHECK(dq__kt_encode(kt, lev, n, scratch, enc) <= kt->container);
    FUZZ_CHECK(memcmp(enc, rec + 4, kt->container) == 0);
    free(scratch);
    free(enc);
}

/* dq_hot_rebuild gives the window back byte for byte. */
static void hot_valid(const dq_codec *c, const uint8_t *win, size_t wb, const uint8_t *hot, size_t hb)
{
    uint8_t *back = malloc(wb);
    FUZZ_CHECK(back);
    FUZZ_CHECK(dq_hot_rebuild(c, hot, hb, back) == DQ_OK);
    FUZZ_CHECK(memcmp(back, win, wb) == 0);
    free(back);
}

/* A zeroed state in the first key and value records. */
static int seeds(const char *dir, uint8_t sel, const dq_codec *c, const uint8_t *win, uint8_t *d, size_t krec,
                 size_t vrec)
{
    const size_t wb = dq_codec_window_bytes(c);
    char name[64];
    int fail = 0;
    for (int kind = 0; kind < 2; kind++) {
        memcpy(d, win, wb);
        memset(d + (kind ? vrec : krec) + 4, 0, 4);
        snprintf(name, sizeof name, "state-%u-%d", sel, kind);
        fail |= fuzz_write_seed(dir, name, sel, d, wb);
    }
    return fail;
}

/* A byte in the key mean, three in the first key record (two of them in its state), two in the
 * first value record, the middle, the last. */
static size_t flips(size_t krec, size_t vrec, size_t wb, size_t *at)
{
    const size_t a[] = {1, krec + 1, krec + 5, krec + 8, vrec + 2, vrec + 6, wb / 2, wb - 1};
    memcpy(at, a, sizeof a);
    return sizeof a / sizeof *a;
}

static const fuzz_window_family family = {
    .count = FZ_N,
    .codecs = codecs,
    .setup = setup,
    .canonical = canonical,
    .hot_levels_always = false,
    .hot_valid = hot_valid,
    .seeds = seeds,
    .flips = flips,
    .tail_set = false,
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

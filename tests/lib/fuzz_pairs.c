/* Fuzz target for untrusted format-version-2 window records (joint two-symbol rANS, rans2.h):
 * whatever the bytes, no crash and no read outside the window, and every verdict agrees.
 *
 * Input: byte 0 picks a profile (bits 0-6, modulo the count; small windows so that inputs stay
 * short); the rest is one window record (zero-padded or cut to dq_codec_window_bytes, in a block of
 * exactly that size). Per record: dq_stream_decode_levels gives 0 or DQ_CORRUPT and levels below M,
 * dq_stream_decode the same code, and a valid container is canonical (encoding its levels again
 * gives its bytes). dq_window_check is DQ_CORRUPT exactly when a record is (or an fp16 field is
 * bad); dq_hot_transcode reports DQ_CORRUPT exactly when a container is; for a window the check
 * passes, dq_hot_rebuild gives the window back byte for byte, and the hot window decodes as the
 * records do.
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
    uint8_t *lev = malloc(n), *again = malloc(n), *scratch = malloc(n);
    uint8_t *enc = malloc(p->container_bytes[0] + p->container_bytes[1]);
    float *y = malloc(n * sizeof *y);
    FUZZ_CHECK(win && lev && again && scratch && enc && y);
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
                const dq__kind_tables *kt = &c->kt[kind];
                FUZZ_CHECK(dq__kt_encode(kt, lev, n, scratch, enc) <= kt->container);
                FUZZ_CHECK(memcmp(enc, rec + 4, kt->container) == 0);
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
    if (check == DQ_OK) {
        FUZZ_CHECK(dq_hot_check(c, hot, hb) == DQ_OK);
        for (int kind = 0; kind < 2; kind++)
            for (uint32_t t = 0; t < W; t++) {
                FUZZ_CHECK(dq_hot_levels(c, hot, (dq_kind)kind, t, again) == DQ_OK);
                dq_stream_decode_levels(c, (dq_kind)kind, dq_window_record(c, win, (dq_kind)kind, t), lev);
                FUZZ_CHECK(memcmp(lev, again, n) == 0);
            }
        uint8_t *back = malloc(wb);
        FUZZ_CHECK(back);
        FUZZ_CHECK(dq_hot_rebuild(c, hot, hb, back) == DQ_OK);
        FUZZ_CHECK(memcmp(back, win, wb) == 0);
        free(back);
    }
    free(hot);
    free(win);
    free(lev);
    free(again);
    free(scratch);
    free(enc);
    free(y);
    return 0;
}

#ifdef DQ_FUZZ_GEN
/* The seed corpus: per profile a valid window of encoded tokens, then damaged copies (a flipped
 * byte in each part, the last byte of each kind, a zeroed state, a cut). */
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
        for (int kind = 0; kind < 2; kind++) {
            memcpy(d, win, wb);
            memset(d + (kind ? vrec : krec) + 4, 0, 4);
            snprintf(name, sizeof name, "state-%u-%d", sel, kind);
            fail |= fuzz_write_seed(argv[1], name, sel, d, wb);
            memcpy(d, win, wb);
            d[(kind ? wb : vrec) - 1] ^= 0x80;
            snprintf(name, sizeof name, "tail-%u-%d", sel, kind);
            fail |= fuzz_write_seed(argv[1], name, sel, d, wb);
        }
        const size_t at[] = {1, krec + 1, krec + 5, krec + 8, vrec + 2, vrec + 6, wb / 2, wb - 1};
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

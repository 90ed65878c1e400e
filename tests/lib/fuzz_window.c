/* The window-record fuzz driver and seed generator shared by fuzz_fixed.c and fuzz_pairs.c
 * (fuzz_window.h). */
#include "fuzz_window.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/dquant.h"
#include "dquant/hot.h"
#include "fuzz.h"

static int bad_half(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u;
}

int fuzz_window_run(const fuzz_window_family *f, const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    f->setup();
    const dq_codec *c = f->codecs[(data[0] & 0x7f) % f->count];
    const dq_profile *p = dq_codec_profile(c);
    const uint32_t n = dq_codec_stream_len(c), W = p->window;
    const size_t wb = dq_codec_window_bytes(c);
    uint8_t *win = calloc(1, wb); /* exact size: a sanitizer sees any overread */
    uint8_t *lev = malloc(n), *again = malloc(n);
    float *y = malloc(n * sizeof *y);
    FUZZ_CHECK(win && lev && again && y);
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
            if (rc == DQ_OK)
                f->canonical(c, kind, lev, rec);
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
    if (check == DQ_OK || f->hot_levels_always)
        for (int kind = 0; kind < 2; kind++)
            for (uint32_t t = 0; t < W; t++) {
                FUZZ_CHECK(dq_hot_levels(c, hot, (dq_kind)kind, t, again) == DQ_OK);
                dq_stream_decode_levels(c, (dq_kind)kind, dq_window_record(c, win, (dq_kind)kind, t), lev);
                FUZZ_CHECK(memcmp(lev, again, n) == 0);
            }
    if (check == DQ_OK) {
        FUZZ_CHECK(dq_hot_check(c, hot, hb) == DQ_OK);
        f->hot_valid(c, win, wb, hot, hb);
    }
    free(hot);
    free(win);
    free(lev);
    free(again);
    free(y);
    return 0;
}

int fuzz_window_gen(const fuzz_window_family *f, const char *dir)
{
    f->setup();
    int fail = 0;
    for (uint8_t sel = 0; sel < f->count; sel++) {
        const dq_codec *c = f->codecs[sel];
        const uint32_t n = dq_codec_stream_len(c), W = dq_codec_profile(c)->window;
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
        fail |= fuzz_write_seed(dir, name, sel, win, wb);
        const size_t krec = (size_t)(dq_window_record(c, win, DQ_KIND_K, 0) - win);
        const size_t vrec = (size_t)(dq_window_record(c, win, DQ_KIND_V, 0) - win);
        fail |= f->seeds(dir, sel, c, win, d, krec, vrec);
        for (int kind = 0; kind < 2; kind++) {
            memcpy(d, win, wb);
            uint8_t *last = &d[(kind ? wb : vrec) - 1];
            *last = f->tail_set ? *last | 0x80 : *last ^ 0x80;
            snprintf(name, sizeof name, "tail-%u-%d", sel, kind);
            fail |= fuzz_write_seed(dir, name, sel, d, wb);
        }
        size_t at[16];
        const size_t nflip = f->flips(krec, vrec, wb, at);
        FUZZ_CHECK(nflip <= sizeof at / sizeof *at);
        for (size_t i = 0; i < nflip; i++) {
            FUZZ_CHECK(at[i] < wb);
            memcpy(d, win, wb);
            d[at[i]] ^= 0x40;
            snprintf(name, sizeof name, "flip-%u-%zu", sel, i);
            fail |= fuzz_write_seed(dir, name, sel, d, wb);
        }
        snprintf(name, sizeof name, "cut-%u", sel);
        fail |= fuzz_write_seed(dir, name, sel, win, wb / 3);
        free(k);
        free(v);
        free(win);
        free(d);
    }
    fail |= fuzz_write_seed(dir, "empty", 0, NULL, 0);
    return fail ? 1 : 0;
}

/* Fuzz target for untrusted containers and profiles (DESIGN §2.3: a corrupted container decodes to
 * garbage, never to a crash or an out-of-bounds read).
 *
 * Input: byte 0 picks a profile and kind (fuzz_container_profiles.h); the rest is one or more
 * records (short input is zero-padded, each record sits in a block of exactly record_bytes). Each
 * record is decoded by the public scalar decoder, the C and the fast dsp decoders (which must agree
 * byte for byte and on the verdict) and dq_stream_decode. The whole input is also offered to
 * dq_profile_deserialize: whatever it accepts must validate and round-trip. The body is also read
 * as a hot window of the profile (zero-padded to dq_hot_window_bytes) and given to dq_hot_rebuild:
 * it fails exactly when dq_hot_check does (or with DQ_CORRUPT when the levels fit no container),
 * leaving a zeroed window, and a window it accepts is a valid record that transcodes back to the
 * same hot bytes.
 *
 * Built as a libFuzzer target where clang supports -fsanitize=fuzzer, and always with the replay
 * driver tests/support/fuzz_replay.c, which runs every file of the directories (or files) it is
 * given, so the checked-in corpus runs in plain CI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/hot.h"
#include "dsp.h"
#include "fuzz.h"
#include "fuzz_container_profiles.h"

static dq_codec *codecs[FUZZ_NPROFILES];
static dq__dsp c_dsp, fast_dsp;

static void teardown(void)
{
    for (int i = 0; i < FUZZ_NPROFILES; i++) {
        dq_codec_free(codecs[i]);
        codecs[i] = NULL;
    }
}

/* The codecs live until exit (freed then, so the replay leaves no leak for ASan to report). */
static void setup(void)
{
    if (codecs[0])
        return;
    atexit(teardown);
    for (int i = 0; i < FUZZ_NPROFILES; i++) {
        dq_profile p;
        FUZZ_CHECK(fuzz_profile(i, &p) == DQ_OK);
        FUZZ_CHECK(dq_codec_create(&p, NULL, &codecs[i]) == DQ_OK);
    }
    dq__dsp_init_c(&c_dsp);
    dq__dsp_init_c(&fast_dsp);
    dq__dsp_init_x86(&fast_dsp);
}

static void fuzz_profile_bytes(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    FUZZ_CHECK(copy);
    memcpy(copy, data, size);
    dq_profile p;
    if (dq_profile_deserialize(copy, size, &p) == DQ_OK) {
        FUZZ_CHECK(dq_profile_validate(&p) == DQ_OK);
        uint8_t buf[DQ_PROFILE_SERIALIZED_MAX];
        size_t len = 0;
        FUZZ_CHECK(dq_profile_serialize(&p, buf, sizeof buf, &len) == DQ_OK);
        dq_profile q;
        FUZZ_CHECK(dq_profile_deserialize(buf, len, &q) == DQ_OK);
        FUZZ_CHECK(q.kv_heads == p.kv_heads && q.head_dim == p.head_dim);
        FUZZ_CHECK(memcmp(q.freq, p.freq, sizeof p.freq) == 0);
    }
    free(copy);
}

static void fuzz_records(const uint8_t *data, size_t size)
{
    const int prof = (data[0] & 0x7f) % FUZZ_NPROFILES;
    const dq_kind kind = (dq_kind)(data[0] >> 7);
    const dq_codec *codec = codecs[prof];
    const uint32_t n = dq_codec_stream_len(codec);
    const uint32_t C = dq_codec_profile(codec)->container_bytes[kind];
    const uint32_t M = dq_codec_profile(codec)->levels[kind];
    const size_t rb = dq_codec_record_bytes(codec, kind);
    const uint8_t *body = data + 1;
    const size_t blen = size - 1;

    /* Every record the input holds (at least one, zero-padded), at most 8. */
    size_t count = blen / rb + (blen % rb != 0);
    if (count == 0)
        count = 1;
    if (count > 8)
        count = 8;
    uint8_t *recs = malloc(count * rb);
    uint8_t *lev = malloc(n), *lc = malloc(count * n), *lf = malloc(count * n);
    float *vals = malloc(n * sizeof *vals);
    FUZZ_CHECK(recs && lev && lc && lf && vals);
    memset(recs, 0, count * rb);
    memcpy(recs, body, blen < count * rb ? blen : count * rb);

    size_t corrupt = 0;
    for (size_t i = 0; i < count; i++) {
        uint8_t *rec = malloc(rb); /* exact block: an overread is caught */
        FUZZ_CHECK(rec);
        memcpy(rec, recs + i * rb, rb);
        int rc = dq_stream_decode_levels(codec, kind, rec, lev);
        FUZZ_CHECK(rc == DQ_OK || rc == DQ_CORRUPT);
        for (uint32_t j = 0; j < n; j++)
            FUZZ_CHECK(lev[j] < M);
        corrupt += rc != DQ_OK;
        FUZZ_CHECK(dq_stream_decode(codec, kind, rec, vals) == rc);

        uint8_t *one_c = malloc(n), *one_f = malloc(n);
        FUZZ_CHECK(one_c && one_f);
        size_t bc = c_dsp.decode_levels(&codec->kt[kind].dec, rec, rb, 1, C, n, one_c);
        size_t bf = fast_dsp.decode_levels(&codec->kt[kind].dec, rec, rb, 1, C, n, one_f);
        FUZZ_CHECK(bc == (size_t)(rc != DQ_OK));
        FUZZ_CHECK(bf == bc);
        FUZZ_CHECK(memcmp(one_c, one_f, n) == 0);
        FUZZ_CHECK(memcmp(one_c, lev, n) == 0);
        free(one_c);
        free(one_f);
        free(rec);
    }
    /* All of them at once through the multi-stream decoders. */
    size_t bc = c_dsp.decode_levels(&codec->kt[kind].dec, recs, rb, count, C, n, lc);
    size_t bf = fast_dsp.decode_levels(&codec->kt[kind].dec, recs, rb, count, C, n, lf);
    FUZZ_CHECK(bc == corrupt);
    FUZZ_CHECK(bf == bc);
    FUZZ_CHECK(memcmp(lc, lf, count * n) == 0);

    free(recs);
    free(lev);
    free(lc);
    free(lf);
    free(vals);
}

static void fuzz_hot(const uint8_t *data, size_t size)
{
    const dq_codec *codec = codecs[(data[0] & 0x7f) % FUZZ_NPROFILES];
    const size_t hb = dq_hot_window_bytes(codec), wb = dq_codec_window_bytes(codec), blen = size - 1;
    uint8_t *hot = calloc(hb, 1), *win = malloc(wb), *again = malloc(hb);
    FUZZ_CHECK(hot && win && again);
    memcpy(hot, data + 1, blen < hb ? blen : hb);
    /* the input's own length first: short input is DQ_TRUNCATED */
    if (blen < hb)
        FUZZ_CHECK(dq_hot_rebuild(codec, hot, blen, win) == DQ_TRUNCATED);
    const int check = dq_hot_check(codec, hot, hb);
    memset(win, 0xa5, wb);
    const int rc = dq_hot_rebuild(codec, hot, hb, win);
    FUZZ_CHECK(check == DQ_OK || rc == check);
    FUZZ_CHECK(rc == DQ_OK || rc == DQ_CORRUPT);
    if (rc != DQ_OK) {
        for (size_t i = 0; i < wb; i++)
            FUZZ_CHECK(win[i] == 0);
    } else {
        FUZZ_CHECK(dq_hot_transcode(codec, win, again) == DQ_OK);
        FUZZ_CHECK(memcmp(again, hot, hb) == 0);
    }
    free(hot);
    free(win);
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    fuzz_profile_bytes(data, size);
    if (size >= 1) {
        fuzz_records(data, size);
        fuzz_hot(data, size);
    }
    return 0;
}

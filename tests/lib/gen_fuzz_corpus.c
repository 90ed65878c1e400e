/* Writes the seed corpus of fuzz_container.c into a directory: valid records of every fuzz
 * profile and kind from the encoder (Gaussian, constant, outliers, several records in a row),
 * damaged ones, garbage, serialized profiles, and hot windows (dq_hot_transcode of encoded windows,
 * one with a flipped code). Deterministic (fixed seed).
 * Usage: lib-gen-fuzz-corpus DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/hot.h"
#include "dqtest_util.h"
#include "fuzz.h"
#include "fuzz_container_profiles.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    dqt_rng rng;
    dqt_rng_seed(&rng, 0xf022u);
    int rc = 0, files = 0;
    for (int p = 0; p < FUZZ_NPROFILES; p++) {
        dq_profile prof;
        dq_codec *codec = NULL;
        dq_workspace *ws = NULL;
        if (fuzz_profile(p, &prof) != DQ_OK || dq_codec_create(&prof, NULL, &codec) != DQ_OK ||
            dq_workspace_create(codec, &ws) != DQ_OK) {
            fprintf(stderr, "profile %d: cannot make a codec\n", p);
            return 1;
        }
        const uint32_t n = dq_codec_stream_len(codec);
        float *y = dqt_xmalloc(n * sizeof *y);
        for (int k = 0; k < 2; k++) {
            const size_t rb = dq_codec_record_bytes(codec, (dq_kind)k);
            const uint8_t sel = (uint8_t)(p | (k << 7));
            const char kc = k ? 'v' : 'k';
            uint8_t *recs = dqt_xmalloc(3 * rb);
            char name[64];
            /* Three valid records: Gaussian, constant, outliers. */
            for (int r = 0; r < 3; r++) {
                for (uint32_t j = 0; j < n; j++)
                    y[j] = r == 1 ? 0.75f : (float)dqt_normal(&rng);
                if (r == 2)
                    y[dqt_below(&rng, n)] = 900.0f;
                if (dq_stream_encode(codec, ws, (dq_kind)k, y, recs + r * rb, NULL) != DQ_OK) {
                    fprintf(stderr, "profile %d kind %d: encode failed\n", p, k);
                    return 1;
                }
            }
            snprintf(name, sizeof name, "valid-p%d-%c", p, kc);
            rc |= fuzz_write_seed(dir, name, sel, recs, rb);
            files++;
            if (p < 3 || p == 5) {
                snprintf(name, sizeof name, "valid3-p%d-%c", p, kc);
                rc |= fuzz_write_seed(dir, name, sel, recs, 3 * rb);
                files++;
            }
            if (p == 0 || p == 4) {
                snprintf(name, sizeof name, "const-p%d-%c", p, kc);
                rc |= fuzz_write_seed(dir, name, sel, recs + rb, rb);
                /* One flipped bit in the first container byte after the state. */
                memcpy(recs + 2 * rb, recs, rb);
                recs[2 * rb + 8] ^= 0x10;
                snprintf(name, sizeof name, "flip-p%d-%c", p, kc);
                rc |= fuzz_write_seed(dir, name, sel, recs + 2 * rb, rb);
                files += 2;
            }
            if (p == 1 && k == 0) {
                /* Zeroed state, then a truncated record (first half only). */
                memcpy(recs + 2 * rb, recs, rb);
                memset(recs + 2 * rb + 4, 0, 4);
                rc |= fuzz_write_seed(dir, "zerostate-p1-k", sel, recs + 2 * rb, rb);
                rc |= fuzz_write_seed(dir, "short-p1-k", sel, recs, rb / 2);
                files += 2;
            }
            free(recs);
        }
        free(y);
        dq_workspace_free(ws);
        dq_codec_free(codec);
    }
    /* Garbage. */
    uint8_t junk[700];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)dqt_next(&rng);
    rc |= fuzz_write_seed(dir, "garbage-700", junk[0], junk + 1, sizeof junk - 1);
    memset(junk, 0xff, sizeof junk);
    rc |= fuzz_write_seed(dir, "all-ff", 0x80, junk, 336);
    rc |= fuzz_write_seed(dir, "empty-body", 0x02, junk, 0);
    files += 3;
    /* Serialized profiles (also decoded as records with the first byte as selector). */
    for (int p = 0; p < FUZZ_NPROFILES; p += 2) {
        dq_profile prof;
        uint8_t buf[DQ_PROFILE_SERIALIZED_MAX];
        size_t len = 0;
        if (fuzz_profile(p, &prof) != DQ_OK || dq_profile_serialize(&prof, buf, sizeof buf, &len) != DQ_OK) {
            fprintf(stderr, "profile %d: cannot serialize\n", p);
            return 1;
        }
        char name[64];
        snprintf(name, sizeof name, "profile-p%d", p);
        rc |= fuzz_write_seed(dir, name, buf[0], buf + 1, len - 1);
        files++;
    }
    /* Hot windows of the small profiles (their own generator: the seeds above stay as they were). */
    dqt_rng hrng;
    dqt_rng_seed(&hrng, 0x4071u);
    for (int p = 3; p < FUZZ_NPROFILES; p++) {
        dq_profile prof;
        dq_codec *codec = NULL;
        dq_workspace *ws = NULL;
        if (fuzz_profile(p, &prof) != DQ_OK || dq_codec_create(&prof, NULL, &codec) != DQ_OK ||
            dq_workspace_create(codec, &ws) != DQ_OK) {
            fprintf(stderr, "profile %d: cannot make a codec\n", p);
            return 1;
        }
        const size_t n = dq_codec_stream_len(codec), W = dq_codec_profile(codec)->window;
        const size_t hb = dq_hot_window_bytes(codec);
        float *kv = dqt_xmalloc(2 * W * n * sizeof *kv);
        for (size_t i = 0; i < 2 * W * n; i++)
            kv[i] = (float)dqt_normal(&hrng);
        uint8_t *win = dqt_xmalloc(dq_codec_window_bytes(codec)), *hot = dqt_xmalloc(hb);
        if (dq_window_encode(codec, ws, kv, kv + W * n, DQ_DTYPE_F32, win, NULL) != DQ_OK ||
            dq_hot_transcode(codec, win, hot) != DQ_OK) {
            fprintf(stderr, "profile %d: hot window failed\n", p);
            return 1;
        }
        char name[64];
        snprintf(name, sizeof name, "hot-p%d", p);
        rc |= fuzz_write_seed(dir, name, (uint8_t)p, hot, hb);
        size_t off[4];
        dq_hot_offsets(codec, off);
        hot[off[2] + 5] ^= 0x24; /* two key codes changed: still valid codes, another record */
        snprintf(name, sizeof name, "hotflip-p%d", p);
        rc |= fuzz_write_seed(dir, name, (uint8_t)p, hot, hb);
        files += 2;
        free(kv);
        free(win);
        free(hot);
        dq_workspace_free(ws);
        dq_codec_free(codec);
    }
    printf("wrote %d seeds to %s\n", files, dir);
    return rc ? 1 : 0;
}

/* Fuzz target for untrusted KVQ calibrations (dq_kvq_calibration_check, dq_codec_create_calibrated):
 * whatever the bytes, a clean error or a codec that encodes and decodes, never a crash.
 *
 * Input: byte 0 picks a profile (kv_heads 2, head_dim 16, low bits) and, with bit 7 set, has the
 * input's trailing 8 bytes rewritten to the xxHash64 of the rest, so that mutated tables get past
 * the checksum; the rest is the calibration. The profile takes its layer count and hash from the
 * input itself (the layers field and the trailing 8 bytes), so that well-formed inputs reach the
 * tables. A calibration the check accepts must make
 * a codec whose first and last layer views encode and decode a few tokens to finite values; one it
 * refuses must be refused by dq_codec_create_calibrated with the same code.
 *
 * Built as a libFuzzer target where clang supports -fsanitize=fuzzer, always with the replay
 * driver tests/support/fuzz_replay.c (tests/lib/corpus_kvq_calib runs in plain CI), and
 * with -DDQ_FUZZ_GEN as the generator of that corpus (lib-gen-kvq-calib-corpus DIR). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "dquant/dquant.h"
#include "dquant/kvq.h"
#include "fuzz.h"

#define FZ_H 2u
#define FZ_D 16u
#define FZ_N (FZ_H * FZ_D)
static const char *const fz_names[] = {"ol3", "pq4x2", "lm3", "ol2+o4+d8", "pq8x3+lr2+d16", "ip3"};
#define FZ_NPROFILES (sizeof fz_names / sizeof fz_names[0])

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void exercise(const dq_codec *c)
{
    dq_workspace *ws = NULL;
    FUZZ_CHECK(dq_workspace_create(c, &ws) == DQ_OK);
    const size_t T = 8, rb = dq_codec_record_bytes(c, DQ_KIND_K), mb = dq_codec_mean_bytes(c);
    float x[8 * FZ_N], y[8 * FZ_N];
    for (size_t i = 0; i < T * FZ_N; i++)
        x[i] = (float)((int)(i * 37 % 23) - 11) * 0.25f;
    uint8_t *rec = malloc(T * rb), *hdr = malloc(mb ? mb : 1);
    FUZZ_CHECK(rec && hdr);
    int rc = dq_tokens_encode(c, ws, DQ_KIND_K, x, DQ_DTYPE_F32, T, mb ? hdr : NULL, rec, rb, NULL);
    FUZZ_CHECK(rc == DQ_OK || rc == DQ_RANGE);
    if (rc == DQ_OK) {
        FUZZ_CHECK(dq_tokens_decode(c, ws, DQ_KIND_K, mb ? hdr : NULL, rec, rb, T, y, DQ_DTYPE_F32) == DQ_OK);
        for (size_t i = 0; i < T * FZ_N; i++)
            FUZZ_CHECK(isfinite(y[i]));
    }
    free(rec);
    free(hdr);
    dq_workspace_free(ws);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    dq_profile p;
    FUZZ_CHECK(dq_profile_kvq(fz_names[(data[0] & 0x7f) % FZ_NPROFILES], FZ_H, FZ_D, &p) == DQ_OK);
    const size_t len = size - 1;
    uint8_t *copy = malloc(len ? len : 1); /* exact size, so a sanitizer sees any overread */
    FUZZ_CHECK(copy);
    memcpy(copy, data + 1, len);
    const uint8_t *blob = copy;
    if ((data[0] & 0x80) && len >= 8) {
        const uint64_t h = XXH64(copy, len - 8, 0);
        for (int i = 0; i < 8; i++)
            copy[len - 8 + i] = (uint8_t)(h >> (8 * i));
    }
    if (len >= 56) {
        uint64_t hash = (uint64_t)rd32(blob + len - 8) | (uint64_t)rd32(blob + len - 4) << 32;
        uint32_t layers = rd32(blob + 8);
        if (hash && layers && layers <= 65536) {
            p.kvq_layers = layers;
            p.kvq_calib_hash = hash;
        }
    }
    uint32_t layers = 0;
    const int rc = dq_profile_validate(&p) == DQ_OK ? dq_kvq_calibration_check(&p, copy, len, &layers) : -1;
    dq_codec *c = NULL;
    const int rc2 = rc == -1 ? -1 : dq_codec_create_calibrated(&p, copy, len, NULL, &c);
    if (rc == DQ_OK) {
        FUZZ_CHECK(rc2 == DQ_OK && c && layers >= 1);
        exercise(dq_codec_layer(c, 0));
        exercise(dq_codec_layer(c, layers - 1));
        FUZZ_CHECK(dq_codec_layer(c, layers) == NULL);
    } else if (rc != -1) {
        FUZZ_CHECK(rc < 0 && rc2 == rc && !c);
    }
    dq_codec_free(c);
    free(copy);
    return 0;
}

#ifdef DQ_FUZZ_GEN
/* The seed corpus: a valid calibration of each profile (1 and 3 layers), then damaged copies. */

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const size_t T = 80;
    float *k = malloc(sizeof(float) * 3 * T * FZ_N), *v = malloc(sizeof(float) * 3 * T * FZ_N);
    FUZZ_CHECK(k && v);
    uint64_t s = 0x5eedull;
    for (size_t i = 0; i < 3 * T * FZ_N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        k[i] = (float)((int64_t)(s >> 40) % 1000) / 250.0f * ((i % FZ_D) == 3 ? 8.0f : 1.0f);
        v[i] = (float)((int64_t)(s >> 20 & 0xfffff) % 1000) / 300.0f;
    }
    int fail = 0;
    for (uint8_t sel = 0; sel < FZ_NPROFILES; sel++)
        for (uint32_t layers = 1; layers <= 3; layers += 2) {
            dq_profile p;
            FUZZ_CHECK(dq_profile_kvq(fz_names[sel], FZ_H, FZ_D, &p) == DQ_OK);
            uint8_t *blob = NULL;
            size_t len = 0;
            FUZZ_CHECK(dq_kvq_calibrate(&p, layers, k, v, T, 3, &blob, &len) == DQ_OK);
            char name[64];
            snprintf(name, sizeof name, "valid-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, sel, blob, len);
            snprintf(name, sizeof name, "trunc-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, sel, blob, len - 9);
            uint8_t *d = malloc(len);
            FUZZ_CHECK(d);
            memcpy(d, blob, len);
            d[len / 2] ^= 0x40; /* a table or header byte: the hash no longer matches */
            snprintf(name, sizeof name, "flip-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, sel, d, len);
            memcpy(d, blob, len);
            d[8] = 7; /* a lying layer count */
            snprintf(name, sizeof name, "layers-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, sel, d, len);
            /* rehashed (selector bit 7): damaged tables behind a valid checksum */
            memcpy(d, blob, len);
            d[48] ^= 0x0f; /* first outlier index or codebook entry */
            snprintf(name, sizeof name, "table-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, (uint8_t)(sel | 0x80), d, len);
            memcpy(d, blob, len);
            if (len > 58) {
                d[49] = 0x7c; /* an fp16 infinity, or an index past head_dim */
                d[48] = 0;
            }
            snprintf(name, sizeof name, "inf-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, (uint8_t)(sel | 0x80), d, len);
            snprintf(name, sizeof name, "rehash-%u-l%u", sel, layers);
            fail |= fuzz_write_seed(argv[1], name, (uint8_t)(sel | 0x80), blob, len);
            free(d);
            dq_kvq_free(blob);
        }
    static const uint8_t junk[] = "DQKC\x01\x00\x00\x00garbage";
    fail |= fuzz_write_seed(argv[1], "junk", 0, junk, sizeof junk - 1);
    fail |= fuzz_write_seed(argv[1], "empty", 1, junk, 0);
    free(k);
    free(v);
    return fail ? 1 : 0;
}
#endif

/* Fuzz target for untrusted containers and profiles (DESIGN §2.3: a corrupted container decodes to
 * garbage, never to a crash or an out-of-bounds read).
 *
 * Input: byte 0 picks a profile and kind (fuzz_container_profiles.h); the rest is one or more
 * records (short input is zero-padded, each record sits in a block of exactly record_bytes). Each
 * record is decoded by the public scalar decoder, the C and the fast dsp decoders (which must agree
 * byte for byte and on the verdict) and dq_stream_decode. The whole input is also offered to
 * dq_profile_deserialize: whatever it accepts must validate and round-trip.
 *
 * Built as a libFuzzer target where clang supports -fsanitize=fuzzer, and always with
 * -DDQ_FUZZ_REPLAY as a program that runs every file of the directories (or files) it is given,
 * so the checked-in corpus runs in plain CI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dsp.h"
#include "fuzz_container_profiles.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                 \
        }                                                                            \
    } while (0)

static dq_codec *codecs[FUZZ_NPROFILES];
static dq__dsp c_dsp, fast_dsp;

static void setup(void)
{
    if (codecs[0])
        return;
    for (int i = 0; i < FUZZ_NPROFILES; i++) {
        dq_profile p;
        FUZZ_CHECK(fuzz_profile(i, &p) == DQ_OK);
        FUZZ_CHECK(dq_codec_create(&p, NULL, &codecs[i]) == DQ_OK);
    }
    dq__dsp_init_c(&c_dsp);
    dq__dsp_init_c(&fast_dsp);
    dq__dsp_init_x86(&fast_dsp);
}

#ifdef DQ_FUZZ_REPLAY
static void teardown(void)
{
    for (int i = 0; i < FUZZ_NPROFILES; i++) {
        dq_codec_free(codecs[i]);
        codecs[i] = NULL;
    }
}
#endif

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    fuzz_profile_bytes(data, size);
    if (size >= 1)
        fuzz_records(data, size);
    return 0;
}

#ifdef DQ_FUZZ_REPLAY
#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    FUZZ_CHECK(buf);
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap)
            break;
        cap *= 2;
        buf = realloc(buf, cap);
        FUZZ_CHECK(buf);
    }
    fclose(f);
    /* An exact-size copy, as libFuzzer hands it over. */
    uint8_t *exact = malloc(len ? len : 1);
    FUZZ_CHECK(exact);
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    long files = 0;
    int failed = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "no such path: %s\n", argv[a]);
            failed = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            failed |= replay_file(argv[a]) != 0;
            files++;
            continue;
        }
        struct dirent **names = NULL;
        int nn = scandir(argv[a], &names, NULL, alphasort);
        if (nn < 0) {
            fprintf(stderr, "cannot read %s\n", argv[a]);
            failed = 1;
            continue;
        }
        for (int i = 0; i < nn; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i]->d_name);
            if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                failed |= replay_file(path) != 0;
                files++;
            }
            free(names[i]);
        }
        free(names);
    }
    teardown();
    printf("replayed %ld inputs\n", files);
    return failed || files == 0 ? 1 : 0;
}
#endif

/* Error codes, dtypes, version and the log callback (error.h, types.h, version.h, log.h). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "dqtest_util.h"

static void suite_init(void)
{
}

static void suite_fini(void)
{
    dq_set_log(NULL, NULL, DQ_LOG_ERROR);
}

TestSuite(errors, .init = suite_init, .fini = suite_fini);

Test(errors, every_code_has_its_name_and_message)
{
    struct {
        int code;
        const char *name, *msg;
    } codes[] = {
#define X(name, value, msg) {value, #name, msg},
        DQ_ERRNO_MAP(X)
#undef X
    };
    const size_t count = sizeof codes / sizeof codes[0];
    cr_assert_eq(count, 28, "the error map has %zu codes", count);
    for (size_t i = 0; i < count; i++) {
        cr_assert_eq(codes[i].code, -(int)i, "codes are dense and fixed: %s is %d", codes[i].name, codes[i].code);
        const char *name = dq_err_name(codes[i].code), *msg = dq_strerror(codes[i].code);
        cr_assert_not_null(name);
        cr_assert_not_null(msg);
        cr_assert_str_eq(name, codes[i].name, "dq_err_name(%d)", codes[i].code);
        cr_assert_str_eq(msg, codes[i].msg, "dq_strerror(%d)", codes[i].code);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(dq_strerror(codes[j].code), msg, "codes %d and %d share a message", codes[j].code,
                              codes[i].code);
    }
    /* Fixed values on the wire. */
    cr_assert_eq(DQ_NONFINITE, -3);
    cr_assert_eq(DQ_CORRUPT, -9);
    cr_assert_eq(DQ_OUT_OF_BOUNDS, -12);
    cr_assert_eq(DQ_INTERNAL, -27);
    static const int unknown[] = {1, 5, -28, -100, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        cr_assert_str_eq(dq_err_name(unknown[i]), "UNKNOWN", "dq_err_name(%d)", unknown[i]);
        cr_assert_str_eq(dq_strerror(unknown[i]), "unknown error", "dq_strerror(%d)", unknown[i]);
    }
}

Test(errors, dtypes)
{
    cr_assert_eq(dq_dtype_size(DQ_DTYPE_F32), 4);
    cr_assert_eq(dq_dtype_size(DQ_DTYPE_F16), 2);
    cr_assert_eq(dq_dtype_size(DQ_DTYPE_BF16), 2);
    cr_assert_eq(dq_dtype_size((dq_dtype)3), 0);
    cr_assert_eq(dq_dtype_size((dq_dtype)-1), 0);
    cr_assert_str_eq(dq_dtype_name(DQ_DTYPE_F32), "f32");
    cr_assert_str_eq(dq_dtype_name(DQ_DTYPE_F16), "f16");
    cr_assert_str_eq(dq_dtype_name(DQ_DTYPE_BF16), "bf16");
    cr_assert_null(dq_dtype_name((dq_dtype)9));
    static const struct {
        const char *s;
        dq_dtype t;
    } ok[] = {{"f32", DQ_DTYPE_F32},  {"float32", DQ_DTYPE_F32}, {"f16", DQ_DTYPE_F16},      {"float16", DQ_DTYPE_F16},
              {"fp16", DQ_DTYPE_F16}, {"bf16", DQ_DTYPE_BF16},   {"bfloat16", DQ_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dq_dtype t = (dq_dtype)99;
        cr_assert_eq(dq_dtype_parse(ok[i].s, &t), DQ_OK, "parse %s", ok[i].s);
        cr_assert_eq(t, ok[i].t, "parse %s", ok[i].s);
    }
    static const char *bad[] = {"", "f64", "F32x", "bf", "int8", "float"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dq_dtype t;
        cr_assert_eq(dq_dtype_parse(bad[i], &t), DQ_DTYPE, "'%s' parsed", bad[i]);
    }
}

static bool same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

Test(errors, convert)
{
    float src[64], back[64];
    uint16_t h[64], b[64];
    for (int i = 0; i < 64; i++)
        src[i] = (float)(i - 32) * 0.37f;
    /* NaN, infinities, -0, the largest float (rounds to infinity in BF16), ties to even, a subnormal */
    const uint32_t special[] = {0x7fc00001u, 0x7f800001u, 0xff800000u, 0x80000000u,
                                0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x00000123u};
    for (int i = 0; i < 8; i++)
        memcpy(&src[56 + i], &special[i], 4);
    cr_assert_eq(dq_convert(src, DQ_DTYPE_F32, h, DQ_DTYPE_F16, 64), DQ_OK);
    cr_assert_eq(dq_convert(src, DQ_DTYPE_F32, b, DQ_DTYPE_BF16, 64), DQ_OK);
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(h[i], dq_f32_to_f16(src[i]));
        cr_assert_eq(b[i], dq_f32_to_bf16(src[i]));
    }
    cr_assert_eq(dq_convert(h, DQ_DTYPE_F16, back, DQ_DTYPE_F32, 64), DQ_OK);
    for (int i = 0; i < 64; i++)
        cr_assert(same_bits(back[i], dq_f16_to_f32(h[i])), "f16 -> f32 at %d", i);
    cr_assert_eq(dq_convert(b, DQ_DTYPE_BF16, back, DQ_DTYPE_F32, 64), DQ_OK);
    for (int i = 0; i < 64; i++)
        cr_assert(same_bits(back[i], dq_bf16_to_f32(b[i])), "bf16 -> f32 at %d", i);
    /* between the 16-bit types: through float */
    uint16_t hb[64], bh[64];
    cr_assert_eq(dq_convert(h, DQ_DTYPE_F16, hb, DQ_DTYPE_BF16, 64), DQ_OK);
    cr_assert_eq(dq_convert(b, DQ_DTYPE_BF16, bh, DQ_DTYPE_F16, 64), DQ_OK);
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(hb[i], dq_f32_to_bf16(dq_f16_to_f32(h[i])));
        cr_assert_eq(bh[i], dq_f32_to_f16(dq_bf16_to_f32(b[i])));
    }
    cr_assert_eq(dq_convert(src, DQ_DTYPE_F32, back, DQ_DTYPE_F32, 64), DQ_OK);
    cr_assert(memcmp(src, back, sizeof src) == 0);
    cr_assert_lt(dq_convert(src, (dq_dtype)5, back, DQ_DTYPE_F32, 64), 0, "invalid dtype accepted");
}

Test(errors, version)
{
    cr_assert_str_eq(dq_version(), DQ_VERSION_STRING);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", DQ_VERSION_MAJOR, DQ_VERSION_MINOR, DQ_VERSION_PATCH);
    cr_assert_str_eq(dq_version(), buf);
}

typedef struct log_sink {
    int count, above_max, bad_args;
    dq_log_level max;
} log_sink;

static void sink(void *opaque, dq_log_level level, const char *file, int line, const char *msg)
{
    log_sink *s = opaque;
    s->count++;
    if (level > s->max)
        s->above_max++;
    if (!file || !msg || line <= 0)
        s->bad_args++;
}

/* Errors are reported through the callback, filtered by level; with none set the library is silent. */
Test(errors, log_callback)
{
    dq_profile p;
    log_sink s = {0, 0, 0, DQ_LOG_DEBUG};
    dq_set_log(sink, &s, DQ_LOG_DEBUG);
    cr_assert_eq(dq_profile_builtin("dq226", 8, 100, &p), DQ_PROFILE);
    cr_assert_gt(s.count, 0, "an error path logged nothing at DEBUG");
    cr_assert_eq(s.bad_args, 0, "log callback got NULL file/message or a bad line");

    log_sink e = {0, 0, 0, DQ_LOG_ERROR};
    dq_set_log(sink, &e, DQ_LOG_ERROR);
    cr_assert_eq(dq_profile_builtin("dq226", 8, 100, &p), DQ_PROFILE);
    cr_assert_eq(e.above_max, 0, "messages above the maximum level were delivered");

    dq_set_log(NULL, NULL, DQ_LOG_DEBUG);
    cr_assert_eq(dq_profile_builtin("dq226", 8, 100, &p), DQ_PROFILE);
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &p), DQ_OK);
}

/* Freeing NULL is allowed everywhere; creation refuses NULL outputs and bad profiles. */
Test(errors, null_and_invalid_handles)
{
    dq_codec_free(NULL);
    dq_workspace_free(NULL);
    dq_layer_free(NULL);
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226", 2, 128, &p), DQ_OK);
    cr_assert_lt(dq_codec_create(&p, NULL, NULL), 0, "NULL output accepted");
    cr_assert_lt(dq_codec_create(NULL, NULL, &(dq_codec *){NULL}), 0, "NULL profile accepted");
    dq_profile bad = p;
    bad.freq[0][0]++;
    dq_codec *c = NULL;
    cr_assert_eq(dq_codec_create(&bad, NULL, &c), DQ_PROFILE, "a profile whose table sums to 257 accepted");
    cr_assert_null(c);
    bad = p;
    bad.head_dim = 96;
    cr_assert_eq(dq_codec_create(&bad, NULL, &c), DQ_PROFILE);
    cr_assert_eq(dq_codec_create(&p, NULL, &c), DQ_OK);
    cr_assert_eq(dq_codec_stream_len(c), 256);
    cr_assert(memcmp(dq_codec_profile(c)->freq, p.freq, sizeof p.freq) == 0);
    cr_assert_lt(dq_workspace_create(c, NULL), 0);
    cr_assert_lt(dq_layer_create(c, NULL), 0);
    dq_codec_free(c);
}

/* fp16 / bf16 conversions by bit manipulation: exact, round to nearest even, identical everywhere. */
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "codec_internal.h"
#include "dquant/types.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dq_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {   /* subnormal or zero in f16 */
        if (abs < 0x33000000u) /* < 2^-25: rounds to zero */
            return sign;
        uint32_t e = abs >> 23;
        uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) ... bring to 2^-24 units */
        /* value = m · 2^(e-150); in units of 2^-24: m · 2^(e-126) = m >> (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (abs >> 23) - 112; /* rebias 127 -> 15 */
    uint32_t m = abs & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++; /* may carry into the exponent: still correct, up to inf */
    return (uint16_t)(sign | h);
}

float dq_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0)
            return bits_f32(sign);
        /* subnormal: m · 2^-24 */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t dq_f64_to_f16(double x)
{
    if (isnan(x))
        return 0x7e00u;
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs(x);
    if (a >= 65520.0)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-25) /* below half the smallest subnormal (ties at exactly 2^-25 round to even 0) */
        return sign;
    if (a == 0x1p-25)
        return sign;
    int ex;
    frexp(a, &ex);  /* a = f · 2^ex, f in [0.5, 1) */
    int e = ex - 1; /* a in [2^e, 2^(e+1)) */
    double ulp = e < -14 ? 0x1p-24 : ldexp(1.0, e - 10);
    double q = a / ulp;      /* exact: power-of-two scaling */
    double r = nearbyint(q); /* default rounding mode: to nearest even */
    /* q · ulp with r possibly carrying to the next binade: reassemble from the value */
    double v = r * ulp;
    if (v >= 65520.0)
        return (uint16_t)(sign | 0x7c00u);
    /* v is exactly representable in f16: convert through f32 (exact) */
    return (uint16_t)(sign | dq_f32_to_f16((float)v));
}

uint16_t dq_f32_to_bf16(float x)
{
    return dq__f32_bf16(x);
}

float dq_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

size_t dq_dtype_size(dq_dtype dtype)
{
    switch (dtype) {
    case DQ_DTYPE_F32:
        return 4;
    case DQ_DTYPE_F16:
        return 2;
    case DQ_DTYPE_BF16:
        return 2;
    default:
        return 0;
    }
}

const char *dq_dtype_name(dq_dtype dtype)
{
    switch (dtype) {
    case DQ_DTYPE_F32:
        return "f32";
    case DQ_DTYPE_F16:
        return "f16";
    case DQ_DTYPE_BF16:
        return "bf16";
    default:
        return NULL;
    }
}

int dq_dtype_parse(const char *name, dq_dtype *out)
{
    DQ_RETURN_IF(!name || !out, DQ_INVALID_ARGUMENT);
    static const struct {
        const char *s;
        dq_dtype t;
    } names[] = {
        {"f32", DQ_DTYPE_F32},     {"float32", DQ_DTYPE_F32}, {"fp32", DQ_DTYPE_F32},  {"f16", DQ_DTYPE_F16},
        {"float16", DQ_DTYPE_F16}, {"fp16", DQ_DTYPE_F16},    {"bf16", DQ_DTYPE_BF16}, {"bfloat16", DQ_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(name, names[i].s) == 0) {
            *out = names[i].t;
            return DQ_OK;
        }
    }
    return DQ_DTYPE;
}

int dq_convert(const void *src, dq_dtype src_type, void *dst, dq_dtype dst_type, size_t count)
{
    DQ_RETURN_IF((!src || !dst) && count, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(src_type) || !dq_dtype_size(dst_type), DQ_DTYPE);
    if (src_type == dst_type) {
        memmove(dst, src, count * dq_dtype_size(src_type));
        return DQ_OK;
    }
    /* the common cases, written so that they vectorize: a plain widening and BF16 rounding */
    if (src_type == DQ_DTYPE_BF16 && dst_type == DQ_DTYPE_F32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < count; i++)
            d[i] = dq__bf16_f32(s[i]);
        return DQ_OK;
    }
    if (src_type == DQ_DTYPE_F32 && dst_type == DQ_DTYPE_BF16) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < count; i++)
            d[i] = dq__f32_bf16(s[i]);
        return DQ_OK;
    }
    for (size_t i = 0; i < count; i++)
        dq__store_elem(dst, dst_type, i, dq__load_elem(src, src_type, i));
    return DQ_OK;
}

/* Whether any of u[0..count) has all the exponent bits of mask set (Inf or NaN). The values are
 * tested in blocks without an early exit inside a block, so the compiler vectorizes the test. */
#define DQ__FINITE_BLOCK 256
#define DQ__DEFINE_ANY_EXP_ALL(name, type)                                                  \
    static bool name(const type *u, size_t count, type mask)                                \
    {                                                                                       \
        for (size_t i0 = 0; i0 < count; i0 += DQ__FINITE_BLOCK) {                           \
            const size_t m = count - i0 < DQ__FINITE_BLOCK ? count - i0 : DQ__FINITE_BLOCK; \
            type hit = 0;                                                                   \
            for (size_t i = 0; i < m; i++)                                                  \
                hit |= (type)((u[i0 + i] & mask) == mask);                                  \
            if (hit)                                                                        \
                return true;                                                                \
        }                                                                                   \
        return false;                                                                       \
    }
DQ__DEFINE_ANY_EXP_ALL(any_exp_all16, uint16_t)
DQ__DEFINE_ANY_EXP_ALL(any_exp_all32, uint32_t)

int dq_check_finite(const void *x, dq_dtype dtype, size_t count)
{
    DQ_RETURN_IF(!x && count, DQ_INVALID_ARGUMENT);
    switch (dtype) {
    case DQ_DTYPE_F32:
        return any_exp_all32(x, count, 0x7f800000u) ? DQ_NONFINITE : DQ_OK;
    case DQ_DTYPE_F16:
        return any_exp_all16(x, count, 0x7c00u) ? DQ_NONFINITE : DQ_OK;
    case DQ_DTYPE_BF16:
        return any_exp_all16(x, count, 0x7f80u) ? DQ_NONFINITE : DQ_OK;
    default:
        return DQ_DTYPE;
    }
}

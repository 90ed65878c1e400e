/* IEEE binary16 and bfloat16 conversions (types.h): exact widening of every bit pattern, exact
 * round trips, round-to-nearest-even at every tie, overflow to infinity, NaN kept NaN, and f64
 * input rounded once (not through f32). */
#include <criterion/criterion.h>
#include <fenv.h>
#include <math.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x4a1fu);
}

static void suite_fini(void)
{
}

TestSuite(half, .init = suite_init, .fini = suite_fini);

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary16 decoded from its definition. */
static double f16_value(uint16_t h)
{
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

/* Correct rounding of x to binary16, from arithmetic: the result's bits. */
static uint16_t f16_reference(double x)
{
    if (isnan(x))
        return 0x7e00;
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (a >= 65520.0)
        return sign | 0x7c00;
    int e;
    frexp(a, &e); /* a = f·2^e, f in [0.5, 1) */
    double ulp = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 11);
    double r = nearbyint(a / ulp) * ulp; /* exact: a / ulp and the product are exact in double */
    if (r >= 65520.0)
        return sign | 0x7c00;
    /* Encode r exactly. */
    if (r < 0x1p-14)
        return sign | (uint16_t)(r / 0x1p-24);
    frexp(r, &e);
    uint16_t exp = (uint16_t)(e - 1 + 15);
    uint16_t man = (uint16_t)(ldexp(r, -(e - 1)) * 1024.0 - 1024.0);
    return sign | (uint16_t)(exp << 10) | man;
}

Test(half, f16_every_pattern)
{
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = dq_f16_to_f32((uint16_t)h);
        const double want = f16_value((uint16_t)h);
        if (isnan(want)) {
            cr_assert(isnan(f), "f16 %#06x is NaN, widened to %g", h, (double)f);
            uint16_t back = dq_f32_to_f16(f);
            cr_assert(((back >> 10) & 31) == 31 && (back & 1023) != 0, "NaN %#06x narrowed to %#06x (not NaN)", h,
                      back);
            continue;
        }
        cr_assert((double)f == want, "f16 %#06x widened to %.9g, expected %.9g", h, (double)f, want);
        cr_assert_eq(signbit(f) != 0, (h >> 15) != 0, "f16 %#06x lost its sign", h);
        cr_assert_eq(dq_f32_to_f16(f), h, "f16 %#06x does not survive f32 and back (%#06x)", h, dq_f32_to_f16(f));
        cr_assert_eq(dq_f64_to_f16((double)f), h, "f16 %#06x does not survive f64 and back", h);
    }
}

/* Ties between neighbouring binary16 values go to the even one; anything off the tie to the nearer. */
Test(half, f16_round_to_nearest_even)
{
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (int neg = 0; neg < 2; neg++) {
            const uint16_t lo = (uint16_t)(h | (neg ? 0x8000 : 0)), hi = (uint16_t)(lo + 1);
            /* Past 65504 the next step would be 65536: the tie there is 65520. */
            const double a = f16_value(lo), b = h == 0x7bff ? (neg ? -65536.0 : 65536.0) : f16_value(hi);
            const double mid = (a + b) / 2; /* exact in float: 12 significant bits */
            const float fm = (float)mid;
            cr_assert((double)fm == mid);
            const uint16_t even = (lo & 1) ? hi : lo;
            if (h == 0x7bff) /* between 65504 and the next step: overflows */
                cr_assert_eq(dq_f32_to_f16(fm), neg ? 0xfc00 : 0x7c00, "65520 must round to infinity");
            else
                cr_assert_eq(dq_f32_to_f16(fm), even, "tie %.10g between %#06x and %#06x gave %#06x", mid, lo, hi,
                             dq_f32_to_f16(fm));
            const float below = nextafterf(fm, 0.0f), above = nextafterf(fm, neg ? -INFINITY : INFINITY);
            cr_assert_eq(dq_f32_to_f16(below), lo, "just below the tie %.10g: %#06x", mid, dq_f32_to_f16(below));
            if (h != 0x7bff)
                cr_assert_eq(dq_f32_to_f16(above), hi, "just above the tie %.10g: %#06x", mid, dq_f32_to_f16(above));
            else
                cr_assert_eq(dq_f32_to_f16(above) & 0x7fff, 0x7c00);
        }
    }
    cr_assert_eq(dq_f32_to_f16(1e6f), 0x7c00);
    cr_assert_eq(dq_f32_to_f16(-1e6f), 0xfc00);
    cr_assert_eq(dq_f32_to_f16(INFINITY), 0x7c00);
    cr_assert_eq(dq_f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(dq_f32_to_f16(0x1p-25f), 0x0000, "half the smallest subnormal ties to zero");
    cr_assert_eq(dq_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    cr_assert_eq(dq_f32_to_f16(1e-30f), 0x0000);
    cr_assert_eq(dq_f32_to_f16(-1e-30f), 0x8000, "sign of a flushed negative");
    cr_assert_eq(dq_f32_to_f16(0x1p-149f), 0x0000, "f32 subnormal");
}

Test(half, f16_random_against_reference)
{
    cr_assert_eq(fegetround(), FE_TONEAREST);
    for (int i = 0; i < 2000000; i++) {
        float f;
        if (i % 2)
            f = bitsf((uint32_t)dqt_next(&rng));
        else /* concentrate on the binary16 range */
            f = (float)(ldexp(dqt_uniform(&rng) + 0.5, (int)dqt_below(&rng, 46) - 28) * (dqt_below(&rng, 2) ? 1 : -1));
        if (isnan(f))
            continue;
        const uint16_t got = dq_f32_to_f16(f), want = f16_reference(f);
        cr_assert_eq(got, want, "f32 %.9g (%#010x) gave %#06x, expected %#06x", (double)f, fbits(f), got, want);
    }
}

/* f64 input is rounded once: values a hair above a binary16 tie must not be rounded to the tie in
 * f32 first and then to even. */
Test(half, f64_single_rounding)
{
    cr_assert_eq(dq_f64_to_f16(1.0 + 0x1p-11 + 0x1p-40), 0x3c01, "1 + 2^-11 + 2^-40 must round up");
    cr_assert_eq(dq_f64_to_f16(1.0 + 0x1p-11), 0x3c00, "exact tie rounds to even");
    cr_assert_eq(dq_f64_to_f16(1.0 + 3 * 0x1p-11 - 0x1p-40), 0x3c01, "just under a tie to odd rounds down");
    cr_assert_eq(dq_f64_to_f16(65519.999999999), 0x7bff);
    cr_assert_eq(dq_f64_to_f16(65520.0), 0x7c00);
    cr_assert_eq(dq_f64_to_f16(1e300), 0x7c00);
    cr_assert_eq(dq_f64_to_f16(-1e300), 0xfc00);
    cr_assert_eq(dq_f64_to_f16(1e-300), 0x0000);
    uint16_t nan = dq_f64_to_f16(NAN);
    cr_assert(((nan >> 10) & 31) == 31 && (nan & 1023), "NaN became %#06x", nan);
    for (int i = 0; i < 1000000; i++) {
        double x = ldexp(dqt_uniform(&rng) + 0.5, (int)dqt_below(&rng, 46) - 28) * (dqt_below(&rng, 2) ? 1 : -1);
        if (i % 4 == 0) { /* exactly at or a hair off a tie */
            uint16_t h = (uint16_t)dqt_below(&rng, 0x7bff);
            double mid = (f16_value(h) + f16_value((uint16_t)(h + 1))) / 2;
            x = mid * (1.0 + ((int)dqt_below(&rng, 3) - 1) * 0x1p-45);
        }
        const uint16_t got = dq_f64_to_f16(x), want = f16_reference(x);
        cr_assert_eq(got, want, "f64 %.17g gave %#06x, expected %#06x", x, got, want);
    }
}

Test(half, bf16_every_pattern)
{
    for (uint32_t b = 0; b < 65536; b++) {
        const float f = dq_bf16_to_f32((uint16_t)b);
        cr_assert_eq(fbits(f), b << 16, "bf16 %#06x widened to bits %#010x", b, fbits(f));
        if (isnan(f)) {
            uint16_t back = dq_f32_to_bf16(f);
            cr_assert(isnan(dq_bf16_to_f32(back)), "bf16 NaN %#06x came back as %#06x", b, back);
            continue;
        }
        cr_assert_eq(dq_f32_to_bf16(f), b, "bf16 %#06x does not survive f32 and back", b);
    }
}

Test(half, bf16_round_to_nearest_even)
{
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)dqt_next(&rng);
        switch (i % 4) {
        case 0:
            u = (u & 0xffff0000u) | 0x8000u;
            break; /* exact tie */
        case 1:
            u = (u & 0xffff0000u) | 0x7fffu;
            break;
        case 2:
            u = (u & 0xffff0000u) | 0x8001u;
            break;
        default:
            break;
        }
        const float f = bitsf(u);
        if (isnan(f)) {
            cr_assert(isnan(dq_bf16_to_f32(dq_f32_to_bf16(f))), "f32 NaN %#010x narrowed to a number", u);
            continue;
        }
        uint32_t hi = u >> 16, low = u & 0xffff;
        uint32_t want = hi + (low > 0x8000 || (low == 0x8000 && (hi & 1)));
        cr_assert_eq(dq_f32_to_bf16(f), (uint16_t)want, "f32 %#010x gave %#06x, expected %#06x", u, dq_f32_to_bf16(f),
                     want);
    }
    cr_assert_eq(dq_f32_to_bf16(bitsf(0x7f7f8000u)), 0x7f80, "the tie above the largest bf16 overflows");
    cr_assert_eq(dq_f32_to_bf16(bitsf(0x7f7f7fffu)), 0x7f7f);
    /* NaN payloads only in the low half must stay NaN, not turn into infinity. */
    cr_assert(isnan(dq_bf16_to_f32(dq_f32_to_bf16(bitsf(0x7f800001u)))), "NaN 0x7f800001 became infinity");
    cr_assert(isnan(dq_bf16_to_f32(dq_f32_to_bf16(bitsf(0xff800100u)))), "NaN 0xff800100 became infinity");
    cr_assert_eq(dq_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(dq_f32_to_bf16(-INFINITY), 0xff80);
}

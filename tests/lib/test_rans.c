/* rANS coder (lib/src/rans.c) against DESIGN §2.3: round trips over every kind of table, the
 * container rules (state range, decoder-order bytes, zero padding, final state L), byte identity
 * with an independent encoder written from the spec, and size versus Σ −log2(f/256). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"
#include "rans.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x7a115eedu);
}

static void suite_fini(void)
{
}

TestSuite(rans, .init = suite_init, .fini = suite_fini);

enum draw { DRAW_MODEL, DRAW_UNIFORM, DRAW_RAREST, DRAW_EXTREMES, DRAW_COUNT };

static const uint32_t lengths[] = {1, 2, 3, 31, 256, 1024, 4096};

static uint32_t rarest(const uint16_t *freq, uint32_t levels)
{
    uint32_t r = 0;
    for (uint32_t m = 1; m < levels; m++)
        if (freq[m] < freq[r])
            r = m;
    return r;
}

static void fill_symbols(enum draw d, const uint16_t *freq, uint32_t levels, uint8_t *syms, uint32_t n)
{
    uint32_t r = rarest(freq, levels);
    for (uint32_t i = 0; i < n; i++) {
        switch (d) {
        case DRAW_MODEL:
            syms[i] = dqt_draw_symbol(&rng, freq, levels);
            break;
        case DRAW_UNIFORM:
            syms[i] = (uint8_t)dqt_below(&rng, levels);
            break;
        case DRAW_RAREST:
            syms[i] = (uint8_t)r;
            break;
        default:
            syms[i] = (uint8_t)((i & 1) ? levels - 1 : 0);
            break;
        }
    }
}

/* One round trip with every check; returns the number of bytes used. */
static uint32_t check_round_trip(const uint16_t *freq, uint32_t levels, const uint8_t *syms, uint32_t n,
                                 const char *what)
{
    dq__rans_enc enc;
    dq__rans_dec dec;
    dq__rans_tables(freq, levels, &enc, &dec);

    uint32_t cap = 4 + n + 8;
    uint8_t *out = dqt_xmalloc(cap);
    uint8_t *ref = dqt_xmalloc(cap);
    uint8_t *scratch = dqt_xmalloc(n);
    uint8_t *back = dqt_xmalloc(n);
    memset(out, 0xa5, cap);

    uint32_t used = dq__rans_encode(&enc, syms, n, scratch, out, cap);
    uint32_t ref_used = dqt_ref_rans_encode(freq, levels, syms, n, ref, cap);
    cr_assert_eq(used, ref_used, "%s n=%u: library needs %u bytes, the spec encoder %u", what, n, used, ref_used);
    cr_assert_leq(used, cap, "%s n=%u: %u bytes exceed the %u-byte buffer", what, n, used, cap);
    cr_assert(memcmp(out, ref, cap) == 0, "%s n=%u: container bytes differ from the spec encoder", what, n);

    uint32_t state = (uint32_t)out[0] | (uint32_t)out[1] << 8 | (uint32_t)out[2] << 16 | (uint32_t)out[3] << 24;
    cr_assert(state >= DQ_RANS_L && state < (DQ_RANS_L << 8), "%s: final state %#x outside [2^23, 2^31)", what, state);
    for (uint32_t k = used; k < cap; k++)
        cr_assert_eq(out[k], 0, "%s: padding byte %u is %#x", what, k, out[k]);

    /* Decode with the container as given, and with exactly the used bytes. */
    memset(back, 0xee, n);
    cr_assert_eq(dq__rans_decode(&dec, out, cap, n, back), DQ_OK, "%s n=%u: valid container rejected", what, n);
    cr_assert(memcmp(back, syms, n) == 0, "%s n=%u: symbols differ after the round trip", what, n);
    memset(back, 0xee, n);
    cr_assert_eq(dq__rans_decode(&dec, out, used, n, back), DQ_OK, "%s: exact-size container rejected", what);
    cr_assert(memcmp(back, syms, n) == 0, "%s: symbols differ (exact-size container)", what);

    /* The rules that make a container valid: a nonzero padding byte, a state outside
     * [2^23, 2^31) or a different final state are each rejected. */
    if (used < cap) {
        out[used + (cap - used) / 2] = 0x01;
        cr_assert_eq(dq__rans_decode(&dec, out, cap, n, back), DQ_CORRUPT, "%s: nonzero padding accepted", what);
        out[used + (cap - used) / 2] = 0;
    }
    uint8_t st[4];
    memcpy(st, out, 4);
    static const uint32_t bad_states[] = {DQ_RANS_L - 1, DQ_RANS_L << 8, 0, 0xffffffffu};
    for (int b = 0; b < 4; b++) {
        for (int i = 0; i < 4; i++)
            out[i] = (uint8_t)(bad_states[b] >> (8 * i));
        cr_assert_eq(dq__rans_decode(&dec, out, cap, n, back), DQ_CORRUPT, "%s: state %#x accepted", what,
                     bad_states[b]);
    }
    memcpy(out, st, 4);
    /* Damaged payload bytes: the library's verdict is the spec decoder's. */
    for (int t = 0; t < 4 && used > 4; t++) {
        uint32_t pos = 4 + dqt_below(&rng, used - 4);
        uint8_t bit = (uint8_t)(1u << dqt_below(&rng, 8));
        out[pos] ^= bit;
        int rc = dq__rans_decode(&dec, out, cap, n, back);
        dqt_ref_decode rdd = dqt_ref_rans_decode(freq, levels, out, cap, n, back);
        cr_assert_eq(rc == DQ_OK, rdd.valid, "%s: damaged byte %u: library says %s, spec decoder %s", what, pos,
                     dq_err_name(rc), rdd.valid ? "valid" : "corrupt");
        out[pos] ^= bit;
    }

    dqt_ref_decode rd = dqt_ref_rans_decode(freq, levels, out, cap, n, back);
    cr_assert(rd.valid, "%s: spec decoder rejects the container (final state %#x, consumed %u)", what, rd.final_state,
              rd.consumed);
    cr_assert_eq(rd.final_state, DQ_RANS_L, "%s: final decoder state %#x != 2^23", what, rd.final_state);
    cr_assert_eq(rd.consumed, used, "%s: decoder consumed %u bytes, encoder reported %u", what, rd.consumed, used);
    cr_assert(memcmp(back, syms, n) == 0, "%s: spec decoder symbols differ", what);

    /* Size follows the ideal code length: used ≈ 4 + Σ r / 8. */
    double bits = dqt_ideal_bits(freq, syms, n);
    double ideal = 4.0 + bits / 8.0;
    cr_assert(fabs((double)used - ideal) <= 4.0 + 0.01 * bits / 8.0, "%s n=%u: %u bytes, ideal %.2f (Σr = %.1f bits)",
              what, n, used, ideal, bits);

    /* One byte short: the encoder reports the need and stays inside the buffer; the decoder of a
     * container cut one byte short rejects it. */
    uint8_t *small = dqt_xmalloc(used - 1);
    cr_assert_eq(dq__rans_encode(&enc, syms, n, scratch, small, used - 1), used, "%s: short buffer", what);
    memcpy(small, out, used - 1);
    cr_assert_eq(dq__rans_decode(&dec, small, used - 1, n, back), DQ_CORRUPT,
                 "%s n=%u: container missing its last byte accepted", what, n);
    free(small);

    free(out);
    free(ref);
    free(scratch);
    free(back);
    return used;
}

static void sweep_table(const uint16_t *freq, uint32_t levels, const char *what)
{
    uint32_t sum = 0;
    for (uint32_t m = 0; m < levels; m++)
        sum += freq[m];
    cr_assert_eq(sum, 256, "%s: table sums to %u", what, sum);
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        uint32_t n = lengths[li];
        uint8_t *syms = dqt_xmalloc(n);
        for (int d = 0; d < DRAW_COUNT; d++) {
            fill_symbols((enum draw)d, freq, levels, syms, n);
            check_round_trip(freq, levels, syms, n, what);
        }
        free(syms);
    }
}

Test(rans, builtin_tables)
{
    static const char *names[] = {"dq226", "dq196"};
    for (int i = 0; i < 2; i++) {
        dq_profile p;
        cr_assert_eq(dq_profile_builtin(names[i], 8, 128, &p), DQ_OK);
        for (int k = 0; k < 2; k++) {
            char what[96];
            snprintf(what, sizeof what, "%s kind %d", names[i], k);
            sweep_table(p.freq[k], p.levels[k], what);
        }
    }
}

Test(rans, edge_tables)
{
    static const struct {
        uint32_t levels;
        uint16_t f[32];
    } t[] = {
        {2, {255, 1}},
        {2, {1, 255}},
        {2, {128, 128}},
        {3, {1, 254, 1}},
        {4, {64, 64, 64, 64}},
        {32, {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}},
        {32, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 225, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "edge table %zu (M=%u)", i, t[i].levels);
        sweep_table(t[i].f, t[i].levels, what);
    }
}

/* Tables of dq_profile_make for every M, several n and alpha. */
struct make_param {
    uint32_t levels;
};

ParameterizedTestParameters(rans, made_tables)
{
    static struct make_param p[DQ_MAX_LEVELS - DQ_MIN_LEVELS + 1];
    for (uint32_t m = DQ_MIN_LEVELS; m <= DQ_MAX_LEVELS; m++)
        p[m - DQ_MIN_LEVELS].levels = m;
    return cr_make_param_array(struct make_param, p, sizeof p / sizeof p[0]);
}

ParameterizedTest(struct make_param *param, rans, made_tables)
{
    static const uint32_t head_dims[] = {16, 256, 1024};
    static const float alphas[] = {1.0f, 1.4f, 2.0f};
    for (size_t h = 0; h < 3; h++) {
        for (size_t a = 0; a < 3; a++) {
            dq_profile_params pp;
            dq_profile_params_default(&pp);
            pp.kv_heads = 1;
            pp.head_dim = head_dims[h];
            pp.levels[0] = pp.levels[1] = param->levels;
            /* Large enough for any assignment: at most 8 bits per value. */
            pp.container_bytes[0] = pp.container_bytes[1] = 4 + head_dims[h] + 4;
            pp.alpha = alphas[a];
            dq_profile p;
            int rc = dq_profile_make(&pp, &p);
            cr_assert_eq(rc, DQ_OK, "dq_profile_make(M=%u, n=%u, alpha=%g): %s", param->levels, head_dims[h],
                         (double)alphas[a], dq_err_name(rc));
            char what[96];
            snprintf(what, sizeof what, "made table M=%u n=%u alpha=%g", param->levels, head_dims[h],
                     (double)alphas[a]);
            sweep_table(p.freq[0], p.levels[0], what);
        }
    }
}

/* Symbols drawn from the table's own distribution cost about the table's entropy per symbol. */
Test(rans, rate_matches_entropy)
{
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &p), DQ_OK);
    for (int k = 0; k < 2; k++) {
        const uint16_t *f = p.freq[k];
        uint32_t M = p.levels[k];
        double H = 0;
        for (uint32_t m = 0; m < M; m++)
            H += f[m] / 256.0 * -log2(f[m] / 256.0);
        const uint32_t n = 4096, reps = 64;
        uint8_t *syms = dqt_xmalloc(n);
        double total = 0;
        for (uint32_t r = 0; r < reps; r++) {
            fill_symbols(DRAW_MODEL, f, M, syms, n);
            total += check_round_trip(f, M, syms, n, "rate");
        }
        double bps = (total / reps - 4.0) * 8.0 / n;
        cr_assert(fabs(bps - H) < 0.02 * H, "kind %d: %.4f bits/symbol, entropy %.4f", k, bps, H);
        free(syms);
    }
}

/* The encoder divides by a multiply-high with rcp = ceil(2^64 / f): the quotient for every
 * frequency 2..256 and states at the edges of every multiple of f and across the 32-bit range. */
Test(rans, reciprocal_division_is_exact)
{
    uint16_t freq[2];
    dq__rans_enc enc;
    static dq__rans_dec dec;
    dqt_rng r;
    dqt_rng_seed(&r, 77);
    for (uint32_t f = 1; f <= 255; f++) {
        freq[0] = (uint16_t)f;
        freq[1] = (uint16_t)(256 - f);
        dq__rans_tables(freq, 2, &enc, &dec);
        for (int s = 0; s < 2; s++) {
            const uint32_t fs = freq[s];
            cr_assert_eq(enc.rcp[s], fs >= 2 ? UINT64_MAX / fs + 1 : 0);
            if (fs < 2)
                continue;
            for (int i = 0; i < 4000; i++) {
                uint32_t x;
                if (i < 1000) {
                    const uint32_t base = (uint32_t)(dqt_next(&r) % (UINT32_MAX / fs)) * fs;
                    x = base + (uint32_t)(i % 3) - 1u; /* just below, at and just after a multiple */
                } else if (i < 1010) {
                    x = UINT32_MAX - (uint32_t)(i - 1000);
                } else {
                    x = (uint32_t)dqt_next(&r);
                }
                const uint32_t q = (uint32_t)(((unsigned __int128)x * enc.rcp[s]) >> 64);
                cr_assert_eq(q, x / fs, "f %u x %u: %u, want %u", fs, x, q, x / fs);
            }
        }
    }
}

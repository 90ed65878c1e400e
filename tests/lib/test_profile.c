/* Codec profiles (profile.h): the built-ins and their instantiation rule, dq_profile_make's
 * errors and its smallest feasible container, validation, storage accounting, and the
 * serialization round trip. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x9a0f11eu);
}

static void suite_fini(void)
{
}

TestSuite(profile, .init = suite_init, .fini = suite_fini);

static void assert_same_profile(const dq_profile *a, const dq_profile *b, int names_too, const char *what)
{
    cr_assert_eq(a->format_version, b->format_version, "%s: format_version", what);
    if (names_too)
        cr_assert_str_eq(a->name, b->name, "%s: name", what);
    cr_assert_eq(a->kv_heads, b->kv_heads, "%s: kv_heads", what);
    cr_assert_eq(a->head_dim, b->head_dim, "%s: head_dim", what);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(a->container_bytes[k], b->container_bytes[k], "%s: container_bytes[%d]", what, k);
        cr_assert_eq(a->levels[k], b->levels[k], "%s: levels[%d]", what, k);
        cr_assert(memcmp(a->freq[k], b->freq[k], sizeof a->freq[k]) == 0, "%s: freq[%d]", what, k);
    }
    cr_assert(memcmp(&a->alpha, &b->alpha, sizeof a->alpha) == 0, "%s: alpha", what);
    cr_assert_eq(a->window, b->window, "%s: window", what);
    cr_assert_eq(a->residual, b->residual, "%s: residual", what);
    cr_assert_eq(a->rotation_seed, b->rotation_seed, "%s: rotation_seed", what);
}

Test(profile, defaults_are_dq226)
{
    dq_profile_params pp;
    memset(&pp, 0xab, sizeof pp);
    dq_profile_params_default(&pp);
    cr_assert_eq(pp.kv_heads, 8);
    cr_assert_eq(pp.head_dim, 128);
    cr_assert_eq(pp.container_bytes[0], 331);
    cr_assert_eq(pp.container_bytes[1], 231);
    cr_assert_eq(pp.levels[0], 8);
    cr_assert_eq(pp.levels[1], 6);
    cr_assert_eq(pp.alpha, 1.4f);
    cr_assert_eq(pp.window, 128);
    cr_assert_eq(pp.residual, 128);
    cr_assert_eq(pp.rotation_seed, 0x5eed);
    dq_profile made, built;
    cr_assert_eq(dq_profile_make(&pp, &made), DQ_OK);
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &built), DQ_OK);
    assert_same_profile(&made, &built, 0, "default params vs dq226");
    cr_assert_eq(dq_profile_validate(&made), DQ_OK);
}

Test(profile, builtins)
{
    const char *const *names = dq_profile_builtin_names();
    cr_assert_not_null(names);
    int seen226 = 0, seen196 = 0, count = 0;
    for (; names[count]; count++) {
        seen226 |= strcmp(names[count], "dq226") == 0;
        seen196 |= strcmp(names[count], "dq196") == 0;
        dq_profile p;
        cr_assert_eq(dq_profile_builtin(names[count], 8, 128, &p), DQ_OK, "listed built-in %s", names[count]);
        cr_assert_str_eq(p.name, names[count]);
        cr_assert_eq(dq_profile_validate(&p), DQ_OK);
    }
    cr_assert(seen226 && seen196, "dq226 and dq196 must be listed");

    static const struct {
        const char *name;
        uint32_t C[2], M[2];
    } want[] = {{"dq226", {331, 231}, {8, 6}}, {"dq196", {287, 199}, {7, 5}}};
    for (int i = 0; i < 2; i++) {
        dq_profile p;
        cr_assert_eq(dq_profile_builtin(want[i].name, 8, 128, &p), DQ_OK);
        cr_assert_eq(p.format_version, DQ_FORMAT_VERSION);
        cr_assert_str_eq(p.name, want[i].name);
        cr_assert_eq(p.kv_heads, 8);
        cr_assert_eq(p.head_dim, 128);
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(p.container_bytes[k], want[i].C[k], "%s C[%d] = %u", want[i].name, k, p.container_bytes[k]);
            cr_assert_eq(p.levels[k], want[i].M[k], "%s M[%d] = %u", want[i].name, k, p.levels[k]);
        }
        cr_assert_eq(p.alpha, 1.4f);
        cr_assert_eq(p.window, 128);
        cr_assert_eq(p.residual, 128);
        cr_assert_eq(p.rotation_seed, 0x5eed);

        /* Other shapes keep the payload bit rate: C = round((rate·n + 32) / 8). */
        static const uint32_t shapes[][2] = {{2, 128},  {1, 128}, {4, 64}, {1, 16},  {4, 16},   {16, 128},
                                             {32, 128}, {8, 256}, {1, 64}, {3, 128}, {64, 1024}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            dq_profile q;
            const uint32_t n = shapes[s][0] * shapes[s][1];
            cr_assert_eq(dq_profile_builtin(want[i].name, shapes[s][0], shapes[s][1], &q), DQ_OK, "%s at %u×%u",
                         want[i].name, shapes[s][0], shapes[s][1]);
            for (int k = 0; k < 2; k++) {
                const double rate = (8.0 * want[i].C[k] - 32.0) / 1024.0;
                const double exact = (rate * n + 32.0) / 8.0;
                const uint32_t C = (uint32_t)floor(exact + 0.5);
                cr_assert(q.container_bytes[k] == C ||
                              (fabs(exact - floor(exact) - 0.5) < 1e-9 && q.container_bytes[k] == C - 1),
                          "%s at %u×%u kind %d: C = %u, expected %u (%.4f)", want[i].name, shapes[s][0], shapes[s][1],
                          k, q.container_bytes[k], C, exact);
                cr_assert_eq(q.levels[k], want[i].M[k]);
            }
            cr_assert_eq(q.kv_heads, shapes[s][0]);
            cr_assert_eq(q.head_dim, shapes[s][1]);
        }
    }
}

Test(profile, builtin_errors)
{
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq999", 8, 128, &p), DQ_PROFILE);
    cr_assert_eq(dq_profile_builtin("", 8, 128, &p), DQ_PROFILE);
    cr_assert_eq(dq_profile_builtin("DQ226x", 8, 128, &p), DQ_PROFILE);
    cr_assert_lt(dq_profile_builtin(NULL, 8, 128, &p), 0);
    static const uint32_t bad[][2] = {{8, 100}, {8, 96}, {8, 3}, {8, 0}, {0, 128}, {1024, 128}, {1, 131072}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(dq_profile_builtin("dq226", bad[i][0], bad[i][1], &p), DQ_PROFILE, "shape %u×%u accepted",
                     bad[i][0], bad[i][1]);
}

Test(profile, make_errors)
{
    dq_profile p;
    dq_profile_params pp;
#define EXPECT_MAKE(field_change, want)                                                                         \
    do {                                                                                                        \
        dq_profile_params_default(&pp);                                                                         \
        field_change;                                                                                           \
        int rc_ = dq_profile_make(&pp, &p);                                                                     \
        cr_assert_eq(rc_, want, "%s gave %s, expected %s", #field_change, dq_err_name(rc_), dq_err_name(want)); \
    } while (0)
    EXPECT_MAKE(pp.levels[0] = 1, DQ_PROFILE);
    EXPECT_MAKE(pp.levels[1] = 33, DQ_PROFILE);
    EXPECT_MAKE(pp.levels[0] = 0, DQ_PROFILE);
    EXPECT_MAKE(pp.head_dim = 100, DQ_PROFILE);
    EXPECT_MAKE(pp.head_dim = 0, DQ_PROFILE);
    EXPECT_MAKE(pp.kv_heads = 0, DQ_PROFILE);
    EXPECT_MAKE(pp.window = 0, DQ_PROFILE);
    EXPECT_MAKE(pp.residual = 64, DQ_PROFILE);
    EXPECT_MAKE(pp.container_bytes[0] = 4, DQ_CONTAINER_TOO_SMALL);
    EXPECT_MAKE(pp.container_bytes[1] = 20, DQ_CONTAINER_TOO_SMALL);
#undef EXPECT_MAKE
    dq_profile_params_default(&pp);
    pp.container_bytes[0] = 3;
    cr_assert_lt(dq_profile_make(&pp, &p), 0, "a container smaller than the rANS state accepted");
    dq_profile_params_default(&pp);
    pp.container_bytes[0] = DQ_MAX_CONTAINER + 1;
    cr_assert_lt(dq_profile_make(&pp, &p), 0, "container above DQ_MAX_CONTAINER accepted");
    dq_profile_params_default(&pp);
    pp.alpha = NAN;
    cr_assert_lt(dq_profile_make(&pp, &p), 0, "alpha NaN accepted");
    dq_profile_params_default(&pp);
    pp.name = "a-very-long-profile-name-that-does-not-fit-in-32-bytes";
    int rc = dq_profile_make(&pp, &p);
    if (rc == DQ_OK)
        cr_assert_lt(strlen(p.name), (size_t)DQ_PROFILE_NAME_MAX, "name not NUL-terminated within its array");
    dq_profile_params_default(&pp);
    pp.name = NULL;
    cr_assert_eq(dq_profile_make(&pp, &p), DQ_OK);
    cr_assert_str_eq(p.name, "custom");
}

/* The smallest container dq_profile_make accepts really holds every stream; one byte less is
 * refused. */
struct minc_param {
    uint32_t head_dim, levels;
};

ParameterizedTestParameters(profile, smallest_container)
{
    static struct minc_param p[] = {{16, 2}, {16, 8}, {16, 32}, {64, 6}, {64, 16}, {128, 8}, {256, 32}, {4, 8}};
    return cr_make_param_array(struct minc_param, p, sizeof p / sizeof p[0]);
}

ParameterizedTest(struct minc_param *mp, profile, smallest_container)
{
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = 1;
    pp.head_dim = mp->head_dim;
    pp.levels[0] = mp->levels;
    pp.container_bytes[1] = 4 + mp->head_dim + 4;
    dq_profile p;
    /* Feasibility is monotone in C: bisect for the smallest accepted size. */
    uint32_t lo = 3, hi = 4 + mp->head_dim + 4; /* lo refused (below the state), hi accepted */
    pp.container_bytes[0] = hi;
    int rc = dq_profile_make(&pp, &p);
    cr_assert_eq(rc, DQ_OK, "n=%u M=%u: a %u-byte container refused (%s)", mp->head_dim, mp->levels, hi,
                 dq_err_name(rc));
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        pp.container_bytes[0] = mid;
        rc = dq_profile_make(&pp, &p);
        cr_assert(rc == DQ_OK || rc == DQ_CONTAINER_TOO_SMALL || (mid < 4 && rc < 0), "C=%u: %s", mid, dq_err_name(rc));
        if (rc == DQ_OK)
            hi = mid;
        else
            lo = mid;
    }
    const uint32_t C = hi;
    pp.container_bytes[0] = C;
    cr_assert_eq(dq_profile_make(&pp, &p), DQ_OK);
    const uint32_t n = mp->head_dim;
    /* The all-cheapest stream fits. */
    uint32_t cheapest = 0;
    for (uint32_t m = 1; m < mp->levels; m++)
        if (p.freq[0][m] > p.freq[0][cheapest])
            cheapest = m;
    uint8_t *syms = dqt_xmalloc(n), *buf = dqt_xmalloc(4 + n + 8);
    memset(syms, (int)cheapest, n);
    cr_assert_leq(dqt_ref_rans_encode(p.freq[0], mp->levels, syms, n, buf, 4 + n + 8), C,
                  "the all-cheapest stream does not fit the smallest accepted container");
    fprintf(stderr, "n=%u M=%u: smallest key container %u bytes (%.2f bits/value)\n", n, mp->levels, C,
            (8.0 * C - 32) / n);

    /* Every stream fits it. */
    dq_codec *codec = NULL;
    cr_assert_eq(dq_codec_create(&p, NULL, &codec), DQ_OK);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    float *y = dqt_xmalloc(n * sizeof *y), *dec = dqt_xmalloc(n * sizeof *dec);
    uint8_t *rec = dqt_xmalloc(4 + C);
    for (int t = 0; t < 3000; t++) {
        for (uint32_t j = 0; j < n; j++)
            y[j] = t % 3 == 0   ? (float)(2.0 * dqt_uniform(&rng) - 1.0)
                   : t % 3 == 1 ? (float)dqt_normal(&rng)
                                : (float)(dqt_normal(&rng) * (dqt_below(&rng, 10) ? 1.0 : 100.0));
        dq_encode_stats st;
        memset(&st, 0, sizeof st);
        rc = dq_stream_encode(codec, ws, DQ_KIND_K, y, rec, &st);
        cr_assert_eq(rc, DQ_OK, "stream %d at the smallest container: %s", t, dq_err_name(rc));
        cr_assert_leq(st.max_payload_bytes, C);
        cr_assert_eq(dq_stream_decode(codec, DQ_KIND_K, rec, dec), DQ_OK, "stream %d does not decode", t);
    }
    free(y);
    free(dec);
    free(rec);
    free(syms);
    free(buf);
    dq_workspace_free(ws);
    dq_codec_free(codec);

    if (C > 4) {
        pp.container_bytes[0] = C - 1;
        cr_assert_eq(dq_profile_make(&pp, &p), DQ_CONTAINER_TOO_SMALL);
    }
}

Test(profile, validate)
{
    dq_profile good;
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &good), DQ_OK);
    cr_assert_eq(dq_profile_validate(&good), DQ_OK);
#define EXPECT_INVALID(change)                                                       \
    do {                                                                             \
        dq_profile b_ = good;                                                        \
        change;                                                                      \
        cr_assert_lt(dq_profile_validate(&b_), 0, "validate accepted: %s", #change); \
    } while (0)
    EXPECT_INVALID(b_.freq[0][3]--);
    EXPECT_INVALID(b_.freq[1][1] += b_.freq[1][0]; b_.freq[1][0] = 0);
    EXPECT_INVALID(b_.freq[0][9] = 1);
    EXPECT_INVALID(b_.levels[0] = 33);
    EXPECT_INVALID(b_.levels[1] = 1);
    EXPECT_INVALID(b_.head_dim = 96);
    EXPECT_INVALID(b_.kv_heads = 0);
    EXPECT_INVALID(b_.window = 0);
    EXPECT_INVALID(b_.residual = 64);
    EXPECT_INVALID(b_.container_bytes[0] = 4);
    EXPECT_INVALID(b_.container_bytes[1] = DQ_MAX_CONTAINER + 1);
    EXPECT_INVALID(b_.format_version = 3);
    EXPECT_INVALID(b_.format_version = 0);
    EXPECT_INVALID(b_.kv_heads = 1024);
#undef EXPECT_INVALID
}

Test(profile, bits_per_value)
{
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &p), DQ_OK);
    const double n = 1024;
    const double k = (331 + 4) * 8 / n + (n + 2) * 8 / (128 * n);
    const double v = (231 + 4) * 8 / n;
    cr_assert(fabs(dq_profile_bits_per_value(&p, DQ_KIND_K) - k) < 1e-9, "K: %.6f, expected %.6f",
              dq_profile_bits_per_value(&p, DQ_KIND_K), k);
    cr_assert(fabs(dq_profile_bits_per_value(&p, DQ_KIND_V) - v) < 1e-9);
    cr_assert(fabs(dq_profile_bits_per_value_mean(&p) - (k + v) / 2) < 1e-9);
    cr_assert(fabs(dq_profile_bits_per_value_mean(&p) - 2.26) < 0.005, "dq226 is %.4f bits/value",
              dq_profile_bits_per_value_mean(&p));
    cr_assert_eq(dq_profile_builtin("dq196", 8, 128, &p), DQ_OK);
    cr_assert(fabs(dq_profile_bits_per_value_mean(&p) - 1.96) < 0.005, "dq196 is %.4f bits/value",
              dq_profile_bits_per_value_mean(&p));
}

Test(profile, serialize_round_trip)
{
    dq_profile profs[6];
    int np = 0;
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &profs[np++]), DQ_OK);
    cr_assert_eq(dq_profile_builtin("dq196", 2, 128, &profs[np++]), DQ_OK);
    cr_assert_eq(dq_profile_builtin("dq226", 1, 16, &profs[np++]), DQ_OK);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = 3;
    pp.head_dim = 32;
    pp.levels[0] = 32;
    pp.levels[1] = 2;
    pp.container_bytes[0] = 120;
    pp.container_bytes[1] = 30;
    pp.alpha = 1.0f;
    pp.window = 64;
    pp.residual = 256;
    pp.rotation_seed = 0xffffffffffffffffull;
    pp.name = "odd-one";
    cr_assert_eq(dq_profile_make(&pp, &profs[np++]), DQ_OK);
    pp.rotation_seed = 0;
    pp.name = "";
    cr_assert_eq(dq_profile_make(&pp, &profs[np++]), DQ_OK);

    for (int i = 0; i < np; i++) {
        uint8_t buf[DQ_PROFILE_SERIALIZED_MAX];
        size_t len = 0;
        cr_assert_eq(dq_profile_serialize(&profs[i], buf, sizeof buf, &len), DQ_OK);
        cr_assert(len >= 4 && len <= DQ_PROFILE_SERIALIZED_MAX);
        cr_assert(memcmp(buf, "DQPF", 4) == 0, "magic is not DQPF");
        uint8_t *exact = dqt_xmalloc(len);
        memcpy(exact, buf, len);
        dq_profile back;
        cr_assert_eq(dq_profile_deserialize(exact, len, &back), DQ_OK);
        assert_same_profile(&profs[i], &back, 1, "serialize round trip");
        /* Deterministic bytes. */
        uint8_t again[DQ_PROFILE_SERIALIZED_MAX];
        size_t len2 = 0;
        cr_assert_eq(dq_profile_serialize(&back, again, sizeof again, &len2), DQ_OK);
        cr_assert_eq(len2, len);
        cr_assert(memcmp(again, exact, len) == 0, "serialization not canonical");
        /* Too small a buffer: refused without writing past it. */
        for (size_t cap = 0; cap < len; cap++) {
            uint8_t *small = dqt_xmalloc(cap);
            size_t l3 = 12345;
            cr_assert_eq(dq_profile_serialize(&profs[i], small, cap, &l3), DQ_INVALID_ARGUMENT, "cap %zu", cap);
            free(small);
        }
        free(exact);
    }
}

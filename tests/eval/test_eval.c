/* The quality evaluation (client/eval/: eval_*.c): codec specs (the fixed-width ones resolve to the
 * library's fixed-width profiles), the bootstrap machinery on synthetic KV, and
 * the orderings the real KV caches of $DQ_DATA_DIR support (skipped when the data is absent).
 *
 * DQ_EVAL_FAST=1 (set automatically in sanitizer builds) runs fewer bootstrap resamples and
 * query positions; the asserted orderings have margins far wider than that changes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/dquant.h"
#include "eval_ablation.h"
#include "eval_core.h"
#include "eval_vskip.h"

static const char *data_dir(void)
{
    const char *d = getenv("DQ_DATA_DIR");
    return d && *d ? d : "../shared/data";
}

static int fast_mode(void)
{
#ifdef DQ_EVAL_SANITIZED
    return 1;
#else
    const char *f = getenv("DQ_EVAL_FAST");
    return f && *f && strcmp(f, "0") != 0;
#endif
}

static void test_opts(eval_opts *o, uint32_t tokens)
{
    eval_opts_default(o);
    o->resamples = fast_mode() ? 200 : 1000;
    o->query_stride = fast_mode() ? tokens / 16 : tokens / 64;
}

static uint64_t g_rng;
static double gauss(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = ((double)(g_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Synthetic one-layer KV with a channel offset in the keys (what the window mean removes) and
 * queries correlated with the keys so attention is not uniform. */
static void synthetic(eval_data *d, uint32_t tokens, uint32_t kv_heads, uint32_t head_dim, uint32_t q_heads)
{
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "synthetic");
    d->seqs = d->layers = 1;
    d->tokens = tokens;
    d->kv_heads = kv_heads;
    d->head_dim = head_dim;
    d->q_heads = q_heads;
    const size_t n = (size_t)kv_heads * head_dim;
    d->k = malloc(tokens * n * sizeof *d->k);
    d->v = malloc(tokens * n * sizeof *d->v);
    d->q = malloc((size_t)tokens * q_heads * head_dim * sizeof *d->q);
    cr_assert(d->k && d->v && d->q);
    g_rng = 42;
    for (size_t i = 0; i < tokens * n; i++) {
        d->k[i] = (float)(gauss() + 0.8 * ((i % n) % 7 == 0));
        d->v[i] = (float)gauss();
    }
    for (size_t t = 0; t < tokens; t++)
        for (size_t h = 0; h < q_heads; h++)
            for (size_t j = 0; j < head_dim; j++)
                d->q[(t * q_heads + h) * head_dim + j] = (float)(0.5 * gauss() + 0.8 * ((j % 7) == 0));
}

static void run_codec(const eval_data *d, const char *spec, const eval_opts *o, eval_result *r)
{
    eval_codec c;
    char err[256];
    cr_assert_eq(eval_codec_parse(spec, d->kv_heads, d->head_dim, &c, err, sizeof err), DQ_OK, "%s", err);
    cr_assert_eq(eval_run(d, &c, o, r, err, sizeof err), DQ_OK, "%s", err);
    cr_log_info("%s %s: %.4f bits/value, NMSE K %.4g [%.4g, %.4g] V %.4g [%.4g, %.4g], KL %.4g, attn err %.4g", d->name,
                spec, r->bits_mean, r->nmse[0].est, r->nmse[0].lo, r->nmse[0].hi, r->nmse[1].est, r->nmse[1].lo,
                r->nmse[1].hi, r->kl.est, r->attn_err.est);
}

/* ---- no data needed ---- */

/* fixedNNN resolves to the library's fixed-width profile at dqNNN's storage: the levels the
 * matched-storage comparison (seed Appendix B) always used, every stored byte charged. */
Test(eval, fixed_width_specs)
{
    static const struct {
        uint32_t heads, dim, mk, mv;
    } cases[] = {{8, 128, 6, 3}, {2, 128, 6, 3}, {4, 16, 8, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eval_codec c;
        char err[256];
        cr_assert_eq(eval_codec_parse("fixed226", cases[i].heads, cases[i].dim, &c, err, sizeof err), DQ_OK, "%s", err);
        cr_expect_eq(c.profile.codec_type, DQ_CODEC_FIXED);
        cr_expect_eq(c.profile.levels[0], cases[i].mk, "%ux%u K", cases[i].heads, cases[i].dim);
        cr_expect_eq(c.profile.levels[1], cases[i].mv, "%ux%u V", cases[i].heads, cases[i].dim);
        cr_expect_str_eq(c.profile.name, "fixed226");
        dq_profile dq;
        cr_assert_eq(dq_profile_builtin("dq226", cases[i].heads, cases[i].dim, &dq), DQ_OK);
        const double n = (double)cases[i].heads * cases[i].dim;
        const uint32_t cv = dq_fixed_packing((uint32_t)n, cases[i].mv, NULL, NULL);
        cr_expect(fabs(eval_codec_bits(&c, DQ_KIND_V) - 8.0 * (4 + cv) / n) < 1e-12);
        /* at most a group's rounding above the ideal log2(M) bits per symbol */
        cr_expect_leq(eval_codec_bits(&c, DQ_KIND_V), log2((double)cases[i].mv) + 32.0 / n + 8.0 * 4 / n + 1e-12);
        /* stored no more than the D-Quant profile it is matched to, in the mean */
        cr_expect_leq(eval_codec_bits_mean(&c), dq_profile_bits_per_value_mean(&dq) + 1e-12);
    }
    eval_codec c;
    char err[256];
    cr_assert_eq(eval_codec_parse("fixed226@2.0", 8, 128, &c, err, sizeof err), DQ_OK, "%s", err);
    cr_expect_eq(c.profile.codec_type, DQ_CODEC_FIXED);
    cr_expect_lt(c.profile.levels[0], 6);
    cr_assert_eq(eval_codec_parse("fixedk8v4", 8, 128, &c, err, sizeof err), DQ_OK, "%s", err);
    cr_expect_eq(c.profile.levels[0], 8);
    cr_expect_eq(c.profile.levels[1], 4);
    cr_expect_neq(eval_codec_parse("fixedint2", 8, 128, &c, err, sizeof err), DQ_OK);
    cr_expect_neq(eval_codec_parse("fixedk1v4", 8, 128, &c, err, sizeof err), DQ_OK);
}

Test(eval, codec_specs)
{
    eval_codec c;
    char err[256];
    cr_assert_eq(eval_codec_parse("int2-g256", 2, 128, &c, err, sizeof err), DQ_OK, "%s", err);
    cr_expect(fabs(eval_codec_bits_mean(&c) - 2.125) < 1e-12, "int2 with one scale pair per 256 values");
    cr_assert_eq(eval_codec_parse("dq226@2.25", 2, 128, &c, err, sizeof err), DQ_OK, "%s", err);
    cr_expect_leq(eval_codec_bits_mean(&c), 2.25);
    cr_expect_gt(eval_codec_bits_mean(&c), 2.20, "the budget is used, not wasted");
    cr_expect_eq(c.profile.levels[0], 8);
    cr_expect_eq(c.profile.levels[1], 6);
    cr_assert_eq(eval_codec_parse("fixed196", 8, 128, &c, err, sizeof err), DQ_OK, "%s", err);
    cr_expect_eq(c.profile.codec_type, DQ_CODEC_FIXED);
    cr_expect_eq(c.profile.container_bytes[0], 256); /* M 4 at dq196's 287 bytes: 2 bits a level */
    cr_expect_neq(eval_codec_parse("int9", 2, 128, &c, err, sizeof err), DQ_OK);
    cr_expect_neq(eval_codec_parse("kivi2-g64", 2, 128, &c, err, sizeof err), DQ_OK);
    /* 64 values per stream: rANS state and fp16 scale/offset alone are 1 bit/value, so dq226's
     * levels cannot be held at int2's 2.5 bits/value */
    cr_expect_eq(eval_codec_parse("dq226@2.5", 4, 16, &c, err, sizeof err), DQ_CONTAINER_TOO_SMALL, "%s", err);
}

Test(eval, synthetic_orderings_and_intervals)
{
    eval_data d;
    synthetic(&d, 384, 2, 64, 4);
    eval_opts o;
    test_opts(&o, d.tokens);
    eval_result bf, dq, i2, again;
    run_codec(&d, "bf16", &o, &bf);
    run_codec(&d, "dq226", &o, &dq);
    run_codec(&d, "int2", &o, &i2);
    run_codec(&d, "dq226", &o, &again);
    const eval_ci *cis[] = {&dq.nmse[0], &dq.nmse[1], &dq.kl, &dq.attn_err};
    for (size_t i = 0; i < sizeof cis / sizeof cis[0]; i++) {
        cr_expect_leq(cis[i]->lo, cis[i]->est);
        cr_expect_leq(cis[i]->est, cis[i]->hi);
        cr_expect_lt(cis[i]->lo, cis[i]->hi);
    }
    cr_expect_eq(memcmp(&dq.nmse, &again.nmse, sizeof dq.nmse), 0, "same seed, same intervals");
    cr_expect_eq(dq.kl.lo, again.kl.lo);
    cr_expect_lt(bf.nmse[0].est, 1e-4);
    cr_expect_lt(bf.kl.est, 1e-4);
    cr_expect_geq(dq.kl.est, 0.0);
    for (int k = 0; k < 2; k++)
        cr_expect_lt(dq.nmse[k].est, i2.nmse[k].est, "Gaussian %s: D-Quant below int2", k ? "V" : "K");
    cr_expect_eq(dq.query_positions, (d.tokens - 1) / o.query_stride + 1);
    eval_data_free(&d);
}

Test(eval, drift_summary_from_symbols)
{
    eval_data d;
    synthetic(&d, 256, 2, 64, 4);
    eval_opts o;
    test_opts(&o, d.tokens);
    o.collect_levels = 1;
    o.skip_attention = 1;
    eval_codec c;
    char err[256];
    cr_assert_eq(eval_codec_parse("dq226", 2, 64, &c, err, sizeof err), DQ_OK, "%s", err);
    eval_result r;
    cr_assert_eq(eval_run(&d, &c, &o, &r, err, sizeof err), DQ_OK, "%s", err);
    cr_expect_eq(r.have_attn, 0);
    for (int k = 0; k < 2; k++) {
        eval_drift dr;
        cr_assert_eq(eval_drift_summary(&r, &c.profile, (dq_kind)k, &dr), DQ_OK);
        cr_expect_geq(dr.excess_table, -1e-12, "cross-entropy is never below entropy");
        cr_expect_geq(dr.excess_model, -1e-12);
        cr_expect_gt(dr.entropy, 0.5);
        cr_expect_leq(dr.entropy, log2((double)dr.levels));
        /* what the coder pays per value cannot exceed the payload budget */
        cr_expect_leq(dr.entropy + dr.excess_table, (8.0 * dr.container - 32.0) / 128.0 + 1e-3);
        cr_expect_leq(dr.fill, 1.0);
        cr_expect_leq(dr.moved_fraction, 1.0);
    }
    eval_data_free(&d);
}

Test(eval, ablation_rows)
{
    static const struct {
        const char *name;
        size_t rows;
    } cases[] = {{"levels", 17}, {"budget", 9}, {"split", 9}, {"alpha", 11}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eval_ablation_row *rows;
        size_t n;
        cr_assert_eq(eval_ablation_rows(cases[i].name, 8, 128, &rows, &n), DQ_OK);
        cr_expect_eq(n, cases[i].rows, "%s", cases[i].name);
        for (size_t r = 0; r < n; r++)
            if (strcmp(cases[i].name, "split") == 0)
                cr_expect_eq(rows[r].containers[0] + rows[r].containers[1], 562, "split keeps C_K + C_V at n = 1024");
        /* the default configuration appears in every panel with dq226's containers */
        int found = 0;
        for (size_t r = 0; r < n; r++)
            found |= rows[r].rc == DQ_OK && rows[r].containers[0] == 331 && rows[r].containers[1] == 231 &&
                     rows[r].levels[0] == 8 && rows[r].levels[1] == 6 && fabsf(rows[r].alpha - 1.4f) < 1e-6f;
        cr_expect(found, "%s: no dq226 row", cases[i].name);
        free(rows);
    }
    eval_ablation_row *rows;
    size_t n;
    cr_expect_eq(eval_ablation_rows("nope", 8, 128, &rows, &n), DQ_INVALID_ARGUMENT);
}

/* ---- real KV ---- */

static int load_or_skip(const char *name, eval_data *d)
{
    char err[512];
    const int rc = eval_data_load_named(name, data_dir(), d, err, sizeof err);
    if (rc == DQ_NOT_FOUND)
        return 0;
    cr_assert_eq(rc, DQ_OK, "%s", err);
    cr_assert_not_null(d->q, "%s: queries missing", name);
    return 1;
}

/* a's interval lies entirely below b's */
static void expect_below(const char *what, const eval_ci *a, const eval_ci *b)
{
    cr_expect_lt(a->est, b->est, "%s: %.4g not below %.4g", what, a->est, b->est);
    cr_expect_lt(a->hi, b->lo, "%s: intervals overlap ([%.4g, %.4g] vs [%.4g, %.4g])", what, a->lo, a->hi, b->lo,
                 b->hi);
}

static void expect_dominates(const char *dname, const eval_result *dq, const eval_result *base)
{
    char what[128];
    static const char *const names[2] = {"K NMSE", "V NMSE"};
    for (int k = 0; k < 2; k++) {
        snprintf(what, sizeof what, "%s %s %s vs %s", dname, names[k], dq->label, base->label);
        expect_below(what, &dq->nmse[k], &base->nmse[k]);
    }
    snprintf(what, sizeof what, "%s attention output error %s vs %s", dname, dq->label, base->label);
    expect_below(what, &dq->attn_err, &base->attn_err);
    snprintf(what, sizeof what, "%s attention-score KL %s vs %s", dname, dq->label, base->label);
    expect_below(what, &dq->kl, &base->kl);
}

/* bytellama-19m (n = 256): D-Quant at the storage of int2/kivi2 (2.25 bits/value, which needs
 * smaller containers than dq226's: its per-token metadata costs 0.125 bits/value at this n) beats
 * both on every metric; and dq226 beats fixed-width coding at matched storage (seed Appendix B). */
Test(realdata, bytellama_dquant_beats_int2_kivi2_and_fixed_width, .timeout = 600)
{
    eval_data d;
    if (!load_or_skip("bytellama-19m", &d))
        cr_skip("real-data eval skipped: %s/bytellama-19m/kv_f16.bin is absent (set DQ_DATA_DIR)", data_dir());
    eval_opts o;
    test_opts(&o, d.tokens);
    eval_result dqm, i2, kv, dq, fw;
    run_codec(&d, "int2", &o, &i2);
    run_codec(&d, "kivi2", &o, &kv);
    char spec[32];
    snprintf(spec, sizeof spec, "dq226@%.4f", fmin(i2.bits_mean, kv.bits_mean));
    run_codec(&d, spec, &o, &dqm);
    cr_assert_leq(dqm.bits_mean, i2.bits_mean);
    cr_assert_leq(dqm.bits_mean, kv.bits_mean);
    expect_dominates(d.name, &dqm, &i2);
    expect_dominates(d.name, &dqm, &kv);

    run_codec(&d, "dq226", &o, &dq);
    run_codec(&d, "fixed226", &o, &fw);
    cr_assert_leq(fw.bits_mean, dq.bits_mean);
    expect_dominates(d.name, &dq, &fw);
    eval_data_free(&d);
}

/* tinystories-656k (n = 64 values per stream): dq226 beats int2 and kivi2 on every metric, but it
 * stores more (3.16 bits/value against 2.5 and 2.375): at this n the rANS state and fp16
 * scale/offset take 1 bit/value, and no profile with dq226's levels fits int2's storage
 * (eval.codec_specs); see tests/eval/RESULTS.md for the comparisons D-Quant loses here. */
Test(realdata, tinystories_dq226_beats_int2_kivi2_at_its_own_rate, .timeout = 600)
{
    eval_data d;
    if (!load_or_skip("tinystories-656k", &d))
        cr_skip("real-data eval skipped: %s/tinystories-656k/kv/kv_f16.bin is absent (set DQ_DATA_DIR)", data_dir());
    eval_opts o;
    test_opts(&o, d.tokens);
    eval_result dq, i2, kv;
    run_codec(&d, "dq226", &o, &dq);
    run_codec(&d, "int2", &o, &i2);
    run_codec(&d, "kivi2", &o, &kv);
    cr_expect_gt(dq.bits_mean, i2.bits_mean, "if D-Quant ever stores less here, tighten this test to matched bits");
    expect_dominates(d.name, &dq, &i2);
    expect_dominates(d.name, &dq, &kv);
    eval_data_free(&d);
}

/* dquant eval --value-mass (eval_vskip.c): the error against exact attention stays within the
 * returned bound everywhere, a lower mass target decodes fewer value streams and errs more, and
 * the bad inputs are refused. Synthetic KV, then bytellama-19m where the figure (tau 0.999:
 * about 77% of value streams, about 1e-4 relative error) is checked loosely. */
static void check_vskip(const eval_data *d, const eval_opts *o, const char *what)
{
    eval_codec c;
    char err[256];
    cr_assert_eq(eval_codec_parse("dq226", d->kv_heads, d->head_dim, &c, err, sizeof err), 0, "%s", err);
    static const double taus[] = {0.9, 0.99, 0.999};
    eval_vskip_row rows[3];
    cr_assert_eq(eval_vskip_run(d, &c, o, taus, 3, rows, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 3; i++) {
        cr_log_info("%s tau %g: %.1f%% of value streams decoded, %.1f%% of value tokens used, %.1f%% of 16-token "
                    "blocks, relative error %.3g [%.3g, %.3g], max %.3g, bound %.3g",
                    what, taus[i], 100 * rows[i].decoded, 100 * rows[i].used, 100 * rows[i].blocks16,
                    rows[i].rel_err.est, rows[i].rel_err.lo, rows[i].rel_err.hi, rows[i].rel_err_max,
                    rows[i].bound_rel);
        cr_expect_eq(rows[i].held, 1.0, "%s tau %g: an error above its bound", what, taus[i]);
        cr_expect_leq(rows[i].rel_err.est, rows[i].bound_rel);
        cr_expect_geq(rows[i].used, rows[i].decoded * 0.999);
        /* a 16-token block counts when any of its tokens is decoded (every sealed block is whole) */
        cr_expect(rows[i].blocks16 >= rows[i].decoded && rows[i].blocks16 <= 1.0, "%s tau %g: blocks %g, tokens %g",
                  what, taus[i], rows[i].blocks16, rows[i].decoded);
        if (i) {
            cr_expect_geq(rows[i].decoded, rows[i - 1].decoded);
            cr_expect_geq(rows[i].blocks16, rows[i - 1].blocks16);
            cr_expect_leq(rows[i].rel_err.est, rows[i - 1].rel_err.est);
        }
    }
    cr_expect_lt(rows[0].decoded, 1.0, "%s: tau 0.9 skipped nothing", what);
    const double bad[] = {0.0, 1.0, NAN, 1.5};
    for (int i = 0; i < 4; i++)
        cr_expect_eq(eval_vskip_run(d, &c, o, &bad[i], 1, rows, err, sizeof err), DQ_INVALID_ARGUMENT);
    eval_codec b;
    cr_assert_eq(eval_codec_parse("int2", d->kv_heads, d->head_dim, &b, err, sizeof err), 0, "%s", err);
    cr_expect_eq(eval_vskip_run(d, &b, o, taus, 1, rows, err, sizeof err), DQ_UNSUPPORTED);
}

Test(eval, value_skipping_synthetic)
{
    eval_data d;
    synthetic(&d, 700, 2, 64, 4);
    eval_opts o;
    test_opts(&o, d.tokens);
    check_vskip(&d, &o, "synthetic");
    eval_data_free(&d);
}

Test(eval, value_skipping_bytellama)
{
    eval_data d;
    char err[512];
    if (eval_data_load_named("bytellama-19m", data_dir(), &d, err, sizeof err) != DQ_OK)
        cr_skip_test("%s", err);
    eval_opts o;
    test_opts(&o, d.tokens);
    check_vskip(&d, &o, "bytellama-19m");
    eval_codec c;
    cr_assert_eq(eval_codec_parse("dq226", d.kv_heads, d.head_dim, &c, err, sizeof err), 0);
    const double tau = 0.999;
    eval_vskip_row r;
    cr_assert_eq(eval_vskip_run(&d, &c, &o, &tau, 1, &r, err, sizeof err), 0, "%s", err);
    cr_expect(r.decoded > 0.6 && r.decoded < 0.9, "tau 0.999 decodes %.3f of value streams", r.decoded);
    cr_expect(r.rel_err.est > 1e-5 && r.rel_err.est < 1e-3, "tau 0.999: relative error %.3g", r.rel_err.est);
    eval_data_free(&d);
}

/* The C Llama forward (client/eval/eval_model.c), its JSON reader, the perplexity / KL protocol
 * (eval_ppl.c) and the KVQuant++ claims table (eval_claims.c). The real-model cases read
 * $DQ_DATA_DIR and skip when it is absent; sanitizer builds (-O0) run shorter sequences. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dquant/dquant.h"
#include "eval_claims.h"
#include "eval_data.h"
#include "eval_json.h"
#include "eval_model.h"
#include "eval_ppl.h"

static const char *data_dir(void)
{
    const char *d = getenv("DQ_DATA_DIR");
    return d && *d ? d : "../shared/data";
}

static int sanitized(void)
{
#ifdef DQ_EVAL_SANITIZED
    return 1;
#else
    return 0;
#endif
}

/* Loads a model of the data folder, or skips the test when the folder is absent. */
static eval_model *model_or_skip(const char *name, char *dir, size_t dirlen)
{
    snprintf(dir, dirlen, "%s/%s", data_dir(), name);
    struct stat sb;
    if (stat(dir, &sb) != 0)
        cr_skip_test("%s absent (real-model data not available)", dir);
    eval_model *m = NULL;
    char err[512] = "";
    int rc = eval_model_load(dir, &m, err, sizeof err);
    cr_assert_eq(rc, DQ_OK, "%s: %s", dir, err);
    return m;
}

/* ---- JSON ---- */

static int parse(const char *s, eval_json **j)
{
    char err[128];
    return eval_json_parse(s, strlen(s), j, err, sizeof err);
}

Test(eval_json, accepts_strict_json)
{
    eval_json *j = NULL;
    cr_assert_eq(parse(" {\"a\": [1, -2.5e3, true, null], \"b\\u00e9\": \"x\\\"\\n\\ud83d\\ude00\", \"a\": 7} ", &j),
                 DQ_OK);
    const eval_json *a = eval_json_get(j, "a");
    cr_assert(a && a->type == EVAL_JSON_NUMBER && a->number == 7, "the last of a repeated key wins");
    const eval_json *b = eval_json_get(j, "b\xc3\xa9");
    cr_assert(b && b->type == EVAL_JSON_STRING);
    cr_assert_str_eq(b->str, "x\"\n\xf0\x9f\x98\x80");
    uint64_t u;
    cr_assert_eq(eval_json_u64(j, "a", &u), 0);
    cr_assert_eq(u, 7);
    cr_assert_eq(eval_json_u64(j, "b\xc3\xa9", &u), -1);
    eval_json_free(j);
}

Test(eval_json, rejects_what_is_not_json)
{
    const char *bad[] = {
        "",        "{",     "{\"a\":1,}", "[1,]",          "{\"a\" 1}",     "[01]",       "[1.]", "[.5]",
        "[1e]",    "nul",   "[\"\\x\"]",  "[\"\\ud800\"]", "[\"\\udc00\"]", "[\"a\tb\"]", "{} x", "[\"\\u0000\"]",
        "[1e999]", "{1:2}", "[\"abc",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        eval_json *j = (eval_json *)0x1;
        cr_assert_eq(parse(bad[i], &j), DQ_CORRUPT, "accepted %s", bad[i]);
        cr_assert_null(j);
    }
    /* nesting beyond the limit */
    char deep[2 * EVAL_JSON_MAX_DEPTH + 8];
    memset(deep, '[', EVAL_JSON_MAX_DEPTH + 2);
    memset(deep + EVAL_JSON_MAX_DEPTH + 2, ']', EVAL_JSON_MAX_DEPTH + 2);
    deep[2 * EVAL_JSON_MAX_DEPTH + 4] = 0;
    eval_json *j = NULL;
    cr_assert_eq(parse(deep, &j), DQ_CORRUPT);
}

/* ---- model loading errors ---- */

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

Test(eval_model, bad_folders_get_clear_errors)
{
    char dir[] = "/tmp/dq_eval_model_XXXXXX", path[256], err[512];
    cr_assert_not_null(mkdtemp(dir));
    eval_model *m = NULL;
    cr_assert_eq(eval_model_load(dir, &m, err, sizeof err), DQ_NOT_FOUND);
    cr_assert(strstr(err, "config.json"), "%s", err);
    const char *cfg = "{\"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, "
                      "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 4, "
                      "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true}";
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, cfg, strlen(cfg));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    /* a header length past the end of the file */
    const uint8_t longhdr[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_file(path, longhdr, sizeof longhdr);
    cr_assert_eq(eval_model_load(dir, &m, err, sizeof err), DQ_CORRUPT, "%s", err);
    /* a tensor whose offsets leave the data section */
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,128]}}");
    uint8_t buf[512] = {(uint8_t)hl};
    memcpy(buf + 8, hdr, (size_t)hl);
    write_file(path, buf, 8 + (size_t)hl + 64);
    cr_assert_eq(eval_model_load(dir, &m, err, sizeof err), DQ_CORRUPT, "%s", err);
    /* in range, but the layers are missing */
    write_file(path, buf, 8 + (size_t)hl + 128);
    cr_assert_eq(eval_model_load(dir, &m, err, sizeof err), DQ_SHAPE, "%s", err);
    cr_assert(strstr(err, "model.norm.weight") || strstr(err, "layers"), "%s", err);
    /* an unsupported dtype */
    hl = snprintf(hdr, sizeof hdr, "{\"lm_head.weight\":{\"dtype\":\"I8\",\"shape\":[4,8],\"data_offsets\":[0,32]}}");
    memset(buf, 0, sizeof buf);
    buf[0] = (uint8_t)hl;
    memcpy(buf + 8, hdr, (size_t)hl);
    write_file(path, buf, 8 + (size_t)hl + 32);
    cr_assert_eq(eval_model_load(dir, &m, err, sizeof err), DQ_DTYPE, "%s", err);
    cr_assert_null(m);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- the forward against the captured caches ---- */

/* Runs the first ntok bytes at offset 300000 of bytellama-n1024's held-out text and compares
 * every K/V (keys post-RoPE) and query with kv_f16.bin / q_f16.bin to fp16 tolerance. */
Test(eval_model, bytellama_n1024_reproduces_kv_f16, .timeout = 300)
{
    char dir[4096], err[512];
    eval_model *m = model_or_skip("bytellama-n1024", dir, sizeof dir);
    const eval_model_config *cfg = eval_model_cfg(m);
    cr_assert_eq(cfg->layers, 4);
    cr_assert_eq(cfg->kv_heads * cfg->head_dim, 1024);
    cr_assert_eq(eval_model_params(m), 22286848);
    cr_assert(cfg->rope_bf16);
    const uint32_t T = sanitized() ? 24 : 64;
    eval_text text;
    cr_assert_eq(eval_text_load(dir, cfg->vocab, &text, err, sizeof err), DQ_OK, "%s", err);
    eval_data d;
    cr_assert_eq(eval_data_load_named("bytellama-n1024", data_dir(), &d, err, sizeof err), DQ_OK, "%s", err);
    cr_assert_eq(d.tokens, 512);
    cr_assert_not_null(d.q);
    eval_kv_cache c;
    cr_assert_eq(eval_kv_cache_init(m, T, &c), DQ_OK);
    const size_t qd = (size_t)cfg->heads * cfg->head_dim;
    float *q = malloc((size_t)cfg->layers * T * qd * sizeof *q);
    /* two calls (T/2 + T/2) must equal one: the cache carries the first half */
    cr_assert_eq(eval_model_forward(m, &c, text.tokens + 300000, T / 2, NULL, NULL), DQ_OK);
    cr_assert_eq(eval_model_forward(m, &c, text.tokens + 300000 + T / 2, T / 2, NULL, NULL), DQ_OK);
    eval_kv_cache c1;
    cr_assert_eq(eval_kv_cache_init(m, T, &c1), DQ_OK);
    cr_assert_eq(eval_model_forward(m, &c1, text.tokens + 300000, T, NULL, q), DQ_OK);
    cr_assert_eq(memcmp(c.k, c1.k, (size_t)cfg->layers * T * c.n * sizeof *c.k), 0, "split prefill differs");
    cr_assert_eq(eval_model_forward(m, &c1, text.tokens, 1, NULL, NULL), DQ_OUT_OF_BOUNDS);
    double worst = 0;
    for (uint32_t l = 0; l < cfg->layers; l++)
        for (int kind = 0; kind < 2; kind++) {
            const float *ref = eval_data_slab(&d, (dq_kind)kind, 0, l), *x = eval_kv_cache_layer(&c, kind, l);
            double e2 = 0, r2 = 0;
            for (size_t i = 0; i < T * c.n; i++) {
                const double diff = fabs((double)x[i] - ref[i]);
                cr_assert_leq(diff, 1e-3 * fabs(ref[i]) + 2e-3, "%c layer %u value %zu: %g vs %g", kind ? 'V' : 'K', l,
                              i, x[i], ref[i]);
                e2 += diff * diff;
                r2 += (double)ref[i] * ref[i];
            }
            worst = fmax(worst, sqrt(e2 / r2));
        }
    cr_assert_lt(worst, 5e-4, "relative RMS %g: more than fp16 rounding", worst);
    for (uint32_t l = 0; l < cfg->layers; l++)
        for (size_t i = 0; i < T * qd; i++) {
            const float r = d.q[(size_t)l * d.tokens * qd + i], x = q[(size_t)l * T * qd + i];
            cr_assert_leq(fabs((double)x - r), 1e-3 * fabs(r) + 4e-3, "query layer %u value %zu: %g vs %g", l, i, x, r);
        }
    free(q);
    eval_kv_cache_free(&c);
    eval_kv_cache_free(&c1);
    eval_data_free(&d);
    eval_text_free(&text);
    eval_model_free(m);
}

/* meta.json: the 512-byte capture window scores 1.0629 nats/byte (1.5334 bits/byte). */
Test(eval_model, bytellama_n1024_heldout_bits_per_byte, .timeout = 300)
{
    if (sanitized())
        cr_skip_test("512 tokens at -O0: covered by the unsanitized build");
    char dir[4096], err[512];
    eval_model *m = model_or_skip("bytellama-n1024", dir, sizeof dir);
    const eval_model_config *cfg = eval_model_cfg(m);
    eval_text text;
    cr_assert_eq(eval_text_load(dir, cfg->vocab, &text, err, sizeof err), DQ_OK, "%s", err);
    const uint32_t T = 512;
    eval_kv_cache c;
    cr_assert_eq(eval_kv_cache_init(m, T, &c), DQ_OK);
    float *logits = malloc((size_t)T * cfg->vocab * sizeof *logits);
    cr_assert_eq(eval_model_forward(m, &c, text.tokens + 300000, T, logits, NULL), DQ_OK);
    double nll = 0;
    for (uint32_t t = 0; t + 1 < T; t++) {
        const float *z = logits + (size_t)t * cfg->vocab;
        double mx = -INFINITY, s = 0;
        for (uint32_t i = 0; i < cfg->vocab; i++)
            mx = fmax(mx, z[i]);
        for (uint32_t i = 0; i < cfg->vocab; i++)
            s += exp(z[i] - mx);
        nll += log(s) + mx - z[text.tokens[300000 + t + 1]];
    }
    nll /= T - 1;
    cr_assert(fabs(nll - 1.0629000663757324) < 2e-3, "%.5f nats/byte, meta.json 1.06290", nll);
    free(logits);
    eval_kv_cache_free(&c);
    eval_text_free(&text);
    eval_model_free(m);
}

/* ---- the protocol ---- */

Test(eval_ppl, layout_is_checked)
{
    eval_ppl_opts o;
    eval_ppl_opts_default(&o);
    cr_assert_eq(eval_ppl_fit(&o, 100), DQ_OUT_OF_BOUNDS);
    cr_assert_eq(eval_ppl_fit(&o, 495), DQ_OK); /* tinystories-656k: 2 chunks, 0 calibration */
    cr_assert_eq(o.chunks, 2);
    cr_assert_eq(o.calib_seqs, 0);
    eval_ppl_opts_default(&o);
    cr_assert_eq(eval_ppl_fit(&o, 1 << 20), DQ_OK);
    cr_assert_eq(o.chunks, 50);
    cr_assert_eq(o.calib_seqs, 8);
    cr_assert_eq(o.offset, 8 * 128);
}

/* bytellama-n1024 (or skip), its held-out text and the options of a one-chunk run. */
static eval_model *one_chunk_setup(eval_text *text, eval_ppl_opts *o)
{
    char dir[4096], err[512];
    eval_model *m = model_or_skip("bytellama-n1024", dir, sizeof dir);
    cr_assert_eq(eval_text_load(dir, eval_model_cfg(m)->vocab, text, err, sizeof err), DQ_OK, "%s", err);
    eval_ppl_opts_default(o);
    o->chunks = 1;
    o->resamples = 50;
    if (sanitized()) {
        o->context = 32; /* dq226's window is 128: a partial window of its own statistics */
        o->targets = 8;
    }
    cr_assert_eq(eval_ppl_fit(o, text->len), DQ_OK);
    return m;
}

Test(eval_ppl, one_chunk_dquant_and_a_baseline, .timeout = 300)
{
    char err[512];
    eval_text text;
    eval_ppl_opts o;
    eval_model *m = one_chunk_setup(&text, &o);
    const eval_model_config *cfg = eval_model_cfg(m);
    const char *names[] = {"fp32", "bf16", "dq226", "int2"};
    eval_ppl_codec codecs[4];
    memset(codecs, 0, sizeof codecs);
    codecs[0].identity = 1;
    for (int i = 1; i < 4; i++)
        cr_assert_eq(eval_codec_parse(names[i], cfg->kv_heads, cfg->head_dim, &codecs[i].codec, err, sizeof err), DQ_OK,
                     "%s", err);
    eval_ppl_result r[4];
    cr_assert_eq(eval_ppl_run(m, &text, codecs, 4, &o, r, err, sizeof err), DQ_OK, "%s", err);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(r[i].rc, DQ_OK, "%s: %s", names[i], r[i].why);
        cr_assert_str_eq(r[i].label, names[i]);
        cr_assert(isfinite(r[i].ppl) && isfinite(r[i].dppl) && isfinite(r[i].kl.est), "%s", names[i]);
        cr_assert_geq(r[i].kl.est, 0.0, "%s", names[i]);
        cr_assert_eq(r[i].chunks, 1);
        cr_assert_eq(r[i].targets, o.targets);
    }
    /* the identity through the cache hook changes nothing, bit for bit */
    cr_assert_eq(r[0].kl.est, 0.0);
    cr_assert_eq(r[0].dppl, 0.0);
    cr_assert_eq(r[0].nmse[0], 0.0);
    cr_assert_eq(r[0].bits_mean, 32.0);
    /* BF16 rounding of the cache: 16 bits, a KL near zero but not zero */
    cr_assert_eq(r[1].bits_mean, 16.0);
    cr_assert(r[1].kl.est > 0 && r[1].kl.est < 1e-4, "bf16 KL %g", r[1].kl.est);
    /* every stored byte: dq226 at n = 1024 is 2.26 bits/value; INT2 (group 128) 2.25 */
    if (o.context == 128)
        cr_assert(fabs(r[2].bits_mean - 2.2579) < 0.01, "dq226 %.4f bits", r[2].bits_mean);
    else /* the key window mean amortized over a partial window */
        cr_assert(r[2].bits_mean > 2.2579 && r[2].bits_mean < 2.5, "dq226 %.4f bits", r[2].bits_mean);
    cr_assert(fabs(r[3].bits_mean - 2.25) < 1e-9, "int2 %.4f bits", r[3].bits_mean);
    cr_assert(r[2].kl.est > r[1].kl.est, "dq226 KL %g vs bf16 %g", r[2].kl.est, r[1].kl.est);
    cr_assert(r[2].kl.est < r[3].kl.est, "dq226 KL %g vs int2 %g at the same storage", r[2].kl.est, r[3].kl.est);
    cr_assert_eq(r[2].ppl_ref, r[0].ppl_ref);
    eval_text_free(&text);
    eval_model_free(m);
}

/* --ppl --value-mass: the targets' attention over the prefill skips values as dquant/vskip.h
 * selects them. fp32 (the identity cache) then measures skipping alone: a tiny KL at 0.99 and a
 * larger one at 0.5, fewer values used at the lower target; the counts; bad targets and a missing
 * selection codec are refused. (0.99, not 0.999: on this one chunk the last 0.1% of the mass sits
 * at the edge of a selection, and clang's build keeps every value at 0.999 where gcc's skips a few.) */
Test(eval_ppl, value_skipping, .timeout = 300)
{
    char err[512];
    eval_text text;
    eval_ppl_opts o;
    eval_model *m = one_chunk_setup(&text, &o);
    const eval_model_config *cfg = eval_model_cfg(m);
    eval_ppl_codec codecs[2];
    memset(codecs, 0, sizeof codecs);
    codecs[0].identity = 1;
    cr_assert_eq(eval_codec_parse("dq226", cfg->kv_heads, cfg->head_dim, &codecs[1].codec, err, sizeof err), DQ_OK);
    eval_ppl_result off[2], hi[2], lo[2];
    cr_assert_eq(eval_ppl_run(m, &text, codecs, 2, &o, off, err, sizeof err), DQ_OK, "%s", err);
    o.value_mass = 0.99;
    cr_assert_eq(eval_ppl_run(m, &text, codecs, 2, &o, hi, err, sizeof err), DQ_OK, "%s", err);
    o.value_mass = 0.5;
    cr_assert_eq(eval_ppl_run(m, &text, codecs, 2, &o, lo, err, sizeof err), DQ_OK, "%s", err);
    cr_log_info("fp32 prefill: tau 0.99 uses %.1f%% of values, KL %.3g; tau 0.5 %.1f%%, KL %.3g",
                100 * hi[0].value_kept, hi[0].kl.est, 100 * lo[0].value_kept, lo[0].kl.est);
    cr_log_info("dq226 prefill: KL %.4g off, %.4g at 0.99, %.4g at 0.5", off[1].kl.est, hi[1].kl.est, lo[1].kl.est);
    cr_assert_eq(off[0].kl.est, 0.0);
    cr_assert_eq(off[0].value_kept, 1.0, "no skipping without a target");
    cr_assert(hi[0].kl.est >= 0 && hi[0].kl.est < 1e-4, "fp32 at 0.99: KL %g", hi[0].kl.est);
    cr_assert(lo[0].kl.est > hi[0].kl.est, "KL %g at 0.5 vs %g at 0.99", lo[0].kl.est, hi[0].kl.est);
    cr_assert(lo[0].value_kept < hi[0].value_kept && hi[0].value_kept < 1.0, "values used %g at 0.5, %g at 0.99",
              lo[0].value_kept, hi[0].value_kept);
    cr_assert_eq(hi[1].ppl_ref, off[1].ppl_ref, "the fp32 reference run is exact");
    cr_assert(fabs(hi[1].kl.est - off[1].kl.est) < 0.05 * off[1].kl.est, "dq226 KL %g at 0.99 vs %g off", hi[1].kl.est,
              off[1].kl.est);
    o.value_mass = 1.5;
    cr_assert_eq(eval_ppl_run(m, &text, codecs, 2, &o, hi, err, sizeof err), DQ_INVALID_ARGUMENT);
    /* the forward itself: value skipping without a codec lending the allocator is refused */
    eval_kv_cache c;
    cr_assert_eq(eval_kv_cache_init(m, 8, &c), DQ_OK);
    const int32_t tok[2] = {65, 66};
    cr_assert_eq(eval_model_forward(m, &c, tok, 1, NULL, NULL), DQ_OK);
    c.value_mass = 0.9;
    c.sealed = 1;
    cr_assert_eq(eval_model_forward(m, &c, tok + 1, 1, NULL, NULL), DQ_INVALID_ARGUMENT);
    eval_kv_cache_free(&c);
    eval_text_free(&text);
    eval_model_free(m);
}

/* ---- the claims table ---- */

Test(eval_claims, every_claim_row_is_measured, .timeout = 300)
{
    char dir[4096], err[512];
    eval_model *m = model_or_skip("tinystories-656k", dir, sizeof dir);
    eval_text text;
    cr_assert_eq(eval_text_load(dir, eval_model_cfg(m)->vocab, &text, err, sizeof err), DQ_OK, "%s", err);
    cr_assert_eq(text.len, 495);
    eval_data d;
    cr_assert_eq(eval_data_load_named("tinystories-656k", data_dir(), &d, err, sizeof err), DQ_OK, "%s", err);
    eval_claims_opts o;
    eval_claims_opts_default(&o);
    o.ppl_chunks = 1;
    o.bench_reps = 2;
    o.kmeans_samples = sanitized() ? 5000 : 20000;
    const size_t n = eval_claims_count();
    cr_assert_eq(n, 8);
    eval_claim rows[8];
    cr_assert_eq(eval_claims_run(&d, m, &text, &o, rows, err, sizeof err), DQ_OK, "%s", err);
    const char *ids[] = {"awq", "delta", "lowrank", "pq", "kmeans", "kv_asym", "bucketize", "huffman"};
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(rows[i].id, ids[i]);
        cr_assert(rows[i].claim && *rows[i].claim && rows[i].paper && *rows[i].paper);
        cr_assert_neq(rows[i].verdict, EVAL_NOT_RUN, "%s: %s", rows[i].id, rows[i].note);
        cr_assert(strlen(rows[i].ours) > 10, "%s: '%s'", rows[i].id, rows[i].ours);
        cr_assert_gt(rows[i].nvalues, 0, "%s", rows[i].id);
        for (size_t j = 0; j < rows[i].nvalues; j++)
            cr_assert(isfinite(rows[i].values[j].value), "%s.%s", rows[i].id, rows[i].values[j].key);
    }
    /* figures with a known direction on any data */
    cr_assert_gt(rows[0].values[2].value, 0.0, "attention-weighted assignment must lower the weighted distortion");
    cr_assert_str_eq(rows[7].values[1].key, "huffman_synthetic");
    cr_assert(rows[7].values[1].value < 4.0 && rows[7].values[1].value >= rows[7].values[0].value,
              "Huffman %.3f bits vs entropy %.3f", rows[7].values[1].value, rows[7].values[0].value);
    /* without a model the dPPL parts say so, the rest is measured all the same */
    o.ppl_chunks = 0;
    cr_assert_eq(eval_claims_run(&d, NULL, NULL, &o, rows, err, sizeof err), DQ_OK, "%s", err);
    cr_assert(strstr(rows[2].note, "dPPL not run"), "%s", rows[2].note);
    eval_data_free(&d);
    eval_text_free(&text);
    eval_model_free(m);
}

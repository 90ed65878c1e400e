/* The perplexity / KL protocol (eval_ppl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec_run.h"
#include "dquant/error.h"
#include "dquant/kvq.h"
#include "dquant/vskip.h"
#include "eval_data.h"
#include "eval_ppl.h"
#include "eval_rng.h"

int eval_text_load(const char *model_dir, uint32_t vocab, eval_text *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    char path[4096];
    void *raw = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/heldout.txt", model_dir);
    int rc = vocab == 256 ? eval_read_file(path, &raw, &len) : DQ_NOT_FOUND;
    if (rc == DQ_OK) {
        t->tokens = malloc((len ? len : 1) * sizeof *t->tokens);
        if (!t->tokens) {
            free(raw);
            return eval_fail(err, errlen, DQ_NOMEM, "out of memory");
        }
        for (size_t i = 0; i < len; i++)
            t->tokens[i] = ((const uint8_t *)raw)[i];
        t->len = len;
        snprintf(t->source, sizeof t->source, "heldout.txt (bytes)");
        free(raw);
        return DQ_OK;
    }
    if (rc != DQ_NOT_FOUND)
        return eval_fail(err, errlen, rc, "%s: %s", path, dq_strerror(rc));
    snprintf(path, sizeof path, "%s/kv/tokens_i32.bin", model_dir);
    rc = eval_read_file(path, &raw, &len);
    if (rc != DQ_OK)
        return eval_fail(err, errlen, rc, "%s: no held-out text (heldout.txt for a byte-level model, or %s)", model_dir,
                         path);
    if (len % 4) {
        free(raw);
        return eval_fail(err, errlen, DQ_SHAPE, "%s: %zu bytes is not a whole number of int32", path, len);
    }
    t->len = len / 4;
    t->tokens = malloc((t->len ? t->len : 1) * sizeof *t->tokens);
    if (!t->tokens) {
        free(raw);
        return eval_fail(err, errlen, DQ_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < t->len; i++) {
        const uint8_t *b = (const uint8_t *)raw + 4 * i;
        t->tokens[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        if (t->tokens[i] < 0 || (uint32_t)t->tokens[i] >= vocab) {
            free(raw);
            eval_text_free(t);
            return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "%s: token %zu outside the vocabulary", path, i);
        }
    }
    free(raw);
    snprintf(t->source, sizeof t->source, "kv/tokens_i32.bin");
    return DQ_OK;
}

void eval_text_free(eval_text *t)
{
    if (!t)
        return;
    free(t->tokens);
    memset(t, 0, sizeof *t);
}

void eval_ppl_opts_default(eval_ppl_opts *o)
{
    memset(o, 0, sizeof *o);
    o->context = 128;
    o->targets = 64;
    o->chunks = 50;
    o->calib_seqs = 8;
    o->resamples = 2000;
    o->seed = 0x5eed2001;
}

static size_t chunk_len(const eval_ppl_opts *o)
{
    return (size_t)o->context + o->targets + 1;
}

int eval_ppl_fit(eval_ppl_opts *o, size_t text_len)
{
    if (!o->context || !o->targets || !o->chunks)
        return DQ_INVALID_ARGUMENT;
    /* the chunks first (as many as asked for and fit), calibration from what is left */
    if (text_len < chunk_len(o))
        return DQ_OUT_OF_BOUNDS;
    if (o->chunks > text_len / chunk_len(o))
        o->chunks = (uint32_t)(text_len / chunk_len(o));
    const size_t room = text_len - (size_t)o->chunks * chunk_len(o);
    if ((size_t)o->calib_seqs * o->context > room)
        o->calib_seqs = (uint32_t)(room / o->context);
    o->calib_offset = 0;
    o->offset = (uint64_t)o->calib_seqs * o->context;
    return DQ_OK;
}

/* Checks that the chunks and calibration lie in the text and do not overlap. */
static int check_layout(const eval_ppl_opts *o, size_t text_len, char *err, size_t errlen)
{
    const uint64_t c0 = o->offset, c1 = o->offset + (uint64_t)o->chunks * chunk_len(o);
    const uint64_t k0 = o->calib_offset, k1 = o->calib_offset + (uint64_t)o->calib_seqs * o->context;
    if (!o->context || !o->targets || !o->chunks)
        return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "context, targets and chunks must be positive");
    if (c1 > text_len || k1 > text_len)
        return eval_fail(
            err, errlen, DQ_OUT_OF_BOUNDS, "chunks [%llu, %llu) or calibration [%llu, %llu) outside the %zu-token text",
            (unsigned long long)c0, (unsigned long long)c1, (unsigned long long)k0, (unsigned long long)k1, text_len);
    if (o->calib_seqs && k0 < c1 && c0 < k1)
        return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "calibration [%llu, %llu) overlaps the chunks [%llu, %llu)",
                         (unsigned long long)k0, (unsigned long long)k1, (unsigned long long)c0,
                         (unsigned long long)c1);
    return DQ_OK;
}

int eval_ppl_calibration(const eval_model *m, const eval_text *t, const eval_ppl_opts *o, float **k, float **v,
                         size_t *tokens, char *err, size_t errlen)
{
    *k = *v = NULL;
    *tokens = 0;
    int rc = check_layout(o, t->len, err, errlen);
    if (rc != DQ_OK)
        return rc;
    if (!o->calib_seqs)
        return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "no calibration sequences fit in the %zu-token text",
                         t->len);
    const eval_model_config *cfg = eval_model_cfg(m);
    const size_t n = (size_t)cfg->kv_heads * cfg->head_dim, total = (size_t)o->calib_seqs * o->context;
    eval_kv_cache c;
    if ((rc = eval_kv_cache_init(m, o->context, &c)) != DQ_OK)
        return eval_fail(err, errlen, rc, "KV cache of %u tokens: %s", o->context, dq_strerror(rc));
    *k = malloc((size_t)cfg->layers * total * n * sizeof **k);
    *v = malloc((size_t)cfg->layers * total * n * sizeof **v);
    if (!*k || !*v)
        rc = eval_fail(err, errlen, DQ_NOMEM, "out of memory");
    for (uint32_t s = 0; s < o->calib_seqs && rc == DQ_OK; s++) {
        c.len = 0;
        rc = eval_model_forward(m, &c, t->tokens + o->calib_offset + (size_t)s * o->context, o->context, NULL, NULL);
        for (uint32_t l = 0; l < cfg->layers && rc == DQ_OK; l++) {
            const size_t dst = ((size_t)l * total + (size_t)s * o->context) * n;
            memcpy(*k + dst, eval_kv_cache_layer(&c, 0, l), (size_t)o->context * n * sizeof **k);
            memcpy(*v + dst, eval_kv_cache_layer(&c, 1, l), (size_t)o->context * n * sizeof **v);
        }
    }
    eval_kv_cache_free(&c);
    if (rc != DQ_OK) {
        free(*k);
        free(*v);
        *k = *v = NULL;
        return rc;
    }
    *tokens = total;
    return DQ_OK;
}

/* ---- one codec's state over the run ---- */

typedef struct codec_state {
    dq_codec *codec;              /* library codecs */
    double *chunk_nll, *chunk_kl; /* [chunks]: sums over the chunk's targets */
    double err2[2], ref2[2];      /* NMSE sums */
    uint64_t stored_bits[2], values[2];
    uint64_t vskip_kept, vskip_sealed; /* value_mass: prefill values summed / offered */
    double seconds;
} codec_state;

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Replaces the prefill K/V of every layer in c (positions 0..ctx−1; ref holds the float32 ones,
 * [2][layers][ctx][n]) with the codec's reconstruction. */
static int apply_codec(const eval_ppl_codec *pc, codec_state *st, eval_kv_cache *c, const float *ref, uint32_t ctx)
{
    const size_t per = (size_t)ctx * c->n;
    for (int kind = 0; kind < 2; kind++)
        for (uint32_t l = 0; l < c->layers; l++) {
            const float *x = ref + ((size_t)kind * c->layers + l) * per;
            float *xhat = eval_kv_cache_layer(c, kind, l);
            int rc = DQ_OK;
            if (pc->identity) {
                memcpy(xhat, x, per * sizeof *xhat);
                st->stored_bits[kind] += 32 * (uint64_t)per;
            } else {
                codec_rt_result rt;
                const dq_codec *lc = dq_codec_layer(st->codec, l);
                rc = codec_roundtrip_codec(lc ? lc : st->codec, (dq_kind)kind, x, ctx, xhat, NULL, &rt);
                st->stored_bits[kind] += 8 * rt.stored_bytes;
            }
            if (rc != DQ_OK)
                return rc;
            st->values[kind] += per;
            for (size_t i = 0; i < per; i++) {
                const double d = (double)xhat[i] - x[i];
                st->err2[kind] += d * d;
                st->ref2[kind] += (double)x[i] * x[i];
            }
        }
    c->len = ctx;
    return DQ_OK;
}

/* log-softmax of z[V] into out (float64). */
static void log_softmax(const float *z, uint32_t V, double *out)
{
    double mx = -INFINITY, s = 0;
    for (uint32_t i = 0; i < V; i++)
        mx = z[i] > mx ? z[i] : mx;
    for (uint32_t i = 0; i < V; i++)
        s += exp((double)z[i] - mx);
    const double lse = mx + log(s);
    for (uint32_t i = 0; i < V; i++)
        out[i] = (double)z[i] - lse;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile bootstrap over chunks of exp(Σnll/Σn) − exp(Σnll_ref/Σn) and of Σkl/Σn. */
static void bootstrap(const double *nll, const double *nll_ref, const double *kl, uint32_t chunks, uint32_t targets,
                      const eval_ppl_opts *o, eval_ci *dppl, eval_ci *klci)
{
    const uint32_t R = o->resamples ? o->resamples : 1;
    double *bd = malloc(R * sizeof *bd), *bk = malloc(R * sizeof *bk);
    if (!bd || !bk) {
        dppl->lo = dppl->hi = dppl->est;
        klci->lo = klci->hi = klci->est;
        free(bd);
        free(bk);
        return;
    }
    uint64_t rng = o->seed;
    const double cnt = (double)chunks * targets;
    for (uint32_t r = 0; r < R; r++) {
        double a = 0, b = 0, k = 0;
        for (uint32_t i = 0; i < chunks; i++) {
            const uint32_t j = (uint32_t)(rng_splitmix64(&rng) % chunks);
            a += nll[j];
            b += nll_ref[j];
            k += kl[j];
        }
        bd[r] = exp(a / cnt) - exp(b / cnt);
        bk[r] = k / cnt;
    }
    qsort(bd, R, sizeof *bd, cmp_double);
    qsort(bk, R, sizeof *bk, cmp_double);
    dppl->lo = bd[(size_t)(0.025 * (R - 1))];
    dppl->hi = bd[(size_t)(0.975 * (R - 1))];
    klci->lo = bk[(size_t)(0.025 * (R - 1))];
    klci->hi = bk[(size_t)(0.975 * (R - 1))];
    free(bd);
    free(bk);
}

int eval_ppl_run(const eval_model *m, const eval_text *t, const eval_ppl_codec *codecs, size_t ncodecs,
                 const eval_ppl_opts *o, eval_ppl_result *res, char *err, size_t errlen)
{
    int rc = check_layout(o, t->len, err, errlen);
    if (rc != DQ_OK)
        return rc;
    const eval_model_config *cfg = eval_model_cfg(m);
    const uint32_t C = o->context, T = o->targets, V = cfg->vocab;
    const size_t n = (size_t)cfg->kv_heads * cfg->head_dim, per = (size_t)C * n;
    codec_state *st = calloc(ncodecs ? ncodecs : 1, sizeof *st);
    float *ref = malloc(2 * cfg->layers * per * sizeof *ref);
    float *lref = malloc((size_t)T * V * sizeof *lref), *lc = malloc((size_t)T * V * sizeof *lc);
    double *lpr = malloc((size_t)T * V * sizeof *lpr), *lpc = malloc((size_t)V * sizeof *lpc);
    double *nll_ref = calloc(o->chunks, sizeof *nll_ref);
    eval_kv_cache c = {0};
    dq_codec *vskip_codec = NULL;
    float *calib_k = NULL, *calib_v = NULL;
    size_t calib_tokens = 0;
    int calib_rc = DQ_OK;
    char calib_err[200] = "";
    if (!st || !ref || !lref || !lc || !lpr || !lpc || !nll_ref) {
        rc = eval_fail(err, errlen, DQ_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = eval_kv_cache_init(m, C + T, &c)) != DQ_OK) {
        rc = eval_fail(err, errlen, rc, "KV cache of %u tokens: %s", C + T, dq_strerror(rc));
        goto out;
    }
    if (o->value_mass != 0) {
        /* value skipping's selection borrows a codec's allocator only: any profile of the shape */
        dq_profile bp;
        if (dq_vskip_enabled(o->value_mass) != 1) {
            rc = eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "value mass %g is not in (0, 1)", o->value_mass);
            goto out;
        }
        if ((rc = dq_profile_builtin("bf16", cfg->kv_heads, cfg->head_dim, &bp)) != DQ_OK ||
            (rc = dq_codec_create(&bp, NULL, &vskip_codec)) != DQ_OK) {
            rc = eval_fail(err, errlen, rc, "value skipping: %s", dq_strerror(rc));
            goto out;
        }
    }
    for (size_t i = 0; i < ncodecs; i++) {
        memset(&res[i], 0, sizeof res[i]);
        snprintf(res[i].label, sizeof res[i].label, "%s", codecs[i].identity ? "fp32" : codecs[i].codec.label);
        st[i].chunk_nll = calloc(o->chunks, sizeof *st[i].chunk_nll);
        st[i].chunk_kl = calloc(o->chunks, sizeof *st[i].chunk_kl);
        if (!st[i].chunk_nll || !st[i].chunk_kl) {
            rc = eval_fail(err, errlen, DQ_NOMEM, "out of memory");
            goto out;
        }
        if (codecs[i].unavailable) {
            res[i].rc = DQ_CONTAINER_TOO_SMALL;
            snprintf(res[i].why, sizeof res[i].why, "%s", codecs[i].unavailable);
        } else if (!codecs[i].identity && (codecs[i].codec.profile.kv_heads != cfg->kv_heads ||
                                           codecs[i].codec.profile.head_dim != cfg->head_dim)) {
            res[i].rc = DQ_SHAPE;
            snprintf(res[i].why, sizeof res[i].why, "profile shape does not match the model");
        } else if (!codecs[i].identity && dq_profile_needs_calibration(&codecs[i].codec.profile)) {
            /* per-layer calibration on the calibration sequences' float32 prefill K/V */
            if (!calib_k && !calib_rc)
                calib_rc = eval_ppl_calibration(m, t, o, &calib_k, &calib_v, &calib_tokens, calib_err,
                                                sizeof calib_err);
            if (calib_rc != DQ_OK) {
                res[i].rc = calib_rc;
                snprintf(res[i].why, sizeof res[i].why, "needs calibration: %s", calib_err);
                continue;
            }
            dq_profile p = codecs[i].codec.profile;
            uint8_t *blob = NULL;
            size_t blob_len = 0;
            res[i].rc = dq_kvq_calibrate(&p, cfg->layers, calib_k, calib_v, calib_tokens, o->seed, &blob, &blob_len);
            if (res[i].rc == DQ_OK)
                res[i].rc = dq_codec_create_calibrated(&p, blob, blob_len, NULL, &st[i].codec);
            dq_kvq_free(blob);
            if (res[i].rc != DQ_OK)
                snprintf(res[i].why, sizeof res[i].why, "calibration on %zu tokens: %s", calib_tokens,
                         dq_strerror(res[i].rc));
        } else if (!codecs[i].identity) {
            res[i].rc = dq_codec_create(&codecs[i].codec.profile, NULL, &st[i].codec);
            if (res[i].rc != DQ_OK)
                snprintf(res[i].why, sizeof res[i].why, "codec: %s", dq_strerror(res[i].rc));
        }
    }
    for (uint32_t ch = 0; ch < o->chunks; ch++) {
        const int32_t *x = t->tokens + o->offset + (size_t)ch * chunk_len(o);
        /* full-precision prefill, then the float32 reference run of the targets */
        c.len = 0;
        if ((rc = eval_model_forward(m, &c, x, C, NULL, NULL)) != DQ_OK)
            goto fwd_fail;
        for (int kind = 0; kind < 2; kind++)
            for (uint32_t l = 0; l < cfg->layers; l++)
                memcpy(ref + ((size_t)kind * cfg->layers + l) * per, eval_kv_cache_layer(&c, kind, l),
                       per * sizeof *ref);
        if ((rc = eval_model_forward(m, &c, x + C, T, lref, NULL)) != DQ_OK)
            goto fwd_fail;
        for (uint32_t j = 0; j < T; j++) {
            log_softmax(lref + (size_t)j * V, V, lpr + (size_t)j * V);
            nll_ref[ch] -= lpr[(size_t)j * V + x[C + 1 + j]];
        }
        for (size_t i = 0; i < ncodecs; i++) {
            if (res[i].rc != DQ_OK)
                continue;
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            res[i].rc = apply_codec(&codecs[i], &st[i], &c, ref, C);
            if (res[i].rc != DQ_OK) {
                snprintf(res[i].why, sizeof res[i].why, "chunk %u: %s", ch, dq_strerror(res[i].rc));
                continue;
            }
            c.value_mass = o->value_mass;
            c.sealed = C;
            c.vskip_codec = vskip_codec;
            c.vskip_kept = c.vskip_sealed = 0;
            rc = eval_model_forward(m, &c, x + C, T, lc, NULL);
            c.value_mass = 0;
            st[i].vskip_kept += c.vskip_kept;
            st[i].vskip_sealed += c.vskip_sealed;
            if (rc != DQ_OK)
                goto fwd_fail;
            for (uint32_t j = 0; j < T; j++) {
                const double *p = lpr + (size_t)j * V;
                log_softmax(lc + (size_t)j * V, V, lpc);
                double kl = 0;
                for (uint32_t w = 0; w < V; w++)
                    kl += exp(p[w]) * (p[w] - lpc[w]);
                st[i].chunk_kl[ch] += kl;
                st[i].chunk_nll[ch] -= lpc[x[C + 1 + j]];
            }
            st[i].seconds += seconds_since(&t0);
        }
    }
    double ref_sum = 0;
    for (uint32_t ch = 0; ch < o->chunks; ch++)
        ref_sum += nll_ref[ch];
    const double cnt = (double)o->chunks * T;
    for (size_t i = 0; i < ncodecs; i++) {
        eval_ppl_result *r = &res[i];
        r->chunks = o->chunks;
        r->targets = T;
        r->nll_ref = ref_sum / cnt;
        r->ppl_ref = exp(r->nll_ref);
        if (r->rc != DQ_OK)
            continue;
        double s = 0, k = 0;
        for (uint32_t ch = 0; ch < o->chunks; ch++) {
            s += st[i].chunk_nll[ch];
            k += st[i].chunk_kl[ch];
        }
        r->nll = s / cnt;
        r->ppl = exp(r->nll);
        r->dppl = r->ppl - r->ppl_ref;
        r->dppl_ci.est = r->dppl;
        r->kl.est = k / cnt;
        bootstrap(st[i].chunk_nll, nll_ref, st[i].chunk_kl, o->chunks, T, o, &r->dppl_ci, &r->kl);
        for (int kind = 0; kind < 2; kind++) {
            r->bits[kind] = (double)st[i].stored_bits[kind] / (double)st[i].values[kind];
            r->nmse[kind] = st[i].ref2[kind] > 0 ? st[i].err2[kind] / st[i].ref2[kind] : 0;
        }
        r->bits_mean = 0.5 * (r->bits[0] + r->bits[1]);
        r->seconds = st[i].seconds;
        r->value_kept = st[i].vskip_sealed ? (double)st[i].vskip_kept / (double)st[i].vskip_sealed : 1.0;
    }
    rc = DQ_OK;
    goto out;
fwd_fail:
    rc = eval_fail(err, errlen, rc, "forward: %s", dq_strerror(rc));
out:
    for (size_t i = 0; st && i < ncodecs; i++) {
        dq_codec_free(st[i].codec);
        free(st[i].chunk_nll);
        free(st[i].chunk_kl);
    }
    free(st);
    free(ref);
    free(lref);
    free(lc);
    free(lpr);
    free(lpc);
    free(nll_ref);
    free(calib_k);
    free(calib_v);
    eval_kv_cache_free(&c);
    dq_codec_free(vskip_codec);
    return rc;
}

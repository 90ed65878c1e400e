/* Codec quality on real KV: reconstruction, attention fidelity, bootstrap intervals (eval_core.h). */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval_rng.h"
#include "codec_run.h"
#include "dquant/error.h"
#include "eval_core.h"

/* ---- codec specs ---- */

void eval_dq_containers(uint32_t kv_heads, uint32_t head_dim, const uint32_t c1024[2], double scale, uint32_t out[2])
{
    const double n = (double)kv_heads * head_dim;
    for (int k = 0; k < 2; k++) {
        const double rate = (8.0 * c1024[k] - 32.0) / 1024.0;
        out[k] = (uint32_t)lround((rate * scale * n + 32.0) / 8.0);
    }
}

int eval_dq_profile(uint32_t kv_heads, uint32_t head_dim, const uint32_t c1024[2], double scale,
                    const uint32_t levels[2], float alpha, const char *name, dq_profile *out)
{
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = kv_heads;
    pp.head_dim = head_dim;
    pp.alpha = alpha;
    pp.name = name;
    eval_dq_containers(kv_heads, head_dim, c1024, scale, pp.container_bytes);
    pp.levels[0] = levels[0];
    pp.levels[1] = levels[1];
    return dq_profile_make(&pp, out);
}

/* The n = 1024 definition of a built-in D-Quant profile. */
static int builtin_1024(const char *name, dq_profile *ref)
{
    int rc = dq_profile_builtin(name, 8, 128, ref);
    if (rc == DQ_OK && ref->codec_type != DQ_CODEC_DQUANT)
        rc = DQ_PROFILE;
    return rc;
}

/* Stored mean bits/value of a D-Quant profile with the given containers (only the sizes matter). */
static double dq_bits_for(const dq_profile *shape, const uint32_t c1024[2], double scale)
{
    dq_profile p = *shape;
    eval_dq_containers(p.kv_heads, p.head_dim, c1024, scale, p.container_bytes);
    return dq_profile_bits_per_value_mean(&p);
}

/* base@BITS: the largest container scale whose stored mean bits/value is <= bits. */
static int dq_matched(const char *base, double bits, uint32_t kv_heads, uint32_t head_dim, const char *label,
                      const char *spec, dq_profile *out, char *err, size_t errlen)
{
    dq_profile ref, shape;
    int rc = builtin_1024(base, &ref);
    if (rc == DQ_OK)
        rc = dq_profile_builtin(base, kv_heads, head_dim, &shape);
    if (rc != DQ_OK)
        return eval_fail(err, errlen, DQ_PROFILE, "'%s': not a built-in D-Quant profile for %u x %u", base, kv_heads,
                         head_dim);
    double lo = 0.0, hi = 16.0;
    if (dq_bits_for(&shape, ref.container_bytes, 1e-9) > bits)
        return eval_fail(err, errlen, DQ_CONTAINER_TOO_SMALL, "'%s': %.4g bits/value is below the metadata alone", spec,
                         bits);
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (dq_bits_for(&shape, ref.container_bytes, mid) <= bits)
            lo = mid;
        else
            hi = mid;
    }
    rc = eval_dq_profile(kv_heads, head_dim, ref.container_bytes, lo, ref.levels, ref.alpha, label, out);
    if (rc == DQ_OK && ref.format_version != out->format_version) {
        /* dqNNNp@BITS: the container format of the base profile (version 2: joint pairs) */
        out->format_version = ref.format_version;
        rc = dq_profile_validate(out);
    }
    if (rc != DQ_OK) {
        uint32_t c[2];
        eval_dq_containers(kv_heads, head_dim, ref.container_bytes, lo, c);
        return eval_fail(err, errlen, rc, "'%s': containers %u/%u bytes at n = %u cannot hold %u/%u levels (%s)", spec,
                         c[0], c[1], kv_heads * head_dim, ref.levels[0], ref.levels[1], dq_err_name(rc));
    }
    return DQ_OK;
}

/* intB-gG / quarotB-gG: the library's INT record with G channels per fp16 scale/zero pair. */
static int int_grouped(const char *name, uint32_t group, uint32_t kv_heads, uint32_t head_dim, dq_profile *out)
{
    int rc = dq_profile_builtin(name, kv_heads, head_dim, out);
    if (rc != DQ_OK)
        return rc;
    const uint32_t n = kv_heads * head_dim;
    if (out->codec_type != DQ_CODEC_INT || !group || n % group)
        return DQ_PROFILE;
    out->group = group;
    for (int k = 0; k < 2; k++)
        out->container_bytes[k] = 4 * (n / group) + (n * out->bits[k] + 7) / 8;
    return dq_profile_validate(out);
}

int eval_codec_parse(const char *spec, uint32_t kv_heads, uint32_t head_dim, eval_codec *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!spec || !*spec || strlen(spec) >= EVAL_LABEL_MAX)
        return eval_fail(err, errlen, DQ_PROFILE, "bad codec name '%s'", spec ? spec : "");
    snprintf(out->label, sizeof out->label, "%s", spec);
    char name[EVAL_LABEL_MAX];
    const char *rest = spec;
    /* fixedNNN[@BITS]: the fixed-width profile at the storage of dqNNN[@BITS]; fixedkAvB as it is */
    const int fixed = strncmp(spec, "fixed", 5) == 0 && spec[5] != 'k';
    if (fixed) {
        snprintf(name, sizeof name, "dq%s", spec + 5);
        rest = name;
    } else {
        snprintf(name, sizeof name, "%s", spec);
    }
    int rc;
    char *at = strchr(name, '@'), *grp = strstr(name, "-g");
    if (at) {
        *at = 0;
        char *end;
        const double bits = strtod(at + 1, &end);
        if (end == at + 1 || *end || !(bits > 0))
            return eval_fail(err, errlen, DQ_PROFILE, "'%s': bad bit budget after '@'", spec);
        rc = dq_matched(name, bits, kv_heads, head_dim, rest, spec, &out->profile, err, errlen);
        if (rc != DQ_OK)
            return rc;
    } else if (grp && !fixed) {
        *grp = 0;
        char *end;
        const unsigned long g = strtoul(grp + 2, &end, 10);
        if (end == grp + 2 || *end || g > UINT32_MAX ||
            int_grouped(name, (uint32_t)g, kv_heads, head_dim, &out->profile) != DQ_OK)
            return eval_fail(err, errlen, DQ_PROFILE, "'%s': groups apply to intB/quarotB with G dividing n = %u", spec,
                             kv_heads * head_dim);
        snprintf(out->profile.name, sizeof out->profile.name, "%s", spec);
    } else {
        rc = dq_profile_builtin(name, kv_heads, head_dim, &out->profile);
        if (rc != DQ_OK)
            return eval_fail(err, errlen, rc,
                             "'%s': %s for %u x %u (dq226, dq196, bf16, intB, quarotB, kiviB, "
                             "turboB, fixed226, fixed196, NAME@BITS, intB-gG)",
                             spec, dq_strerror(rc), kv_heads, head_dim);
    }
    if (fixed) {
        if (out->profile.codec_type != DQ_CODEC_DQUANT)
            return eval_fail(err, errlen, DQ_PROFILE, "'%s': fixed-width is matched to a D-Quant profile", spec);
        const dq_profile dqp = out->profile;
        rc = dq_profile_fixed_matched(&dqp, spec, &out->profile);
        if (rc != DQ_OK)
            return eval_fail(err, errlen, DQ_CONTAINER_TOO_SMALL,
                             "'%s': %s's containers (%u/%u bytes) afford fewer than 2 fixed-width levels", spec,
                             dqp.name, dqp.container_bytes[0], dqp.container_bytes[1]);
    }
    return DQ_OK;
}

double eval_codec_bits(const eval_codec *c, dq_kind kind)
{
    return dq_profile_bits_per_value(&c->profile, kind);
}

double eval_codec_bits_mean(const eval_codec *c)
{
    return 0.5 * (eval_codec_bits(c, DQ_KIND_K) + eval_codec_bits(c, DQ_KIND_V));
}

/* ---- options ---- */

void eval_opts_default(eval_opts *o)
{
    memset(o, 0, sizeof *o);
    o->resamples = 2000;
    o->seed = 0x0d9a4e7a11ull;
}

uint32_t eval_query_stride(const eval_data *d, const eval_opts *o)
{
    if (o->query_stride)
        return o->query_stride;
    const uint32_t s = d->tokens / 128;
    return s ? s : 1;
}

/* ---- bootstrap ---- */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile interval of ratio statistics Σ num[u] / Σ den[u] over units resampled with
 * replacement (den NULL: the mean of num). nstat statistics share each resample's indices. */
int eval_bootstrap(size_t units, size_t nstat, const double *const *num, const double *const *den, uint32_t resamples,
                   uint64_t seed, eval_ci *out)
{
    assert(nstat <= 4 && units > 0 && resamples > 0);
    double *stat = malloc((size_t)resamples * nstat * sizeof *stat);
    if (!stat)
        return DQ_NOMEM;
    uint64_t rng = seed;
    for (uint32_t b = 0; b < resamples; b++) {
        double sn[4] = {0}, sd[4] = {0};
        for (size_t i = 0; i < units; i++) {
            const size_t u = (size_t)(((rng_splitmix64(&rng) >> 32) * (uint64_t)units) >> 32);
            for (size_t s = 0; s < nstat; s++) {
                sn[s] += num[s][u];
                sd[s] += den[s] ? den[s][u] : 1.0;
            }
        }
        for (size_t s = 0; s < nstat; s++)
            stat[s * resamples + b] = sd[s] > 0 ? sn[s] / sd[s] : 0.0;
    }
    for (size_t s = 0; s < nstat; s++) {
        double *v = stat + s * resamples;
        qsort(v, resamples, sizeof *v, cmp_double);
        out[s].lo = v[(size_t)floor(0.025 * (resamples - 1) + 0.5)];
        out[s].hi = v[(size_t)floor(0.975 * (resamples - 1) + 0.5)];
        double sn = 0, sd = 0;
        for (size_t u = 0; u < units; u++) {
            sn += num[s][u];
            sd += den[s] ? den[s][u] : 1.0;
        }
        out[s].est = sd > 0 ? sn / sd : 0.0;
    }
    free(stat);
    return DQ_OK;
}

/* ---- attention ---- */

typedef struct attn_ctx {
    const eval_data *d;
    const size_t *pos; /* query positions */
    size_t npos;
    double *s, *sh;   /* [tokens] scores, original and reconstructed */
    double *o, *oh;   /* [head_dim] outputs */
    double *kl, *err; /* [npos] sums over layers and heads */
} attn_ctx;

/* Adds, for every evaluated position of one layer of sequence 0 and every query head, the score
 * KL and the output error of (K̂, V̂) against (K, V). */
static void attend_layer(attn_ctx *a, uint32_t layer, const float *K, const float *V, const float *Kh, const float *Vh)
{
    const eval_data *d = a->d;
    const size_t n = eval_data_stream_len(d), hd = d->head_dim, qh = d->q_heads, T = d->tokens;
    const size_t group = qh / d->kv_heads;
    const double scale = 1.0 / sqrt((double)hd);
    for (size_t p = 0; p < a->npos; p++) {
        const size_t t = a->pos[p];
        for (size_t h = 0; h < qh; h++) {
            const float *q = d->q + (((size_t)layer * T + t) * qh + h) * hd;
            const size_t off = (h / group) * hd;
            double m = -INFINITY, mh = -INFINITY;
            for (size_t i = 0; i <= t; i++) {
                const float *k = K + i * n + off, *kh = Kh + i * n + off;
                double dot = 0, doth = 0;
                for (size_t j = 0; j < hd; j++) {
                    dot += (double)q[j] * k[j];
                    doth += (double)q[j] * kh[j];
                }
                a->s[i] = dot * scale;
                a->sh[i] = doth * scale;
                m = fmax(m, a->s[i]);
                mh = fmax(mh, a->sh[i]);
            }
            double z = 0, zh = 0;
            for (size_t i = 0; i <= t; i++) {
                z += exp(a->s[i] - m);
                zh += exp(a->sh[i] - mh);
            }
            const double lse = m + log(z), lseh = mh + log(zh);
            double kl = lseh - lse;
            memset(a->o, 0, hd * sizeof *a->o);
            memset(a->oh, 0, hd * sizeof *a->oh);
            for (size_t i = 0; i <= t; i++) {
                const double pi = exp(a->s[i] - lse), phi = exp(a->sh[i] - lseh);
                kl += pi * (a->s[i] - a->sh[i]);
                const float *v = V + i * n + off, *vh = Vh + i * n + off;
                for (size_t j = 0; j < hd; j++) {
                    a->o[j] += pi * v[j];
                    a->oh[j] += phi * vh[j];
                }
            }
            double num = 0, den = 0;
            for (size_t j = 0; j < hd; j++) {
                num += (a->o[j] - a->oh[j]) * (a->o[j] - a->oh[j]);
                den += a->o[j] * a->o[j];
            }
            a->kl[p] += kl > 0 ? kl : 0.0;
            a->err[p] += den > 0 ? sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
        }
    }
}

/* ---- one codec ---- */

static int reconstruct(const eval_codec *c, dq_kind kind, const float *x, size_t ntok, float *xhat, uint8_t *levels,
                       eval_result *r)
{
    codec_rt_result rt;
    int rc = codec_roundtrip_f32(&c->profile, kind, x, ntok, xhat, levels, &rt);
    if (rc != DQ_OK)
        return rc;
    r->streams[kind] += rt.streams;
    r->retries[kind] += rt.retries;
    r->fallbacks[kind] += rt.fallbacks;
    r->symbols_moved[kind] += rt.symbols_moved;
    r->payload_bytes[kind] += rt.payload_bytes;
    if (rt.max_move > r->max_move[kind])
        r->max_move[kind] = rt.max_move;
    if (levels) {
        const size_t count = ntok * ((size_t)c->profile.kv_heads * c->profile.head_dim);
        for (size_t i = 0; i < count; i++)
            r->hist[kind][levels[i] < DQ_MAX_LEVELS ? levels[i] : DQ_MAX_LEVELS - 1]++;
    }
    return DQ_OK;
}

int eval_run(const eval_data *d, const eval_codec *c, const eval_opts *o, eval_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    snprintf(r->label, sizeof r->label, "%s", c->label);
    if (c->profile.kv_heads != d->kv_heads || c->profile.head_dim != d->head_dim)
        return eval_fail(err, errlen, DQ_SHAPE, "%s: profile shape %u x %u, data %u x %u", c->label,
                         c->profile.kv_heads, c->profile.head_dim, d->kv_heads, d->head_dim);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const size_t n = eval_data_stream_len(d), T = d->tokens, units = (size_t)d->seqs * T;
    const int attn = d->q && d->q_heads && !o->skip_attention;
    const int want_levels = o->collect_levels && c->profile.codec_type == DQ_CODEC_DQUANT;
    r->query_stride = eval_query_stride(d, o);
    r->resamples = o->resamples;
    attn_ctx a = {.d = d};
    a.npos = attn ? (T - 1) / r->query_stride + 1 : 0;
    float *kh = malloc(T * n * sizeof *kh), *vh = malloc(T * n * sizeof *vh);
    uint8_t *levels = want_levels ? malloc(T * n) : NULL;
    double *sums = calloc(4 * units, sizeof *sums); /* se_k, sx_k, se_v, sx_v per unit */
    size_t *pos = malloc((a.npos + 1) * sizeof *pos);
    double *abuf = malloc((2 * (size_t)T + 2 * d->head_dim + 2 * a.npos + 1) * sizeof *abuf);
    int rc = DQ_NOMEM;
    if (!kh || !vh || (want_levels && !levels) || !sums || !pos || !abuf) {
        eval_fail(err, errlen, rc, "out of memory");
        goto out;
    }
    a.pos = pos;
    for (size_t p = 0; p < a.npos; p++)
        pos[p] = T - 1 - p * r->query_stride;
    a.s = abuf;
    a.sh = a.s + T;
    a.o = a.sh + T;
    a.oh = a.o + d->head_dim;
    a.kl = a.oh + d->head_dim;
    a.err = a.kl + a.npos;
    memset(a.kl, 0, 2 * a.npos * sizeof *a.kl);
    for (uint32_t s = 0; s < d->seqs; s++) {
        for (uint32_t l = 0; l < d->layers; l++) {
            const float *K = eval_data_slab(d, DQ_KIND_K, s, l), *V = eval_data_slab(d, DQ_KIND_V, s, l);
            if ((rc = reconstruct(c, DQ_KIND_K, K, T, kh, levels, r)) != DQ_OK ||
                (rc = reconstruct(c, DQ_KIND_V, V, T, vh, levels, r)) != DQ_OK) {
                eval_fail(err, errlen, rc, "%s: sequence %u layer %u: %s (%s)", c->label, s, l, dq_strerror(rc),
                          dq_err_name(rc));
                goto out;
            }
            for (size_t t = 0; t < T; t++) {
                double *u = sums + 4 * ((size_t)s * T + t);
                for (size_t j = 0; j < n; j++) {
                    const double xk = K[t * n + j], xv = V[t * n + j];
                    const double ek = xk - kh[t * n + j], ev = xv - vh[t * n + j];
                    u[0] += ek * ek;
                    u[1] += xk * xk;
                    u[2] += ev * ev;
                    u[3] += xv * xv;
                }
            }
            if (attn && s == 0)
                attend_layer(&a, l, K, V, kh, vh);
        }
    }
    /* unit-major columns for the bootstrap */
    double *col = malloc(4 * units * sizeof *col);
    if (!col) {
        rc = eval_fail(err, errlen, DQ_NOMEM, "out of memory");
        goto out;
    }
    for (size_t u = 0; u < units; u++)
        for (int k = 0; k < 4; k++)
            col[k * units + u] = sums[4 * u + k];
    const double *num[2] = {col, col + 2 * units}, *den[2] = {col + units, col + 3 * units};
    rc = eval_bootstrap(units, 2, num, den, o->resamples, o->seed, r->nmse);
    if (rc == DQ_OK && attn) {
        const double per = (double)d->layers * d->q_heads;
        for (size_t p = 0; p < a.npos; p++) {
            a.kl[p] /= per;
            a.err[p] /= per;
        }
        const double *anum[2] = {a.kl, a.err}, *aden[2] = {NULL, NULL};
        eval_ci ci[2];
        rc = eval_bootstrap(a.npos, 2, anum, aden, o->resamples, o->seed ^ 0xa77e5ull, ci);
        r->kl = ci[0];
        r->attn_err = ci[1];
        r->have_attn = 1;
        r->query_positions = (uint32_t)a.npos;
    }
    free(col);
    if (rc != DQ_OK) {
        eval_fail(err, errlen, rc, "out of memory");
        goto out;
    }
    for (int k = 0; k < 2; k++)
        r->bits[k] = eval_codec_bits(c, (dq_kind)k);
    r->bits_mean = eval_codec_bits_mean(c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
out:
    free(kh);
    free(vh);
    free(levels);
    free(sums);
    free(pos);
    free(abuf);
    return rc;
}

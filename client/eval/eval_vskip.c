/* dquant eval --value-mass (eval_vskip.h). */
#include "eval_vskip.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dquant/dquant.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int eval_vskip_run(const eval_data *d, const eval_codec *c, const eval_opts *o, const double *taus, size_t ntau,
                   eval_vskip_row *rows, char *err, size_t errlen)
{
    if (!d->q || !d->q_heads)
        return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "%s: the data has no queries", d->name);
    if (c->profile.codec_type != DQ_CODEC_DQUANT && c->profile.codec_type != DQ_CODEC_FIXED)
        return eval_fail(err, errlen, DQ_UNSUPPORTED, "%s: value skipping needs a D-Quant or fixed-width codec",
                         c->label);
    for (size_t i = 0; i < ntau; i++)
        if (dq_vskip_enabled(taus[i]) != 1)
            return eval_fail(err, errlen, DQ_INVALID_ARGUMENT, "value mass %g is not in (0, 1)", taus[i]);
    const size_t n = eval_data_stream_len(d), hd = d->head_dim, qh = d->q_heads, T = d->tokens;
    const uint32_t S = eval_query_stride(d, o);
    const size_t npos = (T - 1) / S + 1;
    dq_codec *codec = NULL;
    dq_workspace *ws = NULL;
    int rc = dq_codec_create(&c->profile, NULL, &codec);
    if (rc == DQ_OK)
        rc = dq_workspace_create(codec, &ws);
    float *ex = malloc(qh * hd * sizeof *ex), *out = malloc(qh * hd * sizeof *out);
    double *bound = malloc(qh * sizeof *bound);
    double *perr = calloc(ntau * npos, sizeof *perr); /* [tau][position] sums over layers and heads */
    uint64_t *cnt = calloc(6 * ntau, sizeof *cnt);    /* decoded, sealed, used, attended, blocks kept, blocks */
    uint8_t *keep = malloc(T);
    double *bsum = calloc(3 * ntau, sizeof *bsum); /* bound/||o||, held, max err per tau */
    double texact = 0, *tskip = calloc(ntau, sizeof *tskip);
    if (rc == DQ_OK && (!ex || !out || !bound || !perr || !cnt || !bsum || !tskip || !keep))
        rc = DQ_NOMEM;
    if (rc != DQ_OK) {
        eval_fail(err, errlen, rc, "%s: %s", c->label, dq_strerror(rc));
        goto out;
    }
    for (uint32_t l = 0; l < d->layers && rc == DQ_OK; l++) {
        const float *K = eval_data_slab(d, DQ_KIND_K, 0, l), *V = eval_data_slab(d, DQ_KIND_V, 0, l);
        dq_layer *layer = NULL;
        rc = dq_layer_create(codec, &layer);
        size_t have = 0;
        /* positions in increasing order: p = npos − 1 is the earliest */
        for (size_t pi = npos; pi-- > 0 && rc == DQ_OK;) {
            const size_t t = T - 1 - pi * S;
            rc = dq_layer_append(layer, ws, K + have * n, V + have * n, DQ_DTYPE_F32, t + 1 - have, NULL);
            if (rc != DQ_OK)
                break;
            have = t + 1;
            const float *q = d->q + ((size_t)l * T + t) * qh * hd;
            dq_attn_item ie = {layer, q, ex, NULL}, it = {layer, q, out, NULL};
            const double scale = 1.0 / sqrt((double)hd);
            double t0 = now_s();
            rc = dq_attend(codec, ws, (uint32_t)qh, (float)scale, &ie, 1);
            texact += now_s() - t0;
            const size_t tail = dq_layer_tail_tokens(layer);
            for (size_t ti = 0; ti < ntau && rc == DQ_OK; ti++) {
                dq_vskip_out vo = {.bound = bound, .keep = keep};
                t0 = now_s();
                rc = dq_attend_vskip(codec, ws, (uint32_t)qh, (float)scale, taus[ti], &it, &vo, 1);
                tskip[ti] += now_s() - t0;
                if (rc != DQ_OK)
                    break;
                cnt[6 * ti] += vo.values_decoded;
                cnt[6 * ti + 1] += vo.values_sealed;
                cnt[6 * ti + 2] += vo.values_decoded + tail;
                cnt[6 * ti + 3] += t + 1;
                for (size_t b0 = 0; b0 < vo.values_sealed; b0 += 16) {
                    bool any = false;
                    for (size_t s = b0; s < b0 + 16 && s < vo.values_sealed; s++)
                        any |= keep[s] != 0;
                    cnt[6 * ti + 4] += any;
                    cnt[6 * ti + 5]++;
                }
                for (size_t h = 0; h < qh; h++) {
                    double e = 0, nn = 0;
                    for (size_t j = 0; j < hd; j++) {
                        const double x = (double)out[h * hd + j] - ex[h * hd + j];
                        e += x * x;
                        nn += (double)ex[h * hd + j] * ex[h * hd + j];
                    }
                    e = sqrt(e);
                    nn = sqrt(nn);
                    const double rel = nn > 0 ? e / nn : (e > 0 ? 1.0 : 0.0);
                    perr[ti * npos + pi] += rel;
                    bsum[3 * ti] += nn > 0 ? bound[h] / nn : 0.0;
                    bsum[3 * ti + 1] += e <= bound[h];
                    bsum[3 * ti + 2] = fmax(bsum[3 * ti + 2], rel);
                }
            }
        }
        dq_layer_free(layer);
    }
    if (rc != DQ_OK) {
        eval_fail(err, errlen, rc, "%s: %s (%s)", c->label, dq_strerror(rc), dq_err_name(rc));
        goto out;
    }
    const double per = (double)d->layers * qh;
    for (size_t ti = 0; ti < ntau && rc == DQ_OK; ti++) {
        eval_vskip_row *r = &rows[ti];
        memset(r, 0, sizeof *r);
        double *pe = perr + ti * npos;
        for (size_t p = 0; p < npos; p++)
            pe[p] /= per;
        const double *num[1] = {pe}, *den[1] = {NULL};
        rc = eval_bootstrap(npos, 1, num, den, o->resamples, o->seed ^ 0x5c1bull, &r->rel_err);
        r->tau = taus[ti];
        r->decoded = cnt[6 * ti + 1] ? (double)cnt[6 * ti] / (double)cnt[6 * ti + 1] : 1.0;
        r->used = cnt[6 * ti + 3] ? (double)cnt[6 * ti + 2] / (double)cnt[6 * ti + 3] : 1.0;
        r->blocks16 = cnt[6 * ti + 5] ? (double)cnt[6 * ti + 4] / (double)cnt[6 * ti + 5] : 1.0;
        r->rel_err_max = bsum[3 * ti + 2];
        r->bound_rel = bsum[3 * ti] / (per * (double)npos);
        r->held = bsum[3 * ti + 1] / (per * (double)npos);
        r->positions = (uint32_t)npos;
        r->items = (uint32_t)(npos * d->layers);
        r->seconds_exact = texact;
        r->seconds_vskip = tskip[ti];
    }
    if (rc != DQ_OK)
        eval_fail(err, errlen, rc, "out of memory");
out:
    free(ex);
    free(out);
    free(bound);
    free(perr);
    free(cnt);
    free(bsum);
    free(tskip);
    free(keep);
    dq_workspace_free(ws);
    dq_codec_free(codec);
    return rc;
}

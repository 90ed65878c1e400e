/* The checks of a model served by the dquantd under test against libdquant in-process (served.h). */
#include "served.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client_check.h"
#include "dquant/attention.h"

srv_model srv_model_of(const char *name, uint32_t layers, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
                       const dq_codec *codec, dq_workspace *ws, const uint8_t *profile, size_t profile_len,
                       float (*val)(uint32_t id, uint32_t l, uint64_t t, uint32_t j, int is_v))
{
    return (srv_model){.name = name,
                       .layers = layers,
                       .q_heads = q_heads,
                       .kv_heads = kv_heads,
                       .head_dim = head_dim,
                       .codec = codec,
                       .ws = ws,
                       .profile = profile,
                       .profile_len = profile_len,
                       .val = val};
}

void srv_start(dqd_daemon *d, const char *const *extra)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(d, &o), 0, "could not start the daemon");
}

void srv_stop(dqd_daemon *d)
{
    if (d->pid) {
        int st = dqd_stop(d);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

dqc_client *srv_connect(const dqd_daemon *d)
{
    dqc_client *c = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(d->addr, NULL, &c, err, sizeof err), 0, "connect: %s", err);
    return c;
}

float *srv_kv(const srv_model *m, uint32_t id, uint32_t layers, uint64_t start, uint64_t n, int is_v)
{
    const uint32_t row = m->kv_heads * m->head_dim;
    float *x = malloc(layers * n * row * sizeof *x);
    cr_assert(x);
    for (uint32_t l = 0; l < layers; l++)
        for (uint64_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < row; j++)
                x[(l * n + t) * row + j] = m->val(id, l, start + t, j, is_v);
    return x;
}

const dq_codec *srv_layer_codec(const srv_model *m, uint32_t layer)
{
    return m->view ? m->view(m, layer) : m->codec;
}

bool srv_same_attend(const srv_model *m, const float *out, const float *want, size_t n, const float *lse,
                     const float *wlse, size_t nl)
{
    const double tol = m->attend_tol;
    if (tol <= 0)
        return memcmp(out, want, n * sizeof *out) == 0 && memcmp(lse, wlse, nl * sizeof *lse) == 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)out[i] - want[i]) <= tol * (1.0 + fabs((double)want[i]))))
            return false;
    for (size_t i = 0; i < nl; i++)
        if (!(fabs((double)lse[i] - wlse[i]) <= tol * (1.0 + fabs((double)wlse[i]))))
            return false;
    return true;
}

void srv_put(dqc_client *c, const srv_model *m, const char *key, dq_layer **ref, uint64_t start, uint64_t n)
{
    const uint32_t L = m->layers, row = m->kv_heads * m->head_dim;
    float *k = srv_kv(m, 1, L, start, n, 0), *v = srv_kv(m, 1, L, start, n, 1);
    dqc_put_args a = {.seq = {NULL, key, strlen(key)},
                      .model = m->name,
                      .start_token = start,
                      .num_layers = L,
                      .tokens = n,
                      .kv_heads = m->kv_heads,
                      .head_dim = m->head_dim,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    for (uint32_t l = 0; l < L; l++) {
        if (!ref[l])
            cr_assert_eq(dq_layer_create(srv_layer_codec(m, l), &ref[l]), 0);
        cr_assert_eq(dq_layer_append(ref[l], m->ws, k + l * n * row, v + l * n * row, DQ_DTYPE_F32, n, NULL), 0);
    }
    free(k);
    free(v);
}

void srv_check_seq(dqc_client *c, const srv_model *m, const char *key, dq_layer *const *ref, uint64_t tokens,
                   const char *what)
{
    const uint32_t L = m->layers, QH = m->q_heads, HD = m->head_dim, row = m->kv_heads * HD;
    const dqc_seq s = {NULL, key, strlen(key)};
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = s, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, tokens, "%s", what);
    cr_assert_eq(g.num_layers, L);
    float *want = malloc(tokens * row * sizeof *want);
    cr_assert(want);
    for (uint32_t l = 0; l < L; l++)
        for (int kind = 0; kind < 2; kind++) {
            cr_assert_eq(dq_layer_decode(ref[l], m->ws, (dq_kind)kind, 0, tokens, want, DQ_DTYPE_F32), 0);
            const float *got = (const float *)(kind ? g.v : g.k) + l * tokens * row;
            cr_assert(memcmp(got, want, tokens * row * sizeof *want) == 0, "%s: GET layer %u %s differs", what, l,
                      kind ? "V" : "K");
        }
    free(want);
    dqc_get_result_free(&g);

    dqc_raw_result raw = {0};
    OK(c, dqc_get_raw(c, &s, 0, 0, &raw));
    cr_assert_eq(raw.nlayers, L);
    cr_assert_eq(raw.profile_len, m->profile_len);
    cr_assert(memcmp(raw.profile, m->profile, m->profile_len) == 0, "%s: GET_RAW's profile differs", what);
    const size_t wb = dq_codec_window_bytes(m->codec);
    for (uint32_t l = 0; l < L; l++) {
        const dqc_raw_layer *rl = &raw.layers[l];
        cr_assert_eq(rl->windows, dq_layer_window_count(ref[l]), "%s layer %u", what, l);
        cr_assert_eq(rl->tail_tokens, dq_layer_tail_tokens(ref[l]), "%s layer %u", what, l);
        for (size_t w = 0; w < rl->windows; w++) {
            cr_assert(memcmp(rl->records + w * wb, dq_layer_window(ref[l], w), wb) == 0,
                      "%s: layer %u window %zu differs", what, l, w);
            cr_assert(!m->window_check || dq_window_check(m->codec, rl->records + w * wb) == DQ_OK,
                      "%s: layer %u window %zu fails dq_window_check", what, l, w);
        }
        const size_t tb = rl->tail_tokens * row * 2;
        cr_assert(!tb || memcmp(rl->tail_k, dq_layer_tail(ref[l], DQ_KIND_K), tb) == 0, "%s layer %u tail", what, l);
        cr_assert(!tb || memcmp(rl->tail_v, dq_layer_tail(ref[l], DQ_KIND_V), tb) == 0, "%s layer %u tail", what, l);
    }
    dqc_raw_result_free(&raw);

    const size_t qn = (size_t)QH * HD;
    float *q = malloc(L * qn * sizeof *q), *out = malloc(L * qn * sizeof *out), *lse = malloc(L * QH * sizeof *lse);
    float *rout = malloc(qn * sizeof *rout), *rlse = malloc(QH * sizeof *rlse);
    dqc_attend_item *it = malloc(L * sizeof *it);
    cr_assert(q && out && lse && rout && rlse && it);
    for (uint32_t l = 0; l < L; l++) {
        for (size_t i = 0; i < qn; i++)
            q[l * qn + i] = 0.5f * m->val(500 + l, l, 0, (uint32_t)i, 0);
        it[l] = (dqc_attend_item){.seq = s, .layer = l, .q = q + l * qn};
    }
    dqc_attend_args aa = {
        .items = it, .nitems = L, .q_heads = QH, .kv_heads = m->kv_heads, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out, lse));
    for (uint32_t l = 0; l < L; l++) {
        dq_attn_item ri = {ref[l], q + l * qn, rout, rlse};
        cr_assert_eq(dq_attend(srv_layer_codec(m, l), m->ws, QH, 1.0f / sqrtf((float)HD), &ri, 1), 0);
        cr_assert(srv_same_attend(m, out + l * qn, rout, qn, lse + l * QH, rlse, QH),
                  "%s: ATTEND of layer %u differs from dq_attend", what, l);
    }
    free(q);
    free(out);
    free(lse);
    free(rout);
    free(rlse);
    free(it);
}

void srv_attend_append(dqc_client *c, const srv_model *m, const char *key, uint32_t layer, dq_layer *ref,
                       const char *what)
{
    const uint32_t QH = m->q_heads, HD = m->head_dim, row = m->kv_heads * HD;
    const size_t qn = (size_t)QH * HD;
    float *ak = malloc(row * sizeof *ak), *av = malloc(row * sizeof *av), *q = malloc(qn * sizeof *q);
    float *out = malloc(qn * sizeof *out), *rout = malloc(qn * sizeof *rout);
    float *lse = malloc(QH * sizeof *lse), *rlse = malloc(QH * sizeof *rlse);
    cr_assert(ak && av && q && out && rout && lse && rlse);
    for (uint32_t i = 0; i < row; i++) {
        ak[i] = m->val(7, layer, 0, i, 0);
        av[i] = m->val(7, layer, 0, i, 1);
    }
    for (size_t i = 0; i < qn; i++)
        q[i] = m->val(8, layer, 0, (uint32_t)i, 0);
    dqc_attend_item it = {.seq = {NULL, key, strlen(key)}, .layer = layer, .q = q, .append_k = ak, .append_v = av};
    dqc_attend_args aa = {
        .items = &it, .nitems = 1, .q_heads = QH, .kv_heads = m->kv_heads, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out, lse));
    cr_assert_eq(dq_layer_append(ref, m->ws, ak, av, DQ_DTYPE_F32, 1, NULL), 0);
    dq_attn_item ri = {ref, q, rout, rlse};
    cr_assert_eq(dq_attend(srv_layer_codec(m, layer), m->ws, QH, 1.0f / sqrtf((float)HD), &ri, 1), 0);
    cr_assert(srv_same_attend(m, out, rout, qn, lse, rlse, QH), "%s: ATTEND with an append differs", what);
    free(ak);
    free(av);
    free(q);
    free(out);
    free(rout);
    free(lse);
    free(rlse);
}

uint8_t *srv_compress_check(dqc_client *c, const srv_model *m, int layer, int kind, const float *x, uint64_t ntok,
                            uint8_t **means_out)
{
    const dq_codec *vw = srv_layer_codec(m, layer < 0 ? 0 : (uint32_t)layer);
    const uint32_t row = m->kv_heads * m->head_dim;
    const size_t rb = dq_codec_record_bytes(m->codec, (dq_kind)kind), mb = dq_codec_mean_bytes(m->codec);
    const uint32_t W = dq_codec_profile(m->codec)->window;
    const uint64_t blocks = (ntok + W - 1) / W;
    const bool header = kind == 0 && mb;
    uint8_t *rec = calloc(ntok, rb), *means = calloc(blocks, mb ? mb : 1);
    float *dec = malloc(ntok * row * sizeof *dec);
    cr_assert(rec && means && dec);
    for (uint64_t b = 0; b < blocks; b++) {
        const uint64_t t0 = b * W, cnt = ntok - t0 < W ? ntok - t0 : W;
        cr_assert_eq(dq_tokens_encode(vw, m->ws, (dq_kind)kind, x + t0 * row, DQ_DTYPE_F32, cnt,
                                      header ? means + b * mb : NULL, rec + t0 * rb, rb, NULL),
                     0);
        cr_assert_eq(dq_tokens_decode(vw, m->ws, (dq_kind)kind, header ? means + b * mb : NULL, rec + t0 * rb, rb, cnt,
                                      dec + t0 * row, DQ_DTYPE_F32),
                     0);
    }
    dqc_compress_args ca = {.model = m->name,
                            .kv_heads = m->kv_heads,
                            .head_dim = m->head_dim,
                            .kind = kind,
                            .dtype = DQ_DTYPE_F32,
                            .x = x,
                            .tokens = ntok};
    dqc_compress_result cr = {0};
    OK(c, layer < 0 ? dqc_compress(c, &ca, &cr) : dqc_compress_layer(c, &ca, (uint32_t)layer, &cr));
    cr_assert_eq(cr.profile_len, m->profile_len);
    cr_assert(memcmp(cr.profile, m->profile, m->profile_len) == 0);
    cr_assert_eq(cr.records_bytes, ntok * rb);
    cr_assert(memcmp(cr.records, rec, ntok * rb) == 0, "COMPRESS layer %d kind %d: records differ", layer, kind);
    cr_assert_eq(cr.means_bytes, header ? blocks * mb : 0);
    cr_assert(!header || memcmp(cr.means, means, blocks * mb) == 0, "COMPRESS layer %d: window headers differ", layer);

    dqc_decompress_args da = {.profile = cr.profile,
                              .profile_len = cr.profile_len,
                              .kind = kind,
                              .tokens = ntok,
                              .means = cr.means,
                              .means_bytes = cr.means_bytes,
                              .records = cr.records,
                              .records_bytes = cr.records_bytes,
                              .out_dtype = DQ_DTYPE_F32};
    dqc_decompress_result dr = {0};
    OK(c, layer < 0 ? dqc_decompress(c, &da, &dr) : dqc_decompress_layer(c, &da, (uint32_t)layer, &dr));
    cr_assert_eq(dr.bytes, ntok * row * sizeof(float));
    cr_assert(memcmp(dr.x, dec, dr.bytes) == 0, "DECOMPRESS layer %d kind %d differs from dq_tokens_decode", layer,
              kind);
    dqc_decompress_result_free(&dr);
    dqc_compress_result_free(&cr);
    free(dec);
    if (means_out && header) {
        *means_out = means;
    } else {
        if (means_out)
            *means_out = NULL;
        free(means);
    }
    return rec;
}

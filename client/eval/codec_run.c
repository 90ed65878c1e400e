/* One layer's K or V through a codec profile and back, in memory (see codec_run.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec_run.h"
#include "dquant/error.h"

static double seconds_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

int codec_roundtrip_f32(const dq_profile *p, dq_kind kind, const float *x, size_t ntok, float *xhat, uint8_t *levels,
                        codec_rt_result *res)
{
    if (!p)
        return DQ_INVALID_ARGUMENT;
    dq_codec *c = NULL;
    int rc = dq_codec_create(p, NULL, &c);
    if (rc == DQ_OK)
        rc = codec_roundtrip_codec(c, kind, x, ntok, xhat, levels, res);
    dq_codec_free(c);
    return rc;
}

int codec_roundtrip_codec(const dq_codec *c, dq_kind kind, const float *x, size_t ntok, float *xhat, uint8_t *levels,
                          codec_rt_result *res)
{
    if (!c || !x || !xhat || !res || !ntok || (kind != DQ_KIND_K && kind != DQ_KIND_V))
        return DQ_INVALID_ARGUMENT;
    const dq_profile *p = dq_codec_profile(c);
    dq_workspace *ws = NULL;
    uint8_t *records = NULL, *means = NULL;
    int rc = dq_workspace_create(c, &ws);
    if (rc != DQ_OK)
        goto out;
    const size_t n = dq_codec_stream_len(c), W = p->window, rb = dq_codec_record_bytes(c, kind);
    const size_t nwin = (ntok + W - 1) / W, mb = dq_codec_mean_bytes(c);
    /* Keys carry a window header (D-Quant mean, KIVI scales) only when the codec has one. */
    const int header = kind == DQ_KIND_K && mb > 0;
    records = malloc(ntok * rb + 1);
    means = malloc(nwin * mb + 1);
    if (!records || !means) {
        rc = DQ_NOMEM;
        goto out;
    }
    dq_encode_stats st = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t w = 0; w < nwin; w++) {
        size_t first = w * W, cnt = ntok - first < W ? ntok - first : W;
        rc = dq_tokens_encode(c, ws, kind, x + first * n, DQ_DTYPE_F32, cnt, header ? means + w * mb : NULL,
                              records + first * rb, rb, &st);
        if (rc != DQ_OK)
            goto out;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (size_t w = 0; w < nwin; w++) {
        size_t first = w * W, cnt = ntok - first < W ? ntok - first : W;
        rc = dq_tokens_decode(c, ws, kind, header ? means + w * mb : NULL, records + first * rb, rb, cnt,
                              xhat + first * n, DQ_DTYPE_F32);
        if (rc != DQ_OK)
            goto out;
    }
    if (levels && p->codec_type == DQ_CODEC_DQUANT) {
        for (size_t t = 0; t < ntok; t++)
            if ((rc = dq_stream_decode_levels(c, kind, records + t * rb, levels + t * n)) != DQ_OK)
                goto out;
    }
    memset(res, 0, sizeof *res);
    res->streams = st.streams;
    res->tokens = ntok;
    res->retries = st.retries;
    res->fallbacks = st.fallbacks;
    res->container_bytes = p->container_bytes[kind];
    res->max_payload = st.max_payload_bytes;
    res->payload_bytes = st.payload_bytes;
    res->symbols_moved = st.symbols_moved;
    res->stored_bytes = ntok * rb + (header ? nwin * mb : 0);
    res->bits_per_value = 8.0 * (double)res->stored_bytes / ((double)ntok * n);
    res->moved_fraction = (double)st.symbols_moved / ((double)ntok * n);
    res->max_move = st.max_move;
    res->encode_s = seconds_between(&t0, &t1);
out:
    free(records);
    free(means);
    dq_workspace_free(ws);
    return rc;
}

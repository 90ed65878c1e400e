/* dquantd COMPRESS and DECOMPRESS: the codec as a stateless remote service. Work is split by
 * key-mean window (W tokens) over the workers. A per-layer calibrated (KVQ) codec encodes and decodes
 * with the view of the request's layer.
 *
 * COMPRESS reply payload: means (keys only: one mean block per W tokens, the last covering the
 * rest) then records (tokens x record bytes). DECOMPRESS takes the same two tensors back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/kvq.h"
#include "logging.h"
#include "ops_internal.h"
#include "tensor.h"
#include "work.h"

typedef struct codec_op {
    dqd_req *req;
    dqd_ctx *ctx;
    dqd_codec *codec;
    const dq_codec *view; /* dqd_codec_view of the request's layer */
    dq_kind kind;
    uint64_t tokens, blocks;
    size_t nchunks;
    dqd_tensor x;              /* COMPRESS input */
    dqd_tensor means, records; /* DECOMPRESS input */
    dq_dtype out_dtype;
    uint8_t *out;
    size_t out_len, means_len;
    int *rc;
    dq_encode_stats *stats;
} codec_op;

static void codec_op_free(codec_op *op)
{
    dqd_registry_codec_release(op->ctx->reg, op->codec);
    free(op->out);
    free(op->rc);
    free(op->stats);
    free(op);
}

static void codec_op_fail(codec_op *op, int code, const char *msg)
{
    dqd_req_fail(op->req, code, "%s", msg);
    codec_op_free(op);
}

/* The op for req with codec (referenced: given back by codec_op_free); NULL after replying to req. */
static codec_op *codec_op_with(dqd_req *req, dqd_codec *codec, dq_kind kind)
{
    codec_op *op = calloc(1, sizeof *op);
    if (!op) {
        dqd_registry_codec_release(req->ctx->reg, codec);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return NULL;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->codec = codec;
    op->view = codec->codec;
    op->kind = kind;
    return op;
}

/* Sets op's view of model layer `layer`; on failure replies (op freed) and returns false. */
static bool codec_op_layer(codec_op *op, uint32_t layer)
{
    op->view = dqd_codec_view(op->codec, layer);
    if (op->view)
        return true;
    char msg[160];
    snprintf(msg, sizeof msg, "layer %u outside the profile's calibration of %u layers", layer,
             op->codec->calib_layers);
    codec_op_fail(op, DQ_OUT_OF_BOUNDS, msg);
    return false;
}

/* The op for req with the codec of profile p; on failure replies to req and returns NULL. */
static codec_op *codec_op_new(dqd_req *req, const dq_profile *p, dq_kind kind)
{
    dqd_codec *codec;
    int rc = dqd_registry_codec(req->ctx->reg, p, &codec);
    if (rc == DQ_PROFILE && p->codec_type == DQ_CODEC_KVQ && dq_profile_needs_calibration(p)) {
        dqd_req_fail(req, rc,
                     "profile '%s' needs a calibration: register a model with it (REGISTER_MODEL calibration) and "
                     "compress with that model",
                     p->name);
        return NULL;
    }
    if (rc < 0) {
        dqd_req_fail(req, rc, "cannot create the codec: %s", dq_strerror(rc));
        return NULL;
    }
    return codec_op_with(req, codec, kind);
}

/* Replies with op->out as the payload and frees op. */
static void codec_op_reply(codec_op *op, Dquant__Response *resp)
{
    uint8_t *out = op->out;
    op->out = NULL;
    dqd_req_reply(op->req, resp, out, op->out_len);
    codec_op_free(op);
}

static void block_range(const codec_op *op, size_t c, uint64_t *lo, uint64_t *hi)
{
    *lo = op->blocks * c / op->nchunks;
    *hi = op->blocks * (c + 1) / op->nchunks;
}

/* ---- COMPRESS ---- */

static void compress_task(void *arg, size_t c)
{
    codec_op *op = arg;
    const dq_profile *p = &op->codec->profile;
    size_t n = op->codec->n, esize = dqd_dtype_size(op->x.dtype), rb = op->codec->record_bytes[op->kind];
    uint64_t lo, hi;
    block_range(op, c, &lo, &hi);
    dq_workspace *ws = dqd_codec_ws_take(op->codec);
    if (!ws) {
        op->rc[c] = DQ_NOMEM;
        return;
    }
    for (uint64_t b = lo; b < hi && op->rc[c] == 0; b++) {
        uint64_t t0 = b * p->window;
        size_t ntok = (size_t)(op->tokens - t0 < p->window ? op->tokens - t0 : p->window);
        dqd_tensor slice = op->x;
        slice.data = op->x.data + t0 * n * esize;
        slice.len = ntok * n * esize;
        const void *src;
        void *tmp;
        op->rc[c] = dqd_tensor_aligned(&slice, &src, &tmp);
        if (op->rc[c] < 0)
            break;
        uint8_t *mean = op->kind == DQ_KIND_K && op->codec->mean_bytes ? op->out + b * op->codec->mean_bytes : NULL;
        uint8_t *rec = op->out + op->means_len + t0 * rb;
        op->rc[c] = dq_tokens_encode(op->view, ws, op->kind, src, dqd_tensor_dtype(&op->x), ntok, mean, rec, rb,
                                     &op->stats[c]);
        free(tmp);
    }
    dqd_codec_ws_give(op->codec, ws);
}

static void compress_done(void *arg)
{
    codec_op *op = arg;
    dq_encode_stats total = {0};
    for (size_t c = 0; c < op->nchunks; c++) {
        if (op->rc[c] < 0) {
            codec_op_fail(op, op->rc[c],
                          op->rc[c] == DQ_NONFINITE ? "x holds NaN or infinity" : dq_strerror(op->rc[c]));
            return;
        }
        total.streams += op->stats[c].streams;
        total.retries += op->stats[c].retries;
    }
    Dquant__CompressReply r = DQUANT__COMPRESS_REPLY__INIT;
    Dquant__Tensor tm, tr;
    uint64_t sm[2], sr[2];
    const uint64_t mshape[2] = {op->kind == DQ_KIND_K ? op->blocks : 0, op->codec->mean_bytes};
    const uint64_t rshape[2] = {op->tokens, op->codec->record_bytes[op->kind]};
    dqd_reply_tensor(&tm, sm, DQUANT__DTYPE__RAW, mshape, 2, 0, op->means_len);
    dqd_reply_tensor(&tr, sr, DQUANT__DTYPE__RAW, rshape, 2, op->means_len, op->out_len - op->means_len);
    r.profile.data = op->codec->pbytes;
    r.profile.len = op->codec->plen;
    r.tokens = op->tokens;
    r.means = &tm;
    r.records = &tr;
    r.bits_per_value = (double)op->out_len * 8.0 / ((double)op->tokens * op->codec->n);
    r.retries = total.retries;
    op->ctx->metrics.compress_tokens += op->tokens;
    op->ctx->metrics.streams_encoded += total.streams;
    op->ctx->metrics.encode_retries += total.retries;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_COMPRESS;
    resp.compress = &r;
    codec_op_reply(op, &resp);
}

void dqd_op_compress(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    const Dquant__Compress *c = req->msg->compress;
    dq_profile builtin;
    int rc;
    codec_op *op;
    if (c->model && *c->model) {
        dqd_model *m = dqd_registry_find(ctx->reg, c->model);
        if (!m) {
            dqd_req_fail(req, DQ_NOT_FOUND, "no model named '%s'", c->model);
            return;
        }
        if (c->layer >= m->layers) {
            dqd_req_fail(req, DQ_OUT_OF_BOUNDS, "layer %u outside model '%s' of %u layers", c->layer, m->name,
                         m->layers);
            return;
        }
        /* The model's own codec: its calibration included. */
        dqd_registry_codec_ref(ctx->reg, m->codec);
        op = codec_op_with(req, m->codec, c->kind ? DQ_KIND_V : DQ_KIND_K);
    } else {
        rc = dq_profile_builtin(c->profile_name, c->kv_heads, c->head_dim, &builtin);
        if (rc < 0) {
            dqd_req_fail(req, rc, "built-in profile '%s' unavailable for %u x %u: %s", c->profile_name, c->kv_heads,
                         c->head_dim, dq_strerror(rc));
            return;
        }
        op = codec_op_new(req, &builtin, c->kind ? DQ_KIND_V : DQ_KIND_K);
    }
    if (!op || !codec_op_layer(op, c->layer))
        return;
    const dqd_codec *codec = op->codec;

    dqd_profile_info info;
    dqd_profile_info_of(codec, &info);
    char msg[256];
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    rc = dqd_validate_compress(c, &pl, &info, &op->x, msg, sizeof msg);
    if (rc < 0) {
        codec_op_fail(op, rc, msg);
        return;
    }
    uint32_t W = codec->profile.window;
    op->tokens = op->x.shape[0];
    op->blocks = op->tokens / W + (op->tokens % W != 0);
    op->means_len = op->kind == DQ_KIND_K ? (size_t)(op->blocks * codec->mean_bytes) : 0;
    uint64_t rb = codec->record_bytes[op->kind];
    if (op->means_len > ctx->cfg->max_payload || op->tokens > (ctx->cfg->max_payload - op->means_len) / rb) {
        codec_op_fail(op, DQ_TOO_LARGE, "the reply would exceed max_payload; compress fewer tokens");
        return;
    }
    op->out_len = op->means_len + (size_t)(op->tokens * rb);
    op->nchunks = dqd_tasks_split(ctx, (size_t)op->blocks);
    op->out = dqd_req_out_alloc(op->req, op->out_len);
    op->rc = calloc(op->nchunks, sizeof *op->rc);
    op->stats = calloc(op->nchunks, sizeof *op->stats);
    if (!op->out || !op->rc || !op->stats || dqd_tasks_run(ctx, op->nchunks, compress_task, compress_done, op) < 0)
        codec_op_fail(op, DQ_NOMEM, "out of memory");
}

/* ---- DECOMPRESS ---- */

static void decompress_task(void *arg, size_t c)
{
    codec_op *op = arg;
    const dq_profile *p = &op->codec->profile;
    size_t n = op->codec->n, esize = dq_dtype_size(op->out_dtype), rb = op->codec->record_bytes[op->kind];
    uint64_t lo, hi;
    block_range(op, c, &lo, &hi);
    dq_workspace *ws = dqd_codec_ws_take(op->codec);
    if (!ws) {
        op->rc[c] = DQ_NOMEM;
        return;
    }
    for (uint64_t b = lo; b < hi; b++) {
        uint64_t t0 = b * p->window;
        size_t ntok = (size_t)(op->tokens - t0 < p->window ? op->tokens - t0 : p->window);
        const uint8_t *mean = op->kind == DQ_KIND_K && op->codec->mean_bytes
                                  ? op->means.data + b * op->codec->mean_bytes
                                  : NULL;
        int rc = dq_tokens_decode(op->view, ws, op->kind, mean, op->records.data + t0 * rb, rb, ntok,
                                  op->out + t0 * n * esize, op->out_dtype);
        if (rc < 0 && op->rc[c] == 0)
            op->rc[c] = rc;
    }
    dqd_codec_ws_give(op->codec, ws);
}

static void decompress_done(void *arg)
{
    codec_op *op = arg;
    for (size_t c = 0; c < op->nchunks; c++) {
        if (op->rc[c] < 0) {
            codec_op_fail(op, op->rc[c],
                          op->rc[c] == DQ_CORRUPT ? "a record is not a valid container" : dq_strerror(op->rc[c]));
            return;
        }
    }
    Dquant__DecompressReply r = DQUANT__DECOMPRESS_REPLY__INIT;
    Dquant__Tensor tx;
    uint64_t sx[3];
    const uint64_t shape[3] = {op->tokens, op->codec->profile.kv_heads, op->codec->profile.head_dim};
    dqd_reply_tensor(&tx, sx, (Dquant__DType)op->out_dtype, shape, 3, 0, op->out_len);
    r.x = &tx;
    op->ctx->metrics.decompress_tokens += op->tokens;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_DECOMPRESS;
    resp.decompress = &r;
    codec_op_reply(op, &resp);
}

void dqd_op_decompress(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    const Dquant__Decompress *d = req->msg->decompress;
    dqd_codec *cached;
    int rc = dqd_registry_codec_bytes(ctx->reg, d->profile.data, d->profile.len, &cached);
    if (rc == DQ_PROFILE) {
        dq_profile p;
        if (dq_profile_deserialize(d->profile.data, d->profile.len, &p) == DQ_OK && p.codec_type == DQ_CODEC_KVQ &&
            p.kvq_calib_hash) {
            dqd_req_fail(req, rc,
                         "profile '%s' is calibrated and no registered model has its calibration: register the "
                         "model first",
                         p.name);
            return;
        }
    }
    if (rc < 0) {
        dqd_req_fail(req, rc, "profile rejected: %s", dq_strerror(rc));
        return;
    }
    codec_op *op = codec_op_with(req, cached, d->kind ? DQ_KIND_V : DQ_KIND_K);
    if (!op || !codec_op_layer(op, d->layer))
        return;
    const dqd_codec *codec = op->codec;
    op->out_dtype = (dq_dtype)d->out_dtype;
    op->tokens = d->tokens;

    dqd_profile_info info;
    dqd_profile_info_of(codec, &info);
    char msg[256];
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    rc = dqd_validate_decompress(d, &pl, &info, &op->means, &op->records, msg, sizeof msg);
    if (rc < 0) {
        codec_op_fail(op, rc, msg);
        return;
    }
    uint64_t per = (uint64_t)codec->n * dq_dtype_size(op->out_dtype);
    if (op->tokens > ctx->cfg->max_payload / per) {
        codec_op_fail(op, DQ_TOO_LARGE, "the reply would exceed max_payload; decompress fewer tokens");
        return;
    }
    uint32_t W = codec->profile.window;
    op->blocks = op->tokens / W + (op->tokens % W != 0);
    op->out_len = (size_t)(op->tokens * per);
    op->nchunks = dqd_tasks_split(ctx, (size_t)op->blocks);
    op->out = dqd_req_out_alloc(op->req, op->out_len);
    op->rc = calloc(op->nchunks, sizeof *op->rc);
    if (!op->out || !op->rc || dqd_tasks_run(ctx, op->nchunks, decompress_task, decompress_done, op) < 0)
        codec_op_fail(op, DQ_NOMEM, "out of memory");
}

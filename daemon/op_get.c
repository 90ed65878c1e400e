/* dquantd GET: a token range of a layer range, decoded to f16/bf16/f32 on the workers (one task
 * per layer and kind), or GET_RAW: the profile plus each layer's window records and BF16 tail.
 * A layer in GPU memory (cuda backend) is decoded there (dqcu_decompress) or its records copied
 * out; GET never moves layers between tiers. */
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "ctx.h"
#include "dquant/error.h"
#include "gpu.h"
#include "logging.h"
#include "ops_internal.h"
#include "work.h"

typedef struct get_op {
    dqd_req *req;
    dqd_ctx *ctx;
    const Dquant__Get *get;
    dqd_access_set as;
    dqd_seq *seq;
    dqd_codec *codec;
    uint32_t first, num;
    uint64_t start, tokens;
    dq_dtype dtype;
    size_t esize;
    uint8_t *out;
    size_t out_len;
    uint8_t *dout;     /* nccl_reply: the reply in device memory (out stays NULL) */
    int alloc_rc;
    size_t *raw_off;   /* GET_RAW: per layer offset of its records */
    int *rc;
} get_op;

static void get_free(get_op *op)
{
    dqd_access_end(&op->as);
    if (op->dout)
        dqd_gpu_free_transient(op->ctx->gpu, op->dout);
    free(op->out);
    free(op->raw_off);
    free(op->rc);
    free(op);
}

static void get_fail(get_op *op, int code, const char *msg)
{
    dqd_req_fail(op->req, code, "%s", msg);
    get_free(op);
}

/* ---- typed ---- */

static void decode_task(void *arg, size_t i)
{
    get_op *op = arg;
    size_t layer = i / 2;
    dq_kind kind = (i & 1) ? DQ_KIND_V : DQ_KIND_K;
    size_t per_layer = (size_t)op->tokens * op->codec->n * op->esize;
    size_t off = (kind == DQ_KIND_V ? op->out_len / 2 : 0) + layer * per_layer;
    const dqd_glayer *g = dqd_seq_glayer(op->seq, op->first + (uint32_t)layer);
    if (op->dout) {
        /* NCCL reply: decoded into device memory, from GPU layers directly, host layers via a copy. */
        if (g) {
            op->rc[i] = dqd_gpu_decode_dev(op->ctx->gpu, op->codec, g, kind, (size_t)op->start, (size_t)op->tokens,
                                           op->dout + off, op->dtype);
            return;
        }
        uint8_t *tmp = malloc(per_layer ? per_layer : 1);
        dq_workspace *ws = dqd_codec_ws_take(op->codec);
        int rc = tmp && ws ? DQ_OK : DQ_NOMEM;
        if (rc == DQ_OK)
            rc = dq_layer_decode(op->seq->layers[op->first + layer], ws, kind, (size_t)op->start, (size_t)op->tokens,
                                 tmp, op->dtype);
        if (ws)
            dqd_codec_ws_give(op->codec, ws);
        if (rc == DQ_OK)
            rc = dqd_gpu_h2d(op->ctx->gpu, op->dout + off, tmp, per_layer);
        free(tmp);
        op->rc[i] = rc;
        return;
    }
    uint8_t *dst = op->out + off;
    if (g) {
        op->rc[i] = dqd_gpu_decode(op->ctx->gpu, op->codec, g, kind, (size_t)op->start, (size_t)op->tokens, dst,
                                   op->dtype);
        return;
    }
    dq_workspace *ws = dqd_codec_ws_take(op->codec);
    if (!ws) {
        op->rc[i] = DQ_NOMEM;
        return;
    }
    op->rc[i] = dq_layer_decode(op->seq->layers[op->first + layer], ws, kind, (size_t)op->start,
                                (size_t)op->tokens, dst, op->dtype);
    dqd_codec_ws_give(op->codec, ws);
}

/* Replies with r and op->out as the payload; the caller frees op. */
static void get_reply(get_op *op, Dquant__GetReply *r)
{
    dqd_store_touch(op->ctx->store, op->seq);
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_GET;
    resp.get = r;
    if (op->dout) {
        uint8_t *dout = op->dout;
        op->dout = NULL;
        dqd_req_reply_nccl(op->req, &resp, dout, true, op->out_len);
        return;
    }
    uint8_t *out = op->out;
    op->out = NULL;
    dqd_req_reply(op->req, &resp, out, op->out_len);
}

static void reply_typed(get_op *op)
{
    const dqd_model *m = op->seq->model;
    Dquant__GetReply r = DQUANT__GET_REPLY__INIT;
    Dquant__Tensor tk, tv;
    uint64_t sk[4], sv[4];
    const uint64_t shape[4] = {op->num, op->tokens, m->kv_heads, m->head_dim};
    Dquant__DType dt = (Dquant__DType)op->dtype;
    dqd_reply_tensor(&tk, sk, dt, shape, 4, 0, op->out_len / 2);
    dqd_reply_tensor(&tv, sv, dt, shape, 4, op->out_len / 2, op->out_len / 2);
    r.start_token = op->start;
    r.tokens = op->tokens;
    r.k = &tk;
    r.v = &tv;
    op->ctx->metrics.tokens_get += op->tokens * op->num;
    get_reply(op, &r);
    get_free(op);
}

static void decode_done(void *arg)
{
    get_op *op = arg;
    for (size_t i = 0; i < (size_t)op->num * 2; i++) {
        if (op->rc[i] < 0) {
            get_fail(op, op->rc[i], dq_strerror(op->rc[i]));
            return;
        }
    }
    reply_typed(op);
}

/* NCCL reply: the device buffer the decodes write (on a worker: the allocation is stream-ordered). */
static void alloc_task(void *arg, size_t i)
{
    get_op *op = arg;
    (void)i;
    void *p = NULL;
    op->alloc_rc = dqd_gpu_alloc_transient(op->ctx->gpu, op->out_len, &p);
    op->dout = p;
}

static void alloc_done(void *arg)
{
    get_op *op = arg;
    if (op->alloc_rc < 0) {
        get_fail(op, op->alloc_rc, "cannot allocate the reply in GPU memory");
        return;
    }
    if (dqd_tasks_run(op->ctx, (size_t)op->num * 2, decode_task, decode_done, op) < 0)
        get_fail(op, DQ_NOMEM, "out of memory");
}

static void get_typed(get_op *op)
{
    dqd_ctx *ctx = op->ctx;
    const Dquant__Get *g = op->get;
    static const dq_dtype fmt_dtype[3] = {DQ_DTYPE_F16, DQ_DTYPE_BF16, DQ_DTYPE_F32};
    op->dtype = fmt_dtype[g->format];
    op->esize = dq_dtype_size(op->dtype);

    uint64_t end = UINT64_MAX;
    for (uint32_t i = 0; i < op->num; i++) {
        uint64_t have = dqd_seq_layer_tokens(op->seq, op->first + i);
        if (g->tokens) {
            if (g->start_token + g->tokens > have) {
                char msg[160];
                snprintf(msg, sizeof msg, "layer %u holds %llu tokens; asked for [%llu, %llu)", op->first + i,
                         (unsigned long long)have, (unsigned long long)g->start_token,
                         (unsigned long long)(g->start_token + g->tokens));
                get_fail(op, DQ_OUT_OF_BOUNDS, msg);
                return;
            }
        } else if (have < end) {
            end = have;
        }
    }
    if (g->tokens)
        end = g->start_token + g->tokens;
    if (g->start_token > end) {
        get_fail(op, DQ_OUT_OF_BOUNDS, "start_token lies past the end of the requested layers");
        return;
    }
    op->start = g->start_token;
    op->tokens = end - g->start_token;

    uint64_t n = op->codec->n;
    uint64_t per = n * op->esize * 2;
    if (op->tokens && (uint64_t)op->num * op->tokens > ctx->cfg->max_payload / per) {
        get_fail(op, DQ_TOO_LARGE, "the reply would exceed max_payload; ask for fewer tokens or layers");
        return;
    }
    op->out_len = (size_t)(op->num * op->tokens * per);
    if (!op->out_len) {
        reply_typed(op);
        return;
    }
    op->rc = calloc((size_t)op->num * 2, sizeof *op->rc);
    if (!op->rc) {
        get_fail(op, DQ_NOMEM, "out of memory");
        return;
    }
    if (op->req->msg->nccl_reply) {
        if (dqd_tasks_run(ctx, 1, alloc_task, alloc_done, op) < 0)
            get_fail(op, DQ_NOMEM, "out of memory");
        return;
    }
    op->out = dqd_out_alloc(op->out_len);
    if (!op->out || dqd_tasks_run(ctx, (size_t)op->num * 2, decode_task, decode_done, op) < 0)
        get_fail(op, DQ_NOMEM, "out of memory");
}

/* ---- raw ---- */

static void copy_task(void *arg, size_t i)
{
    get_op *op = arg;
    const dqd_glayer *g = dqd_seq_glayer(op->seq, op->first + (uint32_t)i);
    if (g) {
        op->rc[i] = dqd_gpu_copy_raw(op->ctx->gpu, op->codec, g, op->out + op->raw_off[i]);
        return;
    }
    const dq_layer *l = op->seq->layers[op->first + i];
    if (!l)
        return;
    size_t nwin = dq_layer_window_count(l), wb = op->codec->window_bytes;
    uint8_t *dst = op->out + op->raw_off[i];
    for (size_t w = 0; w < nwin; w++)
        memcpy(dst + w * wb, dq_layer_window(l, w), wb);
    dst += nwin * wb;
    size_t tail = dq_layer_tail_tokens(l) * op->codec->n * sizeof(uint16_t);
    if (tail) {
        memcpy(dst, dq_layer_tail(l, DQ_KIND_K), tail);
        memcpy(dst + tail, dq_layer_tail(l, DQ_KIND_V), tail);
    }
}

static void copy_done(void *arg)
{
    get_op *op = arg;
    const dqd_model *m = op->seq->model;
    size_t n = op->num;
    for (size_t i = 0; op->rc && i < n; i++) {
        if (op->rc[i] < 0) {
            get_fail(op, op->rc[i], dq_strerror(op->rc[i]));
            return;
        }
    }
    Dquant__RawLayer *layers = calloc(n, sizeof *layers);
    Dquant__RawLayer **ptrs = calloc(n, sizeof *ptrs);
    Dquant__Tensor *t = calloc(n * 3, sizeof *t);
    uint64_t *shapes = calloc(n * 3 * 3, sizeof *shapes);
    if (!layers || !ptrs || !t || !shapes) {
        free(layers);
        free(ptrs);
        free(t);
        free(shapes);
        get_fail(op, DQ_NOMEM, "out of memory");
        return;
    }
    size_t wb = op->codec->window_bytes;
    for (size_t i = 0; i < n; i++) {
        uint32_t layer = op->first + (uint32_t)i;
        uint64_t nwin = dqd_seq_layer_windows(op->seq, layer);
        uint64_t tail = dqd_seq_layer_tail(op->seq, layer);
        uint64_t off = op->raw_off[i];
        uint64_t rec_len = nwin * wb;
        uint64_t tail_len = tail * op->codec->n * 2;
        const uint64_t rshape[2] = {nwin, wb};
        const uint64_t tshape[3] = {tail, m->kv_heads, m->head_dim};
        dquant__raw_layer__init(&layers[i]);
        layers[i].layer = op->first + (uint32_t)i;
        layers[i].tokens = dqd_seq_layer_tokens(op->seq, layer);
        layers[i].windows = nwin;
        dqd_reply_tensor(&t[3 * i], &shapes[9 * i], DQUANT__DTYPE__RAW, rshape, 2, off, rec_len);
        dqd_reply_tensor(&t[3 * i + 1], &shapes[9 * i + 3], DQUANT__DTYPE__BF16, tshape, 3, off + rec_len, tail_len);
        dqd_reply_tensor(&t[3 * i + 2], &shapes[9 * i + 6], DQUANT__DTYPE__BF16, tshape, 3, off + rec_len + tail_len,
                         tail_len);
        layers[i].records = &t[3 * i];
        layers[i].tail_k = &t[3 * i + 1];
        layers[i].tail_v = &t[3 * i + 2];
        ptrs[i] = &layers[i];
    }
    Dquant__GetReply r = DQUANT__GET_REPLY__INIT;
    r.profile.data = op->codec->pbytes;
    r.profile.len = op->codec->plen;
    r.n_raw = n;
    r.raw = ptrs;
    get_reply(op, &r);
    free(layers);
    free(ptrs);
    free(t);
    free(shapes);
    get_free(op);
}

static void get_raw(get_op *op)
{
    dqd_ctx *ctx = op->ctx;
    op->raw_off = calloc(op->num, sizeof *op->raw_off);
    if (!op->raw_off) {
        get_fail(op, DQ_NOMEM, "out of memory");
        return;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < op->num; i++) {
        op->raw_off[i] = (size_t)total;
        total += dqd_seq_layer_windows(op->seq, op->first + i) * op->codec->window_bytes +
                 dqd_seq_layer_tail(op->seq, op->first + i) * op->codec->n * 4u;
        if (total > ctx->cfg->max_payload) {
            get_fail(op, DQ_TOO_LARGE, "the raw reply would exceed max_payload; ask for fewer layers");
            return;
        }
    }
    op->out_len = (size_t)total;
    if (!total) {
        copy_done(op);
        return;
    }
    op->out = dqd_out_alloc(op->out_len);
    op->rc = calloc(op->num, sizeof *op->rc);
    if (!op->out || !op->rc || dqd_tasks_run(ctx, op->num, copy_task, copy_done, op) < 0)
        get_fail(op, DQ_NOMEM, "out of memory");
}

static void get_ready(dqd_access_set *as)
{
    get_op *op = as->arg;
    op->seq = as->items[0].seq;
    if (!dqd_seq_alive(op->seq)) {
        get_fail(op, DQ_NOT_FOUND, "no such sequence");
        return;
    }
    op->codec = op->seq->model->codec;
    dqd_model_info info;
    dqd_model_info_of(op->seq->model, &info);
    char msg[256];
    int rc = dqd_validate_get(op->get, &info, &op->first, &op->num, msg, sizeof msg);
    if (rc < 0) {
        get_fail(op, rc, msg);
        return;
    }
    if (op->get->format == DQUANT__GET_FORMAT__GET_RAW)
        get_raw(op);
    else
        get_typed(op);
}

void dqd_op_get(dqd_req *req)
{
    dqd_seq *seq = dqd_ops_lookup(req, req->msg->get->seq);
    if (!seq) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no such sequence");
        return;
    }
    get_op *op = calloc(1, sizeof *op);
    if (!op || dqd_access_init(&op->as, 1) < 0) {
        free(op);
        dqd_seq_unref(seq);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->get = req->msg->get;
    dqd_access_add(&op->as, seq, DQD_ACCESS_READ);
    dqd_access_start(&op->as, get_ready, op);
}

/* dquantd GET: a token range of a layer range, decoded to f16/bf16/f32 on the workers (one task
 * per layer and kind), or GET_RAW: the profile plus each layer's window records and BF16 tail.
 * Each layer is read in the tier it is in (tier.h); GET never moves layers between tiers.
 *
 * The operation is a state machine (get_state, get_step), its states in the order they run:
 * ACCESS (read access on the sequence) → VALIDATE (the sequence is alive, the layer range valid)
 * → typed: RANGE (token range, reply size) → ALLOC_DEVICE (an NCCL reply: device memory, on a
 * worker) → DECODE (the decode tasks) → REPLY; raw: RAW_SIZE (offsets) → RAW_COPY (the copy
 * tasks) → REPLY. A state that waits (access, tasks) returns; its callback moves on. */
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "ctx.h"
#include "dquant/error.h"
#include "logging.h"
#include "ops_internal.h"
#include "tier.h"
#include "work.h"

typedef enum get_state {
    GET_ACCESS,
    GET_VALIDATE,
    GET_RANGE,
    GET_ALLOC_DEVICE,
    GET_DECODE,
    GET_RAW_SIZE,
    GET_RAW_COPY,
    GET_REPLY,
} get_state;

typedef struct get_op {
    dqd_req *req;
    dqd_seq **chunks; /* a GET of chunks: their entries in order (seq is chunks[0]); NULL otherwise */
    size_t nchunks;
    dqd_ctx *ctx;
    get_state state;
    bool raw; /* GET_RAW */
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
    uint8_t *dout; /* nccl_reply: the reply in device memory (out stays NULL) */
    int alloc_rc;
    size_t *raw_off; /* GET_RAW: per layer offset of its records */
    int *rc;
} get_op;

static void get_free(get_op *op)
{
    dqd_access_end(&op->as);
    dqd_tier_free_device(op->ctx, op->dout);
    free(op->out);
    free(op->raw_off);
    free(op->rc);
    free(op->chunks);
    free(op);
}

static void get_fail(get_op *op, int code, const char *msg)
{
    dqd_req_fail(op->req, code, "%s", msg);
    get_free(op);
}

/* The first failed task's code, or 0. */
static int first_error(const get_op *op, size_t n)
{
    for (size_t i = 0; op->rc && i < n; i++)
        if (op->rc[i] < 0)
            return op->rc[i];
    return 0;
}

/* Replies with r and op->out (or op->dout) as the payload; the caller frees op. */
static void get_reply(get_op *op, Dquant__GetReply *r)
{
    dqd_store_touch(op->ctx->store, op->seq);
    for (size_t c = 1; c < op->nchunks; c++)
        dqd_store_touch(op->ctx->store, op->chunks[c]);
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

/* Decode tasks: (layer, kind) of the sequence, or of every chunk. */
static size_t ntasks(const get_op *op)
{
    return (size_t)op->num * 2 * (op->chunks ? op->nchunks : 1);
}

/* The states' work, defined below in the order the states run. */
static void access_ready(dqd_access_set *as);
static int get_validate(get_op *op);
static int get_range(get_op *op);
static void alloc_task(void *arg, size_t i);
static void alloc_done(void *arg);
static void decode_task(void *arg, size_t i);
static void decode_done(void *arg);
static int get_raw_size(get_op *op);
static void copy_task(void *arg, size_t i);
static void copy_done(void *arg);
static void reply_typed(get_op *op);
static void reply_raw(get_op *op);

/* The entries a GET reads: its chunks, or the one sequence. */
static size_t raw_parts(const get_op *op)
{
    return op->chunks ? op->nchunks : 1;
}

static const dqd_seq *raw_part(const get_op *op, size_t c)
{
    return op->chunks ? op->chunks[c] : op->seq;
}

/* Runs the operation from op->state until it waits (access, tasks) or has finished. */
static void get_step(get_op *op)
{
    dqd_ctx *ctx = op->ctx;
    for (;;) {
        switch (op->state) {
        case GET_ACCESS:
            dqd_access_start(&op->as, access_ready, op);
            return;
        case GET_VALIDATE:
            if (get_validate(op) < 0)
                return;
            op->state = op->raw ? GET_RAW_SIZE : GET_RANGE;
            break;
        case GET_RANGE:
            if (get_range(op) < 0)
                return;
            op->state = !op->out_len ? GET_REPLY : op->req->msg->nccl_reply ? GET_ALLOC_DEVICE : GET_DECODE;
            break;
        case GET_ALLOC_DEVICE:
            if (dqd_tasks_run(ctx, 1, alloc_task, alloc_done, op) < 0)
                get_fail(op, DQ_NOMEM, "out of memory");
            return;
        case GET_DECODE:
            if (!op->dout)
                op->out = dqd_req_out_alloc(op->req, op->out_len);
            if ((!op->dout && !op->out) || dqd_tasks_run(ctx, ntasks(op), decode_task, decode_done, op) < 0)
                get_fail(op, DQ_NOMEM, "out of memory");
            return;
        case GET_RAW_SIZE:
            if (get_raw_size(op) < 0)
                return;
            op->state = op->out_len ? GET_RAW_COPY : GET_REPLY;
            break;
        case GET_RAW_COPY:
            op->out = dqd_req_out_alloc(op->req, op->out_len);
            op->rc = calloc(op->num * raw_parts(op), sizeof *op->rc);
            if (!op->out || !op->rc || dqd_tasks_run(ctx, op->num * raw_parts(op), copy_task, copy_done, op) < 0)
                get_fail(op, DQ_NOMEM, "out of memory");
            return;
        case GET_REPLY:
            if (op->raw)
                reply_raw(op);
            else
                reply_typed(op);
            return;
        }
    }
}

/* A GET of chunks: every chunk held, read access to them all; one chunk after the other in the
 * reply. */
static void get_chunks(dqd_req *req)
{
    const Dquant__Get *g = req->msg->get;
    const char *ns = g->chunk_ns ? g->chunk_ns : "";
    get_op *op = calloc(1, sizeof *op);
    if (op)
        op->chunks = calloc(g->n_chunk_keys, sizeof *op->chunks);
    if (!op || !op->chunks || dqd_access_init(&op->as, g->n_chunk_keys) < 0) {
        if (op)
            free(op->chunks);
        free(op);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->get = g;
    op->nchunks = g->n_chunk_keys;
    for (size_t c = 0; c < op->nchunks; c++) {
        dqd_seq *seq = dqd_store_lookup_kind(req->ctx->store, ns, strlen(ns), g->chunk_keys[c].data,
                                             g->chunk_keys[c].len, DQD_KIND_CHUNK);
        if (!seq) {
            char msg[64];
            snprintf(msg, sizeof msg, "chunk %zu not held", c);
            get_fail(op, DQ_NOT_FOUND, msg);
            return;
        }
        op->chunks[c] = seq;
        dqd_access_add(&op->as, seq, DQD_ACCESS_READ);
    }
    op->state = GET_ACCESS;
    get_step(op);
}

void dqd_op_get(dqd_req *req)
{
    if (req->msg->get->n_chunk_keys) {
        get_chunks(req);
        return;
    }
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
    op->state = GET_ACCESS;
    dqd_access_add(&op->as, seq, DQD_ACCESS_READ);
    get_step(op);
}

static void access_ready(dqd_access_set *as)
{
    get_op *op = as->arg;
    op->seq = op->chunks ? op->chunks[0] : as->items[0].seq;
    op->state = GET_VALIDATE;
    get_step(op);
}

static int get_validate(get_op *op)
{
    if (!dqd_seq_alive(op->seq)) {
        get_fail(op, DQ_NOT_FOUND, op->chunks ? "chunk 0 not held" : "no such sequence");
        return -1;
    }
    for (size_t c = 1; c < op->nchunks; c++) {
        if (!dqd_seq_alive(op->chunks[c]) || op->chunks[c]->model != op->seq->model) {
            get_fail(op, DQ_NOT_FOUND, "a chunk is not held (or of another model)");
            return -1;
        }
    }
    op->codec = op->seq->model->codec;
    dqd_model_info info;
    dqd_model_info_of(op->seq->model, &info);
    char msg[256];
    int rc = dqd_validate_get(op->get, &info, &op->first, &op->num, msg, sizeof msg);
    if (rc < 0) {
        get_fail(op, rc, msg);
        return -1;
    }
    op->raw = op->get->format == DQUANT__GET_FORMAT__GET_RAW;
    return 0;
}

/* Typed: the token range (every layer must hold it; without a count, up to the shortest layer)
 * and the reply's size. */
static int get_range(get_op *op)
{
    const Dquant__Get *g = op->get;
    static const dq_dtype fmt_dtype[3] = {DQ_DTYPE_F16, DQ_DTYPE_BF16, DQ_DTYPE_F32};
    op->dtype = fmt_dtype[g->format];
    op->esize = dq_dtype_size(op->dtype);

    if (op->chunks) { /* whole chunks, one after the other */
        op->start = 0;
        op->tokens = (uint64_t)op->nchunks * op->seq->model->chunk_tokens;
    }
    uint64_t end = UINT64_MAX;
    for (uint32_t i = 0; i < op->num && !op->chunks; i++) {
        uint64_t have = dqd_seq_layer_tokens(op->seq, op->first + i);
        if (g->tokens) {
            if (g->start_token + g->tokens > have) {
                char msg[160];
                snprintf(msg, sizeof msg, "layer %u holds %llu tokens; asked for [%llu, %llu)", op->first + i,
                         (unsigned long long)have, (unsigned long long)g->start_token,
                         (unsigned long long)(g->start_token + g->tokens));
                get_fail(op, DQ_OUT_OF_BOUNDS, msg);
                return -1;
            }
        } else if (have < end) {
            end = have;
        }
    }
    if (!op->chunks) {
        if (g->tokens)
            end = g->start_token + g->tokens;
        if (g->start_token > end) {
            get_fail(op, DQ_OUT_OF_BOUNDS, "start_token lies past the end of the requested layers");
            return -1;
        }
        op->start = g->start_token;
        op->tokens = end - g->start_token;
    }

    uint64_t per = op->codec->n * op->esize * 2;
    if (op->tokens && (uint64_t)op->num * op->tokens > op->ctx->cfg->max_payload / per) {
        get_fail(op, DQ_TOO_LARGE, "the reply would exceed max_payload; ask for fewer tokens or layers");
        return -1;
    }
    op->out_len = (size_t)(op->num * op->tokens * per);
    if (op->out_len) {
        op->rc = calloc(ntasks(op), sizeof *op->rc);
        if (!op->rc) {
            get_fail(op, DQ_NOMEM, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* NCCL reply: the device buffer the decodes write (on a worker: the allocation is stream-ordered). */
static void alloc_task(void *arg, size_t i)
{
    get_op *op = arg;
    (void)i;
    void *p = NULL;
    op->alloc_rc = dqd_tier_alloc_device(op->ctx, op->out_len, &p);
    op->dout = p;
}

static void alloc_done(void *arg)
{
    get_op *op = arg;
    if (op->alloc_rc < 0) {
        get_fail(op, op->alloc_rc, "cannot allocate the reply in GPU memory");
        return;
    }
    op->state = GET_DECODE;
    get_step(op);
}

/* Task i: layer (i / 2) % num, kind i % 2, of chunk i / (2 num) (of the sequence: chunk 0). */
static void decode_task(void *arg, size_t i)
{
    get_op *op = arg;
    const size_t per_task = (size_t)op->num * 2;
    const size_t chunk = i / per_task, j = i % per_task;
    size_t layer = j / 2;
    dq_kind kind = (j & 1) ? DQ_KIND_V : DQ_KIND_K;
    size_t per_layer = (size_t)op->tokens * op->codec->n * op->esize;
    size_t start = (size_t)op->start, count = (size_t)op->tokens;
    size_t off = (kind == DQ_KIND_V ? op->out_len / 2 : 0) + layer * per_layer;
    const dqd_seq *seq = op->seq;
    if (op->chunks) {
        seq = op->chunks[chunk];
        count = seq->model->chunk_tokens;
        start = 0;
        off += chunk * count * op->codec->n * op->esize;
    }
    uint32_t l = op->first + (uint32_t)layer;
    if (op->dout)
        op->rc[i] = dqd_tier_decode_dev(op->ctx, seq, l, kind, start, count, op->dout + off, op->dtype);
    else
        op->rc[i] = dqd_tier_decode(op->ctx, seq, l, kind, start, count, op->out + off, op->dtype);
}

static void decode_done(void *arg)
{
    get_op *op = arg;
    int rc = first_error(op, ntasks(op));
    if (rc < 0) {
        get_fail(op, rc, dq_strerror(rc));
        return;
    }
    op->state = GET_REPLY;
    get_step(op);
}

/* Raw: the offset in the reply of each (layer, part): per layer the parts' records one after the
 * other (chunks have whole windows, no tail), then the tail K and V of a sequence. */
static int get_raw_size(get_op *op)
{
    const size_t parts = raw_parts(op);
    op->raw_off = calloc((size_t)op->num * parts, sizeof *op->raw_off);
    if (!op->raw_off) {
        get_fail(op, DQ_NOMEM, "out of memory");
        return -1;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < op->num; i++) {
        for (size_t c = 0; c < parts; c++) {
            op->raw_off[i * parts + c] = (size_t)total;
            total += dqd_seq_layer_windows(raw_part(op, c), op->first + i) * op->codec->window_bytes;
        }
        total += dqd_seq_layer_tail(op->seq, op->first + i) * op->codec->n * 4u;
        if (total > op->ctx->cfg->max_payload) {
            get_fail(op, DQ_TOO_LARGE, "the raw reply would exceed max_payload; ask for fewer layers");
            return -1;
        }
    }
    op->out_len = (size_t)total;
    return 0;
}

/* Task i: layer i / parts of part i % parts (its records, and a sequence's tail after them). */
static void copy_task(void *arg, size_t i)
{
    get_op *op = arg;
    const size_t parts = raw_parts(op), c = i % parts;
    const uint32_t layer = op->first + (uint32_t)(i / parts);
    op->rc[i] = dqd_tier_copy_raw(op->ctx, raw_part(op, c), layer, op->out + op->raw_off[i]);
}

static void copy_done(void *arg)
{
    get_op *op = arg;
    int rc = first_error(op, op->num * raw_parts(op));
    if (rc < 0) {
        get_fail(op, rc, dq_strerror(rc));
        return;
    }
    op->state = GET_REPLY;
    get_step(op);
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

static void reply_raw(get_op *op)
{
    const dqd_model *m = op->seq->model;
    size_t n = op->num;
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
    size_t wb = op->codec->window_bytes, parts = raw_parts(op);
    for (size_t i = 0; i < n; i++) {
        uint32_t layer = op->first + (uint32_t)i;
        uint64_t nwin = 0, tokens = 0;
        for (size_t c = 0; c < parts; c++) {
            nwin += dqd_seq_layer_windows(raw_part(op, c), layer);
            tokens += dqd_seq_layer_tokens(raw_part(op, c), layer);
        }
        uint64_t tail = dqd_seq_layer_tail(op->seq, layer);
        uint64_t off = op->raw_off[i * parts];
        uint64_t rec_len = nwin * wb;
        uint64_t tail_len = tail * op->codec->n * 2;
        const uint64_t rshape[2] = {nwin, wb};
        const uint64_t tshape[3] = {tail, m->kv_heads, m->head_dim};
        dquant__raw_layer__init(&layers[i]);
        layers[i].layer = op->first + (uint32_t)i;
        layers[i].tokens = tokens;
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

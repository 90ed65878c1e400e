/* dquantd PUT: append K/V for a token range of one or many layers, all or nothing.
 *
 * Loop: look up or create the sequence (a new one stays invisible), queue for exclusive access,
 * check start_token against every layer (ORDER) and reserve the estimated bytes (evicting if that
 * makes room, else RESOURCE_EXHAUSTED with nothing touched).
 * Worker, one task, only when needed: align the input, or bring K/V that came on NCCL (in GPU
 * memory) to the host when some layer takes the cpu path and check them there. Workers, one task
 * per layer: dqd_tier_append_apply (the host or the GPU append), whose token checks see every value
 * of the layer.
 * Loop: commit, or if any layer failed roll the others back on the workers; a sequence this PUT
 * created is removed again. NONFINITE wins over every other error, as if the whole input were
 * checked first: a layer that fails for another reason checks its own input for NaN/Inf (GPU
 * layers report it as raw_nonfinite), and a layer that succeeded held none.
 *
 * On the cuda backend (models the kernels take) the written layers go to the GPU: layers already
 * there are appended there, host layers move there first (promoted), new ones are created
 * there. The GPU budget for all of that is reserved on the loop, possibly moving least recently
 * used sequences to the host first (tier.h, before the prepare task). If the GPU cannot make
 * room, layers not yet on the GPU stay on the host and take the cpu path, and GPU-resident ones
 * are appended there if their growth fits; if even that does not fit (everything else on the GPU
 * pinned or in use), they move to the host first (spill) and are appended there.
 *
 * The operation is a state machine (put_state, put_step), its states in the order they run; a
 * state that waits (access, moves, tasks) returns and its callback moves the state on. A failure
 * before any layer changed answers at once (put_fail). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "ctx.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "logging.h"
#include "ops_internal.h"
#include "tensor.h"
#include "tier.h"
#include "work.h"

#define MAX_LOOKUP_RETRIES 64

typedef enum put_state {
    PUT_LOOKUP,   /* look up or create the sequence, wait for exclusive access */
    PUT_CHECK,    /* still there (else LOOKUP again), same model, every layer at start_token */
    PUT_RESERVE,  /* the written layers' tiers, GPU and host room reserved */
    PUT_MOVES,    /* GPU victims moved to the host (tier.h) */
    PUT_PREPARE,  /* the input aligned, or brought from GPU memory (NCCL); a task when needed */
    PUT_APPEND,   /* one task per layer */
    PUT_ROLLBACK, /* a layer failed after others were applied: undo them, then FAILED */
    PUT_FAILED,   /* a layer failed: the sequence as it was (or dropped), then the error */
    PUT_COMMIT,   /* every layer applied: commit, reply */
} put_state;

typedef struct put_op {
    dqd_req *req;
    dqd_ctx *ctx;
    put_state state;
    const Dquant__Put *put;     /* freed with the request once it is answered */
    const dqd_chunk_put *chunk; /* a chunk of PUT_CHUNKS (op_chunks.c): reports to chunk->done */
    uint32_t nlayers;
    dqd_model *model;
    dqd_codec *codec;
    dqd_tensor k, v;
    const void *kdata, *vdata;
    void *ktmp, *vtmp;
    dqd_access_set as;
    bool as_live;
    dqd_seq *seq;
    bool created;
    int lookups;
    uint64_t reserved;
    uint64_t gpu_reserved;
    dqd_gpu_moves mv;    /* GPU victims to move to the host before the appends */
    dqd_tier_append *ta; /* per written layer: its tier and its undoable append (tier.h) */
    bool dev;            /* kdata/vdata are in device memory (NCCL payload), already checked */
    int prep_rc;
    uint32_t prep_layer; /* the layer prep_rc is about; UINT32_MAX: the input as a whole */
    int *rc;
    dq_encode_stats *stats;
    int fail_rc;
    char fail_msg[256];
    /* PUT_RAW / PUT_CHUNKS_RAW: per written layer its records and tail (raw_own: op's array),
     * stored as they are on the host; bad_win: the first bad record of a CORRUPT layer */
    const dqd_raw_in *raw;
    dqd_raw_in *raw_own;
    size_t *bad_win;
    Dquant__Put rput;
} put_op;

static void put_free(put_op *op)
{
    if (op->reserved)
        dqd_store_unreserve(op->ctx->store, op->reserved);
    if (op->gpu_reserved)
        dqd_store_gpu_unreserve(op->ctx->store, op->gpu_reserved);
    dqd_store_gpu_moves_finish(op->ctx->store, &op->mv);
    if (op->as_live)
        dqd_access_end(&op->as);
    if (op->ta)
        for (uint32_t i = 0; i < op->nlayers; i++)
            dqd_tier_append_clear(&op->ta[i]);
    free(op->ta);
    free(op->rc);
    free(op->stats);
    free(op->ktmp);
    free(op->vtmp);
    free(op->raw_own);
    free(op->bad_win);
    dqd_model_drop(op->model);
    free(op);
}

/* Fails the request; a sequence created by this PUT leaves no trace. */
static void put_fail(put_op *op, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void put_fail(put_op *op, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (op->created && op->seq && op->seq->in_index)
        dqd_store_remove(op->ctx->store, op->seq);
    if (op->chunk)
        op->chunk->done(op->chunk->arg, code, msg, false, 0);
    else
        dqd_req_fail(op->req, code, "%s", msg);
    put_free(op);
}

static size_t layer_bytes(const put_op *op)
{
    return (size_t)op->put->tokens * op->codec->n * dqd_dtype_size(op->k.dtype);
}

static bool on_gpu(const put_op *op, size_t i)
{
    return op->ta && op->ta[i].gpu;
}

/* The states' work, defined below in the order the states run. */
static void put_lookup(put_op *op);
static int put_check(put_op *op);
static int put_reserve(put_op *op);
static void moves_done(void *arg, int rc);
static bool input_ready(const put_op *op);
/* A chunk's rows of every layer out of PUT_CHUNKS' [layers, tokens_total, ...] tensors. */
static int gather_chunk(put_op *op)
{
    const dqd_chunk_put *cp = op->chunk;
    const size_t lb = layer_bytes(op);
    const size_t row = lb / (size_t)op->put->tokens;
    const size_t all = lb * op->nlayers;
    op->ktmp = malloc(all ? all : 1);
    op->vtmp = malloc(all ? all : 1);
    if (!op->ktmp || !op->vtmp)
        return DQ_NOMEM;
    for (uint32_t l = 0; l < op->nlayers; l++) {
        const size_t src = ((size_t)l * (size_t)cp->tokens_total + (size_t)cp->token_off) * row;
        memcpy((uint8_t *)op->ktmp + l * lb, cp->k.data + src, lb);
        memcpy((uint8_t *)op->vtmp + l * lb, cp->v.data + src, lb);
    }
    op->kdata = op->ktmp;
    op->vdata = op->vtmp;
    return DQ_OK;
}

static void prepare_task(void *arg, size_t i);
static void prepare_done(void *arg);
static void append_task(void *arg, size_t i);
static void append_done(void *arg);
static void put_rollback(put_op *op);
static void put_failed(put_op *op);
static void put_commit(put_op *op);

/* Runs the operation from op->state until it waits or has finished. */
static void put_step(put_op *op)
{
    dqd_ctx *ctx = op->ctx;
    for (;;) {
        switch (op->state) {
        case PUT_LOOKUP:
            put_lookup(op);
            return;
        case PUT_CHECK: {
            int rc = put_check(op);
            if (rc < 0)
                return;
            op->state = rc ? PUT_LOOKUP : PUT_RESERVE;
            break;
        }
        case PUT_RESERVE:
            if (put_reserve(op) < 0)
                return;
            op->state = PUT_MOVES;
            break;
        case PUT_MOVES:
            dqd_tier_moves_run(ctx, &op->mv, moves_done, op);
            return;
        case PUT_PREPARE:
            if (input_ready(op)) {
                op->kdata = op->k.data;
                op->vdata = op->v.data;
                op->prep_layer = UINT32_MAX;
                op->prep_rc = DQ_OK;
                prepare_done(op);
            } else if (dqd_tasks_run(ctx, 1, prepare_task, prepare_done, op) < 0) {
                put_fail(op, DQ_NOMEM, "out of memory");
            }
            return;
        case PUT_APPEND:
            if (dqd_tasks_run(ctx, op->put->num_layers, append_task, append_done, op) < 0)
                put_fail(op, DQ_NOMEM, "out of memory");
            return;
        case PUT_ROLLBACK:
            put_rollback(op);
            return;
        case PUT_FAILED:
            put_failed(op);
            return;
        case PUT_COMMIT:
            put_commit(op);
            return;
        }
    }
}

void dqd_op_put(dqd_req *req)
{
    const Dquant__Put *put = req->msg->put;
    dqd_model *model = dqd_registry_find(req->ctx->reg, put->model);
    if (!model) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no model named '%s' (REGISTER_MODEL first)", put->model);
        return;
    }
    put_op *op = calloc(1, sizeof *op);
    if (!op) {
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->put = put;
    op->nlayers = put->num_layers;
    op->model = model;
    dqd_model_hold(model);
    op->codec = model->codec;
    dqd_model_info info;
    dqd_model_info_of(model, &info);
    char msg[256];
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    int rc = dqd_validate_put(put, &pl, &info, &op->k, &op->v, msg, sizeof msg);
    if (rc < 0) {
        dqd_req_fail(req, rc, "%s", msg);
        put_free(op);
        return;
    }
    op->state = PUT_LOOKUP;
    put_step(op);
}

void dqd_op_put_chunk(dqd_req *req, const dqd_chunk_put *cp)
{
    put_op *op = calloc(1, sizeof *op);
    if (!op) {
        cp->done(cp->arg, DQ_NOMEM, "out of memory", false, 0);
        return;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->put = cp->put;
    op->chunk = cp;
    op->nlayers = cp->put->num_layers;
    op->model = cp->model;
    dqd_model_hold(cp->model);
    op->codec = cp->model->codec;
    op->k = cp->k;
    op->v = cp->v;
    if (cp->raw) {
        /* This chunk's windows of every layer: chunk_tokens / W of them at its place in the layer. */
        const uint64_t W = op->codec->profile.window, per = cp->put->tokens / W, first = cp->token_off / W;
        op->raw_own = calloc(op->nlayers, sizeof *op->raw_own);
        if (!op->raw_own) {
            put_free(op);
            cp->done(cp->arg, DQ_NOMEM, "out of memory", false, 0);
            return;
        }
        for (uint32_t l = 0; l < op->nlayers; l++) {
            op->raw_own[l].records = cp->raw[l].records + first * op->codec->window_bytes;
            op->raw_own[l].windows = per;
        }
        op->raw = op->raw_own;
    }
    op->state = PUT_LOOKUP;
    put_step(op);
}

/* Checks the layers of PUT_RAW / PUT_CHUNKS_RAW against the model (validate.c) and the profile
 * their records were made with; out: n entries. *tokens: each layer's. */
int dqd_ops_raw_layers(const dqd_model *model, Dquant__RawLayer *const *layers, size_t n, uint32_t first_layer,
                       const ProtobufCBinaryData *profile, const dqd_payload *pl, dqd_raw_in *out, uint64_t *tokens,
                       char *msg, size_t msglen)
{
    const dqd_codec *codec = model->codec;
    if (profile->len != codec->plen || memcmp(profile->data, codec->pbytes, codec->plen) != 0) {
        snprintf(msg, msglen, "records of another profile: the profile sent is not model '%s''s", model->name);
        return DQ_INVALID_ARGUMENT;
    }
    dqd_model_info info;
    dqd_model_info_of(model, &info);
    dqd_profile_info pinfo;
    dqd_profile_info_of(codec, &pinfo);
    dqd_raw_tensors *t = calloc(n, sizeof *t);
    if (!t) {
        snprintf(msg, msglen, "out of memory");
        return DQ_NOMEM;
    }
    int rc = dqd_validate_raw_layers(layers, n, first_layer, pl, &info, &pinfo, t, tokens, msg, msglen);
    for (size_t i = 0; rc == DQ_OK && i < n; i++) {
        out[i].records = t[i].records.data;
        out[i].windows = (size_t)t[i].windows;
        out[i].tail_k = t[i].tail_k.data;
        out[i].tail_v = t[i].tail_v.data;
        out[i].tail_tokens = (size_t)t[i].tail_tokens;
    }
    free(t);
    return rc;
}

void dqd_op_put_raw(dqd_req *req)
{
    const Dquant__PutRaw *pr = req->msg->put_raw;
    dqd_model *model = dqd_registry_find(req->ctx->reg, pr->model);
    if (!model) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no model named '%s' (REGISTER_MODEL first)", pr->model);
        return;
    }
    put_op *op = calloc(1, sizeof *op);
    if (!op || !(op->raw_own = calloc(pr->n_layers, sizeof *op->raw_own))) {
        free(op);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->nlayers = pr->num_layers;
    op->model = model;
    dqd_model_hold(model);
    op->codec = model->codec;
    op->raw = op->raw_own;
    char msg[256];
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    uint64_t tokens = 0;
    int rc = dqd_ops_raw_layers(model, pr->layers, pr->n_layers, pr->first_layer, &pr->profile, &pl, op->raw_own,
                                &tokens, msg, sizeof msg);
    const uint64_t W = op->codec->profile.window;
    if (rc == DQ_OK && tokens == 0)
        rc = DQ_INVALID_ARGUMENT, snprintf(msg, sizeof msg, "the layers hold no tokens");
    if (rc == DQ_OK && pr->start_token % W)
        rc = DQ_INVALID_ARGUMENT, snprintf(msg, sizeof msg, "start_token %llu is not a multiple of W = %llu",
                                           (unsigned long long)pr->start_token, (unsigned long long)W);
    if (rc == DQ_OK && pr->start_token > UINT64_MAX - tokens)
        rc = DQ_OUT_OF_BOUNDS, snprintf(msg, sizeof msg, "start_token + tokens overflows");
    if (rc < 0) {
        put_free(op);
        dqd_req_fail(req, rc, "%s", msg);
        return;
    }
    dquant__put__init(&op->rput);
    op->rput.seq = pr->seq;
    op->rput.model = pr->model;
    op->rput.start_token = pr->start_token;
    op->rput.first_layer = pr->first_layer;
    op->rput.num_layers = pr->num_layers;
    op->rput.tokens = tokens;
    op->put = &op->rput;
    op->state = PUT_LOOKUP;
    put_step(op);
}

static void access_ready(dqd_access_set *as)
{
    put_op *op = as->arg;
    op->state = PUT_CHECK;
    put_step(op);
}

/* Finds or creates the sequence and asks for exclusive access (access_ready). */
static void put_lookup(put_op *op)
{
    const Dquant__Put *put = op->put;
    if (++op->lookups > MAX_LOOKUP_RETRIES) {
        put_fail(op, DQ_BUSY, "the sequence keeps being deleted concurrently");
        return;
    }
    op->created = false;
    op->seq = dqd_ops_lookup(op->req, put->seq);
    if (!op->seq) {
        const char *ns = put->seq->ns ? put->seq->ns : "";
        int rc = dqd_store_insert_kind(op->ctx->store, ns, strlen(ns), put->seq->key.data, put->seq->key.len,
                                       (uint8_t)put->seq->kind, op->model, &op->seq);
        if (rc < 0) {
            op->seq = NULL;
            put_fail(op, rc, "cannot create the sequence: %s", dq_strerror(rc));
            return;
        }
        op->created = true;
    }
    if (dqd_access_init(&op->as, 1) < 0) {
        dqd_seq *seq = op->seq;
        if (op->created)
            dqd_store_remove(op->ctx->store, seq);
        dqd_seq_unref(seq);
        op->seq = NULL;
        put_fail(op, DQ_NOMEM, "out of memory");
        return;
    }
    op->as_live = true;
    /* A chunk held already is acknowledged without its layers (put_check), so one on disk stays
     * there; a chunk not committed yet is not on disk. */
    op->as.no_load = op->chunk != NULL;
    dqd_access_add(&op->as, op->seq, DQD_ACCESS_WRITE);
    dqd_access_start(&op->as, access_ready, op);
}

/* The creating PUT's prefix chunks: each held, of the same model. */
static int put_prefix(put_op *op)
{
    const Dquant__Put *put = op->put;
    if (!op->created) {
        put_fail(op, DQ_INVALID_ARGUMENT, "prefix_chunks only on the PUT that creates the sequence");
        return -1;
    }
    const size_t n = put->n_prefix_chunks;
    dqd_seq **chunks = malloc(n * sizeof *chunks);
    if (!chunks) {
        put_fail(op, DQ_NOMEM, "out of memory");
        return -1;
    }
    const char *ns = put->seq->ns ? put->seq->ns : "";
    size_t got = 0;
    for (; got < n; got++) {
        chunks[got] = dqd_store_lookup_kind(op->ctx->store, ns, strlen(ns), put->prefix_chunks[got].data,
                                            put->prefix_chunks[got].len, DQD_KIND_CHUNK);
        if (!chunks[got] || !dqd_seq_alive(chunks[got]) || chunks[got]->model != op->model) {
            dqd_seq_unref(chunks[got]);
            break;
        }
    }
    int rc = got < n ? DQ_NOT_FOUND : dqd_store_set_prefix(op->ctx->store, op->seq, chunks, (uint32_t)n);
    for (size_t i = 0; i < got; i++)
        dqd_seq_unref(chunks[i]);
    free(chunks);
    if (rc < 0) {
        if (rc == DQ_NOT_FOUND)
            put_fail(op, rc, "prefix chunk %zu not held", got);
        else
            put_fail(op, rc, "out of memory");
        return -1;
    }
    return 0;
}

/* 0: go on; 1: the sequence went while this PUT waited (look it up again); -1: failed. */
static int put_check(put_op *op)
{
    const Dquant__Put *put = op->put;
    dqd_seq *seq = op->seq;
    if (!seq->in_index || (!seq->visible && !op->created)) {
        /* Deleted, or its creating PUT failed, while this one waited: start over. */
        dqd_access_end(&op->as);
        op->as_live = false;
        op->seq = NULL;
        return 1;
    }
    if (op->chunk && seq->visible) {
        /* Committed by an earlier or concurrent PUT_CHUNKS (this one waited behind its writer). */
        const dqd_chunk_put *cp = op->chunk;
        dqd_store_touch(op->ctx->store, seq);
        put_free(op);
        cp->done(cp->arg, DQ_OK, NULL, true, 0);
        return -1;
    }
    if (seq->model != op->model) {
        put_fail(op, DQ_INVALID_ARGUMENT, "the sequence belongs to model '%s', not '%s'", seq->model->name,
                 op->model->name);
        return -1;
    }
    if (put->n_prefix_chunks && put_prefix(op) < 0)
        return -1;
    for (uint32_t i = 0; i < put->num_layers; i++) {
        uint64_t have = dqd_seq_layer_tokens(seq, put->first_layer + i);
        if (have != put->start_token) {
            put_fail(op, DQ_ORDER, "layer %u holds %llu tokens; start_token is %llu", put->first_layer + i,
                     (unsigned long long)have, (unsigned long long)put->start_token);
            return -1;
        }
        if (op->raw && dqd_seq_layer_tail(seq, put->first_layer + i)) {
            put_fail(op, DQ_ORDER, "layer %u holds %llu BF16 tail tokens; records append only after whole windows",
                     put->first_layer + i, (unsigned long long)dqd_seq_layer_tail(seq, put->first_layer + i));
            return -1;
        }
    }
    return 0;
}

/* The written layers' tiers (see the top of this file) and the room they need. */
static int put_reserve(put_op *op)
{
    dqd_ctx *ctx = op->ctx;
    const Dquant__Put *put = op->put;
    dqd_seq *seq = op->seq;
    op->ta = calloc(put->num_layers, sizeof *op->ta);
    op->rc = calloc(put->num_layers, sizeof *op->rc);
    op->stats = calloc(put->num_layers, sizeof *op->stats);
    if (!op->ta || !op->rc || !op->stats) {
        put_fail(op, DQ_NOMEM, "out of memory");
        return -1;
    }
    int rc = DQ_OK;
    if (op->raw) {
        /* Records are stored on the host as they came (tier.h); a GPU layer moves there first. */
        op->bad_win = calloc(put->num_layers, sizeof *op->bad_win);
        if (!op->bad_win) {
            put_fail(op, DQ_NOMEM, "out of memory");
            return -1;
        }
        for (uint32_t i = 0; i < put->num_layers; i++)
            op->ta[i].spill = dqd_seq_glayer(seq, put->first_layer + i) != NULL;
    } else if (dqd_tier_place_layers(ctx, seq, put->first_layer, put->num_layers, put->tokens, op->ta,
                                     &op->gpu_reserved, &op->mv) < 0) {
        put_fail(op, DQ_NOMEM, "out of memory");
        return -1;
    }
    uint64_t need = 0;
    for (uint32_t i = 0; i < put->num_layers; i++) {
        uint32_t layer = put->first_layer + i;
        need += dqd_tier_host_need(seq, layer, &op->ta[i], put->tokens);
    }
    rc = dqd_store_reserve(ctx->store, need, seq);
    if (rc < 0) {
        dqd_store_stats st;
        dqd_store_get_stats(ctx->store, &st);
        put_fail(op, rc, "needs about %llu bytes; budget %llu, used %llu, nothing evictable frees enough",
                 (unsigned long long)need, (unsigned long long)st.budget, (unsigned long long)st.used);
        return -1;
    }
    op->reserved = need;
    return 0;
}

static void moves_done(void *arg, int rc)
{
    put_op *op = arg;
    if (rc < 0) {
        put_fail(op, rc, "cannot move sequences out of GPU memory: %s", dq_strerror(rc));
        return;
    }
    op->state = PUT_PREPARE;
    put_step(op);
}

/* Host input already aligned for its element type needs no prepare task. */
static bool input_ready(const put_op *op)
{
    if (op->raw)
        return true;
    const size_t es = dqd_dtype_size(op->k.dtype);
    return !op->chunk && !op->k.device && es && (uintptr_t)op->k.data % es == 0 && (uintptr_t)op->v.data % es == 0;
}

static bool all_on_gpu(const put_op *op)
{
    for (uint32_t i = 0; i < op->nlayers; i++)
        if (!on_gpu(op, i))
            return false;
    return true;
}

/* K/V that arrived on NCCL: checked on the GPU when every layer is appended there, else copied to
 * the host for the cpu path. */
static int prepare_device(put_op *op)
{
    if (all_on_gpu(op)) {
        op->kdata = op->k.data;
        op->vdata = op->v.data;
        op->dev = true;
        return dqd_tier_check_device(op->ctx, op->codec, op->kdata, op->vdata, dqd_tensor_dtype(&op->k), op->nlayers,
                                     (size_t)op->put->tokens, &op->prep_layer);
    }
    op->ktmp = malloc(op->k.len ? op->k.len : 1);
    op->vtmp = malloc(op->v.len ? op->v.len : 1);
    if (!op->ktmp || !op->vtmp)
        return DQ_NOMEM;
    int rc = dqd_tier_to_host(op->ctx, op->ktmp, op->k.data, op->k.len);
    if (rc == DQ_OK)
        rc = dqd_tier_to_host(op->ctx, op->vtmp, op->v.data, op->v.len);
    op->kdata = op->ktmp;
    op->vdata = op->vtmp;
    if (rc == DQ_OK)
        rc = dq_check_finite(op->kdata, dqd_tensor_dtype(&op->k), (size_t)op->k.count);
    if (rc == DQ_OK)
        rc = dq_check_finite(op->vdata, dqd_tensor_dtype(&op->v), (size_t)op->v.count);
    return rc;
}

static void prepare_task(void *arg, size_t i)
{
    put_op *op = arg;
    (void)i;
    op->prep_layer = UINT32_MAX;
    if (op->k.device) {
        op->prep_rc = prepare_device(op);
        return;
    }
    if (op->chunk) {
        op->prep_rc = gather_chunk(op);
        return;
    }
    int rc = dqd_tensor_aligned(&op->k, &op->kdata, &op->ktmp);
    if (rc == 0)
        rc = dqd_tensor_aligned(&op->v, &op->vdata, &op->vtmp);
    op->prep_rc = rc;
}

static void prepare_done(void *arg)
{
    put_op *op = arg;
    if (op->prep_rc < 0) {
        if (op->prep_layer != UINT32_MAX)
            put_fail(op, op->prep_rc, "layer %u: %s", op->put->first_layer + op->prep_layer, dq_strerror(op->prep_rc));
        else
            put_fail(op, op->prep_rc, "%s",
                     op->prep_rc == DQ_NONFINITE ? "k or v holds NaN or infinity" : dq_strerror(op->prep_rc));
        return;
    }
    op->state = PUT_APPEND;
    put_step(op);
}

/* Workers: layer i; if it failed for another reason, whether the layer's input holds NaN/Inf,
 * which then decides the error (see the top of this file). Input in GPU memory (NCCL, every layer
 * on the GPU) was checked there as a whole before. */
static void append_task(void *arg, size_t i)
{
    put_op *op = arg;
    if (op->raw) {
        op->rc[i] = dqd_tier_append_raw(op->ctx, op->seq, op->put->first_layer + (uint32_t)i, &op->ta[i], &op->raw[i],
                                        &op->bad_win[i]);
        return;
    }
    const size_t lb = layer_bytes(op);
    op->rc[i] = dqd_tier_append_apply(op->ctx, op->seq, op->put->first_layer + (uint32_t)i, &op->ta[i],
                                      (const uint8_t *)op->kdata + i * lb, (const uint8_t *)op->vdata + i * lb,
                                      dqd_tensor_dtype(&op->k), (size_t)op->put->tokens, op->dev, &op->stats[i]);
    if (op->rc[i] >= 0 || op->rc[i] == DQ_NONFINITE || op->dev)
        return;
    const size_t count = lb / dqd_dtype_size(op->k.dtype);
    const dq_dtype dt = dqd_tensor_dtype(&op->k);
    if (dq_check_finite((const uint8_t *)op->kdata + i * lb, dt, count) == DQ_NONFINITE ||
        dq_check_finite((const uint8_t *)op->vdata + i * lb, dt, count) == DQ_NONFINITE)
        op->rc[i] = DQ_NONFINITE;
}

static void append_done(void *arg)
{
    put_op *op = arg;
    dqd_ctx *ctx = op->ctx;
    const Dquant__Put *put = op->put;
    int first_err = 0;
    uint32_t failed_layer = 0;
    size_t applied = 0;
    for (uint32_t i = 0; i < put->num_layers; i++) {
        if (op->rc[i] < 0 && !first_err) {
            first_err = op->rc[i];
            failed_layer = put->first_layer + i;
        }
        applied += dqd_tier_append_applied(&op->ta[i]);
    }
    if (first_err) {
        op->fail_rc = first_err;
        snprintf(op->fail_msg, sizeof op->fail_msg, "layer %u: %s", failed_layer, dq_strerror(first_err));
        if (op->raw && first_err == DQ_CORRUPT)
            snprintf(op->fail_msg, sizeof op->fail_msg,
                     "layer %u window %zu: the record breaks the container's decode invariants (DESIGN 2.3)",
                     failed_layer, op->bad_win[failed_layer - put->first_layer]);
        /* A NaN anywhere wins (see the top of this file): a layer says DQ_NONFINITE, or a GPU one
         * raw_nonfinite (its rc may be the range check of the rounded values). */
        for (uint32_t i = 0; i < put->num_layers; i++) {
            if (op->rc[i] == DQ_NONFINITE || op->ta[i].dev.raw_nonfinite) {
                op->fail_rc = DQ_NONFINITE;
                snprintf(op->fail_msg, sizeof op->fail_msg, "k or v holds NaN or infinity");
            }
        }
        ctx->metrics.rollbacks += applied;
        op->state = applied ? PUT_ROLLBACK : PUT_FAILED;
    } else {
        op->state = PUT_COMMIT;
    }
    put_step(op);
}

static void rollback_task(void *arg, size_t i)
{
    put_op *op = arg;
    op->rc[i] = dqd_tier_append_rollback(op->ctx, op->seq, op->put->first_layer + (uint32_t)i, &op->ta[i]);
}

/* A layer that could not be put back makes the whole sequence unusable. */
static bool any_broken(const put_op *op)
{
    for (uint32_t i = 0; op->ta && i < op->nlayers; i++)
        if (op->ta[i].dev.broken)
            return true;
    return false;
}

static void count_promoted(put_op *op)
{
    uint64_t n = 0, m = 0;
    for (uint32_t i = 0; op->ta && i < op->nlayers; i++) {
        n += op->ta[i].promoted;
        m += op->ta[i].spilled;
    }
    dqd_store_gpu_promoted(op->ctx->store, n);
    dqd_store_gpu_spilled(op->ctx->store, m);
}

static void rollback_done(void *arg)
{
    put_op *op = arg;
    dqd_ctx *ctx = op->ctx;
    bool broken = any_broken(op);
    for (uint32_t i = 0; i < op->put->num_layers; i++)
        if (op->rc[i] < 0)
            broken = true;
    count_promoted(op);
    if (broken && op->seq->in_index) {
        /* The previous state could not be rebuilt: drop the sequence rather than show it half-written. */
        DQD_ERROR("PUT rollback failed; dropping sequence ns='%s'", op->seq->ns);
        dqd_store_remove(ctx->store, op->seq);
    } else if (op->seq->in_index && !op->created) {
        dqd_store_commit(ctx->store, op->seq); /* accounting back to the previous state */
    }
    put_fail(op, op->fail_rc, "%s", op->fail_msg);
}

/* Undoes the applied layers on the workers, or here when that cannot even be queued (rather than
 * leave a half-written sequence). */
static void put_rollback(put_op *op)
{
    dqd_ctx *ctx = op->ctx;
    const uint32_t n = op->put->num_layers;
    memset(op->rc, 0, n * sizeof *op->rc);
    if (dqd_tasks_run(ctx, n, rollback_task, rollback_done, op) == 0)
        return;
    for (uint32_t i = 0; i < n; i++)
        rollback_task(op, i);
    rollback_done(op);
}

/* A layer failed and none was applied: promotions may still have changed the sequence. */
static void put_failed(put_op *op)
{
    dqd_ctx *ctx = op->ctx;
    if (op->seq->in_index && !op->created) {
        if (any_broken(op)) {
            DQD_ERROR("PUT failed on the GPU and a layer could not be restored; dropping sequence ns='%s'",
                      op->seq->ns);
            dqd_store_remove(ctx->store, op->seq);
        } else {
            count_promoted(op);
            dqd_store_commit(ctx->store, op->seq); /* promotions changed the accounting */
        }
    }
    put_fail(op, op->fail_rc, "%s", op->fail_msg);
}

static void put_commit(put_op *op)
{
    dqd_ctx *ctx = op->ctx;
    const Dquant__Put *put = op->put;
    count_promoted(op);
    dqd_store_commit(ctx->store, op->seq);
    dqd_store_unreserve(ctx->store, op->reserved);
    op->reserved = 0;
    dqd_store_gpu_unreserve(ctx->store, op->gpu_reserved);
    op->gpu_reserved = 0;
    dqd_store_enforce(ctx->store, op->seq);

    Dquant__PutReply r = DQUANT__PUT_REPLY__INIT;
    r.tokens = dqd_seq_layer_tokens(op->seq, put->first_layer);
    r.stored_bytes = op->seq->stored_bytes;
    for (uint32_t i = 0; i < put->num_layers; i++) {
        r.streams_encoded += op->stats[i].streams;
        r.retries += op->stats[i].retries;
    }
    ctx->metrics.tokens_put += put->tokens * put->num_layers;
    for (uint32_t i = 0; op->raw && i < put->num_layers; i++)
        ctx->metrics.put_raw_bytes += op->raw[i].windows * op->codec->window_bytes +
                                      2 * op->raw[i].tail_tokens * op->codec->n * 2;
    ctx->metrics.streams_encoded += r.streams_encoded;
    ctx->metrics.encode_retries += r.retries;
    if (op->chunk) {
        const dqd_chunk_put *cp = op->chunk;
        put_free(op);
        cp->done(cp->arg, DQ_OK, NULL, false, r.streams_encoded);
        return;
    }
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_PUT;
    resp.put = &r;
    dqd_req_reply(op->req, &resp, NULL, 0);
    put_free(op);
}

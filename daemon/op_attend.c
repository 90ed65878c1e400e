/* dquantd ATTEND: a batch of decode-attention items, each (sequence, layer, query) with an
 * optional new token appended first.
 *
 * Loop: look up every sequence and queue for them all (exclusive for sequences that get appends,
 * shared otherwise), then check every item against its model. Workers, three phases over chunks
 * of items: (A) queries to f32 and every input checked finite, (B) the appends, rolled back all
 * together if one fails, (C) dq_attend (dq_attend_vskip with attention_value_mass on, for D-Quant
 * and fixed-width models on the host path). The reply is out F32 [items, q_heads, head_dim] followed
 * by lse F32 [items, q_heads].
 *
 * On the cuda backend, items whose layer is in GPU memory run there: between (A) and (B) the loop
 * places every (sequence, layer) of the batch — on the GPU if it is there already; else, for
 * models the kernels take, moved there (an existing host layer) or created there (a new layer
 * with an append) when the GPU budget can make room, possibly moving least recently used
 * sequences to the host first (tier.h); else it stays on the host. A sequence with a host
 * layer to move is acquired exclusively, as for an append. A GPU layer whose append finds no room
 * at all on the GPU (everything else pinned or in use) moves to the host and is appended there.
 * Phase B and C then run the host items in chunks as above plus one GPU task: promotions and
 * appends on the worker's stream, then one dqcu_attend launch per codec for all GPU items of the
 * batch. When every item is on the GPU (a decode step's usual case), B and C are one task with no
 * synchronization in between, and the appended tokens were already checked in phase A
 * (dq_check_tokens) so the GPU append launches no check of its own.
 *
 * A sequence built on chunks of the shared KV tier (Put.prefix_chunks) attends over the chunks and
 * its own tokens: each of its items brings one extra item per chunk (same layer and query, read
 * only), placed and computed like any other item (host or GPU, tier.h); the reply merges them into
 * the request's item with one softmax (LSE merge), on the loop.
 *
 * The operation is a state machine (att_state, att_step), its states in the order they run; a
 * state that waits (access, moves, tasks) returns and its callback moves the state on. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "ctx.h"
#include "dquant/attention.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/vskip.h"
#include "lane.h"
#include "logging.h"
#include "ops_internal.h"
#include "tensor.h"
#include "tier.h"
#include "work.h"

/* Requests up to this many payload bytes have their inputs converted and checked on the loop. */
#define ATT_INLINE_INPUT (256u << 10)

/* Stages of an ATTEND, timed for the debug-level trace line each reply logs. */
enum { ATT_T_ACCESS, ATT_T_INPUT, ATT_T_B0, ATT_T_B1, ATT_T_C0, ATT_T_C1, ATT_T_COUNT };

typedef dqd_tier_item att_item;

typedef enum att_state {
    ATT_ACCESS,   /* every sequence looked up: wait for access to them all */
    ATT_CHECK,    /* every item against its model, one shape, one append per layer; buffers */
    ATT_INPUT,    /* phase A: queries to f32, inputs checked (here for small requests, else tasks) */
    ATT_PLACE,    /* the tier of every (sequence, layer), GPU and host room reserved */
    ATT_MOVES,    /* GPU victims moved to the host (tier.h) */
    ATT_APPEND,   /* phase B; with phase C in one task when every item is on the GPU */
    ATT_ROLLBACK, /* an append failed after others were applied: undo them, then fail */
    ATT_FAILED,   /* an append failed, none applied: settle the sequences, fail */
    ATT_ATTEND,   /* phase C */
    ATT_REPLY,    /* the attention's result, or its first error */
} att_state;

typedef struct att_op {
    dqd_req *req;
    dqd_ctx *ctx;
    att_state state;
    const Dquant__Attend *a;
    size_t n;       /* items computed: the request's, then one per prefix chunk of each */
    size_t n_req;   /* the request's items (the reply's rows) */
    size_t *src;    /* per item: the request's item it belongs to */
    uint32_t *npre; /* per request item: the prefix chunks expected (their items follow n_req) */
    att_item *items;
    dqd_access_set as;
    uint32_t q_heads, head_dim;
    float scale;
    float *qf;
    uint8_t *out;
    size_t out_len;
    size_t nchunks;
    size_t *append_idx; /* items with appends */
    size_t nappend;
    size_t ncpu_append; /* of which on the host */
    bool gpu_b, gpu_c;  /* a GPU task in phase B (promotions, appends) / C (attention) */
    bool fused;         /* everything on the GPU: B and C in one task (see moves_done) */
    bool c_ran;         /* the fused task got to phase C (the appends all succeeded) */
    uint64_t reserved;
    uint64_t gpu_reserved;
    dqd_gpu_moves mv;
    uint64_t t_ns[ATT_T_COUNT]; /* when each stage ended, for the debug trace */
    /* value skipping (attention_value_mass) on the host path: sealed value streams decoded and
     * in all, summed by the attention tasks (atomically) */
    uint64_t v_decoded, v_sealed;
    int fail_rc;
    char msg[256];
} att_op;

static void att_free(att_op *op)
{
    if (op->reserved)
        dqd_store_unreserve(op->ctx->store, op->reserved);
    if (op->gpu_reserved)
        dqd_store_gpu_unreserve(op->ctx->store, op->gpu_reserved);
    dqd_store_gpu_moves_finish(op->ctx->store, &op->mv);
    dqd_access_end(&op->as);
    if (op->items) {
        for (size_t i = 0; i < op->n; i++) {
            dqd_tier_item_clear(&op->items[i]);
        }
    }
    free(op->items);
    free(op->src);
    free(op->npre);
    free(op->qf);
    free(op->out);
    free(op->append_idx);
    free(op);
}

static void att_fail(att_op *op, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void att_fail(att_op *op, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dqd_req_fail(op->req, code, "%s", msg);
    att_free(op);
}

static void chunk_range(size_t n, size_t nchunks, size_t c, size_t *lo, size_t *hi)
{
    *lo = n * c / nchunks;
    *hi = n * (c + 1) / nchunks;
}

static size_t qsize(const att_op *op)
{
    return (size_t)op->q_heads * op->head_dim;
}

/* The states' work, defined below in the order the states run. */
static void access_ready(dqd_access_set *as);
static int att_check(att_op *op);
static void start_input(att_op *op);
static int att_place(att_op *op);
static void moves_done(void *arg, int rc);
static void start_append(att_op *op);
static void att_rollback(att_op *op);
static void settle_b(att_op *op, bool rolled_back);
static void start_attend(att_op *op);
static void att_reply(att_op *op);
static void attend_gpu(att_op *op);

/* Runs the operation from op->state until it waits or has finished. */
static void att_step(att_op *op)
{
    for (;;) {
        switch (op->state) {
        case ATT_ACCESS:
            dqd_access_start(&op->as, access_ready, op);
            return;
        case ATT_CHECK:
            if (att_check(op) < 0)
                return;
            op->state = ATT_INPUT;
            break;
        case ATT_INPUT:
            start_input(op);
            return;
        case ATT_PLACE: {
            int rc = att_place(op);
            if (rc < 0)
                return;
            op->state = rc ? ATT_MOVES : ATT_ATTEND;
            break;
        }
        case ATT_MOVES:
            dqd_tier_moves_run(op->ctx, &op->mv, moves_done, op);
            return;
        case ATT_APPEND:
            start_append(op);
            return;
        case ATT_ROLLBACK:
            att_rollback(op);
            return;
        case ATT_FAILED:
            settle_b(op, false);
            att_fail(op, op->fail_rc, "%s", op->msg);
            return;
        case ATT_ATTEND:
            start_attend(op);
            return;
        case ATT_REPLY:
            att_reply(op);
            return;
        }
    }
}

/* Moving a host layer to the GPU changes the sequence: that needs exclusive access too. (Its slots
 * may be changing right now; host_layers is the loop's own count.) */
static void add_item(att_op *op, size_t i, dqd_seq *seq, size_t src, bool append)
{
    att_item *it = &op->items[i];
    it->seq = seq;
    it->append = append;
    op->src[i] = src;
    if (append)
        op->append_idx[op->nappend++] = i;
    bool move = seq->host_layers && dqd_tier_gpu_ok(op->ctx, seq->model);
    dqd_access_add(&op->as, seq, append || move ? DQD_ACCESS_WRITE : DQD_ACCESS_READ);
}

void dqd_op_attend(dqd_req *req)
{
    const Dquant__Attend *a = req->msg->attend;
    const size_t nreq = a->n_items;
    att_op *op = calloc(1, sizeof *op);
    dqd_seq **seqs = calloc(nreq, sizeof *seqs);
    if (op)
        op->npre = calloc(nreq, sizeof *op->npre);
    if (!op || !seqs || !op->npre) {
        if (op)
            free(op->npre);
        free(op);
        free(seqs);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    op->req = req;
    op->ctx = req->ctx;
    op->a = a;
    op->n_req = nreq;
    size_t total = nreq;
    for (size_t i = 0; i < nreq; i++) {
        seqs[i] = dqd_ops_lookup(req, a->items[i]->seq);
        if (!seqs[i]) {
            for (size_t j = 0; j < i; j++)
                dqd_seq_unref(seqs[j]);
            free(seqs);
            free(op->npre);
            free(op);
            dqd_req_fail(req, DQ_NOT_FOUND, "item %zu: no such sequence", i);
            return;
        }
        op->npre[i] = seqs[i]->nprefix; /* fixed once the sequence is visible */
        total += seqs[i]->nprefix;
    }
    op->n = total;
    op->items = calloc(total, sizeof *op->items);
    op->src = malloc(total * sizeof *op->src);
    op->append_idx = malloc(total * sizeof *op->append_idx);
    if (!op->items || !op->src || !op->append_idx || dqd_access_init(&op->as, total) < 0) {
        for (size_t j = 0; j < nreq; j++)
            dqd_seq_unref(seqs[j]);
        free(seqs);
        op->n = 0;
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        att_free(op);
        return;
    }
    size_t x = nreq;
    for (size_t i = 0; i < nreq; i++) {
        add_item(op, i, seqs[i], i, a->items[i]->append_k != NULL);
        for (uint32_t p = 0; p < op->npre[i]; p++) {
            dqd_seq *chunk = seqs[i]->prefix[p];
            dqd_seq_ref(chunk); /* the access set drops it at the end */
            add_item(op, x++, chunk, i, false);
        }
    }
    free(seqs);
    op->state = ATT_ACCESS;
    att_step(op);
}

static void access_ready(dqd_access_set *as)
{
    att_op *op = as->arg;
    op->t_ns[ATT_T_ACCESS] = dqd_now_ns();
    op->state = ATT_CHECK;
    att_step(op);
}

/* Every item against its model; the output and query buffers. */
static int att_check(att_op *op)
{
    dqd_ctx *ctx = op->ctx;
    const Dquant__Attend *a = op->a;
    for (size_t i = 0; i < op->n; i++) {
        att_item *it = &op->items[i];
        const Dquant__AttendItem *src = a->items[op->src[i]];
        if (!dqd_seq_alive(it->seq)) {
            att_fail(op, DQ_NOT_FOUND, "item %zu: no such sequence", op->src[i]);
            return -1;
        }
        if (i < op->n_req && it->seq->nprefix != op->npre[i]) {
            /* created on a prefix while this request waited: its chunks are not in the batch */
            att_fail(op, DQ_BUSY, "item %zu: the sequence was being created; retry", i);
            return -1;
        }
        const dqd_model *m = it->seq->model;
        dqd_model_info info;
        dqd_model_info_of(m, &info);
        char msg[200];
        dqd_payload pl;
        dqd_req_payload(op->req, &pl);
        int rc = dqd_validate_attend_item(src, &pl, &info, &it->q, &it->ak, &it->av, msg, sizeof msg);
        if (rc < 0) {
            att_fail(op, rc, "item %zu: %s", i, msg);
            return -1;
        }
        if (i == 0) {
            op->q_heads = m->q_heads;
            op->head_dim = m->head_dim;
        } else if (m->q_heads != op->q_heads || m->head_dim != op->head_dim) {
            att_fail(op, DQ_SHAPE, "item %zu: q_heads/head_dim differ from item 0's; batch items of one shape", i);
            return -1;
        }
        it->codec = m->codec;
        it->layer = src->layer;
        if (i >= op->n_req) { /* a prefix chunk's item: read only */
            memset(&it->ak, 0, sizeof it->ak);
            memset(&it->av, 0, sizeof it->av);
        }
    }
    op->scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)op->head_dim);

    /* Two appends to one layer in one batch would make the result depend on item order. */
    if (op->nappend > 1) {
        dqd_layer_key *keys = malloc(op->nappend * sizeof *keys);
        if (!keys) {
            att_fail(op, DQ_NOMEM, "out of memory");
            return -1;
        }
        for (size_t k = 0; k < op->nappend; k++) {
            const att_item *it = &op->items[op->append_idx[k]];
            keys[k] = (dqd_layer_key){(uintptr_t)it->seq, it->layer, op->append_idx[k]};
        }
        qsort(keys, op->nappend, sizeof *keys, dqd_layer_key_cmp);
        for (size_t x = 1; x < op->nappend; x++) {
            if (dqd_layer_key_same(&keys[x], &keys[x - 1])) {
                uint32_t layer = keys[x].layer;
                free(keys);
                att_fail(op, DQ_INVALID_ARGUMENT, "two items append to the same sequence layer %u", layer);
                return -1;
            }
        }
        free(keys);
    }

    size_t qbytes = op->n * qsize(op) * sizeof(float);
    op->out_len = qbytes + op->n * op->q_heads * sizeof(float);
    if (op->out_len > ctx->cfg->max_payload) {
        att_fail(op, DQ_TOO_LARGE, "the reply would exceed max_payload; split the batch");
        return -1;
    }
    op->qf = malloc(qbytes);
    op->out = dqd_req_out_alloc(op->req, op->out_len);
    if (!op->qf || !op->out) {
        att_fail(op, DQ_NOMEM, "out of memory");
        return -1;
    }
    return 0;
}

/* ---- phase A: inputs ---- */

/* The appended token, checked finite; on the cuda backend checked as dq_layer_append would check
 * it (dq_check_tokens), which spares the GPU append its check kernel and round trip. */
static int check_append(const att_op *op, att_item *it)
{
    const void *kd, *vd;
    void *kt = NULL, *vt = NULL;
    const dq_dtype dt = dqd_tensor_dtype(&it->ak);
    int rc = dqd_tensor_aligned(&it->ak, &kd, &kt);
    if (rc == 0)
        rc = dqd_tensor_aligned(&it->av, &vd, &vt);
    if (rc == 0)
        rc = dq_check_finite(kd, dt, (size_t)it->ak.count);
    if (rc == 0)
        rc = dq_check_finite(vd, dt, (size_t)it->av.count);
    if (rc == 0 && dqd_tier_precheck(op->ctx)) {
        const size_t ntok = (size_t)it->ak.count / it->codec->n;
        dq_workspace *ws = dqd_codec_ws_take(it->codec);
        rc = ws ? dq_check_tokens(ws, kd, dt, ntok) : DQ_NOMEM;
        if (rc == 0)
            rc = dq_check_tokens(ws, vd, dt, ntok);
        dqd_codec_ws_give(it->codec, ws);
        it->checked = rc == 0;
    }
    free(kt);
    free(vt);
    return rc;
}

static void input_task(void *arg, size_t c)
{
    att_op *op = arg;
    size_t lo, hi;
    chunk_range(op->n, op->nchunks, c, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        att_item *it = &op->items[i];
        float *q = op->qf + i * qsize(op);
        it->rc = dqd_tensor_to_f32(&it->q, q);
        /* NaN/Inf, then a query so large that a logit could overflow (attention.h, "Numerics"):
         * refused here for both backends, so no kernel ever sees it. */
        if (it->rc == 0)
            it->rc = dq_attend_check_query(q, op->q_heads, op->head_dim, op->scale, NULL, NULL);
        if ((it->rc == 0 || it->rc == DQ_RANGE) && it->append) {
            int rc = check_append(op, it);
            if (rc < 0 && (it->rc == 0 || rc == DQ_NONFINITE))
                it->rc = rc;
        }
    }
}

/* The request's first input error, NaN/Inf anywhere first (CONTRIBUTING "Precedence"). */
static void input_fail(att_op *op)
{
    size_t bad = op->n;
    for (size_t i = 0; i < op->n && bad == op->n; i++)
        if (op->items[i].rc == DQ_NONFINITE)
            bad = i;
    for (size_t i = 0; i < op->n && bad == op->n; i++)
        if (op->items[i].rc < 0)
            bad = i;
    const int rc = op->items[bad].rc;
    const size_t item = op->src[bad];
    if (rc == DQ_NONFINITE) {
        att_fail(op, rc, "item %zu: q or the appended k/v holds NaN or infinity", item);
        return;
    }
    uint32_t head = 0;
    double norm = 0;
    const float *q = op->qf + bad * qsize(op);
    if (rc == DQ_RANGE && dq_attend_check_query(q, op->q_heads, op->head_dim, op->scale, &head, &norm) == DQ_RANGE) {
        att_fail(op, rc,
                 "item %zu: q head %u has |q|*max(1, scale) = %.3g, above %.3g: its logits could overflow the float "
                 "range",
                 item, head, norm, DQ_ATTEND_QUERY_MAX);
        return;
    }
    if (rc == DQ_RANGE) {
        att_fail(op, rc, "item %zu: the appended k/v holds a value outside the codec range", item);
        return;
    }
    att_fail(op, rc, "item %zu: %s", item, dq_strerror(rc));
}

static void input_done(void *arg)
{
    att_op *op = arg;
    op->t_ns[ATT_T_INPUT] = dqd_now_ns();
    for (size_t i = 0; i < op->n; i++) {
        if (op->items[i].rc < 0) {
            input_fail(op);
            return;
        }
    }
    op->state = ATT_PLACE;
    att_step(op);
}

/* Phase A. A small request (a decode step's queries, a token or two appended) is converted and
 * checked right here: a thread-pool round trip costs more than the work (tens of microseconds). */
static void start_input(att_op *op)
{
    if (op->req->payload_len <= ATT_INLINE_INPUT) {
        op->nchunks = 1;
        input_task(op, 0);
        input_done(op);
        return;
    }
    op->nchunks = dqd_tasks_split(op->ctx, op->n);
    if (dqd_tasks_run(op->ctx, op->nchunks, input_task, input_done, op) < 0)
        att_fail(op, DQ_NOMEM, "out of memory");
}

/* ---- placement ---- */

/* 1: there are appends or promotions (MOVES next), 0: none (straight to ATTEND), -1: failed. */
static int att_place(att_op *op)
{
    if (dqd_tier_place_items(op->ctx, op->items, op->n, &op->as, &op->gpu_reserved, &op->mv) < 0) {
        att_fail(op, DQ_NOMEM, "out of memory");
        return -1;
    }
    op->gpu_b = false;
    for (size_t i = 0; i < op->n; i++)
        op->gpu_b |= op->items[i].promote || (op->items[i].gpu && op->items[i].append);
    op->ncpu_append = 0;
    uint64_t need = 0;
    for (size_t k = 0; k < op->nappend; k++) {
        att_item *it = &op->items[op->append_idx[k]];
        if (it->gpu)
            continue;
        op->ncpu_append++;
        need += dqd_tier_item_host_need(it);
    }
    if (!op->ncpu_append && !op->gpu_b)
        return 0;
    int rc = dqd_store_reserve(op->ctx->store, need, NULL);
    if (rc < 0) {
        att_fail(op, rc, "appending needs about %llu bytes and nothing evictable frees enough",
                 (unsigned long long)need);
        return -1;
    }
    op->reserved = need;
    return 1;
}

static void moves_done(void *arg, int rc)
{
    att_op *op = arg;
    if (rc < 0) {
        att_fail(op, rc, "cannot move sequences out of GPU memory: %s", dq_strerror(rc));
        return;
    }
    op->state = ATT_APPEND;
    att_step(op);
}

/* ---- phase B: appends ---- */

static void append_task(void *arg, size_t c)
{
    att_op *op = arg;
    if (c == op->nchunks) {
        op->t_ns[ATT_T_B0] = dqd_now_ns();
        dqd_tier_items_append_gpu(op->ctx, op->items, op->n, op->append_idx, op->nappend, op->fused);
        op->t_ns[ATT_T_B1] = dqd_now_ns();
        return;
    }
    size_t lo, hi;
    chunk_range(op->nappend, op->nchunks, c, &lo, &hi);
    for (size_t k = lo; k < hi; k++) {
        att_item *it = &op->items[op->append_idx[k]];
        if (it->gpu)
            continue;
        dqd_tier_item_append_host(op->ctx, it);
    }
}

/* After phase B, failed or not: promotions are counted, sequences whose layer could not be put back
 * are dropped, the others' accounting follows their layers. */
static void settle_b(att_op *op, bool rolled_back)
{
    uint64_t promoted = 0, spilled = 0;
    for (size_t i = 0; i < op->n; i++) {
        att_item *it = &op->items[i];
        promoted += it->promoted;
        spilled += it->spilled;
        if (!it->append && !it->promoted)
            continue;
        bool broken = it->gtxn.broken || (rolled_back && it->append && it->rc < 0);
        if (broken && it->seq->in_index) {
            DQD_ERROR("ATTEND rollback failed; dropping sequence ns='%s'", it->seq->ns);
            dqd_store_remove(op->ctx->store, it->seq);
        } else if (it->seq->in_index) {
            dqd_store_commit(op->ctx->store, it->seq);
        }
    }
    dqd_store_gpu_promoted(op->ctx->store, promoted);
    dqd_store_gpu_spilled(op->ctx->store, spilled);
}

/* Phase B went through: the appends are committed and counted, the reservations released. */
static void b_applied(att_op *op)
{
    settle_b(op, false);
    dqd_store_unreserve(op->ctx->store, op->reserved);
    op->reserved = 0;
    dqd_store_gpu_unreserve(op->ctx->store, op->gpu_reserved);
    op->gpu_reserved = 0;
    op->ctx->metrics.attend_appends += op->nappend;
    op->ctx->metrics.tokens_put += op->nappend;
}

static void append_done(void *arg)
{
    att_op *op = arg;
    int first = 0;
    size_t bad = 0, applied = 0;
    for (size_t i = 0; i < op->n; i++) {
        att_item *it = &op->items[i];
        if (!it->append && !it->promote)
            continue;
        if (it->rc < 0 && !first) {
            first = it->rc;
            bad = i;
        }
        applied += it->txn.applied + it->gtxn.applied;
    }
    if (first) {
        snprintf(op->msg, sizeof op->msg, "item %zu: %s failed: %s", bad,
                 op->items[bad].promote && !op->items[bad].promoted ? "moving its layer to the GPU" : "append",
                 dq_strerror(first));
        op->fail_rc = first;
        op->ctx->metrics.rollbacks += applied;
        op->state = applied ? ATT_ROLLBACK : ATT_FAILED;
    } else {
        b_applied(op);
        op->state = ATT_ATTEND;
    }
    att_step(op);
}

/* Fused: B and C in one task on the worker's stream. */
static void fused_task(void *arg, size_t c)
{
    (void)c;
    att_op *op = arg;
    op->t_ns[ATT_T_B0] = dqd_now_ns();
    dqd_tier_items_append_gpu(op->ctx, op->items, op->n, op->append_idx, op->nappend, op->fused);
    op->t_ns[ATT_T_B1] = op->t_ns[ATT_T_C0] = dqd_now_ns();
    for (size_t i = 0; i < op->n; i++)
        if (op->items[i].rc < 0)
            return;
    op->c_ran = true;
    attend_gpu(op);
    op->t_ns[ATT_T_C1] = dqd_now_ns();
}

static void fused_done(void *arg)
{
    att_op *op = arg;
    if (!op->c_ran) {
        append_done(op); /* a failed append: rolled back as in the two-task path */
        return;
    }
    b_applied(op);
    op->state = ATT_REPLY;
    att_step(op);
}

/* Phase B: the appends (and promotions) on the workers, or B and C fused in one GPU task. */
static void start_append(att_op *op)
{
    int rc;
    op->nchunks = op->ncpu_append ? dqd_tasks_split(op->ctx, op->nappend) : 0;
    /* Every item on the GPU: the attention follows the appends on the same stream, in one task,
     * without a synchronization and a trip through the loop in between. */
    op->fused = op->gpu_b && !op->ncpu_append;
    for (size_t i = 0; i < op->n && op->fused; i++)
        op->fused = op->items[i].gpu;
    if (op->fused && op->ctx->lane)
        rc = dqd_lane_run(op->ctx->lane, fused_task, fused_done, op);
    else if (op->fused)
        rc = dqd_tasks_run(op->ctx, 1, fused_task, fused_done, op);
    else
        rc = dqd_tasks_run(op->ctx, op->nchunks + op->gpu_b, append_task, append_done, op);
    if (rc < 0)
        att_fail(op, DQ_NOMEM, "out of memory");
}

static void rollback_task(void *arg, size_t c)
{
    att_op *op = arg;
    if (c == op->nchunks) {
        for (size_t k = 0; k < op->nappend; k++) {
            att_item *it = &op->items[op->append_idx[k]];
            if (it->gpu)
                it->rc = dqd_tier_item_rollback(op->ctx, it);
        }
        return;
    }
    size_t lo, hi;
    chunk_range(op->nappend, op->nchunks, c, &lo, &hi);
    for (size_t k = lo; k < hi; k++) {
        att_item *it = &op->items[op->append_idx[k]];
        if (!it->gpu)
            it->rc = dqd_tier_item_rollback(op->ctx, it);
    }
}

static void rollback_done(void *arg)
{
    att_op *op = arg;
    settle_b(op, true);
    att_fail(op, op->fail_rc, "%s", op->msg);
}

/* Undoes the applied appends on the workers, or here when that cannot even be queued. */
static void att_rollback(att_op *op)
{
    for (size_t k = 0; k < op->nappend; k++)
        op->items[op->append_idx[k]].rc = 0;
    size_t ntasks = op->nchunks + op->gpu_b;
    if (dqd_tasks_run(op->ctx, ntasks, rollback_task, rollback_done, op) == 0)
        return;
    for (size_t c = 0; c < ntasks; c++)
        rollback_task(op, c);
    rollback_done(op);
}

/* ---- phase C: attention ---- */

/* Every GPU item, in batches per codec (tier.h). */
static void attend_gpu(att_op *op)
{
    float *out = (float *)op->out;
    dqd_tier_items_attend_gpu(op->ctx, op->items, op->n, op->q_heads, op->head_dim, op->scale, op->qf, out,
                              out + op->n * qsize(op));
}

/* One dq_attend call of host items; with attention_value_mass on and a codec of levels (D-Quant or
 * fixed-width), dq_attend_vskip (dquant/vskip.h), its value streams counted for the metrics. */
static int attend_host(att_op *op, const dq_codec *view, dq_workspace *ws, const dq_attn_item *batch, size_t nb)
{
    const double tau = op->ctx->cfg->attention_value_mass;
    const dq_codec_type type = dq_codec_profile(view)->codec_type;
    if (!(tau > 0.0 && tau < 1.0) || (type != DQ_CODEC_DQUANT && type != DQ_CODEC_FIXED))
        return dq_attend(view, ws, op->q_heads, op->scale, batch, nb);
    dq_vskip_out vo[64];
    memset(vo, 0, sizeof vo);
    int rc = dq_attend_vskip(view, ws, op->q_heads, op->scale, tau, batch, vo, nb);
    if (rc == DQ_OK) {
        uint64_t dec = 0, all = 0;
        for (size_t k = 0; k < nb; k++) {
            dec += vo[k].values_decoded;
            all += vo[k].values_sealed;
        }
        __atomic_fetch_add(&op->v_decoded, dec, __ATOMIC_RELAXED);
        __atomic_fetch_add(&op->v_sealed, all, __ATOMIC_RELAXED);
    }
    return rc;
}

static void attend_task(void *arg, size_t c)
{
    att_op *op = arg;
    if (c == op->nchunks) {
        op->t_ns[ATT_T_C0] = dqd_now_ns();
        attend_gpu(op);
        op->t_ns[ATT_T_C1] = dqd_now_ns();
        return;
    }
    size_t lo, hi;
    chunk_range(op->n, op->nchunks, c, &lo, &hi);
    float *out = (float *)op->out;
    float *lse = out + op->n * qsize(op);
    size_t i = lo;
    while (i < hi) {
        if (op->items[i].gpu) {
            i++;
            continue;
        }
        /* A run of items of one codec view (the codec, or one layer's of a per-layer calibrated
         * codec) shares a workspace and one dq_attend call. */
        dqd_codec *codec = op->items[i].codec;
        const dq_codec *view = dqd_codec_view(codec, op->items[i].layer);
        size_t j = i;
        dq_attn_item batch[64];
        size_t nb = 0;
        while (j < hi && op->items[j].codec == codec && dqd_codec_view(codec, op->items[j].layer) == view &&
               !op->items[j].gpu && nb < 64) {
            att_item *it = &op->items[j];
            const dq_layer *l = it->seq->layers[it->layer];
            if (!l) {
                memset(out + j * qsize(op), 0, qsize(op) * sizeof(float));
                for (uint32_t h = 0; h < op->q_heads; h++)
                    lse[j * op->q_heads + h] = -INFINITY;
            } else {
                batch[nb++] = (dq_attn_item){l, op->qf + j * qsize(op), out + j * qsize(op), lse + j * op->q_heads};
            }
            j++;
        }
        if (nb) {
            dq_workspace *ws = dqd_codec_ws_take(codec);
            int rc = ws ? attend_host(op, view, ws, batch, nb) : DQ_NOMEM;
            dqd_codec_ws_give(codec, ws);
            for (size_t k = i; k < j; k++)
                op->items[k].rc = rc;
        }
        i = j;
    }
}

static void attend_done(void *arg)
{
    att_op *op = arg;
    op->state = ATT_REPLY;
    att_step(op);
}

static void start_attend(att_op *op)
{
    size_t ngpu = 0;
    for (size_t i = 0; i < op->n; i++) {
        op->items[i].rc = 0;
        ngpu += op->items[i].gpu;
    }
    op->gpu_c = ngpu > 0;
    op->nchunks = ngpu < op->n ? dqd_tasks_split(op->ctx, op->n) : 0;
    /* all on the GPU: the one task goes to the GPU threads (lane.h) */
    int rc;
    if (!op->nchunks && op->ctx->lane)
        rc = dqd_lane_run(op->ctx->lane, attend_task, attend_done, op);
    else
        rc = dqd_tasks_run(op->ctx, op->nchunks + op->gpu_c, attend_task, attend_done, op);
    if (rc < 0)
        att_fail(op, DQ_NOMEM, "out of memory");
}

/* Where a successful ATTEND's time went, in microseconds from the request's arrival (debug level;
 * the GPU stages as the GPU task saw them, 0 when there was none). */
static void att_trace(const att_op *op)
{
    if (dqd_log_max < DQ_LOG_DEBUG)
        return;
    const uint64_t t0 = op->req->t0_ns, now = dqd_now_ns();
    double us[ATT_T_COUNT];
    for (int i = 0; i < ATT_T_COUNT; i++)
        us[i] = op->t_ns[i] ? (double)(op->t_ns[i] - t0) * 1e-3 : 0.0;
    size_t ngpu = 0;
    for (size_t i = 0; i < op->n; i++)
        ngpu += op->items[i].gpu;
    DQD_DEBUG("ATTEND trace: %zu items (%zu GPU, %zu appends%s): access %.1f us, inputs %.1f, GPU B %.1f-%.1f, "
              "GPU C %.1f-%.1f, reply %.1f",
              op->n, ngpu, op->nappend, op->fused ? ", fused" : "", us[ATT_T_ACCESS], us[ATT_T_INPUT], us[ATT_T_B0],
              us[ATT_T_B1], us[ATT_T_C0], us[ATT_T_C1], (double)(now - t0) * 1e-3);
}

/* The prefix chunks' items merged into their request items with one softmax: for parts with
 * (out_i, lse_i), out = Σ exp(lse_i − L)·out_i with L = log Σ exp(lse_i), merged pairwise. The
 * reply then holds the request's items only. 0 or DQ_NOMEM. */
static int merge_prefix(att_op *op)
{
    const size_t qs = qsize(op), qh = op->q_heads, hd = op->head_dim;
    const float *out = (const float *)op->out, *lse = out + op->n * qs;
    const size_t len = op->n_req * (qs + qh) * sizeof(float);
    uint8_t *buf = dqd_req_out_alloc(op->req, len);
    if (!buf)
        return DQ_NOMEM;
    float *mo = (float *)buf, *ml = mo + op->n_req * qs;
    memcpy(mo, out, op->n_req * qs * sizeof(float));
    memcpy(ml, lse, op->n_req * qh * sizeof(float));
    for (size_t x = op->n_req; x < op->n; x++) {
        const size_t i = op->src[x];
        for (size_t h = 0; h < qh; h++) {
            const double a = ml[i * qh + h], b = lse[x * qh + h];
            const double m = a > b ? a : b;
            if (m == -INFINITY)
                continue;
            const double wa = exp(a - m), wb = exp(b - m), s = wa + wb;
            float *o = mo + i * qs + h * hd;
            const float *ob = out + x * qs + h * hd;
            for (size_t d = 0; d < hd; d++)
                o[d] = (float)((wa * o[d] + wb * ob[d]) / s);
            ml[i * qh + h] = (float)(m + log(s));
        }
    }
    free(op->out);
    op->out = buf;
    op->out_len = len;
    return DQ_OK;
}

static void att_reply(att_op *op)
{
    for (size_t i = 0; i < op->n; i++) {
        if (op->items[i].rc == DQ_RANGE) {
            att_fail(op, DQ_RANGE,
                     "item %zu: the attention result is not finite (stored values too large for this "
                     "query)",
                     op->src[i]);
            return;
        }
        if (op->items[i].rc < 0) {
            att_fail(op, op->items[i].rc, "item %zu: %s", op->src[i], dq_strerror(op->items[i].rc));
            return;
        }
    }
    for (size_t i = 0; i < op->n; i++)
        dqd_store_touch(op->ctx->store, op->items[i].seq);
    if (op->n > op->n_req && merge_prefix(op) < 0) {
        att_fail(op, DQ_NOMEM, "out of memory");
        return;
    }
    const size_t n = op->n_req;
    op->ctx->metrics.attend_items += n;
    op->ctx->metrics.attend_values_decoded += op->v_decoded;
    op->ctx->metrics.attend_values_skipped += op->v_sealed - op->v_decoded;

    Dquant__AttendReply r = DQUANT__ATTEND_REPLY__INIT;
    Dquant__Tensor to, tl;
    uint64_t so[3], sl[2];
    const uint64_t oshape[3] = {n, op->q_heads, op->head_dim};
    const uint64_t lshape[2] = {n, op->q_heads};
    size_t olen = n * qsize(op) * sizeof(float);
    dqd_reply_tensor(&to, so, DQUANT__DTYPE__F32, oshape, 3, 0, olen);
    dqd_reply_tensor(&tl, sl, DQUANT__DTYPE__F32, lshape, 2, olen, n * op->q_heads * sizeof(float));
    r.out = &to;
    r.lse = &tl;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_ATTEND;
    resp.attend = &r;
    att_trace(op);
    uint8_t *out = op->out;
    op->out = NULL;
    dqd_req_reply(op->req, &resp, out, op->out_len);
    att_free(op);
}

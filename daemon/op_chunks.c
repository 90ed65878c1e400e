/* dquantd shared KV tier: PUT_CHUNKS and LOOKUP.
 *
 * A chunk is a store entry of kind CHUNK (store.h): a sequence of exactly chunk_tokens tokens in
 * every layer of its model, under (ns, 16-byte key). PUT_CHUNKS stores its chunks one after the
 * other through op_put.c (dqd_op_put_chunk), so that visibility, FIFO access, the budget, eviction
 * and the GPU tier are those of sequences; a chunk already held is acknowledged without encoding.
 * Each chunk is all or nothing; when chunk i fails, chunks 0..i-1 stay (they are a valid prefix)
 * and the request answers the error. Everything that can be checked without the store (key sizes,
 * token counts, the parent) is checked before the first chunk, so bad input stores nothing.
 *
 * LOOKUP runs on the loop at once: the number of leading keys held (stopping at the first miss);
 * with lease_ms it leases those chunks to the connection (lease.h), after releasing
 * release_lease when given. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "dquant/error.h"
#include "logging.h"
#include "ops_internal.h"
#include "work.h"

typedef struct chunks_op {
    dqd_req *req;
    dqd_ctx *ctx;
    size_t n_keys;
    const ProtobufCBinaryData *keys;
    dqd_raw_in *raw; /* PUT_CHUNKS_RAW: every layer's records */
    int *raw_rc;     /* per layer: dq_window_check of its records; raw_bad: the first bad window */
    size_t *raw_bad;
    dqd_model *model;
    Dquant__SeqRef ref;
    Dquant__Put put;
    dqd_chunk_put cp;
    size_t next;
    bool in_launch, finished_sync;
    int fail_rc;
    char fail_msg[300];
    protobuf_c_boolean *was_held;
    uint64_t stored, deduped, streams;
} chunks_op;

static void chunks_free(chunks_op *op)
{
    dqd_model_drop(op->model);
    free(op->was_held);
    free(op->raw);
    free(op->raw_rc);
    free(op->raw_bad);
    free(op);
}

/* A chunk held (committed, not deleted) in ns for model, referenced; NULL if none. */
static dqd_seq *chunk_ref(dqd_ctx *ctx, const char *ns, const dqd_model *model, const uint8_t *key)
{
    dqd_seq *seq = dqd_store_lookup_kind(ctx->store, ns, strlen(ns), key, DQD_CHUNK_KEY_BYTES, (uint8_t)DQD_KIND_CHUNK);
    if (seq && (!dqd_seq_alive(seq) || seq->model != model)) {
        dqd_seq_unref(seq);
        seq = NULL;
    }
    return seq;
}

static bool chunk_held(dqd_ctx *ctx, const char *ns, const dqd_model *model, const uint8_t *key)
{
    dqd_seq *seq = chunk_ref(ctx, ns, model, key);
    if (seq)
        dqd_seq_unref(seq);
    return seq != NULL;
}

static void chunks_reply(chunks_op *op)
{
    Dquant__PutChunksReply r = DQUANT__PUT_CHUNKS_REPLY__INIT;
    r.stored = op->stored;
    r.deduped = op->deduped;
    r.n_was_held = op->n_keys;
    r.was_held = op->was_held;
    r.streams_encoded = op->streams;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_PUT_CHUNKS;
    resp.put_chunks = &r;
    dqd_req_reply(op->req, &resp, NULL, 0);
}

static void advance(chunks_op *op);

static void chunk_done(void *arg, int rc, const char *msg, bool deduped, uint64_t streams)
{
    chunks_op *op = arg;
    if (rc < 0) {
        op->fail_rc = rc;
        snprintf(op->fail_msg, sizeof op->fail_msg, "chunk %zu: %s", op->next, msg ? msg : dq_strerror(rc));
    } else {
        op->was_held[op->next] = deduped;
        if (deduped) {
            op->deduped++;
            op->ctx->metrics.chunk_dedupe_hits++;
        } else {
            op->stored++;
            op->ctx->metrics.chunks_put++;
        }
        op->streams += streams;
        op->next++;
    }
    if (op->in_launch) {
        op->finished_sync = true;
        return;
    }
    advance(op);
}

/* Launches chunk after chunk; a chunk that finishes before dqd_op_put_chunk returns (deduped, or
 * an early failure) loops here rather than recursing. */
static void advance(chunks_op *op)
{
    for (;;) {
        if (op->fail_rc < 0) {
            dqd_req_fail(op->req, op->fail_rc, "%s", op->fail_msg);
            chunks_free(op);
            return;
        }
        if (op->next == op->n_keys) {
            chunks_reply(op);
            chunks_free(op);
            return;
        }
        op->ref.key = op->keys[op->next];
        op->cp.token_off = (uint64_t)op->next * op->model->chunk_tokens;
        op->in_launch = true;
        op->finished_sync = false;
        dqd_op_put_chunk(op->req, &op->cp);
        op->in_launch = false;
        if (!op->finished_sync)
            return;
    }
}

/* What PUT_CHUNKS and PUT_CHUNKS_RAW share once their input is checked: the parent must be held,
 * then each chunk is PUT as a CHUNK entry of the model. False (op freed, request failed) when the
 * parent is missing. */
static bool chunks_begin(chunks_op *op, dqd_ctx *ctx, dqd_req *req, dqd_model *model, const char *ns_in,
                         char *model_name, const ProtobufCBinaryData *parent, size_t n_keys,
                         const ProtobufCBinaryData *keys)
{
    const char *ns = ns_in ? ns_in : "";
    if (parent->len && !chunk_held(ctx, ns, model, parent->data)) {
        chunks_free(op);
        dqd_req_fail(req, DQ_NOT_FOUND, "parent chunk not held");
        return false;
    }
    op->req = req;
    op->ctx = ctx;
    op->n_keys = n_keys;
    op->keys = keys;
    op->model = model;
    dqd_model_hold(model); /* PUT_CHUNKS_RAW checks its records on the workers first */
    dquant__seq_ref__init(&op->ref);
    op->ref.ns = (char *)ns;
    op->ref.kind = DQUANT__SEQ_KIND__CHUNK;
    dquant__put__init(&op->put);
    op->put.seq = &op->ref;
    op->put.model = model_name;
    op->put.num_layers = model->layers;
    op->put.tokens = model->chunk_tokens;
    op->cp.put = &op->put;
    op->cp.model = model;
    op->cp.done = chunk_done;
    op->cp.arg = op;
    return true;
}

void dqd_op_put_chunks(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    const Dquant__PutChunks *pc = req->msg->put_chunks;
    dqd_model *model = dqd_registry_find(ctx->reg, pc->model);
    if (!model) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no model named '%s' (REGISTER_MODEL first)", pc->model);
        return;
    }
    chunks_op *op = calloc(1, sizeof *op);
    if (!op || !(op->was_held = calloc(pc->n_keys, sizeof *op->was_held))) {
        free(op);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    dqd_model_info info;
    dqd_model_info_of(model, &info);
    char msg[256];
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    int rc = dqd_validate_put_chunks(pc, &pl, &info, model->chunk_tokens, &op->cp.k, &op->cp.v, msg, sizeof msg);
    if (rc < 0) {
        chunks_free(op);
        dqd_req_fail(req, rc, "%s", msg);
        return;
    }
    if (!chunks_begin(op, ctx, req, model, pc->ns, pc->model, &pc->parent, pc->n_keys, pc->keys))
        return;
    op->cp.tokens_total = op->cp.k.shape[1];
    advance(op);
}

/* PUT_CHUNKS_RAW: every record of every chunk checked on the workers before the first chunk is
 * stored, so corrupt input stores nothing (each chunk's append checks its records again). */
static void raw_check_task(void *arg, size_t i)
{
    chunks_op *op = arg;
    const dqd_codec *codec = op->model->codec;
    const dq_codec *view = dqd_codec_view(codec, (uint32_t)i); /* i: the model layer */
    op->raw_rc[i] = DQ_OK;
    for (size_t w = 0; w < op->raw[i].windows; w++) {
        int rc = dq_window_check(view, op->raw[i].records + w * codec->window_bytes);
        if (rc < 0) {
            op->raw_rc[i] = rc;
            op->raw_bad[i] = w;
            return;
        }
    }
}

static void raw_check_done(void *arg)
{
    chunks_op *op = arg;
    const uint64_t per = op->model->chunk_tokens / op->model->codec->profile.window;
    for (uint32_t l = 0; l < op->model->layers; l++) {
        if (op->raw_rc[l] == DQ_CORRUPT) {
            dqd_req_fail(op->req, DQ_CORRUPT,
                         "chunk %llu layer %u window %zu: the record breaks the container's decode invariants "
                         "(DESIGN 2.3)",
                         (unsigned long long)(op->raw_bad[l] / per), l, op->raw_bad[l]);
            chunks_free(op);
            return;
        }
        if (op->raw_rc[l] < 0) {
            dqd_req_fail(op->req, op->raw_rc[l], "layer %u: %s", l, dq_strerror(op->raw_rc[l]));
            chunks_free(op);
            return;
        }
    }
    advance(op);
}

/* PUT_CHUNKS_RAW: as PUT_CHUNKS, each chunk stored from its windows of every layer's records. */
void dqd_op_put_chunks_raw(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    const Dquant__PutChunksRaw *pc = req->msg->put_chunks_raw;
    dqd_model *model = dqd_registry_find(ctx->reg, pc->model);
    if (!model) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no model named '%s' (REGISTER_MODEL first)", pc->model);
        return;
    }
    if (pc->n_layers != model->layers) {
        dqd_req_fail(req, DQ_INVALID_ARGUMENT, "%zu raw layers; chunks hold all %u layers of model '%s'", pc->n_layers,
                     model->layers, model->name);
        return;
    }
    chunks_op *op = calloc(1, sizeof *op);
    if (!op || !(op->was_held = calloc(pc->n_keys, sizeof *op->was_held)) ||
        !(op->raw = calloc(pc->n_layers, sizeof *op->raw))) {
        if (op)
            chunks_free(op);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    char msg[256];
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    uint64_t tokens = 0;
    int rc = dqd_ops_raw_layers(model, pc->layers, pc->n_layers, 0, &pc->profile, &pl, op->raw, &tokens, msg,
                                sizeof msg);
    if (rc == DQ_OK && tokens != (uint64_t)pc->n_keys * model->chunk_tokens) {
        rc = DQ_SHAPE;
        snprintf(msg, sizeof msg, "%llu tokens per layer for %zu chunks of %u tokens", (unsigned long long)tokens,
                 pc->n_keys, model->chunk_tokens);
    }
    for (uint32_t l = 0; rc == DQ_OK && l < model->layers; l++)
        if (op->raw[l].tail_tokens) {
            rc = DQ_SHAPE;
            snprintf(msg, sizeof msg, "layer %u: chunks hold whole windows, no tail", l);
        }
    if (rc < 0) {
        chunks_free(op);
        dqd_req_fail(req, rc, "%s", msg);
        return;
    }
    if (!chunks_begin(op, ctx, req, model, pc->ns, pc->model, &pc->parent, pc->n_keys, pc->keys))
        return;
    op->cp.raw = op->raw;
    op->cp.tokens_total = tokens;
    op->raw_rc = calloc(model->layers, sizeof *op->raw_rc);
    op->raw_bad = calloc(model->layers, sizeof *op->raw_bad);
    if (!op->raw_rc || !op->raw_bad || dqd_tasks_run(ctx, model->layers, raw_check_task, raw_check_done, op) < 0) {
        chunks_free(op);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
    }
}

void dqd_op_lookup(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    const Dquant__Lookup *l = req->msg->lookup;
    Dquant__LookupReply r = DQUANT__LOOKUP_REPLY__INIT;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_LOOKUP;
    resp.lookup = &r;
    if (l->release_lease && dqd_lease_release(&ctx->leases, req->sess, l->release_lease) < 0) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no lease %llu on this connection (expired or released)",
                     (unsigned long long)l->release_lease);
        return;
    }
    if (!l->n_keys && l->release_lease) {
        dqd_req_reply(req, &resp, NULL, 0);
        return;
    }
    dqd_model *model = dqd_registry_find(ctx->reg, l->model);
    if (!model) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no model named '%s' (REGISTER_MODEL first)", l->model);
        return;
    }
    if (l->lease_ms && req->sess->leases >= ctx->cfg->max_leases) {
        dqd_req_fail(req, DQ_RESOURCE_EXHAUSTED, "the connection holds %u leases, the limit", req->sess->leases);
        return;
    }
    const char *ns = l->ns ? l->ns : "";
    dqd_seq **held = l->lease_ms && l->n_keys ? malloc(l->n_keys * sizeof *held) : NULL;
    if (l->lease_ms && l->n_keys && !held) {
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    size_t hits = 0;
    for (; hits < l->n_keys; hits++) {
        dqd_seq *seq = chunk_ref(ctx, ns, model, l->keys[hits].data);
        if (!seq)
            break;
        dqd_store_touch(ctx->store, seq);
        if (held) {
            dqd_seq_prefetch(seq); /* leased to be read soon: a chunk on disk comes back meanwhile */
            held[hits] = seq;      /* the lease takes the reference over */
        } else {
            dqd_seq_unref(seq);
        }
    }
    if (held && hits) {
        int rc = dqd_lease_add(&ctx->leases, req->sess, &req->sess->leases, held, hits,
                               dqd_now_ns() + (uint64_t)l->lease_ms * 1000000u, &r.lease_id);
        if (rc < 0) {
            free(held);
            dqd_req_fail(req, rc, "cannot lease: %s", dq_strerror(rc));
            return;
        }
        r.lease_ms = l->lease_ms;
    }
    free(held);
    ctx->metrics.lookups++;
    ctx->metrics.lookup_hit_tokens += (uint64_t)hits * model->chunk_tokens;
    ctx->metrics.lookup_missed_tokens += (uint64_t)(l->n_keys - hits) * model->chunk_tokens;
    r.hits = hits;
    r.hit_tokens = (uint64_t)hits * model->chunk_tokens;
    r.chunk_tokens = model->chunk_tokens;
    dqd_req_reply(req, &resp, NULL, 0);
}

/* dquantd operations: dispatch and the operations that need no codec work (HELLO,
 * REGISTER_MODEL, DELETE, PIN, UNPIN, STATS, PING). */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "ctx.h"
#include "dquant/error.h"
#include "dquant/profile.h"
#include "frame.h"
#include "logging.h"
#include "ncclpath.h"
#include "ops_internal.h"

#ifndef DQD_VERSION
#define DQD_VERSION "0.1.0"
#endif

void dqd_model_info_of(const dqd_model *m, dqd_model_info *out)
{
    out->layers = m->layers;
    out->q_heads = m->q_heads;
    out->kv_heads = m->kv_heads;
    out->head_dim = m->head_dim;
}

void dqd_profile_info_of(const dqd_codec *c, dqd_profile_info *out)
{
    out->kv_heads = c->profile.kv_heads;
    out->head_dim = c->profile.head_dim;
    out->window = c->profile.window;
    out->mean_bytes = c->mean_bytes;
    out->record_bytes[0] = c->record_bytes[DQ_KIND_K];
    out->record_bytes[1] = c->record_bytes[DQ_KIND_V];
}

dqd_seq *dqd_ops_lookup(dqd_req *req, const Dquant__SeqRef *ref)
{
    const char *ns = ref->ns ? ref->ns : "";
    return dqd_store_lookup_kind(req->ctx->store, ns, strlen(ns), ref->key.data, ref->key.len, (uint8_t)ref->kind);
}

/* Compares the whole configured secret whatever the input, so timing says nothing about it. */
static bool secret_matches(const uint8_t *given, size_t given_len, const char *secret, size_t secret_len)
{
    volatile uint8_t diff = (uint8_t)(given_len != secret_len);
    for (size_t i = 0; i < secret_len; i++) {
        uint8_t g = i < given_len ? given[i] : 0;
        diff |= (uint8_t)(g ^ (uint8_t)secret[i]);
    }
    return diff == 0;
}

static void op_hello(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    dqd_session *c = req->sess;
    const Dquant__Hello *h = req->msg->hello;
    uint32_t lo = h->min_version ? h->min_version : 1;
    uint32_t hi = h->max_version ? h->max_version : lo;
    if (lo > DQ_WIRE_VERSION || hi < DQ_WIRE_VERSION) {
        dqd_req_fail(req, DQ_VERSION, "client speaks versions %u..%u, the server speaks %u", lo, hi, DQ_WIRE_VERSION);
        return;
    }
    if (c->require_secret) {
        const uint64_t now = dqd_now_ns() / 1000000u;
        char peer[64];
        if (!dqd_authlimit_allowed(&ctx->auth, &c->peer, now)) {
            ctx->metrics.auth_throttled++;
            dqd_peer_format(&c->peer, peer, sizeof peer);
            DQD_WARN_LIMITED("conn %llu: HELLO from %s refused unchecked: too many failed authentications; closing",
                             (unsigned long long)c->id, peer);
            req->close_after = 1;
            dqd_req_fail(req, DQ_UNAUTHENTICATED, "too many failed authentications from this address; retry later");
            return;
        }
        if (!secret_matches(h->secret.data, h->secret.len, ctx->cfg->secret, ctx->cfg->secret_len)) {
            ctx->metrics.auth_failures++;
            dqd_authlimit_failed(&ctx->auth, &c->peer, now);
            dqd_peer_format(&c->peer, peer, sizeof peer);
            DQD_WARN_LIMITED("conn %llu: HELLO from %s with a wrong or missing secret; closing",
                             (unsigned long long)c->id, peer);
            req->close_after = 1;
            dqd_req_fail(req, DQ_UNAUTHENTICATED, "wrong or missing secret");
            return;
        }
    }
    c->authed = true;
    snprintf(c->client_name, sizeof c->client_name, "%s", h->client_name ? h->client_name : "");

    Dquant__HelloReply r = DQUANT__HELLO_REPLY__INIT;
    r.version = DQ_WIRE_VERSION;
    r.server_version = (char *)DQD_VERSION;
    r.max_frame_bytes = ctx->cfg->max_frame;
    r.max_payload_bytes = ctx->cfg->max_payload;
    r.max_batch_items = ctx->cfg->max_batch_items;
    r.backend = (char *)ctx->backend_name;
    const char *const *names = dq_profile_builtin_names();
    size_t n = 0;
    while (names && names[n])
        n++;
    r.n_profiles = n;
    r.profiles = (char **)names;
    char *features[] = {(char *)"nccl"};
    if (dqd_nccl_offered(ctx)) {
        r.n_features = 1;
        r.features = features;
    }
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_HELLO;
    resp.hello = &r;
    DQD_DEBUG("conn %llu: HELLO from '%s'", (unsigned long long)c->id, h->client_name ? h->client_name : "");
    dqd_req_reply(req, &resp, NULL, 0);
}

static void op_register(dqd_req *req)
{
    const Dquant__ModelSpec *m = req->msg->register_model->model;
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    dqd_tensor cal;
    char msg[256];
    int rc = dqd_validate_calibration(m, &pl, &cal, msg, sizeof msg);
    if (rc < 0) {
        dqd_req_fail(req, rc, "%s", msg);
        return;
    }
    dqd_model_spec spec = {
        .name = m->name,
        .layers = m->layers,
        .q_heads = m->q_heads,
        .kv_heads = m->kv_heads,
        .head_dim = m->head_dim,
        .chunk_tokens = m->chunk_tokens,
        .profile_name = m->profile_name,
        .profile = m->profile.data,
        .profile_len = m->profile.len,
        .calibration = cal.data,
        .calibration_len = (size_t)cal.len,
        .owner = req->sess->client_name,
    };
    dqd_model *model;
    bool existed;
    rc = dqd_registry_register(req->ctx->reg, &spec, &model, &existed, msg, sizeof msg);
    if (rc < 0) {
        dqd_req_fail(req, rc, "%s", msg);
        return;
    }
    Dquant__RegisterModelReply r = DQUANT__REGISTER_MODEL_REPLY__INIT;
    r.profile.data = model->codec->pbytes;
    r.profile.len = model->codec->plen;
    r.bits_per_value = dq_profile_bits_per_value_mean(&model->codec->profile);
    r.existed = existed;
    r.chunk_tokens = model->chunk_tokens;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_REGISTER_MODEL;
    resp.register_model = &r;
    dqd_req_reply(req, &resp, NULL, 0);
}

/* UNREGISTER_MODEL: at once, on the loop (registry.h says when a model may go). */
static void op_unregister(dqd_req *req)
{
    char msg[256];
    int rc = dqd_registry_unregister(req->ctx->reg, req->msg->unregister_model->name, msg, sizeof msg);
    if (rc < 0) {
        dqd_req_fail(req, rc, "%s", msg);
        return;
    }
    Dquant__Empty e = DQUANT__EMPTY__INIT;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_OK;
    resp.ok = &e;
    dqd_req_reply(req, &resp, NULL, 0);
}

/* DELETE, PIN and UNPIN: queue for the sequence like any other request, so that they apply in
 * order after the requests before them. */
typedef struct seq_op {
    dqd_req *req;
    dqd_access_set as;
} seq_op;

static void reply_ok(dqd_req *req)
{
    Dquant__Empty e = DQUANT__EMPTY__INIT;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_OK;
    resp.ok = &e;
    dqd_req_reply(req, &resp, NULL, 0);
}

static void seq_op_ready(dqd_access_set *as)
{
    seq_op *op = as->arg;
    dqd_req *req = op->req;
    dqd_store *store = req->ctx->store;
    dqd_seq *seq = as->items[0].seq;
    if (!dqd_seq_alive(seq)) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no such sequence");
    } else {
        switch (req->op) {
        case DQD_OP_DELETE:
            if (seq->prefix_users) {
                dqd_req_fail(req, DQ_BUSY, "the chunk is the prefix of %u sequences; delete them first",
                             seq->prefix_users);
                dqd_access_end(&op->as);
                free(op);
                return;
            }
            dqd_store_remove(store, seq);
            break;
        case DQD_OP_PIN:
            dqd_store_set_pinned(store, seq, true);
            dqd_store_touch(store, seq);
            break;
        default:
            dqd_store_set_pinned(store, seq, false);
            break;
        }
        reply_ok(req);
    }
    dqd_access_end(&op->as);
    free(op);
}

static void op_seq(dqd_req *req, const Dquant__SeqRef *ref, dqd_access mode)
{
    dqd_seq *seq = dqd_ops_lookup(req, ref);
    if (!seq) {
        dqd_req_fail(req, DQ_NOT_FOUND, "no such sequence");
        return;
    }
    seq_op *op = calloc(1, sizeof *op);
    if (!op || dqd_access_init(&op->as, 1) < 0) {
        free(op);
        dqd_seq_unref(seq);
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    op->req = req;
    /* Only PIN needs the layers in memory: DELETE and UNPIN leave a sequence on disk there. */
    op->as.no_load = req->op != DQD_OP_PIN;
    dqd_access_add(&op->as, seq, mode);
    dqd_access_start(&op->as, seq_op_ready, op);
}

static void op_stats(dqd_req *req)
{
    dqd_gauges g;
    dqd_ctx_gauges(req->ctx, &g);
    Dquant__StatsReply r;
    if (dqd_metrics_stats(&req->ctx->metrics, &g, &r) < 0) {
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_STATS;
    resp.stats = &r;
    dqd_req_reply(req, &resp, NULL, 0);
    dqd_metrics_stats_free(&r);
}

static void op_ping(dqd_req *req)
{
    Dquant__Pong p = DQUANT__PONG__INIT;
    p.data = req->msg->ping->data;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_PONG;
    resp.pong = &p;
    dqd_req_reply(req, &resp, NULL, 0);
}

static void run_op(dqd_req *req);

void dqd_ops_dispatch(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    const Dquant__Request *msg = req->msg;
    req->op = (unsigned)msg->body_case < DQD_OP_COUNT ? (dqd_op)msg->body_case : DQD_OP_UNKNOWN;

    if (!req->sess->authed && msg->body_case != DQUANT__REQUEST__BODY_HELLO) {
        /* Nothing but HELLO is answered before it succeeds, and only once. */
        req->close_after = 1;
        dqd_req_fail(req, DQ_UNAUTHENTICATED, "the first request must be a successful HELLO; closing");
        return;
    }
    dqd_leases_expire(&ctx->leases, dqd_now_ns());
    if (ctx->stopping) {
        dqd_req_fail(req, DQ_SHUTTING_DOWN, "the server is shutting down");
        return;
    }
    char msgbuf[256];
    dqd_op op = req->op;
    dqd_payload pl;
    dqd_req_payload(req, &pl);
    int rc = dqd_validate_strings(&dquant__request__descriptor, req->header, req->header_len, msgbuf, sizeof msgbuf);
    if (rc == 0)
        rc = dqd_request_validate(msg, &pl, &ctx->limits, &op, msgbuf, sizeof msgbuf);
    req->op = op;
    if (rc < 0) {
        if (msg->nccl_payload)
            dqd_nccl_break(req->sess);
        dqd_req_fail(req, rc, "%s", msgbuf);
        return;
    }
    if (msg->nccl_payload || msg->nccl_reply) {
        dqd_nccl_admit(req, run_op);
        return;
    }
    run_op(req);
}

static void run_op(dqd_req *req)
{
    const Dquant__Request *msg = req->msg;
    switch (req->op) {
    case DQD_OP_HELLO:
        op_hello(req);
        return;
    case DQD_OP_REGISTER_MODEL:
        op_register(req);
        return;
    case DQD_OP_PUT:
        dqd_op_put(req);
        return;
    case DQD_OP_GET:
        dqd_op_get(req);
        return;
    case DQD_OP_ATTEND:
        dqd_op_attend(req);
        return;
    case DQD_OP_COMPRESS:
        dqd_op_compress(req);
        return;
    case DQD_OP_DECOMPRESS:
        dqd_op_decompress(req);
        return;
    case DQD_OP_DELETE:
        op_seq(req, msg->delete_->seq, DQD_ACCESS_WRITE);
        return;
    case DQD_OP_PIN:
        op_seq(req, msg->pin->seq, DQD_ACCESS_READ);
        return;
    case DQD_OP_UNPIN:
        op_seq(req, msg->unpin->seq, DQD_ACCESS_READ);
        return;
    case DQD_OP_STATS:
        op_stats(req);
        return;
    case DQD_OP_PING:
        op_ping(req);
        return;
    case DQD_OP_NCCL_SETUP:
        dqd_op_nccl_setup(req);
        return;
    case DQD_OP_PUT_CHUNKS:
        dqd_op_put_chunks(req);
        return;
    case DQD_OP_LOOKUP:
        dqd_op_lookup(req);
        return;
    case DQD_OP_PUT_RAW:
        dqd_op_put_raw(req);
        return;
    case DQD_OP_PUT_CHUNKS_RAW:
        dqd_op_put_chunks_raw(req);
        return;
    case DQD_OP_UNREGISTER_MODEL:
        op_unregister(req);
        return;
    default:
        break;
    }
    dqd_req_fail(req, DQ_UNSUPPORTED, "unsupported request");
}

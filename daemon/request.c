/* dquantd requests and reply frames (see request.h). */
#include "request.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "dquant/error.h"
#include "frame.h"
#include "logging.h"
#include "tier.h"

uint8_t *dqd_out_alloc(size_t len)
{
    if (len == 0 || len > SIZE_MAX - 64)
        return NULL;
    return aligned_alloc(64, (len + 63u) & ~(size_t)63u);
}

uint8_t *dqd_req_out_alloc(dqd_req *req, size_t len)
{
    if (len && req->charge && req->charge(req, len) < 0) {
        req->out_refused = true;
        return NULL;
    }
    return dqd_out_alloc(len);
}

void dqd_reply_tensor(Dquant__Tensor *t, uint64_t *shape_store, Dquant__DType dtype, const uint64_t *shape, size_t ndim,
                      uint64_t offset, uint64_t length)
{
    dquant__tensor__init(t);
    t->dtype = dtype;
    memcpy(shape_store, shape, ndim * sizeof *shape);
    t->shape = shape_store;
    t->n_shape = ndim;
    t->offset = offset;
    t->length = length;
}

/* Packs resp behind a fixed header. */
static int pack_frame(uint64_t request_id, const Dquant__Response *resp, uint64_t payload_len, size_t max_header,
                      uint8_t **head, size_t *head_len)
{
    size_t plen = dquant__response__get_packed_size(resp);
    if (plen == 0 || plen > max_header || plen > UINT32_MAX)
        return DQ_TOO_LARGE;
    uint8_t *buf = malloc(DQ_FRAME_HEADER_BYTES + plen);
    if (!buf)
        return DQ_NOMEM;
    size_t n = dquant__response__pack(resp, buf + DQ_FRAME_HEADER_BYTES);
    dq_frame_write_header(buf, buf + DQ_FRAME_HEADER_BYTES, (uint32_t)n, payload_len, request_id);
    *head = buf;
    *head_len = DQ_FRAME_HEADER_BYTES + n;
    return DQ_OK;
}

int dqd_error_frame(uint64_t request_id, int code, const char *message, uint8_t **head, size_t *head_len)
{
    Dquant__Error e = DQUANT__ERROR__INIT;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    e.code = code;
    e.name = (char *)dq_err_name(code);
    e.message = (char *)(message ? message : dq_strerror(code));
    resp.body_case = DQUANT__RESPONSE__BODY_ERROR;
    resp.error = &e;
    return pack_frame(request_id, &resp, 0, 1u << 20, head, head_len);
}

static void release_input(dqd_req *req)
{
    if (req->msg) {
        dquant__request__free_unpacked(req->msg, &req->pbmem.a);
        assert(req->pbmem.used == 0 && "every byte protobuf-c allocated comes back");
    }
    req->msg = NULL;
    dqd_framebuf_put(&req->ctx->frames, req->frame);
    req->frame = NULL;
    req->payload = NULL;
    req->header = NULL;
    dqd_tier_free_device(req->ctx, req->dpayload);
    req->dpayload = NULL;
    free(req->hpayload);
    req->hpayload = NULL;
}

void dqd_req_payload(const dqd_req *req, dqd_payload *pl)
{
    pl->data = req->payload;
    pl->len = req->payload_len;
    pl->nccl = req->hpayload ? req->hpayload : (const uint8_t *)req->dpayload;
    pl->nccl_len = req->msg ? req->msg->nccl_payload : 0;
    pl->nccl_on_host = req->hpayload != NULL;
}

void dqd_req_free(dqd_req *req)
{
    if (!req)
        return;
    release_input(req);
    free(req->head);
    free(req->out);
    free(req);
}

static void finish(dqd_req *req, int err)
{
    dqd_ctx *ctx = req->ctx;
    assert(!req->done && "a request is completed exactly once");
    assert(ctx->reqs_inflight > 0);
    req->err = err;
    double secs = (double)(dqd_now_ns() - req->t0_ns) * 1e-9;
    dqd_metrics_observe(&ctx->metrics, req->op, err, secs);
    ctx->reqs_inflight--;
    req->on_done(req);
    dqd_ctx_check_idle(ctx);
}

static int seg_order(const void *a, const void *b)
{
    const dqd_seg *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

void dqd_req_reply_nccl(dqd_req *req, Dquant__Response *resp, void *buf, bool on_device, size_t len)
{
    dqd_ctx *ctx = req->ctx;
    Dquant__Tensor *ts[2] = {NULL, NULL};
    if (resp->body_case == DQUANT__RESPONSE__BODY_GET) {
        ts[0] = resp->get->k;
        ts[1] = resp->get->v;
    } else if (resp->body_case == DQUANT__RESPONSE__BODY_ATTEND) {
        ts[0] = resp->attend->out;
        ts[1] = resp->attend->lse;
    }
    dqd_seg *segs = calloc(2, sizeof *segs);
    size_t nseg = 0;
    for (int i = 0; i < 2; i++) {
        if (ts[i] && ts[i]->length) {
            ts[i]->nccl = true;
            if (segs)
                segs[nseg++] = (dqd_seg){ts[i]->offset, ts[i]->length};
        }
    }
    int rc = segs ? DQ_OK : DQ_NOMEM;
    if (rc == DQ_OK) {
        qsort(segs, nseg, sizeof *segs, seg_order);
        resp->nccl_payload = len;
        rc = pack_frame(req->id, resp, 0, (size_t)ctx->cfg->max_header, &req->head, &req->head_len);
    }
    if (rc < 0) {
        if (on_device)
            dqd_tier_free_device(ctx, buf);
        else
            free(buf);
        free(segs);
        dqd_req_fail(req, rc, "cannot build the reply: %s", dq_strerror(rc));
        return;
    }
    release_input(req);
    req->nccl_reply.buf = buf;
    req->nccl_reply.on_device = on_device;
    req->nccl_reply.len = len;
    req->nccl_reply.segs = segs;
    req->nccl_reply.nseg = nseg;
    finish(req, 0);
}

void dqd_req_reply(dqd_req *req, Dquant__Response *resp, uint8_t *out, size_t out_len)
{
    dqd_ctx *ctx = req->ctx;
    if (req->nccl_admitted && req->msg && req->msg->nccl_reply && out_len) {
        dqd_req_reply_nccl(req, resp, out, false, out_len);
        return;
    }
    int rc = DQ_OK;
    if (out_len > ctx->cfg->max_payload)
        rc = DQ_TOO_LARGE;
    else
        rc = pack_frame(req->id, resp, out_len, (size_t)ctx->cfg->max_header, &req->head, &req->head_len);
    if (rc < 0) {
        free(out);
        dqd_req_fail(req, rc, "the reply exceeds the configured limits (max_header %llu, max_payload %llu)",
                     (unsigned long long)ctx->cfg->max_header, (unsigned long long)ctx->cfg->max_payload);
        return;
    }
    /* Packed: the input (which resp may point into) can go now. */
    release_input(req);
    req->out = out;
    req->out_len = out ? out_len : 0;
    finish(req, 0);
}

void dqd_req_fail(dqd_req *req, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (code >= 0)
        code = DQ_INTERNAL;
    if (code == DQ_NOMEM && req->out_refused) {
        code = DQ_RESOURCE_EXHAUSTED;
        snprintf(msg, sizeof msg,
                 "the reply does not fit in the daemon's client I/O memory now (max_io_memory %llu bytes); "
                 "retry later",
                 (unsigned long long)req->ctx->cfg->max_io_memory);
    }
    DQD_DEBUG("request %llu (%s) failed: %s: %s", (unsigned long long)req->id, dqd_op_name(req->op), dq_err_name(code),
              msg);
    release_input(req);
    free(req->head);
    free(req->out);
    req->head = req->out = NULL;
    req->head_len = req->out_len = 0;
    if (dqd_error_frame(req->id, code, msg, &req->head, &req->head_len) < 0) {
        req->head = NULL;
        req->head_len = 0;
    }
    finish(req, code);
}

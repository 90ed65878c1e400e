/* dquantd request validation (see validate.h). Pure: no allocation, no global state. */
#include "validate.h"

#include <math.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dquant/error.h"

static int err(char *msg, size_t msglen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int err(char *msg, size_t msglen, int code, const char *fmt, ...)
{
    if (msg && msglen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msglen, fmt, ap);
        va_end(ap);
    }
    return code;
}

#define FAIL(code, ...) return err(msg, msglen, (code), __VA_ARGS__)
#define FORWARD(expr)         \
    do {                      \
        int fwd__rc = (expr); \
        if (fwd__rc < 0)      \
            return fwd__rc;   \
    } while (0)

typedef unsigned long long ull;

void dqd_limits_default(dqd_limits *lim)
{
    lim->max_payload = 256ull << 20;
    lim->max_batch_items = 4096;
    lim->max_ns = 256;
    lim->max_key = 4096;
    lim->max_name = 128;
    lim->max_lookup_keys = 65536;
    lim->max_lease_ms = 60000;
    lim->max_calibration = 64ull << 20;
}

size_t dqd_dtype_size(uint32_t dtype)
{
    switch (dtype) {
    case DQUANT__DTYPE__F32:
        return 4;
    case DQUANT__DTYPE__F16:
        return 2;
    case DQUANT__DTYPE__BF16:
        return 2;
    case DQUANT__DTYPE__RAW:
        return 1;
    default:
        return 0;
    }
}

static const char *dtype_name(uint32_t dtype)
{
    static const char *const names[] = {"F32", "F16", "BF16", "RAW"};
    return dtype < 4 ? names[dtype] : "unknown";
}

int dqd_tensor_check(const Dquant__Tensor *t, const char *what, uint32_t allowed, uint32_t ndim, bool allow_missing,
                     const dqd_payload *pl, dqd_tensor *out, char *msg, size_t msglen)
{
    memset(out, 0, sizeof *out);
    if (!t) {
        if (allow_missing)
            return DQ_OK;
        FAIL(DQ_INVALID_ARGUMENT, "tensor %s is missing", what);
    }
    uint32_t dt = (uint32_t)t->dtype;
    size_t esize = dqd_dtype_size(dt);
    if (!esize || !(allowed & (1u << dt)))
        FAIL(DQ_DTYPE, "tensor %s: dtype %s (%u) is not allowed here", what, dtype_name(dt), dt);
    out->dtype = dt;

    if (dt == DQUANT__DTYPE__RAW && t->n_shape == 0) {
        out->ndim = 1;
        out->shape[0] = t->length;
    } else {
        if (t->n_shape > DQD_MAX_DIMS || (dt != DQUANT__DTYPE__RAW && t->n_shape != ndim))
            FAIL(DQ_SHAPE, "tensor %s: rank %zu, expected %u", what, t->n_shape, ndim);
        out->ndim = (uint32_t)t->n_shape;
        for (size_t i = 0; i < t->n_shape; i++)
            out->shape[i] = t->shape[i];
    }

    uint64_t count = 1;
    for (uint32_t i = 0; i < out->ndim; i++) {
        uint64_t d = out->shape[i];
        if (d && count > UINT64_MAX / d)
            FAIL(DQ_SHAPE, "tensor %s: the product of its shape overflows", what);
        count *= d;
    }
    if (count > UINT64_MAX / esize)
        FAIL(DQ_SHAPE, "tensor %s: its byte size overflows", what);
    uint64_t bytes = count * esize;
    if (bytes != t->length)
        FAIL(DQ_SHAPE, "tensor %s: length %llu != %llu (shape x %zu-byte %s)", what, (ull)t->length, (ull)bytes, esize,
             dtype_name(dt));
    if (t->nccl) {
        if (!(allowed & DQD_DT_NCCL))
            FAIL(DQ_INVALID_ARGUMENT, "tensor %s cannot travel on NCCL", what);
        if (t->offset > pl->nccl_len || t->length > pl->nccl_len - t->offset)
            FAIL(DQ_OUT_OF_BOUNDS, "tensor %s: bytes [%llu, +%llu) lie outside the %llu-byte NCCL payload", what,
                 (ull)t->offset, (ull)t->length, (ull)pl->nccl_len);
        if (t->offset % esize)
            FAIL(DQ_INVALID_ARGUMENT, "tensor %s: NCCL offset %llu is not a multiple of its element size", what,
                 (ull)t->offset);
        out->device = !pl->nccl_on_host;
        out->data = t->length && pl->nccl ? pl->nccl + t->offset : NULL;
    } else {
        if (t->offset > pl->len || t->length > pl->len - t->offset)
            FAIL(DQ_OUT_OF_BOUNDS, "tensor %s: bytes [%llu, +%llu) lie outside the %llu-byte payload", what,
                 (ull)t->offset, (ull)t->length, (ull)pl->len);
        out->data = t->length ? pl->data + t->offset : NULL;
    }
    out->count = count;
    out->offset = t->offset;
    out->len = t->length;
    return DQ_OK;
}

int dqd_tensor_expect(const dqd_tensor *t, const char *what, const uint64_t *shape, char *msg, size_t msglen)
{
    for (uint32_t i = 0; i < t->ndim; i++) {
        if (shape[i] != UINT64_MAX && shape[i] != t->shape[i]) {
            char want[160], got[160];
            size_t wn = 0, gn = 0;
            for (uint32_t j = 0; j < t->ndim; j++) {
                if (shape[j] == UINT64_MAX)
                    wn += (size_t)snprintf(want + wn, sizeof want - wn, "%s*", j ? ", " : "");
                else
                    wn += (size_t)snprintf(want + wn, sizeof want - wn, "%s%llu", j ? ", " : "", (ull)shape[j]);
                gn += (size_t)snprintf(got + gn, sizeof got - gn, "%s%llu", j ? ", " : "", (ull)t->shape[j]);
                if (wn >= sizeof want || gn >= sizeof got)
                    break;
            }
            FAIL(DQ_SHAPE, "tensor %s: shape [%s], expected [%s]", what, got, want);
        }
    }
    return DQ_OK;
}

static int check_seq(const Dquant__SeqRef *seq, const dqd_limits *lim, char *msg, size_t msglen)
{
    if (!seq)
        FAIL(DQ_INVALID_ARGUMENT, "seq is missing");
    size_t ns = seq->ns ? strlen(seq->ns) : 0;
    if (ns > lim->max_ns)
        FAIL(DQ_TOO_LARGE, "namespace longer than %u bytes", lim->max_ns);
    if (seq->key.len == 0)
        FAIL(DQ_INVALID_ARGUMENT, "seq.key is empty");
    if (seq->key.len > lim->max_key)
        FAIL(DQ_TOO_LARGE, "seq.key longer than %u bytes", lim->max_key);
    if ((uint32_t)seq->kind > DQUANT__SEQ_KIND__CHUNK)
        FAIL(DQ_INVALID_ARGUMENT, "unknown seq.kind %d", (int)seq->kind);
    if (seq->kind == DQUANT__SEQ_KIND__CHUNK && seq->key.len != DQD_CHUNK_KEY_BYTES)
        FAIL(DQ_INVALID_ARGUMENT, "a chunk key has %d bytes, not %zu", DQD_CHUNK_KEY_BYTES, seq->key.len);
    return DQ_OK;
}

static int check_name(const char *s, const char *what, bool required, const dqd_limits *lim, char *msg, size_t msglen);

static int check_chunk_keys(ProtobufCBinaryData *keys, size_t n, const char *ns, const dqd_limits *lim, char *msg,
                            size_t msglen)
{
    if ((ns ? strlen(ns) : 0) > lim->max_ns)
        FAIL(DQ_TOO_LARGE, "namespace longer than %u bytes", lim->max_ns);
    if (n > lim->max_lookup_keys)
        FAIL(DQ_INVALID_ARGUMENT, "%zu chunk keys; the limit is %u", n, lim->max_lookup_keys);
    for (size_t i = 0; i < n; i++)
        if (keys[i].len != DQD_CHUNK_KEY_BYTES)
            FAIL(DQ_INVALID_ARGUMENT, "chunk key %zu has %zu bytes, not %d", i, keys[i].len, DQD_CHUNK_KEY_BYTES);
    return DQ_OK;
}

static int validate_put_chunks(const Dquant__PutChunks *p, const dqd_payload *pl, const dqd_limits *lim, char *msg,
                               size_t msglen)
{
    FORWARD(check_name(p->model, "model", true, lim, msg, msglen));
    if (p->n_keys == 0)
        FAIL(DQ_INVALID_ARGUMENT, "no chunk keys");
    FORWARD(check_chunk_keys(p->keys, p->n_keys, p->ns, lim, msg, msglen));
    if (p->parent.len && p->parent.len != DQD_CHUNK_KEY_BYTES)
        FAIL(DQ_INVALID_ARGUMENT, "the parent key has %zu bytes, not %d", p->parent.len, DQD_CHUNK_KEY_BYTES);
    dqd_tensor k, v;
    FORWARD(dqd_tensor_check(p->k, "k", DQD_DT_TYPED, 4, false, pl, &k, msg, msglen));
    FORWARD(dqd_tensor_check(p->v, "v", DQD_DT_TYPED, 4, false, pl, &v, msg, msglen));
    if (k.dtype != v.dtype)
        FAIL(DQ_DTYPE, "k and v must have the same dtype");
    for (int i = 0; i < 4; i++)
        if (k.shape[i] != v.shape[i])
            FAIL(DQ_SHAPE, "k and v shapes differ");
    return DQ_OK;
}

/* PUT_RAW / PUT_CHUNKS_RAW: what the layers and the profile say about themselves. */
static int check_raw(Dquant__RawLayer *const *layers, size_t n, const ProtobufCBinaryData *profile,
                     const dqd_payload *pl, char *msg, size_t msglen)
{
    if (n == 0)
        FAIL(DQ_INVALID_ARGUMENT, "no layers");
    if (profile->len == 0)
        FAIL(DQ_INVALID_ARGUMENT, "the records' profile is missing");
    if (profile->len > DQD_PROFILE_MAX)
        FAIL(DQ_TOO_LARGE, "profile longer than %d bytes", DQD_PROFILE_MAX);
    for (size_t i = 0; i < n; i++) {
        const Dquant__RawLayer *l = layers[i];
        char what[48];
        if (!l)
            FAIL(DQ_INVALID_ARGUMENT, "layers[%zu] is empty", i);
        dqd_tensor t;
        snprintf(what, sizeof what, "layers[%zu].records", i);
        FORWARD(dqd_tensor_check(l->records, what, DQD_DT_RAW, 1, true, pl, &t, msg, msglen));
        snprintf(what, sizeof what, "layers[%zu].tail_k", i);
        FORWARD(dqd_tensor_check(l->tail_k, what, DQD_DT_BF16, 2, true, pl, &t, msg, msglen));
        snprintf(what, sizeof what, "layers[%zu].tail_v", i);
        FORWARD(dqd_tensor_check(l->tail_v, what, DQD_DT_BF16, 2, true, pl, &t, msg, msglen));
    }
    return DQ_OK;
}

/* Byte lengths: dqd_request_validate runs after dqd_validate_strings, so a string holds no NUL and
 * strlen is its length on the wire. */
static int check_name(const char *s, const char *what, bool required, const dqd_limits *lim, char *msg, size_t msglen)
{
    size_t n = s ? strlen(s) : 0;
    if (required && n == 0)
        FAIL(DQ_INVALID_ARGUMENT, "%s is missing", what);
    if (n > lim->max_name)
        FAIL(DQ_TOO_LARGE, "%s longer than %u bytes", what, lim->max_name);
    return DQ_OK;
}

static int validate_put_raw(const Dquant__PutRaw *p, const dqd_payload *pl, const dqd_limits *lim, char *msg,
                            size_t msglen)
{
    FORWARD(check_seq(p->seq, lim, msg, msglen));
    FORWARD(check_name(p->model, "model", true, lim, msg, msglen));
    if (p->seq->kind == DQUANT__SEQ_KIND__CHUNK)
        FAIL(DQ_INVALID_ARGUMENT, "chunks are written by PUT_CHUNKS_RAW, not PUT_RAW");
    if (p->num_layers == 0)
        FAIL(DQ_INVALID_ARGUMENT, "num_layers must be at least 1");
    if (p->n_layers != p->num_layers)
        FAIL(DQ_INVALID_ARGUMENT, "%zu raw layers for num_layers %u", p->n_layers, p->num_layers);
    if ((uint64_t)p->first_layer + p->num_layers > UINT32_MAX)
        FAIL(DQ_OUT_OF_BOUNDS, "first_layer + num_layers overflows");
    return check_raw(p->layers, p->n_layers, &p->profile, pl, msg, msglen);
}

static int validate_put_chunks_raw(const Dquant__PutChunksRaw *p, const dqd_payload *pl, const dqd_limits *lim,
                                   char *msg, size_t msglen)
{
    FORWARD(check_name(p->model, "model", true, lim, msg, msglen));
    if (p->n_keys == 0)
        FAIL(DQ_INVALID_ARGUMENT, "no chunk keys");
    FORWARD(check_chunk_keys(p->keys, p->n_keys, p->ns, lim, msg, msglen));
    if (p->parent.len && p->parent.len != DQD_CHUNK_KEY_BYTES)
        FAIL(DQ_INVALID_ARGUMENT, "the parent key has %zu bytes, not %d", p->parent.len, DQD_CHUNK_KEY_BYTES);
    return check_raw(p->layers, p->n_layers, &p->profile, pl, msg, msglen);
}

static int validate_put(const Dquant__Put *p, const dqd_payload *pl, const dqd_limits *lim, char *msg, size_t msglen)
{
    FORWARD(check_seq(p->seq, lim, msg, msglen));
    FORWARD(check_name(p->model, "model", true, lim, msg, msglen));
    if (p->seq->kind == DQUANT__SEQ_KIND__CHUNK)
        FAIL(DQ_INVALID_ARGUMENT, "chunks are written by PUT_CHUNKS, not PUT");
    FORWARD(check_chunk_keys(p->prefix_chunks, p->n_prefix_chunks, NULL, lim, msg, msglen));
    if (p->num_layers == 0)
        FAIL(DQ_INVALID_ARGUMENT, "num_layers must be at least 1");
    if (p->tokens == 0)
        FAIL(DQ_INVALID_ARGUMENT, "tokens must be at least 1");
    if (p->start_token > UINT64_MAX - p->tokens)
        FAIL(DQ_OUT_OF_BOUNDS, "start_token + tokens overflows");
    dqd_tensor k, v;
    FORWARD(dqd_tensor_check(p->k, "k", DQD_DT_TYPED | DQD_DT_NCCL, 4, false, pl, &k, msg, msglen));
    FORWARD(dqd_tensor_check(p->v, "v", DQD_DT_TYPED | DQD_DT_NCCL, 4, false, pl, &v, msg, msglen));
    if (k.dtype != v.dtype)
        FAIL(DQ_DTYPE, "k and v must have the same dtype");
    const uint64_t want[4] = {p->num_layers, p->tokens, UINT64_MAX, UINT64_MAX};
    FORWARD(dqd_tensor_expect(&k, "k", want, msg, msglen));
    FORWARD(dqd_tensor_expect(&v, "v", want, msg, msglen));
    if (k.shape[2] != v.shape[2] || k.shape[3] != v.shape[3])
        FAIL(DQ_SHAPE, "k and v shapes differ");
    return DQ_OK;
}

static int validate_attend(const Dquant__Attend *a, const dqd_payload *pl, const dqd_limits *lim, char *msg,
                           size_t msglen)
{
    if (a->n_items == 0)
        FAIL(DQ_INVALID_ARGUMENT, "attend has no items");
    if (a->n_items > lim->max_batch_items)
        FAIL(DQ_TOO_LARGE, "attend has %zu items, the limit is %u", a->n_items, lim->max_batch_items);
    if (!isfinite(a->scale) || a->scale < 0)
        FAIL(DQ_INVALID_ARGUMENT, "scale must be finite and >= 0 (0: 1/sqrt(head_dim))");
    for (size_t i = 0; i < a->n_items; i++) {
        const Dquant__AttendItem *it = a->items[i];
        char what[48];
        if (!it)
            FAIL(DQ_INVALID_ARGUMENT, "item %zu is empty", i);
        int rc = check_seq(it->seq, lim, msg, msglen);
        if (rc < 0)
            return rc;
        dqd_tensor q, ak, av;
        snprintf(what, sizeof what, "items[%zu].q", i);
        FORWARD(dqd_tensor_check(it->q, what, DQD_DT_TYPED | DQD_DT_NCCL, 2, false, pl, &q, msg, msglen));
        snprintf(what, sizeof what, "items[%zu].append_k", i);
        FORWARD(dqd_tensor_check(it->append_k, what, DQD_DT_TYPED | DQD_DT_NCCL, 3, true, pl, &ak, msg, msglen));
        snprintf(what, sizeof what, "items[%zu].append_v", i);
        FORWARD(dqd_tensor_check(it->append_v, what, DQD_DT_TYPED | DQD_DT_NCCL, 3, true, pl, &av, msg, msglen));
        if (!it->append_k != !it->append_v)
            FAIL(DQ_INVALID_ARGUMENT, "item %zu: append_k and append_v go together", i);
        if (it->append_k) {
            if (it->seq->kind == DQUANT__SEQ_KIND__CHUNK)
                FAIL(DQ_INVALID_ARGUMENT, "item %zu: a chunk cannot be appended to", i);
            if (ak.dtype != av.dtype)
                FAIL(DQ_DTYPE, "item %zu: append_k and append_v must have the same dtype", i);
            if (ak.shape[0] != 1 || av.shape[0] != 1)
                FAIL(DQ_SHAPE, "item %zu: append_k / append_v must be [1, kv_heads, head_dim]", i);
        }
    }
    return DQ_OK;
}

static int validate_compress(const Dquant__Compress *c, const dqd_payload *pl, const dqd_limits *lim, char *msg,
                             size_t msglen)
{
    FORWARD(check_name(c->model, "model", false, lim, msg, msglen));
    FORWARD(check_name(c->profile_name, "profile_name", false, lim, msg, msglen));
    bool has_model = c->model && *c->model;
    bool has_profile = c->profile_name && *c->profile_name;
    if (!has_model && !has_profile)
        FAIL(DQ_INVALID_ARGUMENT, "compress needs a model or a profile_name");
    if (!has_model && (c->kv_heads == 0 || c->head_dim == 0))
        FAIL(DQ_INVALID_ARGUMENT, "profile_name needs kv_heads and head_dim");
    if (c->kind > 1)
        FAIL(DQ_INVALID_ARGUMENT, "kind must be 0 (keys) or 1 (values)");
    dqd_tensor x;
    FORWARD(dqd_tensor_check(c->x, "x", DQD_DT_TYPED, 3, false, pl, &x, msg, msglen));
    if (x.shape[0] == 0)
        FAIL(DQ_SHAPE, "x holds no tokens");
    return DQ_OK;
}

static int validate_decompress(const Dquant__Decompress *d, const dqd_payload *pl, char *msg, size_t msglen)
{
    if (d->profile.len == 0)
        FAIL(DQ_INVALID_ARGUMENT, "profile is missing");
    if (d->profile.len > 4096)
        FAIL(DQ_TOO_LARGE, "profile longer than 4096 bytes");
    if (d->kind > 1)
        FAIL(DQ_INVALID_ARGUMENT, "kind must be 0 (keys) or 1 (values)");
    if (d->tokens == 0)
        FAIL(DQ_INVALID_ARGUMENT, "tokens must be at least 1");
    if (!dqd_dtype_size((uint32_t)d->out_dtype) || d->out_dtype == DQUANT__DTYPE__RAW)
        FAIL(DQ_DTYPE, "out_dtype must be F32, F16 or BF16");
    dqd_tensor t;
    FORWARD(dqd_tensor_check(d->records, "records", DQD_DT_RAW, 1, false, pl, &t, msg, msglen));
    /* optional: keys of a codec without window headers (int, turbo, KVQ) have none */
    FORWARD(dqd_tensor_check(d->means, "means", DQD_DT_RAW, 1, true, pl, &t, msg, msglen));
    return DQ_OK;
}

/* The NCCL tensors of a PUT or ATTEND, in message order. */
static size_t nccl_tensors(const Dquant__Request *req, const Dquant__Tensor **out, size_t cap)
{
    size_t n = 0;
#define ADD(t)                                          \
    do {                                                \
        if ((t) && (t)->nccl && (t)->length && n < cap) \
            out[n++] = (t);                             \
        else if ((t) && (t)->nccl && (t)->length)       \
            n++;                                        \
    } while (0)
    if (req->body_case == DQUANT__REQUEST__BODY_PUT) {
        ADD(req->put->k);
        ADD(req->put->v);
    } else if (req->body_case == DQUANT__REQUEST__BODY_ATTEND) {
        for (size_t i = 0; i < req->attend->n_items; i++) {
            const Dquant__AttendItem *it = req->attend->items[i];
            if (!it)
                continue;
            ADD(it->q);
            ADD(it->append_k);
            ADD(it->append_v);
        }
    }
#undef ADD
    return n;
}

static int seg_cmp(const void *a, const void *b)
{
    const dqd_seg *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int dqd_nccl_segments(const Dquant__Request *req, dqd_seg **out, size_t *nseg)
{
    *out = NULL;
    *nseg = 0;
    size_t n = nccl_tensors(req, NULL, 0);
    if (!n)
        return DQ_OK;
    const Dquant__Tensor **ts = malloc(n * sizeof *ts);
    dqd_seg *segs = malloc(n * sizeof *segs);
    if (!ts || !segs) {
        free(ts);
        free(segs);
        return DQ_NOMEM;
    }
    nccl_tensors(req, ts, n);
    for (size_t i = 0; i < n; i++)
        segs[i] = (dqd_seg){ts[i]->offset, ts[i]->length};
    free(ts);
    qsort(segs, n, sizeof *segs, seg_cmp);
    *out = segs;
    *nseg = n;
    return DQ_OK;
}

/* The NCCL tensors must tile [0, nccl_payload): the bytes arrive as one ncclRecv per tensor, in
 * offset order, so a gap or an overlap would leave the two sides out of step. */
static int check_segments(const Dquant__Request *req, char *msg, size_t msglen)
{
    if (req->body_case == DQUANT__REQUEST__BODY_ATTEND && nccl_tensors(req, NULL, 0) > 3 * (size_t)UINT16_MAX)
        FAIL(DQ_TOO_LARGE, "too many NCCL tensors");
    dqd_seg *segs;
    size_t n;
    if (dqd_nccl_segments(req, &segs, &n) < 0)
        FAIL(DQ_NOMEM, "out of memory");
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (segs[i].offset != at) {
            const bool gap = segs[i].offset > at;
            free(segs);
            FAIL(DQ_INVALID_ARGUMENT, "the NCCL tensors must cover the NCCL payload back to back (a %s at byte %llu)",
                 gap ? "gap" : "overlap", (ull)at);
        }
        at += segs[i].length;
    }
    free(segs);
    if (at != req->nccl_payload)
        FAIL(DQ_INVALID_ARGUMENT, "the NCCL tensors cover %llu of the %llu bytes of the NCCL payload", (ull)at,
             (ull)req->nccl_payload);
    return DQ_OK;
}

int dqd_request_validate(const Dquant__Request *req, const dqd_payload *pl, const dqd_limits *lim, dqd_op *op,
                         char *msg, size_t msglen)
{
    *op = DQD_OP_UNKNOWN;
    if (!req)
        FAIL(DQ_PROTOCOL, "no request");
    if (pl->len > lim->max_payload)
        FAIL(DQ_TOO_LARGE, "payload of %llu bytes exceeds the limit of %llu", (ull)pl->len, (ull)lim->max_payload);
    if (pl->len && !pl->data)
        FAIL(DQ_PROTOCOL, "payload missing");
    if (req->nccl_payload > lim->max_payload)
        FAIL(DQ_TOO_LARGE, "NCCL payload of %llu bytes exceeds the limit of %llu", (ull)req->nccl_payload,
             (ull)lim->max_payload);
    if (req->nccl_payload != pl->nccl_len)
        FAIL(DQ_PROTOCOL, "NCCL payload of %llu bytes announced, %llu given", (ull)req->nccl_payload,
             (ull)pl->nccl_len);
    if (req->nccl_payload && req->body_case != DQUANT__REQUEST__BODY_PUT &&
        req->body_case != DQUANT__REQUEST__BODY_ATTEND)
        FAIL(DQ_INVALID_ARGUMENT, "only PUT and ATTEND take an NCCL payload");
    if (req->nccl_reply && req->body_case != DQUANT__REQUEST__BODY_ATTEND &&
        !(req->body_case == DQUANT__REQUEST__BODY_GET && req->get->format != DQUANT__GET_FORMAT__GET_RAW))
        FAIL(DQ_INVALID_ARGUMENT, "only typed GET and ATTEND replies can travel on NCCL");
    if (req->nccl_payload) {
        int rc = check_segments(req, msg, msglen);
        if (rc < 0)
            return rc;
    }

    switch (req->body_case) {
    case DQUANT__REQUEST__BODY_HELLO: {
        *op = DQD_OP_HELLO;
        const Dquant__Hello *h = req->hello;
        FORWARD(check_name(h->client_name, "client_name", false, lim, msg, msglen));
        for (const char *p = h->client_name; p && *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                FAIL(DQ_INVALID_ARGUMENT, "client_name holds a control character");
        if (h->secret.len > 4096)
            FAIL(DQ_TOO_LARGE, "secret longer than 4096 bytes");
        if (h->n_features > 64)
            FAIL(DQ_TOO_LARGE, "more than 64 features");
        for (size_t i = 0; i < h->n_features; i++)
            FORWARD(check_name(h->features[i], "feature", true, lim, msg, msglen));
        return DQ_OK;
    }
    case DQUANT__REQUEST__BODY_REGISTER_MODEL: {
        *op = DQD_OP_REGISTER_MODEL;
        const Dquant__ModelSpec *m = req->register_model->model;
        if (!m)
            FAIL(DQ_INVALID_ARGUMENT, "model spec is missing");
        FORWARD(check_name(m->name, "model name", true, lim, msg, msglen));
        FORWARD(check_name(m->profile_name, "profile_name", false, lim, msg, msglen));
        if (m->profile.len > 4096)
            FAIL(DQ_TOO_LARGE, "profile longer than 4096 bytes");
        dqd_tensor cal;
        FORWARD(dqd_tensor_check(m->calibration, "calibration", DQD_DT_RAW, 1, true, pl, &cal, msg, msglen));
        if (cal.len > lim->max_calibration)
            FAIL(DQ_TOO_LARGE, "calibration of %llu bytes exceeds max_calibration_bytes (%llu)", (ull)cal.len,
                 (ull)lim->max_calibration);
        return DQ_OK;
    }
    case DQUANT__REQUEST__BODY_PUT:
        *op = DQD_OP_PUT;
        return validate_put(req->put, pl, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_GET: {
        *op = DQD_OP_GET;
        const Dquant__Get *g = req->get;
        if (g->n_chunk_keys) {
            if (g->seq)
                FAIL(DQ_INVALID_ARGUMENT, "GET takes seq or chunk_keys, not both");
            FORWARD(check_chunk_keys(g->chunk_keys, g->n_chunk_keys, g->chunk_ns, lim, msg, msglen));
            if (g->start_token || g->tokens)
                FAIL(DQ_INVALID_ARGUMENT, "a GET of chunks returns them whole: start_token and tokens must be 0");
        } else {
            FORWARD(check_seq(g->seq, lim, msg, msglen));
        }
        if ((uint32_t)g->format > DQUANT__GET_FORMAT__GET_RAW)
            FAIL(DQ_INVALID_ARGUMENT, "unknown GET format %d", (int)g->format);
        if (g->start_token > UINT64_MAX - g->tokens)
            FAIL(DQ_OUT_OF_BOUNDS, "start_token + tokens overflows");
        if ((uint64_t)g->first_layer + g->num_layers > UINT32_MAX)
            FAIL(DQ_OUT_OF_BOUNDS, "first_layer + num_layers overflows");
        return DQ_OK;
    }
    case DQUANT__REQUEST__BODY_ATTEND:
        *op = DQD_OP_ATTEND;
        return validate_attend(req->attend, pl, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_COMPRESS:
        *op = DQD_OP_COMPRESS;
        return validate_compress(req->compress, pl, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_DECOMPRESS:
        *op = DQD_OP_DECOMPRESS;
        return validate_decompress(req->decompress, pl, msg, msglen);
    case DQUANT__REQUEST__BODY_DELETE:
        *op = DQD_OP_DELETE;
        return check_seq(req->delete_->seq, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_PIN:
        *op = DQD_OP_PIN;
        return check_seq(req->pin->seq, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_UNPIN:
        *op = DQD_OP_UNPIN;
        return check_seq(req->unpin->seq, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_STATS:
        *op = DQD_OP_STATS;
        return DQ_OK;
    case DQUANT__REQUEST__BODY_PING:
        *op = DQD_OP_PING;
        return DQ_OK;
    case DQUANT__REQUEST__BODY_NCCL_SETUP:
        *op = DQD_OP_NCCL_SETUP;
        return DQ_OK;
    case DQUANT__REQUEST__BODY_PUT_CHUNKS:
        *op = DQD_OP_PUT_CHUNKS;
        return validate_put_chunks(req->put_chunks, pl, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_PUT_RAW:
        *op = DQD_OP_PUT_RAW;
        return validate_put_raw(req->put_raw, pl, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_PUT_CHUNKS_RAW:
        *op = DQD_OP_PUT_CHUNKS_RAW;
        return validate_put_chunks_raw(req->put_chunks_raw, pl, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_UNREGISTER_MODEL:
        *op = DQD_OP_UNREGISTER_MODEL;
        return check_name(req->unregister_model->name, "model name", true, lim, msg, msglen);
    case DQUANT__REQUEST__BODY_LOOKUP: {
        *op = DQD_OP_LOOKUP;
        const Dquant__Lookup *l = req->lookup;
        /* a LOOKUP that only releases a lease needs no model */
        FORWARD(check_name(l->model, "model", l->n_keys || !l->release_lease, lim, msg, msglen));
        FORWARD(check_chunk_keys(l->keys, l->n_keys, l->ns, lim, msg, msglen));
        if (l->lease_ms > lim->max_lease_ms)
            FAIL(DQ_INVALID_ARGUMENT, "lease of %u ms; the limit is %u ms", l->lease_ms, lim->max_lease_ms);
        return DQ_OK;
    }
    default:
        break;
    }
    FAIL(DQ_UNSUPPORTED, "unknown or missing request body (case %d)", (int)req->body_case);
}

int dqd_validate_put(const Dquant__Put *put, const dqd_payload *pl, const dqd_model_info *m, dqd_tensor *k,
                     dqd_tensor *v, char *msg, size_t msglen)
{
    if ((uint64_t)put->first_layer + put->num_layers > m->layers)
        FAIL(DQ_OUT_OF_BOUNDS, "layers [%u, %llu) outside the model's %u layers", put->first_layer,
             (ull)put->first_layer + put->num_layers, m->layers);
    FORWARD(dqd_tensor_check(put->k, "k", DQD_DT_TYPED | DQD_DT_NCCL, 4, false, pl, k, msg, msglen));
    FORWARD(dqd_tensor_check(put->v, "v", DQD_DT_TYPED | DQD_DT_NCCL, 4, false, pl, v, msg, msglen));
    const uint64_t want[4] = {put->num_layers, put->tokens, m->kv_heads, m->head_dim};
    FORWARD(dqd_tensor_expect(k, "k", want, msg, msglen));
    FORWARD(dqd_tensor_expect(v, "v", want, msg, msglen));
    if (k->dtype != v->dtype)
        FAIL(DQ_DTYPE, "k and v must have the same dtype");
    return DQ_OK;
}

int dqd_validate_put_chunks(const Dquant__PutChunks *p, const dqd_payload *pl, const dqd_model_info *m,
                            uint32_t chunk_tokens, dqd_tensor *k, dqd_tensor *v, char *msg, size_t msglen)
{
    FORWARD(dqd_tensor_check(p->k, "k", DQD_DT_TYPED, 4, false, pl, k, msg, msglen));
    FORWARD(dqd_tensor_check(p->v, "v", DQD_DT_TYPED, 4, false, pl, v, msg, msglen));
    if (k->shape[1] != (uint64_t)p->n_keys * chunk_tokens)
        FAIL(DQ_INVALID_ARGUMENT, "%llu tokens for %zu chunks of %u tokens", (ull)k->shape[1], p->n_keys, chunk_tokens);
    const uint64_t want[4] = {m->layers, (uint64_t)p->n_keys * chunk_tokens, m->kv_heads, m->head_dim};
    FORWARD(dqd_tensor_expect(k, "k", want, msg, msglen));
    FORWARD(dqd_tensor_expect(v, "v", want, msg, msglen));
    return DQ_OK;
}

int dqd_validate_get(const Dquant__Get *get, const dqd_model_info *m, uint32_t *first, uint32_t *num, char *msg,
                     size_t msglen)
{
    if (get->first_layer >= m->layers)
        FAIL(DQ_OUT_OF_BOUNDS, "first_layer %u outside the model's %u layers", get->first_layer, m->layers);
    uint32_t n = get->num_layers ? get->num_layers : m->layers - get->first_layer;
    if ((uint64_t)get->first_layer + n > m->layers)
        FAIL(DQ_OUT_OF_BOUNDS, "layers [%u, %llu) outside the model's %u layers", get->first_layer,
             (ull)get->first_layer + n, m->layers);
    *first = get->first_layer;
    *num = n;
    return DQ_OK;
}

int dqd_validate_attend_item(const Dquant__AttendItem *it, const dqd_payload *pl, const dqd_model_info *m,
                             dqd_tensor *q, dqd_tensor *ak, dqd_tensor *av, char *msg, size_t msglen)
{
    if (it->layer >= m->layers)
        FAIL(DQ_OUT_OF_BOUNDS, "layer %u outside the model's %u layers", it->layer, m->layers);
    FORWARD(dqd_tensor_check(it->q, "q", DQD_DT_TYPED | DQD_DT_NCCL, 2, false, pl, q, msg, msglen));
    const uint64_t wq[2] = {m->q_heads, m->head_dim};
    FORWARD(dqd_tensor_expect(q, "q", wq, msg, msglen));
    FORWARD(dqd_tensor_check(it->append_k, "append_k", DQD_DT_TYPED | DQD_DT_NCCL, 3, true, pl, ak, msg, msglen));
    FORWARD(dqd_tensor_check(it->append_v, "append_v", DQD_DT_TYPED | DQD_DT_NCCL, 3, true, pl, av, msg, msglen));
    if (!it->append_k != !it->append_v)
        FAIL(DQ_INVALID_ARGUMENT, "append_k and append_v go together");
    if (it->append_k) {
        const uint64_t wkv[3] = {1, m->kv_heads, m->head_dim};
        FORWARD(dqd_tensor_expect(ak, "append_k", wkv, msg, msglen));
        FORWARD(dqd_tensor_expect(av, "append_v", wkv, msg, msglen));
        if (ak->dtype != av->dtype)
            FAIL(DQ_DTYPE, "append_k and append_v must have the same dtype");
    }
    return DQ_OK;
}

int dqd_validate_calibration(const Dquant__ModelSpec *m, const dqd_payload *pl, dqd_tensor *cal, char *msg,
                             size_t msglen)
{
    return dqd_tensor_check(m->calibration, "calibration", DQD_DT_RAW, 1, true, pl, cal, msg, msglen);
}

int dqd_validate_compress(const Dquant__Compress *c, const dqd_payload *pl, const dqd_profile_info *p, dqd_tensor *x,
                          char *msg, size_t msglen)
{
    if (c->kind > 1)
        FAIL(DQ_INVALID_ARGUMENT, "kind must be 0 (keys) or 1 (values)");
    FORWARD(dqd_tensor_check(c->x, "x", DQD_DT_TYPED, 3, false, pl, x, msg, msglen));
    const uint64_t want[3] = {UINT64_MAX, p->kv_heads, p->head_dim};
    FORWARD(dqd_tensor_expect(x, "x", want, msg, msglen));
    if (x->shape[0] == 0)
        FAIL(DQ_SHAPE, "x holds no tokens");
    return DQ_OK;
}

int dqd_validate_decompress(const Dquant__Decompress *d, const dqd_payload *pl, const dqd_profile_info *p,
                            dqd_tensor *means, dqd_tensor *records, char *msg, size_t msglen)
{
    if (d->kind > 1)
        FAIL(DQ_INVALID_ARGUMENT, "kind must be 0 (keys) or 1 (values)");
    if (d->tokens == 0)
        FAIL(DQ_INVALID_ARGUMENT, "tokens must be at least 1");
    FORWARD(dqd_tensor_check(d->records, "records", DQD_DT_RAW, 1, false, pl, records, msg, msglen));
    FORWARD(dqd_tensor_check(d->means, "means", DQD_DT_RAW, 1, true, pl, means, msg, msglen));
    uint64_t rb = p->record_bytes[d->kind];
    if (rb == 0 || d->tokens > UINT64_MAX / rb || records->len != d->tokens * rb)
        FAIL(DQ_SHAPE, "records: %llu bytes, expected tokens (%llu) x record bytes (%llu)", (ull)records->len,
             (ull)d->tokens, (ull)rb);
    if (d->kind == 0 && p->mean_bytes) {
        uint64_t w = p->window ? p->window : 1;
        uint64_t blocks = d->tokens / w + (d->tokens % w != 0);
        if (blocks > UINT64_MAX / p->mean_bytes || means->len != blocks * p->mean_bytes)
            FAIL(DQ_SHAPE, "means: %llu bytes, expected %llu blocks x %llu bytes", (ull)means->len, (ull)blocks,
                 (ull)p->mean_bytes);
    } else if (means->len != 0) {
        FAIL(DQ_SHAPE, d->kind ? "values carry no means" : "this profile's keys carry no means (no window header)");
    }
    return DQ_OK;
}

int dqd_validate_raw_layers(Dquant__RawLayer *const *layers, size_t n, uint32_t first_layer, const dqd_payload *pl,
                            const dqd_model_info *m, const dqd_profile_info *p, dqd_raw_tensors *out, uint64_t *tokens,
                            char *msg, size_t msglen)
{
    if ((uint64_t)first_layer + n > m->layers)
        FAIL(DQ_OUT_OF_BOUNDS, "layers [%u, %llu) outside the model's %u layers", first_layer, (ull)first_layer + n,
             m->layers);
    const uint64_t W = p->window ? p->window : 1;
    const uint64_t wb = p->mean_bytes + W * (p->record_bytes[0] + p->record_bytes[1]);
    const uint64_t row = (uint64_t)m->kv_heads * m->head_dim;
    uint64_t want_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        const Dquant__RawLayer *l = layers[i];
        dqd_raw_tensors *o = &out[i];
        const uint32_t layer = first_layer + (uint32_t)i;
        if (l->layer != layer)
            FAIL(DQ_INVALID_ARGUMENT, "raw layer %zu says layer %u, not %u", i, l->layer, layer);
        FORWARD(dqd_tensor_check(l->records, "records", DQD_DT_RAW, 1, true, pl, &o->records, msg, msglen));
        FORWARD(dqd_tensor_check(l->tail_k, "tail_k", DQD_DT_BF16, 2, true, pl, &o->tail_k, msg, msglen));
        FORWARD(dqd_tensor_check(l->tail_v, "tail_v", DQD_DT_BF16, 2, true, pl, &o->tail_v, msg, msglen));
        if (wb == 0 || l->windows > UINT64_MAX / wb || o->records.len != l->windows * wb)
            FAIL(DQ_SHAPE, "layer %u: records of %llu bytes, not %llu windows x %llu bytes", layer, (ull)o->records.len,
                 (ull)l->windows, (ull)wb);
        const uint64_t tt = o->tail_k.len ? o->tail_k.shape[0] : 0;
        const uint64_t tv = o->tail_v.len ? o->tail_v.shape[0] : 0;
        if (tt != tv)
            FAIL(DQ_SHAPE, "layer %u: tail_k holds %llu tokens, tail_v %llu", layer, (ull)tt, (ull)tv);
        if (tt >= W)
            FAIL(DQ_SHAPE, "layer %u: tail_tokens %llu, not below W = %llu", layer, (ull)tt, (ull)W);
        if (tt && (o->tail_k.shape[1] != row || o->tail_v.shape[1] != row))
            FAIL(DQ_SHAPE, "layer %u: tail tokens of %llu and %llu values, the model's are %llu", layer,
                 (ull)o->tail_k.shape[1], (ull)o->tail_v.shape[1], (ull)row);
        if (l->windows > (UINT64_MAX - tt) / W)
            FAIL(DQ_SHAPE, "layer %u: token count overflows", layer);
        const uint64_t tokens_i = l->windows * W + tt;
        if (l->tokens && l->tokens != tokens_i)
            FAIL(DQ_SHAPE, "layer %u: tokens %llu, but windows and tail hold %llu", layer, (ull)l->tokens,
                 (ull)tokens_i);
        if (i && tokens_i != want_tokens)
            FAIL(DQ_SHAPE, "layer %u holds %llu tokens, layer %u %llu: every layer must hold the same", layer,
                 (ull)tokens_i, first_layer, (ull)want_tokens);
        want_tokens = tokens_i;
        o->windows = l->windows;
        o->tail_tokens = tt;
    }
    *tokens = want_tokens;
    return DQ_OK;
}

/* ---- strings on the wire ---- */

#define WIRE_MAX_DEPTH 16

/* The index of the first byte of s that is NUL or starts an invalid UTF-8 sequence (overlong
 * forms, surrogates and code points above U+10FFFF included), n when there is none; *nul says
 * whether it is a NUL. */
static size_t utf8_bad(const uint8_t *s, size_t n, bool *nul)
{
    *nul = false;
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        if (c < 0x80) {
            if (c == 0) {
                *nul = true;
                return i;
            }
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1fu, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0fu, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07u, min = 0x10000;
        } else {
            return i;
        }
        if (n - i <= k)
            return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += k + 1;
    }
    return n;
}

/* A varint at *p (advanced), below end. false when truncated or longer than 10 bytes. */
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        const uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

static int walk_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth,
                        char *path, size_t at, size_t pathcap, char *msg, size_t msglen)
{
    if (depth > WIRE_MAX_DEPTH)
        FAIL(DQ_PROTOCOL, "the header message nests deeper than %d levels", WIRE_MAX_DEPTH);
    while (p < end) {
        uint64_t tag, len = 0;
        if (!wire_varint(&p, end, &tag))
            FAIL(DQ_PROTOCOL, "the header message is not a valid protobuf message");
        switch (tag & 7) {
        case 0:
            if (!wire_varint(&p, end, &len))
                FAIL(DQ_PROTOCOL, "the header message is not a valid protobuf message");
            continue;
        case 1:
            len = 8;
            break;
        case 5:
            len = 4;
            break;
        case 2:
            if (!wire_varint(&p, end, &len))
                FAIL(DQ_PROTOCOL, "the header message is not a valid protobuf message");
            break;
        default:
            FAIL(DQ_PROTOCOL, "the header message is not a valid protobuf message (wire type %u)", (unsigned)(tag & 7));
        }
        if (len > (uint64_t)(end - p))
            FAIL(DQ_PROTOCOL, "the header message is not a valid protobuf message");
        const ProtobufCFieldDescriptor *f = (tag & 7) == 2 && tag >> 3 <= UINT32_MAX
                                                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3))
                                                : NULL;
        if (f && (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)) {
            /* path: "body.field.field" (truncated when long; it only names the field) */
            size_t next = at + (size_t)snprintf(path + at, pathcap - at, "%s%s", at ? "." : "", f->name);
            if (next >= pathcap)
                next = pathcap - 1;
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                bool nul;
                const size_t bad = utf8_bad(p, (size_t)len, &nul);
                if (bad < len)
                    FAIL(DQ_INVALID_ARGUMENT, "%s: %s at byte %zu of %llu; names are UTF-8 without NUL", path,
                         nul ? "a NUL byte" : "invalid UTF-8", bad, (ull)len);
            } else {
                FORWARD(walk_strings(f->descriptor, p, p + len, depth + 1, path, next, pathcap, msg, msglen));
            }
            path[at] = 0;
        }
        p += len;
    }
    return DQ_OK;
}

int dqd_validate_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *header, size_t header_len, char *msg,
                         size_t msglen)
{
    char path[160] = "";
    if (!header_len)
        return DQ_OK;
    if (!header)
        FAIL(DQ_PROTOCOL, "header missing");
    return walk_strings(desc, header, header + header_len, 0, path, 0, sizeof path, msg, msglen);
}

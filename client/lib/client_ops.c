/* libdquant-client: one function per operation. Each validates its arguments, builds the request
 * around the caller's buffers (payload tensors are sent straight from caller memory), makes the
 * call through dqc__call and checks every tensor of the reply before handing it out. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chunkkey.h"
#include "client_internal.h"

#define DQC_RAW_DTYPE DQUANT__DTYPE__RAW

static int dtype_ok(dq_dtype d)
{
    return d == DQ_DTYPE_F32 || d == DQ_DTYPE_F16 || d == DQ_DTYPE_BF16;
}

static size_t dtype_size(dq_dtype d)
{
    return dqc__wire_dtype_size((int)d);
}

/* product of dims · elem into *out; 0 on overflow of size_t. */
static int mul_size(size_t *out, size_t elem, const uint64_t *dims, size_t n)
{
    uint64_t v = elem;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] && v > UINT64_MAX / dims[i])
            return 0;
        v *= dims[i];
    }
    if (v > SIZE_MAX)
        return 0;
    *out = (size_t)v;
    return 1;
}

static int seq_fill(dqc_client *c, const char *op, const dqc_seq *s, Dquant__SeqRef *out)
{
    DQC_CHECK_ARG(c, s, "%s: seq is NULL", op);
    DQC_CHECK_ARG(c, s->key || !s->key_len, "%s: seq.key is NULL with key_len %zu", op, s->key_len);
    dquant__seq_ref__init(out);
    out->ns = (char *)(s->ns ? s->ns : "");
    out->key.data = (uint8_t *)s->key;
    out->key.len = s->key_len;
    return 0;
}

static void tensor_set(Dquant__Tensor *t, int dtype, uint64_t *shape, size_t ndim, uint64_t offset, size_t length)
{
    dquant__tensor__init(t);
    t->dtype = (Dquant__DType)dtype;
    t->shape = shape;
    t->n_shape = ndim;
    t->offset = offset;
    t->length = length;
}

/* Empties a result for a new call, keeping its block for reuse. */
#define RESULT_RESET(res)                \
    do {                                 \
        void *m_ = (res)->mem_;          \
        size_t c_ = (res)->mem_cap_;     \
        memset((res), 0, sizeof *(res)); \
        (res)->mem_ = m_;                \
        (res)->mem_cap_ = c_;            \
    } while (0)

/* The body of the dqc_*_result_free functions: releases the block and empties the result (NULL
 * allowed). */
#define RESULT_FREE(res)                     \
    do {                                     \
        if (res) {                           \
            free((res)->mem_);               \
            memset((res), 0, sizeof *(res)); \
        }                                    \
    } while (0)

/* ---- REGISTER_MODEL ---- */

int dqc_register_model(dqc_client *c, const dqc_model_spec *spec, dqc_model_info *info)
{
    return dqc_register_model_ex(c, spec, 0, info, NULL);
}

int dqc_register_model_ex(dqc_client *c, const dqc_model_spec *spec, uint32_t chunk_tokens, dqc_model_info *info,
                          uint32_t *chunk_tokens_out)
{
    return dqc_register_model_calibrated(c, spec, chunk_tokens, NULL, 0, info, chunk_tokens_out);
}

int dqc_register_model_calibrated(dqc_client *c, const dqc_model_spec *spec, uint32_t chunk_tokens,
                                  const void *calibration, size_t calibration_len, dqc_model_info *info,
                                  uint32_t *chunk_tokens_out)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, calibration || !calibration_len, "register_model: calibration is NULL with %zu bytes",
                  calibration_len);
    DQC_CHECK_ARG(c, spec && spec->name && spec->name[0], "register_model: spec and its name are required");
    DQC_CHECK_ARG(c, spec->layers && spec->q_heads && spec->kv_heads && spec->head_dim,
                  "register_model: layers, q_heads, kv_heads and head_dim must be positive");
    DQC_CHECK_ARG(c, (spec->profile_name && spec->profile_name[0]) || (spec->profile && spec->profile_len),
                  "register_model: a profile name or a serialized profile is required");
    if (info)
        memset(info, 0, sizeof *info);

    Dquant__ModelSpec ms = DQUANT__MODEL_SPEC__INIT;
    ms.name = (char *)spec->name;
    ms.layers = spec->layers;
    ms.q_heads = spec->q_heads;
    ms.kv_heads = spec->kv_heads;
    ms.head_dim = spec->head_dim;
    ms.profile_name = (char *)(spec->profile_name ? spec->profile_name : "");
    ms.profile.data = (uint8_t *)spec->profile;
    ms.profile.len = spec->profile ? spec->profile_len : 0;
    ms.chunk_tokens = chunk_tokens;
    uint64_t cshape[1] = {calibration_len};
    Dquant__Tensor tc;
    tensor_set(&tc, DQC_RAW_DTYPE, cshape, 1, 0, calibration_len);
    ms.calibration = calibration_len ? &tc : NULL;
    Dquant__RegisterModel rm = DQUANT__REGISTER_MODEL__INIT;
    rm.model = &ms;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_REGISTER_MODEL;
    req.register_model = &rm;
    struct iovec iov[1] = {{(void *)calibration, calibration_len}};

    dqc__reply rep;
    DQC_FORWARD(
        dqc__call(c, &req, iov, calibration_len ? 1 : 0, 1, DQUANT__RESPONSE__BODY_REGISTER_MODEL, NULL, NULL, &rep));
    int rc = 0;
    if (info) {
        const Dquant__RegisterModelReply *r = rep.resp->register_model;
        info->existed = r->existed;
        info->bits_per_value = r->bits_per_value;
        rc = dqc__copy_profile(c, &r->profile, info->profile, &info->profile_len);
    }
    if (chunk_tokens_out)
        *chunk_tokens_out = rep.resp->register_model->chunk_tokens;
    dqc__reply_free(&rep);
    return rc;
}

int dqc_unregister_model(dqc_client *c, const char *name)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, name && name[0], "unregister_model: a model name is required");
    Dquant__UnregisterModel um = DQUANT__UNREGISTER_MODEL__INIT;
    um.name = (char *)name;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_UNREGISTER_MODEL;
    req.unregister_model = &um;
    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, NULL, 0, 0, DQUANT__RESPONSE__BODY_OK, NULL, NULL, &rep));
    dqc__reply_free(&rep);
    return 0;
}

/* keys (n · 16 bytes) as protobuf bytes fields; *out malloc'd (NULL when n is 0). */
static int keys_fill(dqc_client *c, const char *op, const uint8_t *keys, size_t n, ProtobufCBinaryData **out)
{
    *out = NULL;
    DQC_CHECK_ARG(c, keys || !n, "%s: keys is NULL with nkeys %zu", op, n);
    if (!n)
        return 0;
    if (n > SIZE_MAX / sizeof **out || !(*out = malloc(n * sizeof **out)))
        return dqc__fail(c, DQ_NOMEM, "%s: out of memory for %zu keys", op, n);
    for (size_t i = 0; i < n; i++) {
        (*out)[i].data = (uint8_t *)keys + i * DQC_CHUNK_KEY_BYTES;
        (*out)[i].len = DQC_CHUNK_KEY_BYTES;
    }
    return 0;
}

/* ---- PUT ---- */

int dqc__put_build(dqc_client *c, const char *op, const dqc_put_args *a, int nccl, dqc__put_req *r)
{
    DQC_CHECK_ARG(c, a, "%s: args is NULL", op);
    DQC_CHECK_ARG(c, a->model && a->model[0], "%s: model name required", op);
    DQC_CHECK_ARG(c, a->num_layers && a->tokens && a->kv_heads && a->head_dim,
                  "%s: num_layers, tokens, kv_heads and head_dim must be positive", op);
    DQC_CHECK_ARG(c, dtype_ok(a->dtype), "%s: unsupported dtype %d", op, (int)a->dtype);
    DQC_CHECK_ARG(c, a->k && a->v, "%s: k and v are required", op);
    r->shape[0] = a->num_layers;
    r->shape[1] = a->tokens;
    r->shape[2] = a->kv_heads;
    r->shape[3] = a->head_dim;
    if (!mul_size(&r->bytes, dtype_size(a->dtype), r->shape, 4) || r->bytes > SIZE_MAX / 2)
        return dqc__fail(c, DQ_TOO_LARGE, "%s: tensor size overflows", op);

    DQC_FORWARD(seq_fill(c, op, &a->seq, &r->seq));
    tensor_set(&r->k, (int)a->dtype, r->shape, 4, 0, r->bytes);
    tensor_set(&r->v, (int)a->dtype, r->shape, 4, r->bytes, r->bytes);
    r->k.nccl = r->v.nccl = nccl != 0;
    dquant__put__init(&r->put);
    r->put.seq = &r->seq;
    r->put.model = (char *)a->model;
    r->put.start_token = a->start_token;
    r->put.first_layer = a->first_layer;
    r->put.num_layers = a->num_layers;
    r->put.tokens = a->tokens;
    r->put.k = &r->k;
    r->put.v = &r->v;
    dquant__request__init(&r->req);
    r->req.body_case = DQUANT__REQUEST__BODY_PUT;
    r->req.put = &r->put;
    return 0;
}

void dqc__put_result(const dqc__reply *rep, dqc_put_result *res)
{
    if (res) {
        const Dquant__PutReply *r = rep->resp->put;
        res->tokens = r->tokens;
        res->stored_bytes = r->stored_bytes;
        res->streams_encoded = r->streams_encoded;
        res->retries = r->retries;
    }
}

static int put_call(dqc_client *c, const char *op, const dqc_put_args *a, const uint8_t *prefix, size_t nprefix,
                    dqc_put_result *res)
{
    DQC_CHECK_HANDLE(c);
    if (res)
        memset(res, 0, sizeof *res);
    dqc__put_req r;
    DQC_FORWARD(dqc__put_build(c, op, a, 0, &r));
    DQC_FORWARD(keys_fill(c, op, prefix, nprefix, &r.put.prefix_chunks));
    r.put.n_prefix_chunks = nprefix;
    struct iovec iov[2] = {{(void *)a->k, r.bytes}, {(void *)a->v, r.bytes}};

    dqc__reply rep;
    int rc = dqc__call(c, &r.req, iov, 2, 0, DQUANT__RESPONSE__BODY_PUT, NULL, NULL, &rep);
    free(r.put.prefix_chunks);
    DQC_FORWARD(rc);
    dqc__put_result(&rep, res);
    dqc__reply_free(&rep);
    return 0;
}

int dqc_put(dqc_client *c, const dqc_put_args *a, dqc_put_result *res)
{
    return put_call(c, "put", a, NULL, 0, res);
}

int dqc_put_on_prefix(dqc_client *c, const dqc_put_args *a, const uint8_t *prefix_keys, size_t nprefix,
                      dqc_put_result *res)
{
    return put_call(c, "put_on_prefix", a, prefix_keys, nprefix, res);
}

/* ---- GET ---- */

/* Sends GET g (every field but seq set) for sequence s and waits for its reply; the payload goes
 * into the result's block *blk. dqc_get and dqc_get_raw. */
static int get_call(dqc_client *c, const char *op, const dqc_seq *s, int kind, Dquant__Get *g, void **blk,
                    size_t *blk_cap, dqc__reply *rep)
{
    Dquant__SeqRef seq;
    if (s) { /* else g names chunks */
        DQC_FORWARD(seq_fill(c, op, s, &seq));
        seq.kind = (Dquant__SeqKind)kind;
        g->seq = &seq;
    }
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = g;
    int rc = dqc__call(c, &req, NULL, 0, 1, DQUANT__RESPONSE__BODY_GET, blk, blk_cap, rep);
    g->seq = NULL;
    return rc;
}

static Dquant__GetFormat get_format(dq_dtype d)
{
    switch (d) {
    case DQ_DTYPE_F16:
        return DQUANT__GET_FORMAT__GET_F16;
    case DQ_DTYPE_BF16:
        return DQUANT__GET_FORMAT__GET_BF16;
    default:
        return DQUANT__GET_FORMAT__GET_F32;
    }
}

int dqc__get_build(dqc_client *c, const char *op, const dqc_get_args *a, dqc__get_req *r)
{
    DQC_CHECK_ARG(c, dtype_ok(a->dtype), "%s: unsupported dtype %d", op, (int)a->dtype);
    DQC_FORWARD(seq_fill(c, op, &a->seq, &r->seq));
    dquant__get__init(&r->get);
    r->get.seq = &r->seq;
    r->get.first_layer = a->first_layer;
    r->get.num_layers = a->num_layers;
    r->get.start_token = a->start_token;
    r->get.tokens = a->tokens;
    r->get.format = get_format(a->dtype);
    dquant__request__init(&r->req);
    r->req.body_case = DQUANT__REQUEST__BODY_GET;
    r->req.get = &r->get;
    return 0;
}

int dqc__get_check(dqc_client *c, const char *op, const dqc_get_args *a, const Dquant__GetReply *r,
                   uint64_t payload_len, size_t *bytes)
{
    uint64_t want[4] = {a->num_layers ? a->num_layers : UINT64_MAX, r->tokens, UINT64_MAX, UINT64_MAX};
    size_t kb = 0, vb = 0;
    DQC_FORWARD(dqc__tensor_check(c, r->k, "k", payload_len, (int)a->dtype, 4, want, &kb));
    const uint64_t *ks = r->k->shape;
    uint64_t same[4] = {ks[0], ks[1], ks[2], ks[3]};
    DQC_FORWARD(dqc__tensor_check(c, r->v, "v", payload_len, (int)a->dtype, 4, same, &vb));
    if (a->tokens && r->tokens != a->tokens)
        return dqc__fail(c, DQ_PROTOCOL, "%s: asked for %llu tokens, reply has %llu", op, (unsigned long long)a->tokens,
                         (unsigned long long)r->tokens);
    *bytes = kb;
    return 0;
}

void dqc__get_meta(const Dquant__GetReply *r, dq_dtype dtype, size_t bytes, dqc_get_result *res)
{
    res->start_token = r->start_token;
    res->tokens = r->tokens;
    res->num_layers = (uint32_t)r->k->shape[0];
    res->kv_heads = (uint32_t)r->k->shape[2];
    res->head_dim = (uint32_t)r->k->shape[3];
    res->dtype = dtype;
    res->bytes = bytes;
}

/* A typed GET of a sequence or (kind CHUNK) a chunk. */
static int get_typed(dqc_client *c, const char *op, const dqc_get_args *a, int kind, dqc_get_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, a && res, "%s: args and res are required", op);
    RESULT_RESET(res);
    dqc__get_req g;
    DQC_FORWARD(dqc__get_build(c, op, a, &g));
    g.seq.kind = (Dquant__SeqKind)kind;
    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &g.req, NULL, 0, 1, DQUANT__RESPONSE__BODY_GET, &res->mem_, &res->mem_cap_, &rep));
    const Dquant__GetReply *r = rep.resp->get;
    size_t kb = 0;
    int rc = dqc__get_check(c, op, a, r, rep.payload_len, &kb);
    if (!rc) {
        dqc__get_meta(r, a->dtype, kb, res);
        res->k = kb ? rep.payload + r->k->offset : NULL;
        res->v = kb ? rep.payload + r->v->offset : NULL;
    }
    dqc__reply_free(&rep);
    return rc;
}

int dqc_get(dqc_client *c, const dqc_get_args *a, dqc_get_result *res)
{
    return get_typed(c, "get", a, DQUANT__SEQ_KIND__SEQUENCE, res);
}

void dqc_get_result_free(dqc_get_result *res)
{
    RESULT_FREE(res);
}

/* ---- GET_RAW ---- */

static int get_raw(dqc_client *c, const dqc_seq *s, int kind, uint32_t first_layer, uint32_t num_layers,
                   const char *chunk_ns, const uint8_t *keys, size_t nkeys, dqc_raw_result *res);

int dqc_get_raw(dqc_client *c, const dqc_seq *s, uint32_t first_layer, uint32_t num_layers, dqc_raw_result *res)
{
    return get_raw(c, s, DQUANT__SEQ_KIND__SEQUENCE, first_layer, num_layers, NULL, NULL, 0, res);
}

int dqc_get_chunk_raw(dqc_client *c, const char *ns, const uint8_t *key, dqc_raw_result *res)
{
    dqc_seq s = {ns, key, DQC_CHUNK_KEY_BYTES};
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, key, "get_chunk_raw: key is NULL");
    return get_raw(c, &s, DQUANT__SEQ_KIND__CHUNK, 0, 0, NULL, NULL, 0, res);
}

int dqc_get_chunks_raw(dqc_client *c, const char *ns, const uint8_t *keys, size_t nkeys, dqc_raw_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, keys && nkeys, "get_chunks_raw: at least one key is required");
    return get_raw(c, NULL, DQUANT__SEQ_KIND__CHUNK, 0, 0, ns ? ns : "", keys, nkeys, res);
}

int dqc_get_chunk(dqc_client *c, const char *ns, const uint8_t *key, dq_dtype dtype, dqc_get_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, key, "get_chunk: key is NULL");
    dqc_get_args a = {.seq = {ns, key, DQC_CHUNK_KEY_BYTES}, .dtype = dtype};
    return get_typed(c, "get_chunk", &a, DQUANT__SEQ_KIND__CHUNK, res);
}

static int get_raw(dqc_client *c, const dqc_seq *s, int kind, uint32_t first_layer, uint32_t num_layers,
                   const char *chunk_ns, const uint8_t *keys, size_t nkeys, dqc_raw_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, res, "get_raw: res is required");
    dqc_raw_layer *layers = res->layers;
    size_t layers_cap = res->layers_cap_;
    RESULT_RESET(res);
    res->layers = layers;
    res->layers_cap_ = layers_cap;

    Dquant__Get g = DQUANT__GET__INIT;
    g.first_layer = first_layer;
    g.num_layers = num_layers;
    g.format = DQUANT__GET_FORMAT__GET_RAW;
    if (nkeys) { /* chunks, their windows one after the other per layer */
        DQC_FORWARD(keys_fill(c, "get_chunks_raw", keys, nkeys, &g.chunk_keys));
        g.n_chunk_keys = nkeys;
        g.chunk_ns = (char *)chunk_ns;
    }
    dqc__reply rep;
    int crc = get_call(c, "get_raw", nkeys ? NULL : s, kind, &g, &res->mem_, &res->mem_cap_, &rep);
    free(g.chunk_keys);
    DQC_FORWARD(crc);
    const Dquant__GetReply *r = rep.resp->get;
    int rc = dqc__copy_profile(c, &r->profile, res->profile, &res->profile_len);
    if (!rc && num_layers && r->n_raw != num_layers)
        rc = dqc__fail(c, DQ_PROTOCOL, "get_raw: asked for %u layers, reply has %zu", num_layers, r->n_raw);
    if (!rc && r->n_raw > res->layers_cap_) {
        dqc_raw_layer *nl = realloc(res->layers, r->n_raw * sizeof *nl);
        if (!nl)
            rc = dqc__fail(c, DQ_NOMEM, "get_raw: no memory for %zu layers", r->n_raw);
        else {
            res->layers = nl;
            res->layers_cap_ = r->n_raw;
        }
    }
    for (size_t i = 0; !rc && i < r->n_raw; i++) {
        const Dquant__RawLayer *rl = r->raw[i];
        dqc_raw_layer *o = &res->layers[i];
        memset(o, 0, sizeof *o);
        o->layer = rl->layer;
        o->tokens = rl->tokens;
        o->windows = rl->windows;
        size_t rb = 0, kb = 0, vb = 0;
        if (rl->records) {
            rc = dqc__tensor_check(c, rl->records, "records", rep.payload_len, DQC_RAW_DTYPE, 0, NULL, &rb);
            if (rc)
                break;
            o->records = rb ? rep.payload + rl->records->offset : NULL;
        }
        if (rl->windows && (!rb || rb % rl->windows)) {
            rc = dqc__fail(c, DQ_PROTOCOL, "get_raw: layer %u: %llu windows in %zu record bytes", rl->layer,
                           (unsigned long long)rl->windows, rb);
            break;
        }
        o->records_bytes = rb;
        if (rl->tail_k || rl->tail_v) {
            rc = dqc__tensor_check(c, rl->tail_k, "tail_k", rep.payload_len, DQUANT__DTYPE__BF16, 3, NULL, &kb);
            if (!rc) {
                const uint64_t *ks = rl->tail_k->shape;
                uint64_t same[3] = {ks[0], ks[1], ks[2]};
                rc = dqc__tensor_check(c, rl->tail_v, "tail_v", rep.payload_len, DQUANT__DTYPE__BF16, 3, same, &vb);
            }
            if (rc)
                break;
            o->tail_tokens = rl->tail_k->shape[0];
            o->tail_bytes = kb;
            o->tail_k = kb ? rep.payload + rl->tail_k->offset : NULL;
            o->tail_v = vb ? rep.payload + rl->tail_v->offset : NULL;
        }
        if (o->tail_tokens > o->tokens) {
            rc = dqc__fail(c, DQ_PROTOCOL, "get_raw: layer %u: tail of %llu tokens in a layer of %llu", rl->layer,
                           (unsigned long long)o->tail_tokens, (unsigned long long)o->tokens);
            break;
        }
    }
    if (!rc)
        res->nlayers = r->n_raw;
    dqc__reply_free(&rep);
    return rc;
}

void dqc_raw_result_free(dqc_raw_result *res)
{
    if (!res)
        return;
    free(res->mem_);
    free(res->layers);
    memset(res, 0, sizeof *res);
}

/* ---- ATTEND ---- */

int dqc__attend_build(dqc_client *c, const char *op, const dqc_attend_args *a, int nccl, dqc__attend_req *r)
{
    memset(r, 0, sizeof *r);
    DQC_CHECK_ARG(c, a, "%s: args is NULL", op);
    DQC_CHECK_ARG(c, a->items && a->nitems, "%s: at least one item is required", op);
    DQC_CHECK_ARG(c, a->q_heads && a->head_dim, "%s: q_heads and head_dim must be positive", op);
    DQC_CHECK_ARG(c, dtype_ok(a->dtype), "%s: unsupported dtype %d", op, (int)a->dtype);
    DQC_CHECK_ARG(c, isfinite(a->scale) && a->scale >= 0, "%s: scale must be finite and >= 0", op);
    if (c->info.max_batch_items && a->nitems > c->info.max_batch_items)
        return dqc__fail(c, DQ_TOO_LARGE, "%s: %zu items exceed the server's batch limit of %u", op, a->nitems,
                         c->info.max_batch_items);
    size_t nappend = 0;
    for (size_t i = 0; i < a->nitems; i++) {
        const dqc_attend_item *it = &a->items[i];
        DQC_CHECK_ARG(c, it->q, "%s: item %zu has no q", op, i);
        DQC_CHECK_ARG(c, !it->append_k == !it->append_v, "%s: item %zu: append_k and append_v go together", op, i);
        DQC_CHECK_ARG(c, it->seq.key || !it->seq.key_len, "%s: item %zu: seq.key is NULL", op, i);
        nappend += it->append_k != NULL;
    }
    DQC_CHECK_ARG(c, !nappend || a->kv_heads, "%s: kv_heads is required with appends", op);

    /* One block for the request structures: items, item pointers, seq refs, tensors, iovecs, and the
     * shapes the tensors point to. */
    size_t n = a->nitems;
    size_t niov = n + 2 * nappend;
    size_t need = n * (sizeof(Dquant__AttendItem) + sizeof(Dquant__AttendItem *) + sizeof(Dquant__SeqRef) +
                       3 * sizeof(Dquant__Tensor)) +
                  niov * sizeof(struct iovec) + 5 * sizeof(uint64_t);
    uint8_t *blk = malloc(need);
    if (!blk)
        return dqc__fail(c, DQ_NOMEM, "%s: no memory for %zu items", op, n);
    Dquant__AttendItem *items = (Dquant__AttendItem *)blk;
    Dquant__AttendItem **ptrs = (Dquant__AttendItem **)(items + n);
    Dquant__SeqRef *seqs = (Dquant__SeqRef *)(ptrs + n);
    Dquant__Tensor *tens = (Dquant__Tensor *)(seqs + n);
    struct iovec *iov = (struct iovec *)(tens + 3 * n);
    uint64_t *qshape = (uint64_t *)(iov + niov);
    uint64_t *ashape = qshape + 2;
    qshape[0] = a->q_heads;
    qshape[1] = a->head_dim;
    ashape[0] = 1;
    ashape[1] = a->kv_heads;
    ashape[2] = a->head_dim;
    r->oshape[0] = a->nitems;
    r->oshape[1] = a->q_heads;
    r->oshape[2] = a->head_dim;
    size_t es = dtype_size(a->dtype), qbytes, abytes = 0;
    if (!mul_size(&qbytes, es, qshape, 2) || (nappend && !mul_size(&abytes, es, ashape, 3)) ||
        !mul_size(&r->obytes, 4, r->oshape, 3) || !mul_size(&r->lbytes, 4, r->oshape, 2)) {
        free(blk);
        return dqc__fail(c, DQ_TOO_LARGE, "%s: tensor size overflows", op);
    }

    uint64_t off = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const dqc_attend_item *it = &a->items[i];
        dquant__attend_item__init(&items[i]);
        seq_fill(c, op, &it->seq, &seqs[i]);
        items[i].seq = &seqs[i];
        items[i].layer = it->layer;
        tensor_set(&tens[3 * i], (int)a->dtype, qshape, 2, off, qbytes);
        tens[3 * i].nccl = nccl != 0;
        items[i].q = &tens[3 * i];
        iov[k++] = (struct iovec){(void *)it->q, qbytes};
        off += qbytes;
        if (it->append_k) {
            tensor_set(&tens[3 * i + 1], (int)a->dtype, ashape, 3, off, abytes);
            iov[k++] = (struct iovec){(void *)it->append_k, abytes};
            off += abytes;
            tensor_set(&tens[3 * i + 2], (int)a->dtype, ashape, 3, off, abytes);
            iov[k++] = (struct iovec){(void *)it->append_v, abytes};
            off += abytes;
            tens[3 * i + 1].nccl = tens[3 * i + 2].nccl = nccl != 0;
            items[i].append_k = &tens[3 * i + 1];
            items[i].append_v = &tens[3 * i + 2];
        }
        ptrs[i] = &items[i];
    }
    dquant__attend__init(&r->at);
    r->at.n_items = n;
    r->at.items = ptrs;
    r->at.scale = a->scale;
    dquant__request__init(&r->req);
    r->req.body_case = DQUANT__REQUEST__BODY_ATTEND;
    r->req.attend = &r->at;
    r->iov = iov;
    r->niov = niov;
    r->payload = off;
    r->nappend = nappend;
    r->blk_ = blk;
    return 0;
}

void dqc__attend_free(dqc__attend_req *r)
{
    free(r->blk_);
    r->blk_ = NULL;
}

int dqc_attend(dqc_client *c, const dqc_attend_args *a, float *out, float *lse)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, a && out, "attend: args and out are required");
    dqc__attend_req ar;
    DQC_FORWARD(dqc__attend_build(c, "attend", a, 0, &ar));
    dqc__reply rep;
    int rc = dqc__call(c, &ar.req, ar.iov, ar.niov, ar.nappend == 0, DQUANT__RESPONSE__BODY_ATTEND, NULL, NULL, &rep);
    dqc__attend_free(&ar);
    if (rc)
        return rc;
    const Dquant__AttendReply *r = rep.resp->attend;
    size_t ob = 0, lb = 0;
    rc = dqc__tensor_check(c, r->out, "out", rep.payload_len, DQUANT__DTYPE__F32, 3, ar.oshape, &ob);
    if (!rc)
        rc = dqc__tensor_check(c, r->lse, "lse", rep.payload_len, DQUANT__DTYPE__F32, 2, ar.oshape, &lb);
    if (!rc) {
        memcpy(out, rep.payload + r->out->offset, ar.obytes);
        if (lse)
            memcpy(lse, rep.payload + r->lse->offset, ar.lbytes);
    }
    dqc__reply_free(&rep);
    return rc;
}

/* ---- COMPRESS / DECOMPRESS ---- */

int dqc_compress(dqc_client *c, const dqc_compress_args *a, dqc_compress_result *res)
{
    return dqc_compress_layer(c, a, 0, res);
}

int dqc_compress_layer(dqc_client *c, const dqc_compress_args *a, uint32_t layer, dqc_compress_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, a && res, "compress: args and res are required");
    RESULT_RESET(res);
    DQC_CHECK_ARG(c, (a->model && a->model[0]) || (a->profile_name && a->profile_name[0]),
                  "compress: a model or a profile name is required");
    DQC_CHECK_ARG(c, a->kv_heads && a->head_dim && a->tokens,
                  "compress: kv_heads, head_dim and tokens must be positive");
    DQC_CHECK_ARG(c, a->kind == 0 || a->kind == 1, "compress: kind must be 0 (keys) or 1 (values)");
    DQC_CHECK_ARG(c, dtype_ok(a->dtype), "compress: unsupported dtype %d", (int)a->dtype);
    DQC_CHECK_ARG(c, a->x, "compress: x is required");
    uint64_t shape[3] = {a->tokens, a->kv_heads, a->head_dim};
    size_t bytes;
    if (!mul_size(&bytes, dtype_size(a->dtype), shape, 3))
        return dqc__fail(c, DQ_TOO_LARGE, "compress: tensor size overflows");

    Dquant__Tensor tx;
    tensor_set(&tx, (int)a->dtype, shape, 3, 0, bytes);
    Dquant__Compress cm = DQUANT__COMPRESS__INIT;
    cm.model = (char *)(a->model ? a->model : "");
    cm.profile_name = (char *)(a->profile_name ? a->profile_name : "");
    cm.kv_heads = a->kv_heads;
    cm.head_dim = a->head_dim;
    cm.kind = (uint32_t)a->kind;
    cm.x = &tx;
    cm.layer = layer;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_COMPRESS;
    req.compress = &cm;
    struct iovec iov[1] = {{(void *)a->x, bytes}};

    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, iov, 1, 1, DQUANT__RESPONSE__BODY_COMPRESS, &res->mem_, &res->mem_cap_, &rep));
    const Dquant__CompressReply *r = rep.resp->compress;
    size_t mb = 0, rb = 0;
    int rc = dqc__copy_profile(c, &r->profile, res->profile, &res->profile_len);
    if (!rc && r->means)
        rc = dqc__tensor_check(c, r->means, "means", rep.payload_len, DQC_RAW_DTYPE, 0, NULL, &mb);
    if (!rc)
        rc = dqc__tensor_check(c, r->records, "records", rep.payload_len, DQC_RAW_DTYPE, 0, NULL, &rb);
    if (!rc && r->tokens != a->tokens)
        rc = dqc__fail(c, DQ_PROTOCOL, "compress: sent %llu tokens, reply has %llu", (unsigned long long)a->tokens,
                       (unsigned long long)r->tokens);
    if (!rc && (rb == 0 || rb % a->tokens))
        rc = dqc__fail(c, DQ_PROTOCOL, "compress: %zu record bytes for %llu tokens", rb, (unsigned long long)a->tokens);
    if (!rc) {
        res->tokens = r->tokens;
        res->means = mb ? rep.payload + r->means->offset : NULL;
        res->means_bytes = mb;
        res->records = rep.payload + r->records->offset;
        res->records_bytes = rb;
        res->bits_per_value = r->bits_per_value;
        res->retries = r->retries;
    }
    dqc__reply_free(&rep);
    return rc;
}

void dqc_compress_result_free(dqc_compress_result *res)
{
    RESULT_FREE(res);
}

int dqc_decompress(dqc_client *c, const dqc_decompress_args *a, dqc_decompress_result *res)
{
    return dqc_decompress_layer(c, a, 0, res);
}

int dqc_decompress_layer(dqc_client *c, const dqc_decompress_args *a, uint32_t layer, dqc_decompress_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, a && res, "decompress: args and res are required");
    RESULT_RESET(res);
    DQC_CHECK_ARG(c, a->profile && a->profile_len, "decompress: a serialized profile is required");
    DQC_CHECK_ARG(c, a->kind == 0 || a->kind == 1, "decompress: kind must be 0 (keys) or 1 (values)");
    DQC_CHECK_ARG(c, a->tokens, "decompress: tokens must be positive");
    DQC_CHECK_ARG(c, a->records && a->records_bytes, "decompress: records are required");
    DQC_CHECK_ARG(c, a->means || !a->means_bytes, "decompress: means is NULL with %zu bytes", a->means_bytes);
    DQC_CHECK_ARG(c, dtype_ok(a->out_dtype), "decompress: unsupported dtype %d", (int)a->out_dtype);

    uint64_t mshape[1] = {a->kind == 0 ? a->means_bytes : 0};
    uint64_t rshape[1] = {a->records_bytes};
    Dquant__Tensor tm, tr;
    tensor_set(&tm, DQC_RAW_DTYPE, mshape, 1, 0, a->kind == 0 ? a->means_bytes : 0);
    tensor_set(&tr, DQC_RAW_DTYPE, rshape, 1, tm.length, a->records_bytes);
    Dquant__Decompress d = DQUANT__DECOMPRESS__INIT;
    d.profile.data = (uint8_t *)a->profile;
    d.profile.len = a->profile_len;
    d.kind = (uint32_t)a->kind;
    d.tokens = a->tokens;
    d.means = a->kind == 0 ? &tm : NULL;
    d.records = &tr;
    d.out_dtype = (Dquant__DType)a->out_dtype;
    d.layer = layer;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_DECOMPRESS;
    req.decompress = &d;
    struct iovec iov[2] = {{(void *)a->means, (size_t)tm.length}, {(void *)a->records, a->records_bytes}};

    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, iov, 2, 1, DQUANT__RESPONSE__BODY_DECOMPRESS, &res->mem_, &res->mem_cap_, &rep));
    const Dquant__DecompressReply *r = rep.resp->decompress;
    uint64_t want[3] = {a->tokens, UINT64_MAX, UINT64_MAX};
    size_t xb = 0;
    int rc = dqc__tensor_check(c, r->x, "x", rep.payload_len, (int)a->out_dtype, 3, want, &xb);
    if (!rc) {
        res->dtype = a->out_dtype;
        res->ndim = 3;
        for (int i = 0; i < 3; i++)
            res->shape[i] = r->x->shape[i];
        res->x = xb ? rep.payload + r->x->offset : NULL;
        res->bytes = xb;
    }
    dqc__reply_free(&rep);
    return rc;
}

void dqc_decompress_result_free(dqc_decompress_result *res)
{
    RESULT_FREE(res);
}

/* ---- DELETE / PIN / UNPIN ---- */

static int seq_op(dqc_client *c, const char *op, Dquant__Request__BodyCase which, const dqc_seq *s, int kind)
{
    DQC_CHECK_HANDLE(c);
    Dquant__SeqRef seq;
    DQC_FORWARD(seq_fill(c, op, s, &seq));
    seq.kind = (Dquant__SeqKind)kind;
    Dquant__Delete del = DQUANT__DELETE__INIT;
    Dquant__Pin pin = DQUANT__PIN__INIT;
    Dquant__Unpin unpin = DQUANT__UNPIN__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = which;
    switch (which) {
    case DQUANT__REQUEST__BODY_DELETE:
        del.seq = &seq;
        req.delete_ = &del;
        break;
    case DQUANT__REQUEST__BODY_PIN:
        pin.seq = &seq;
        req.pin = &pin;
        break;
    default:
        unpin.seq = &seq;
        req.unpin = &unpin;
        break;
    }
    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, NULL, 0, 1, DQUANT__RESPONSE__BODY_OK, NULL, NULL, &rep));
    dqc__reply_free(&rep);
    return 0;
}

int dqc_delete(dqc_client *client, const dqc_seq *seq)
{
    return seq_op(client, "delete", DQUANT__REQUEST__BODY_DELETE, seq, DQUANT__SEQ_KIND__SEQUENCE);
}

int dqc_pin(dqc_client *client, const dqc_seq *seq)
{
    return seq_op(client, "pin", DQUANT__REQUEST__BODY_PIN, seq, DQUANT__SEQ_KIND__SEQUENCE);
}

int dqc_unpin(dqc_client *client, const dqc_seq *seq)
{
    return seq_op(client, "unpin", DQUANT__REQUEST__BODY_UNPIN, seq, DQUANT__SEQ_KIND__SEQUENCE);
}

/* DELETE, PIN, UNPIN of a chunk. */
static int chunk_op(dqc_client *c, const char *op, Dquant__Request__BodyCase which, const char *ns, const uint8_t *key)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, key, "%s: key is NULL", op);
    const dqc_seq s = {ns, key, DQC_CHUNK_KEY_BYTES};
    return seq_op(c, op, which, &s, DQUANT__SEQ_KIND__CHUNK);
}

int dqc_delete_chunk(dqc_client *client, const char *ns, const uint8_t *key)
{
    return chunk_op(client, "delete_chunk", DQUANT__REQUEST__BODY_DELETE, ns, key);
}

int dqc_pin_chunk(dqc_client *client, const char *ns, const uint8_t *key)
{
    return chunk_op(client, "pin_chunk", DQUANT__REQUEST__BODY_PIN, ns, key);
}

int dqc_unpin_chunk(dqc_client *client, const char *ns, const uint8_t *key)
{
    return chunk_op(client, "unpin_chunk", DQUANT__REQUEST__BODY_UNPIN, ns, key);
}

/* ---- STATS ---- */

static int cmp_counter(const void *a, const void *b)
{
    return strcmp(((const dqc_counter *)a)->name, ((const dqc_counter *)b)->name);
}

static int cmp_gauge(const void *a, const void *b)
{
    return strcmp(((const dqc_gauge *)a)->name, ((const dqc_gauge *)b)->name);
}

int dqc_stats(dqc_client *c, dqc_stats_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, res, "stats: res is required");
    free(res->mem_);
    memset(res, 0, sizeof *res);

    Dquant__Stats st = DQUANT__STATS__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_STATS;
    req.stats = &st;
    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, NULL, 0, 1, DQUANT__RESPONSE__BODY_STATS, NULL, NULL, &rep));
    const Dquant__StatsReply *r = rep.resp->stats;

    /* One block: the two arrays, then the names. */
    size_t need = r->n_counters * sizeof(dqc_counter) + r->n_gauges * sizeof(dqc_gauge);
    for (size_t i = 0; i < r->n_counters; i++)
        need += strlen(r->counters[i]->key) + 1;
    for (size_t i = 0; i < r->n_gauges; i++)
        need += strlen(r->gauges[i]->key) + 1;
    uint8_t *blk = malloc(need ? need : 1);
    if (!blk) {
        dqc__reply_free(&rep);
        return dqc__fail(c, DQ_NOMEM, "stats: no memory");
    }
    dqc_counter *cs = (dqc_counter *)blk;
    dqc_gauge *gs = (dqc_gauge *)(cs + r->n_counters);
    char *names = (char *)(gs + r->n_gauges);
    for (size_t i = 0; i < r->n_counters; i++) {
        size_t l = strlen(r->counters[i]->key) + 1;
        memcpy(names, r->counters[i]->key, l);
        cs[i] = (dqc_counter){names, r->counters[i]->value};
        names += l;
    }
    for (size_t i = 0; i < r->n_gauges; i++) {
        size_t l = strlen(r->gauges[i]->key) + 1;
        memcpy(names, r->gauges[i]->key, l);
        gs[i] = (dqc_gauge){names, r->gauges[i]->value};
        names += l;
    }
    qsort(cs, r->n_counters, sizeof *cs, cmp_counter);
    qsort(gs, r->n_gauges, sizeof *gs, cmp_gauge);
    res->mem_ = blk;
    res->ncounters = r->n_counters;
    res->counters = r->n_counters ? cs : NULL;
    res->ngauges = r->n_gauges;
    res->gauges = r->n_gauges ? gs : NULL;
    dqc__reply_free(&rep);
    return 0;
}

void dqc_stats_result_free(dqc_stats_result *res)
{
    RESULT_FREE(res);
}

int dqc_stats_counter(const dqc_stats_result *res, const char *name, uint64_t *value)
{
    if (!res || !name || !value)
        return DQ_INVALID_ARGUMENT;
    dqc_counter key = {name, 0};
    const dqc_counter *f = res->ncounters ? bsearch(&key, res->counters, res->ncounters, sizeof key, cmp_counter)
                                          : NULL;
    if (!f)
        return DQ_NOT_FOUND;
    *value = f->value;
    return 0;
}

int dqc_stats_gauge(const dqc_stats_result *res, const char *name, double *value)
{
    if (!res || !name || !value)
        return DQ_INVALID_ARGUMENT;
    dqc_gauge key = {name, 0};
    const dqc_gauge *f = res->ngauges ? bsearch(&key, res->gauges, res->ngauges, sizeof key, cmp_gauge) : NULL;
    if (!f)
        return DQ_NOT_FOUND;
    *value = f->value;
    return 0;
}

/* ---- NCCL_SETUP (for libdquant-client-nccl) ---- */

int dqc__nccl_setup_call(dqc_client *c, int cuda_device, dqc__reply *rep)
{
    Dquant__NcclSetup ns = DQUANT__NCCL_SETUP__INIT;
    ns.client_device = cuda_device;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_NCCL_SETUP;
    req.nccl_setup = &ns;
    return dqc__call(c, &req, NULL, 0, 1, DQUANT__RESPONSE__BODY_NCCL_SETUP, NULL, NULL, rep);
}

/* ---- shared KV tier ---- */

size_t dqc_chunk_keys(const char *ns, const uint32_t *tokens, size_t ntokens, uint32_t chunk_tokens,
                      const uint8_t *parent, uint8_t *out, size_t max_keys)
{
    if (!out || (!tokens && ntokens))
        return 0;
    if (!ns)
        ns = "";
    return dq_chunk_keys(ns, strlen(ns), parent, tokens, ntokens, chunk_tokens, out, max_keys);
}

int dqc_put_chunks(dqc_client *c, const dqc_put_chunks_args *a, dqc_put_chunks_result *res)
{
    DQC_CHECK_HANDLE(c);
    if (res)
        memset(res, 0, sizeof *res);
    DQC_CHECK_ARG(c, a, "put_chunks: args is NULL");
    DQC_CHECK_ARG(c, a->model && a->model[0], "put_chunks: model name required");
    DQC_CHECK_ARG(c, a->nkeys && a->layers && a->chunk_tokens && a->kv_heads && a->head_dim,
                  "put_chunks: nkeys, layers, chunk_tokens, kv_heads and head_dim must be positive");
    DQC_CHECK_ARG(c, dtype_ok(a->dtype), "put_chunks: unsupported dtype %d", (int)a->dtype);
    DQC_CHECK_ARG(c, a->k && a->v, "put_chunks: k and v are required");
    uint64_t shape[4] = {a->layers, (uint64_t)a->nkeys * a->chunk_tokens, a->kv_heads, a->head_dim};
    size_t bytes;
    if (a->nkeys > UINT32_MAX || !mul_size(&bytes, dtype_size(a->dtype), shape, 4) || bytes > SIZE_MAX / 2)
        return dqc__fail(c, DQ_TOO_LARGE, "put_chunks: tensor size overflows");
    Dquant__Tensor k, v;
    tensor_set(&k, (int)a->dtype, shape, 4, 0, bytes);
    tensor_set(&v, (int)a->dtype, shape, 4, bytes, bytes);
    Dquant__PutChunks pc = DQUANT__PUT_CHUNKS__INIT;
    pc.ns = (char *)(a->ns ? a->ns : "");
    pc.model = (char *)a->model;
    DQC_FORWARD(keys_fill(c, "put_chunks", a->keys, a->nkeys, &pc.keys));
    pc.n_keys = a->nkeys;
    pc.parent.data = (uint8_t *)a->parent;
    pc.parent.len = a->parent ? DQC_CHUNK_KEY_BYTES : 0;
    pc.k = &k;
    pc.v = &v;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS;
    req.put_chunks = &pc;
    struct iovec iov[2] = {{(void *)a->k, bytes}, {(void *)a->v, bytes}};
    dqc__reply rep;
    int rc = dqc__call(c, &req, iov, 2, 1, DQUANT__RESPONSE__BODY_PUT_CHUNKS, NULL, NULL, &rep);
    free(pc.keys);
    DQC_FORWARD(rc);
    if (res) {
        const Dquant__PutChunksReply *r = rep.resp->put_chunks;
        res->stored = r->stored;
        res->deduped = r->deduped;
        res->streams_encoded = r->streams_encoded;
    }
    dqc__reply_free(&rep);
    return 0;
}

int dqc_get_chunks(dqc_client *c, const char *ns, const uint8_t *keys, size_t nkeys, dq_dtype dtype,
                   dqc_get_result *res)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, res && nkeys, "get_chunks: res and at least one key are required");
    DQC_CHECK_ARG(c, dtype_ok(dtype), "get_chunks: unsupported dtype %d", (int)dtype);
    RESULT_RESET(res);
    Dquant__Get g = DQUANT__GET__INIT;
    g.chunk_ns = (char *)(ns ? ns : "");
    g.format = get_format(dtype);
    DQC_FORWARD(keys_fill(c, "get_chunks", keys, nkeys, &g.chunk_keys));
    g.n_chunk_keys = nkeys;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &g;
    dqc__reply rep;
    int rc = dqc__call(c, &req, NULL, 0, 1, DQUANT__RESPONSE__BODY_GET, &res->mem_, &res->mem_cap_, &rep);
    free(g.chunk_keys);
    DQC_FORWARD(rc);
    const dqc_get_args a = {.dtype = dtype};
    const Dquant__GetReply *r = rep.resp->get;
    size_t kb = 0;
    rc = dqc__get_check(c, "get_chunks", &a, r, rep.payload_len, &kb);
    if (!rc) {
        dqc__get_meta(r, dtype, kb, res);
        res->k = kb ? rep.payload + r->k->offset : NULL;
        res->v = kb ? rep.payload + r->v->offset : NULL;
    }
    dqc__reply_free(&rep);
    return rc;
}

int dqc_lookup(dqc_client *c, const char *ns, const char *model, const uint8_t *keys, size_t nkeys, uint32_t lease_ms,
               dqc_lookup_result *res)
{
    DQC_CHECK_HANDLE(c);
    if (res)
        memset(res, 0, sizeof *res);
    DQC_CHECK_ARG(c, model && model[0], "lookup: model name required");
    Dquant__Lookup l = DQUANT__LOOKUP__INIT;
    l.ns = (char *)(ns ? ns : "");
    l.model = (char *)model;
    l.lease_ms = lease_ms;
    DQC_FORWARD(keys_fill(c, "lookup", keys, nkeys, &l.keys));
    l.n_keys = nkeys;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_LOOKUP;
    req.lookup = &l;
    dqc__reply rep;
    int rc = dqc__call(c, &req, NULL, 0, !lease_ms, DQUANT__RESPONSE__BODY_LOOKUP, NULL, NULL, &rep);
    free(l.keys);
    DQC_FORWARD(rc);
    if (res) {
        const Dquant__LookupReply *r = rep.resp->lookup;
        res->hits = r->hits;
        res->hit_tokens = r->hit_tokens;
        res->chunk_tokens = r->chunk_tokens;
        res->lease_id = r->lease_id;
        res->lease_ms = r->lease_ms;
    }
    dqc__reply_free(&rep);
    return 0;
}

int dqc_release_lease(dqc_client *c, uint64_t lease_id)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, lease_id, "release_lease: lease_id 0 is no lease");
    Dquant__Lookup l = DQUANT__LOOKUP__INIT;
    l.release_lease = lease_id;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_LOOKUP;
    req.lookup = &l;
    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, NULL, 0, 0, DQUANT__RESPONSE__BODY_LOOKUP, NULL, NULL, &rep));
    dqc__reply_free(&rep);
    return 0;
}

/* ---- PING ---- */

int dqc_ping(dqc_client *c, const void *data, size_t len)
{
    DQC_CHECK_HANDLE(c);
    DQC_CHECK_ARG(c, data || !len, "ping: data is NULL with len %zu", len);
    Dquant__Ping p = DQUANT__PING__INIT;
    p.data.data = (uint8_t *)data;
    p.data.len = len;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    dqc__reply rep;
    DQC_FORWARD(dqc__call(c, &req, NULL, 0, 1, DQUANT__RESPONSE__BODY_PONG, NULL, NULL, &rep));
    const Dquant__Pong *r = rep.resp->pong;
    int rc = 0;
    if (r->data.len != len || (len && memcmp(r->data.data, data, len) != 0))
        rc = dqc__fail(c, DQ_PROTOCOL, "ping: the server echoed %zu bytes that differ from the %zu sent", r->data.len,
                       len);
    dqc__reply_free(&rep);
    return rc;
}

/* ---- PUT_RAW, PUT_CHUNKS_RAW: records the client encoded itself ---- */

/* The RawLayer messages and payload pieces of n layers (first_layer + i each): records, tail K,
 * tail V back to back per layer. *msgs, *ptrs, *shapes and *iov are malloc'd (free with raw_free). */
typedef struct raw_wire {
    Dquant__RawLayer *msgs;
    Dquant__RawLayer **ptrs;
    Dquant__Tensor *tensors; /* 3 per layer */
    uint64_t *shapes;        /* 1 (records) + 2 + 2 per layer */
    struct iovec *iov;       /* 3 per layer */
} raw_wire;

static void raw_free(raw_wire *w)
{
    free(w->msgs);
    free(w->ptrs);
    free(w->tensors);
    free(w->shapes);
    free(w->iov);
}

static int raw_build(dqc_client *c, const char *op, const dqc_raw_layer *layers, size_t n, uint32_t first_layer,
                     raw_wire *w)
{
    memset(w, 0, sizeof *w);
    DQC_CHECK_ARG(c, layers && n, "%s: at least one layer is required", op);
    DQC_CHECK_ARG(c, n <= UINT32_MAX && (uint64_t)first_layer + n <= UINT32_MAX, "%s: %zu layers", op, n);
    w->msgs = calloc(n, sizeof *w->msgs);
    w->ptrs = calloc(n, sizeof *w->ptrs);
    w->tensors = calloc(3 * n, sizeof *w->tensors);
    w->shapes = calloc(5 * n, sizeof *w->shapes);
    w->iov = calloc(3 * n, sizeof *w->iov);
    if (!w->msgs || !w->ptrs || !w->tensors || !w->shapes || !w->iov) {
        raw_free(w);
        return dqc__fail(c, DQ_NOMEM, "%s: out of memory for %zu layers", op, n);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const dqc_raw_layer *l = &layers[i];
        if ((l->records_bytes && !l->records) || (l->tail_tokens && (!l->tail_k || !l->tail_v)) ||
            (l->tail_tokens && (l->tail_bytes % (2 * l->tail_tokens) || !l->tail_bytes)) ||
            (!l->tail_tokens && l->tail_bytes)) {
            raw_free(w);
            return dqc__fail(c, DQ_INVALID_ARGUMENT,
                             "%s: layer %zu: records or tail missing, or tail_bytes %zu not tail_tokens %llu whole "
                             "BF16 tokens",
                             op, i, l->tail_bytes, (unsigned long long)l->tail_tokens);
        }
        Dquant__RawLayer *m = &w->msgs[i];
        dquant__raw_layer__init(m);
        m->layer = first_layer + (uint32_t)i;
        m->windows = l->windows; /* tokens stays 0: the daemon counts windows and tail */
        uint64_t *sh = &w->shapes[5 * i];
        Dquant__Tensor *t = &w->tensors[3 * i];
        sh[0] = l->records_bytes;
        tensor_set(&t[0], DQUANT__DTYPE__RAW, sh, 1, off, l->records_bytes);
        off += l->records_bytes;
        m->records = &t[0];
        w->iov[3 * i] = (struct iovec){(void *)l->records, l->records_bytes};
        if (l->tail_tokens) {
            sh[1] = sh[3] = l->tail_tokens;
            sh[2] = sh[4] = l->tail_bytes / 2 / l->tail_tokens;
            tensor_set(&t[1], DQUANT__DTYPE__BF16, &sh[1], 2, off, l->tail_bytes);
            off += l->tail_bytes;
            tensor_set(&t[2], DQUANT__DTYPE__BF16, &sh[3], 2, off, l->tail_bytes);
            off += l->tail_bytes;
            m->tail_k = &t[1];
            m->tail_v = &t[2];
            w->iov[3 * i + 1] = (struct iovec){(void *)l->tail_k, l->tail_bytes};
            w->iov[3 * i + 2] = (struct iovec){(void *)l->tail_v, l->tail_bytes};
        }
        w->ptrs[i] = m;
    }
    return 0;
}

int dqc_put_raw(dqc_client *c, const dqc_put_raw_args *a, dqc_put_result *res)
{
    DQC_CHECK_HANDLE(c);
    if (res)
        memset(res, 0, sizeof *res);
    DQC_CHECK_ARG(c, a, "put_raw: args is NULL");
    DQC_CHECK_ARG(c, a->model && a->model[0], "put_raw: model name required");
    DQC_CHECK_ARG(c, a->profile && a->profile_len, "put_raw: the records' profile is required");
    Dquant__SeqRef seq;
    DQC_FORWARD(seq_fill(c, "put_raw", &a->seq, &seq));
    raw_wire w;
    DQC_FORWARD(raw_build(c, "put_raw", a->layers, a->nlayers, a->first_layer, &w));
    Dquant__PutRaw p = DQUANT__PUT_RAW__INIT;
    p.seq = &seq;
    p.model = (char *)a->model;
    p.start_token = a->start_token;
    p.first_layer = a->first_layer;
    p.num_layers = (uint32_t)a->nlayers;
    p.layers = w.ptrs;
    p.n_layers = a->nlayers;
    p.profile.data = (uint8_t *)a->profile;
    p.profile.len = a->profile_len;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT_RAW;
    req.put_raw = &p;
    dqc__reply rep;
    int rc = dqc__call(c, &req, w.iov, 3 * a->nlayers, 0, DQUANT__RESPONSE__BODY_PUT, NULL, NULL, &rep);
    raw_free(&w);
    DQC_FORWARD(rc);
    if (res) {
        const Dquant__PutReply *r = rep.resp->put;
        res->tokens = r->tokens;
        res->stored_bytes = r->stored_bytes;
        res->streams_encoded = r->streams_encoded;
        res->retries = r->retries;
    }
    dqc__reply_free(&rep);
    return 0;
}

int dqc_put_chunks_raw(dqc_client *c, const char *ns, const char *model, const uint8_t *keys, size_t nkeys,
                       const uint8_t *parent, const dqc_raw_layer *layers, size_t nlayers, const uint8_t *profile,
                       size_t profile_len, dqc_put_chunks_result *res)
{
    DQC_CHECK_HANDLE(c);
    if (res)
        memset(res, 0, sizeof *res);
    DQC_CHECK_ARG(c, model && model[0], "put_chunks_raw: model name required");
    DQC_CHECK_ARG(c, nkeys, "put_chunks_raw: at least one key is required");
    DQC_CHECK_ARG(c, profile && profile_len, "put_chunks_raw: the records' profile is required");
    raw_wire w;
    DQC_FORWARD(raw_build(c, "put_chunks_raw", layers, nlayers, 0, &w));
    Dquant__PutChunksRaw p = DQUANT__PUT_CHUNKS_RAW__INIT;
    p.ns = (char *)(ns ? ns : "");
    p.model = (char *)model;
    int rc = keys_fill(c, "put_chunks_raw", keys, nkeys, &p.keys);
    if (rc < 0) {
        raw_free(&w);
        return rc;
    }
    p.n_keys = nkeys;
    p.parent.data = (uint8_t *)parent;
    p.parent.len = parent ? DQC_CHUNK_KEY_BYTES : 0;
    p.layers = w.ptrs;
    p.n_layers = nlayers;
    p.profile.data = (uint8_t *)profile;
    p.profile.len = profile_len;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS_RAW;
    req.put_chunks_raw = &p;
    dqc__reply rep;
    rc = dqc__call(c, &req, w.iov, 3 * nlayers, 1, DQUANT__RESPONSE__BODY_PUT_CHUNKS, NULL, NULL, &rep);
    free(p.keys);
    raw_free(&w);
    DQC_FORWARD(rc);
    if (res) {
        const Dquant__PutChunksReply *r = rep.resp->put_chunks;
        res->stored = r->stored;
        res->deduped = r->deduped;
        res->streams_encoded = r->streams_encoded;
    }
    dqc__reply_free(&rep);
    return 0;
}

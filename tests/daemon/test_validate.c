/* Request validation: tensors that lie about where they are or how big they are, shapes that do
 * not match the model, products that overflow, limits. Pure functions: no daemon needed. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "validate.h"

/* A request payload of n bytes at p, no NCCL payload. */
#define PL(p, n) (&(dqd_payload){(p), (n), NULL, 0, false})

static dqd_limits lim;
static uint8_t payload[65536] __attribute__((aligned(64)));
static char msg[256];

static const dqd_model_info model = {.layers = 4, .q_heads = 8, .kv_heads = 2, .head_dim = 64};

static void setup(void)
{
    dqd_limits_default(&lim);
    lim.max_batch_items = 8;
    memset(payload, 0, sizeof payload);
    msg[0] = 0;
}

TestSuite(validate, .init = setup);

static Dquant__Tensor tensor(Dquant__DType dt, uint64_t *shape, size_t ndim, uint64_t offset, uint64_t length)
{
    Dquant__Tensor t = DQUANT__TENSOR__INIT;
    t.dtype = dt;
    t.shape = shape;
    t.n_shape = ndim;
    t.offset = offset;
    t.length = length;
    return t;
}

static uint8_t key[] = {1, 2, 3};

static Dquant__SeqRef seqref(void)
{
    Dquant__SeqRef s = DQUANT__SEQ_REF__INIT;
    s.ns = "ns";
    s.key.data = key;
    s.key.len = sizeof key;
    return s;
}

/* A valid 1-layer, 2-token f16 PUT of kv 2 x hd 64: k at 0, v at 512. */
typedef struct put_fixture {
    Dquant__SeqRef seq;
    uint64_t shape[4];
    Dquant__Tensor k, v;
    Dquant__Put put;
    Dquant__Request req;
} put_fixture;

static void make_put(put_fixture *f)
{
    f->seq = seqref();
    f->shape[0] = 1;
    f->shape[1] = 2;
    f->shape[2] = 2;
    f->shape[3] = 64;
    f->k = tensor(DQUANT__DTYPE__F16, f->shape, 4, 0, 512);
    f->v = tensor(DQUANT__DTYPE__F16, f->shape, 4, 512, 512);
    dquant__put__init(&f->put);
    f->put.seq = &f->seq;
    f->put.model = "m";
    f->put.first_layer = 3;
    f->put.num_layers = 1;
    f->put.tokens = 2;
    f->put.k = &f->k;
    f->put.v = &f->v;
    dquant__request__init(&f->req);
    f->req.body_case = DQUANT__REQUEST__BODY_PUT;
    f->req.put = &f->put;
}

static int validate_put(put_fixture *f, uint64_t plen)
{
    dqd_op op;
    int rc = dqd_request_validate(&f->req, PL(payload, plen), &lim, &op, msg, sizeof msg);
    if (rc < 0)
        return rc;
    cr_assert_eq(op, DQD_OP_PUT);
    dqd_tensor k, v;
    return dqd_validate_put(&f->put, PL(payload, plen), &model, &k, &v, msg, sizeof msg);
}

Test(validate, good_put)
{
    put_fixture f;
    make_put(&f);
    cr_assert_eq(validate_put(&f, 1024), 0, "%s", msg);
    dqd_tensor k, v;
    cr_assert_eq(dqd_validate_put(&f.put, PL(payload, 1024), &model, &k, &v, msg, sizeof msg), 0);
    cr_assert_eq(k.data, payload);
    cr_assert_eq(v.data, payload + 512);
    cr_assert_eq(k.count, 256);
}

Test(validate, tensor_outside_payload)
{
    put_fixture f;
    make_put(&f);
    cr_assert_eq(validate_put(&f, 1023), DQ_OUT_OF_BOUNDS, "v ends one byte past the payload");
    make_put(&f);
    f.v.offset = 4096;
    cr_assert_eq(validate_put(&f, 1024), DQ_OUT_OF_BOUNDS);
    cr_assert(strstr(msg, "outside"), "%s", msg);
    make_put(&f);
    f.v.offset = UINT64_MAX - 100; /* offset + length wraps around */
    cr_assert_eq(validate_put(&f, 1024), DQ_OUT_OF_BOUNDS);
}

Test(validate, length_disagrees_with_shape)
{
    put_fixture f;
    make_put(&f);
    f.k.length = 511;
    cr_assert_eq(validate_put(&f, 1024), DQ_SHAPE);
    cr_assert(strstr(msg, "length 511 != 512"), "%s", msg);
    make_put(&f);
    f.k.dtype = DQUANT__DTYPE__F32; /* the same bytes read as f32 would be 1024 */
    f.v.dtype = DQUANT__DTYPE__F32;
    cr_assert_eq(validate_put(&f, 1024), DQ_SHAPE);
}

Test(validate, shape_product_overflow)
{
    put_fixture f;
    make_put(&f);
    uint64_t huge[4] = {1, 2, 1ull << 40, 1ull << 40};
    f.k.shape = huge;
    cr_assert_eq(validate_put(&f, 1024), DQ_SHAPE);
    cr_assert(strstr(msg, "overflows"), "%s", msg);
    /* product fits in 64 bits, times the element size does not */
    uint64_t big[4] = {1, 2, 1ull << 31, 1ull << 31};
    f.k.shape = big;
    cr_assert_eq(validate_put(&f, 1024), DQ_SHAPE);
    cr_assert(strstr(msg, "overflows"), "%s", msg);
}

Test(validate, shape_must_match_model)
{
    put_fixture f;
    make_put(&f);
    uint64_t wrong[4] = {1, 2, 4, 32}; /* same element count, wrong heads */
    f.k.shape = wrong;
    f.v.shape = wrong;
    cr_assert_eq(validate_put(&f, 1024), DQ_SHAPE);
    cr_assert(strstr(msg, "expected [1, 2, 2, 64]"), "%s", msg);
    make_put(&f);
    f.put.first_layer = 4;
    cr_assert_eq(validate_put(&f, 1024), DQ_OUT_OF_BOUNDS, "layer 4 of a 4-layer model");
    make_put(&f);
    f.put.tokens = 3;
    cr_assert_eq(validate_put(&f, 1024), DQ_SHAPE, "tokens disagrees with the tensors");
}

Test(validate, dtypes)
{
    put_fixture f;
    make_put(&f);
    f.k.dtype = (Dquant__DType)9;
    cr_assert_eq(validate_put(&f, 1024), DQ_DTYPE);
    make_put(&f);
    f.k.dtype = DQUANT__DTYPE__RAW;
    cr_assert_eq(validate_put(&f, 1024), DQ_DTYPE, "raw bytes are no K");
    make_put(&f);
    uint64_t s2[4] = {1, 2, 2, 32};
    f.v.dtype = DQUANT__DTYPE__F32;
    f.v.shape = s2;
    cr_assert_eq(validate_put(&f, 1024), DQ_DTYPE, "k and v of different dtypes");
}

Test(validate, missing_fields)
{
    put_fixture f;
    make_put(&f);
    f.put.seq = NULL;
    cr_assert_eq(validate_put(&f, 1024), DQ_INVALID_ARGUMENT);
    make_put(&f);
    f.put.k = NULL;
    cr_assert_eq(validate_put(&f, 1024), DQ_INVALID_ARGUMENT);
    make_put(&f);
    f.put.model = "";
    cr_assert_eq(validate_put(&f, 1024), DQ_INVALID_ARGUMENT);
    make_put(&f);
    f.seq.key.len = 0;
    cr_assert_eq(validate_put(&f, 1024), DQ_INVALID_ARGUMENT);
    make_put(&f);
    f.put.start_token = UINT64_MAX;
    cr_assert_eq(validate_put(&f, 1024), DQ_OUT_OF_BOUNDS);
}

Test(validate, limits)
{
    put_fixture f;
    make_put(&f);
    lim.max_payload = 512;
    cr_assert_eq(validate_put(&f, 1024), DQ_TOO_LARGE);
    setup();
    make_put(&f);
    static uint8_t longkey[5000];
    f.seq.key.data = longkey;
    f.seq.key.len = sizeof longkey;
    cr_assert_eq(validate_put(&f, 1024), DQ_TOO_LARGE);
}

Test(validate, unknown_body)
{
    Dquant__Request req = DQUANT__REQUEST__INIT;
    dqd_op op;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_UNSUPPORTED);
    cr_assert_eq(op, DQD_OP_UNKNOWN);
}

Test(validate, attend_items)
{
    Dquant__SeqRef seq = seqref();
    uint64_t qs[2] = {8, 64}, kvs[3] = {1, 2, 64};
    Dquant__Tensor q = tensor(DQUANT__DTYPE__F32, qs, 2, 0, 8 * 64 * 4);
    Dquant__Tensor ak = tensor(DQUANT__DTYPE__BF16, kvs, 3, 2048, 256);
    Dquant__Tensor av = tensor(DQUANT__DTYPE__BF16, kvs, 3, 2304, 256);
    Dquant__AttendItem it = DQUANT__ATTEND_ITEM__INIT;
    it.seq = &seq;
    it.layer = 1;
    it.q = &q;
    it.append_k = &ak;
    it.append_v = &av;
    Dquant__AttendItem *items[9] = {&it, &it, &it, &it, &it, &it, &it, &it, &it};
    Dquant__Attend a = DQUANT__ATTEND__INIT;
    a.items = items;
    a.n_items = 2;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_ATTEND;
    req.attend = &a;
    dqd_op op;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), 0, "%s", msg);
    dqd_tensor tq, tk, tv;
    cr_assert_eq(dqd_validate_attend_item(&it, PL(payload, 4096), &model, &tq, &tk, &tv, msg, sizeof msg), 0, "%s",
                 msg);

    a.n_items = 9;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_TOO_LARGE);
    a.n_items = 0;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    a.n_items = 1;
    a.scale = -1;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    a.scale = 0;

    it.append_v = NULL;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    it.append_v = &av;

    uint64_t qbad[2] = {4, 128}; /* 512 elements, wrong split */
    q.shape = qbad;
    cr_assert_eq(dqd_validate_attend_item(&it, PL(payload, 4096), &model, &tq, &tk, &tv, msg, sizeof msg), DQ_SHAPE);
    q.shape = qs;
    it.layer = 4;
    cr_assert_eq(dqd_validate_attend_item(&it, PL(payload, 4096), &model, &tq, &tk, &tv, msg, sizeof msg),
                 DQ_OUT_OF_BOUNDS);
    it.layer = 0;
    uint64_t two[3] = {2, 2, 32};
    ak.shape = two;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_SHAPE,
                 "append_k must hold exactly one token");
}

Test(validate, decompress_sizes)
{
    const dqd_profile_info p = {
        .kv_heads = 2, .head_dim = 64, .window = 128, .mean_bytes = 130, .record_bytes = {49, 36}};
    uint8_t prof[8] = {1};
    uint64_t ms[1] = {260}, rs[1] = {129 * 49};
    Dquant__Tensor means = tensor(DQUANT__DTYPE__RAW, ms, 1, 0, 260);
    Dquant__Tensor recs = tensor(DQUANT__DTYPE__RAW, rs, 1, 320, 129 * 49);
    Dquant__Decompress d = DQUANT__DECOMPRESS__INIT;
    d.profile.data = prof;
    d.profile.len = sizeof prof;
    d.kind = 0;
    d.tokens = 129; /* two mean blocks */
    d.means = &means;
    d.records = &recs;
    d.out_dtype = DQUANT__DTYPE__F32;
    dqd_tensor tm, tr;
    cr_assert_eq(dqd_validate_decompress(&d, PL(payload, 65536), &p, &tm, &tr, msg, sizeof msg), 0, "%s", msg);
    d.tokens = 128;
    cr_assert_eq(dqd_validate_decompress(&d, PL(payload, 65536), &p, &tm, &tr, msg, sizeof msg), DQ_SHAPE);
    d.tokens = 129;
    ms[0] = 130;
    means.length = 130;
    cr_assert_eq(dqd_validate_decompress(&d, PL(payload, 65536), &p, &tm, &tr, msg, sizeof msg), DQ_SHAPE,
                 "129 key tokens need two mean blocks");
    d.kind = 1;
    d.means = NULL;
    rs[0] = 129 * 36;
    recs.length = 129 * 36;
    cr_assert_eq(dqd_validate_decompress(&d, PL(payload, 65536), &p, &tm, &tr, msg, sizeof msg), 0, "%s", msg);
}

/* NCCL payloads: the flagged tensors index the NCCL payload, must tile it back to back (one ncclRecv
 * each, in offset order), be element-aligned, and only PUT and ATTEND carry them; only typed GET
 * and ATTEND replies travel on NCCL. */
Test(validate, nccl_payload)
{
    put_fixture f;
    make_put(&f);
    f.k.nccl = f.v.nccl = true;
    f.req.nccl_payload = 1024;
    dqd_op op;
    const dqd_payload nccl = {NULL, 0, NULL, 1024, false};
    cr_assert_eq(dqd_request_validate(&f.req, &nccl, &lim, &op, msg, sizeof msg), 0, "%s", msg);
    dqd_seg *segs;
    size_t nseg;
    cr_assert_eq(dqd_nccl_segments(&f.req, &segs, &nseg), 0);
    cr_assert_eq(nseg, 2);
    cr_assert(segs[0].offset == 0 && segs[0].length == 512 && segs[1].offset == 512 && segs[1].length == 512);
    free(segs);

    /* Once received, the tensors point into the device buffer and say so. */
    static uint8_t dev[1024];
    const dqd_payload got = {NULL, 0, dev, 1024, false};
    dqd_tensor k, v;
    cr_assert_eq(dqd_validate_put(&f.put, &got, &model, &k, &v, msg, sizeof msg), 0, "%s", msg);
    cr_assert(k.device && v.device);
    cr_assert_eq(k.data, dev);
    cr_assert_eq(v.data, dev + 512);

    /* A gap, an overlap, a short cover, a lying announced length. */
    f.v.offset = 520;
    const dqd_payload wide = {NULL, 0, NULL, 1032, false};
    f.req.nccl_payload = 1032;
    cr_assert_eq(dqd_request_validate(&f.req, &wide, &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "gap"), "%s", msg);
    f.v.offset = 256;
    f.req.nccl_payload = 1024;
    cr_assert_eq(dqd_request_validate(&f.req, &nccl, &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "overlap"), "%s", msg);
    f.v.offset = 512;
    f.v.nccl = false;
    cr_assert_eq(dqd_request_validate(&f.req, PL(payload, 1024), &lim, &op, msg, sizeof msg), DQ_PROTOCOL,
                 "announced NCCL bytes must match the payload description");
    const dqd_payload both = {payload, 1024, NULL, 1024, false};
    cr_assert_eq(dqd_request_validate(&f.req, &both, &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT,
                 "only k on NCCL leaves bytes [512, 1024) uncovered");
    f.v.nccl = true;
    f.v.offset = 513;
    f.k.length = 513; /* lies about its size too: shape says 512 */
    cr_assert_neq(dqd_request_validate(&f.req, &nccl, &lim, &op, msg, sizeof msg), 0);
    f.k.length = 512;
    f.v.offset = 512;

    /* Over the payload limit. */
    lim.max_payload = 1000;
    cr_assert_eq(dqd_request_validate(&f.req, &nccl, &lim, &op, msg, sizeof msg), DQ_TOO_LARGE);
    dqd_limits_default(&lim);

    /* Only PUT and ATTEND carry NCCL tensors; COMPRESS refuses them outright. */
    Dquant__Request ping = DQUANT__REQUEST__INIT;
    Dquant__Ping p = DQUANT__PING__INIT;
    ping.body_case = DQUANT__REQUEST__BODY_PING;
    ping.ping = &p;
    ping.nccl_payload = 1024;
    cr_assert_eq(dqd_request_validate(&ping, &nccl, &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    ping.nccl_payload = 0;
    ping.nccl_reply = true;
    cr_assert_eq(dqd_request_validate(&ping, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);

    uint64_t xs[3] = {2, 2, 64};
    Dquant__Tensor x = tensor(DQUANT__DTYPE__F16, xs, 3, 0, 512);
    x.nccl = true;
    Dquant__Compress c = DQUANT__COMPRESS__INIT;
    c.profile_name = "dq226";
    c.kv_heads = 2;
    c.head_dim = 64;
    c.x = &x;
    const dqd_profile_info prof = {
        .kv_heads = 2, .head_dim = 64, .window = 128, .mean_bytes = 130, .record_bytes = {49, 36}};
    dqd_tensor tx;
    cr_assert_eq(dqd_validate_compress(&c, &nccl, &prof, &tx, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "NCCL"), "%s", msg);

    /* GET_RAW replies never travel on NCCL; typed GETs may. */
    Dquant__SeqRef s = seqref();
    Dquant__Get g = DQUANT__GET__INIT;
    g.seq = &s;
    g.format = DQUANT__GET_FORMAT__GET_RAW;
    Dquant__Request get = DQUANT__REQUEST__INIT;
    get.body_case = DQUANT__REQUEST__BODY_GET;
    get.get = &g;
    get.nccl_reply = true;
    cr_assert_eq(dqd_request_validate(&get, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    g.format = DQUANT__GET_FORMAT__GET_BF16;
    cr_assert_eq(dqd_request_validate(&get, PL(payload, 0), &lim, &op, msg, sizeof msg), 0, "%s", msg);
}

/* The shared KV tier's messages: key sizes, the key and lease limits, chunk SeqRefs, what PUT and
 * GET refuse for chunks, and PUT_CHUNKS' token count against the model (chunk_tokens 2 here). */
Test(validate, chunk_messages)
{
    static uint8_t k16[2][16], k15[15];
    ProtobufCBinaryData keys[2] = {{16, k16[0]}, {16, k16[1]}};
    dqd_op op;
    lim.max_lookup_keys = 2;
    lim.max_lease_ms = 1000;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    Dquant__Lookup l = DQUANT__LOOKUP__INIT;
    l.model = "m";
    l.n_keys = 2;
    l.keys = keys;
    l.lease_ms = 1000;
    req.body_case = DQUANT__REQUEST__BODY_LOOKUP;
    req.lookup = &l;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_OK, "%s", msg);
    cr_assert_eq(op, DQD_OP_LOOKUP);
    l.lease_ms = 1001;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    l.lease_ms = 0;
    keys[1].len = 17;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    keys[1].len = 16;
    lim.max_lookup_keys = 1;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    lim.max_lookup_keys = 2;
    l.model = "";
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    l.n_keys = 0; /* a release needs no model */
    l.release_lease = 3;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_OK, "%s", msg);

    /* PUT_CHUNKS: [layers 4, 2 keys x 2 tokens, 2, 64] f16 */
    uint64_t shape[4] = {4, 4, 2, 64};
    const uint64_t len = 4 * 4 * 2 * 64 * 2;
    Dquant__Tensor tk = tensor(DQUANT__DTYPE__F16, shape, 4, 0, len),
                   tv = tensor(DQUANT__DTYPE__F16, shape, 4, len, len);
    Dquant__PutChunks pc = DQUANT__PUT_CHUNKS__INIT;
    pc.model = "m";
    pc.n_keys = 2;
    pc.keys = keys;
    pc.k = &tk;
    pc.v = &tv;
    req.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS;
    req.put_chunks = &pc;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 2 * len), &lim, &op, msg, sizeof msg), DQ_OK, "%s", msg);
    cr_assert_eq(op, DQD_OP_PUT_CHUNKS);
    dqd_tensor a, b;
    cr_assert_eq(dqd_validate_put_chunks(&pc, PL(payload, 2 * len), &model, 2, &a, &b, msg, sizeof msg), DQ_OK, "%s",
                 msg);
    cr_assert_eq(dqd_validate_put_chunks(&pc, PL(payload, 2 * len), &model, 4, &a, &b, msg, sizeof msg),
                 DQ_INVALID_ARGUMENT, "4 tokens are not 2 chunks of 4");
    pc.parent.data = k15;
    pc.parent.len = sizeof k15;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 2 * len), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    pc.parent.len = 0;
    pc.n_keys = 0;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 2 * len), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);

    /* a chunk SeqRef: 16 bytes; PUT refuses it; GET of chunks is typed and whole */
    Dquant__SeqRef ref = seqref();
    ref.kind = DQUANT__SEQ_KIND__CHUNK;
    Dquant__Delete del = DQUANT__DELETE__INIT;
    del.seq = &ref;
    req.body_case = DQUANT__REQUEST__BODY_DELETE;
    req.delete_ = &del;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    ref.key.data = k16[0];
    ref.key.len = 16;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_OK, "%s", msg);
    put_fixture f;
    make_put(&f);
    f.seq.kind = DQUANT__SEQ_KIND__CHUNK;
    f.seq.key.data = k16[0];
    f.seq.key.len = 16;
    cr_assert_eq(validate_put(&f, 1024), DQ_INVALID_ARGUMENT);
    Dquant__Get g = DQUANT__GET__INIT;
    g.n_chunk_keys = 2;
    g.chunk_keys = keys;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &g;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_OK, "%s", msg);
    g.tokens = 1;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    g.tokens = 0;
    g.format = DQUANT__GET_FORMAT__GET_RAW; /* a range of chunks as stored */
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_OK, "%s", msg);
    g.tokens = 1;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    g.tokens = 0;
    g.format = DQUANT__GET_FORMAT__GET_F16;
    g.seq = &ref;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
}

/* PUT_RAW layers against the model and a profile of W 16, mean block 130, records 49/36 bytes
 * (window 1490 bytes): whole records only, tails below W of the model's row, equal lengths. */
Test(validate, raw_layers)
{
    const dqd_profile_info prof = {
        .kv_heads = 2, .head_dim = 64, .window = 16, .mean_bytes = 130, .record_bytes = {49, 36}};
    const uint64_t wb = 130 + 16 * (49 + 36);
    uint64_t rs[2] = {2 * wb, 2 * wb}, ts[2][4] = {{3, 128, 3, 128}, {3, 128, 3, 128}};
    Dquant__Tensor rec[2], tk[2], tv[2];
    Dquant__RawLayer l[2], *lp[2] = {&l[0], &l[1]};
    uint64_t off = 0;
    for (int i = 0; i < 2; i++) {
        rec[i] = tensor(DQUANT__DTYPE__RAW, &rs[i], 1, off, rs[i]);
        off += rs[i];
        tk[i] = tensor(DQUANT__DTYPE__BF16, &ts[i][0], 2, off, 3 * 128 * 2);
        off += 3 * 128 * 2;
        tv[i] = tensor(DQUANT__DTYPE__BF16, &ts[i][2], 2, off, 3 * 128 * 2);
        off += 3 * 128 * 2;
        dquant__raw_layer__init(&l[i]);
        l[i].layer = 1 + (uint32_t)i;
        l[i].windows = 2;
        l[i].records = &rec[i];
        l[i].tail_k = &tk[i];
        l[i].tail_v = &tv[i];
    }
    cr_assert_leq(off, sizeof payload);
    dqd_raw_tensors out[2];
    uint64_t tokens = 0;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_OK, "%s", msg);
    cr_assert_eq(tokens, 2 * 16 + 3);
    cr_assert_eq(out[1].windows, 2);
    cr_assert_eq(out[1].tail_tokens, 3);
    /* layers beyond the model */
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 3, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_OUT_OF_BOUNDS);
    /* records not windows whole records: one byte short, one record too many */
    l[1].windows = 3;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_SHAPE);
    l[1].windows = 1;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_SHAPE);
    l[1].windows = 2;
    /* a tail of W tokens, and one of another row length */
    ts[0][0] = ts[0][2] = 16;
    tk[0].length = tv[0].length = 16 * 128 * 2;
    cr_assert_eq(
        dqd_validate_raw_layers(lp, 2, 1, PL(payload, sizeof payload), &model, &prof, out, &tokens, msg, sizeof msg),
        DQ_SHAPE);
    cr_assert(strstr(msg, "not below W"), "%s", msg);
    ts[0][0] = ts[0][2] = 3;
    tk[0].length = tv[0].length = 3 * 128 * 2;
    ts[0][1] = 64;
    ts[0][0] = 6;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_SHAPE);
    ts[0][1] = 128;
    ts[0][0] = 3;
    /* K and V tails of different lengths; layers of different lengths */
    l[1].tail_v = NULL;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_SHAPE);
    l[1].tail_k = NULL;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_SHAPE);
    cr_assert(strstr(msg, "same"), "%s", msg);
    /* a layer that names another index */
    l[1].tail_k = &tk[1];
    l[1].tail_v = &tv[1];
    l[1].layer = 7;
    cr_assert_eq(dqd_validate_raw_layers(lp, 2, 1, PL(payload, off), &model, &prof, out, &tokens, msg, sizeof msg),
                 DQ_INVALID_ARGUMENT);
}

/* A PUT whose namespace holds the bytes ns[0..n) on the wire (packed with a placeholder of the
 * same length, then overwritten), checked by dqd_validate_strings. */
static int ns_on_wire(const char *ns, size_t n)
{
    char placeholder[64];
    cr_assert_lt(n, sizeof placeholder);
    memset(placeholder, '~', n);
    placeholder[n] = 0;
    put_fixture f;
    make_put(&f);
    f.seq.ns = placeholder;
    uint8_t key0[] = {0, 0xff, 0}; /* bytes fields take any bytes */
    f.seq.key.data = key0;
    f.seq.key.len = sizeof key0;
    size_t len = dquant__request__get_packed_size(&f.req);
    uint8_t *h = malloc(len);
    dquant__request__pack(&f.req, h);
    uint8_t *p = memmem(h, len, placeholder, n);
    cr_assert(p);
    memcpy(p, ns, n);
    int rc = dqd_validate_strings(&dquant__request__descriptor, h, len, msg, sizeof msg);
    free(h);
    return rc;
}

/* Every string of a request is UTF-8 without NUL, on the wire (issue 18.7); bytes fields, packed
 * shapes and unknown fields are not mistaken for strings. */
Test(validate, strings_on_the_wire)
{
    static const struct {
        const char *s;
        size_t n;
        int ok;
    } cases[] = {
        {"tenantA", 7, 1},
        {"t\xc3\xa9nant", 7, 1},    /* U+00E9 */
        {"\xe3\x83\x86", 3, 1},     /* U+30C6 */
        {"\xf4\x8f\xbf\xbf", 4, 1}, /* U+10FFFF, the last code point */
        {"\xef\xbf\xbf", 3, 1},     /* U+FFFF */
        {"tenantA\0x", 9, 0},       /* NUL */
        {"\0", 1, 0},
        {"a\x80", 2, 0},                /* stray continuation byte */
        {"\xc0\x80", 2, 0},             /* overlong NUL */
        {"\xc1\xbf", 2, 0},             /* overlong */
        {"\xe0\x9f\xbf", 3, 0},         /* overlong 3-byte */
        {"\xf0\x8f\xbf\xbf", 4, 0},     /* overlong 4-byte */
        {"\xed\xa0\x80", 3, 0},         /* U+D800, a surrogate */
        {"\xed\xbf\xbf", 3, 0},         /* U+DFFF */
        {"\xf4\x90\x80\x80", 4, 0},     /* U+110000 */
        {"\xf8\x88\x80\x80\x80", 5, 0}, /* 5-byte form */
        {"ab\xe3\x83", 4, 0},           /* truncated at the end */
        {"\xe3\x83x", 3, 0},            /* truncated in the middle */
        {"\xff", 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = ns_on_wire(cases[i].s, cases[i].n);
        cr_assert_eq(rc, cases[i].ok ? DQ_OK : DQ_INVALID_ARGUMENT, "case %zu: %d (%s)", i, rc, msg);
        if (!cases[i].ok)
            cr_assert(strncmp(msg, "put.seq.ns: ", 12) == 0, "case %zu: %s", i, msg);
    }
    cr_assert_eq(ns_on_wire("tenantA\0x", 9), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "a NUL byte at byte 7 of 9"), "%s", msg);
    cr_assert_eq(ns_on_wire("ab\xe3\x83", 4), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "invalid UTF-8 at byte 2 of 4"), "%s", msg);

    /* a string inside a repeated message field: ATTEND items[1].seq.ns */
    Dquant__SeqRef s0 = seqref(), s1 = seqref();
    s1.ns = "bad~";
    Dquant__AttendItem i0 = DQUANT__ATTEND_ITEM__INIT, i1 = DQUANT__ATTEND_ITEM__INIT;
    i0.seq = &s0;
    i1.seq = &s1;
    Dquant__AttendItem *items[] = {&i0, &i1};
    Dquant__Attend a = DQUANT__ATTEND__INIT;
    a.items = items;
    a.n_items = 2;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_ATTEND;
    req.attend = &a;
    size_t len = dquant__request__get_packed_size(&req);
    uint8_t *h = malloc(len);
    dquant__request__pack(&req, h);
    cr_assert_eq(dqd_validate_strings(&dquant__request__descriptor, h, len, msg, sizeof msg), DQ_OK);
    /* bytes that are not a protobuf message: the last field cut short */
    cr_assert_eq(dqd_validate_strings(&dquant__request__descriptor, h, len - 1, msg, sizeof msg), DQ_PROTOCOL);
    uint8_t *p = memmem(h, len, "bad~", 4);
    p[3] = 0xfe;
    cr_assert_eq(dqd_validate_strings(&dquant__request__descriptor, h, len, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "attend.items.seq.ns: invalid UTF-8 at byte 3 of 4") == msg, "%s", msg);
    free(h);
    cr_assert_eq(dqd_validate_strings(&dquant__request__descriptor, NULL, 0, msg, sizeof msg), DQ_OK);
}

/* HELLO's client_name and features, UNREGISTER_MODEL's name: lengths and control characters. */
Test(validate, names)
{
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.client_name = "tenant\n";
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    dqd_op op;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    h.client_name = "tenant";
    char *features[] = {"nccl", ""};
    h.features = features;
    h.n_features = 2;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    char longname[200];
    memset(longname, 'f', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    features[1] = longname;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_TOO_LARGE);
    h.n_features = 1;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_OK);

    Dquant__UnregisterModel um = DQUANT__UNREGISTER_MODEL__INIT;
    req.body_case = DQUANT__REQUEST__BODY_UNREGISTER_MODEL;
    req.unregister_model = &um;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_INVALID_ARGUMENT);
    cr_assert_eq(op, DQD_OP_UNREGISTER_MODEL);
    um.name = longname;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_TOO_LARGE);
    um.name = "m";
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 0), &lim, &op, msg, sizeof msg), DQ_OK);
}

/* REGISTER_MODEL's calibration: RAW bytes in the frame's payload (not on NCCL), at most
 * max_calibration; absent is fine. */
Test(validate, register_calibration)
{
    Dquant__ModelSpec m = DQUANT__MODEL_SPEC__INIT;
    m.name = "m";
    Dquant__RegisterModel rm = DQUANT__REGISTER_MODEL__INIT;
    rm.model = &m;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_REGISTER_MODEL;
    req.register_model = &rm;
    dqd_op op;
    dqd_tensor cal;
    cr_assert_eq(dqd_request_validate(&req, PL(NULL, 0), &lim, &op, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(op, DQD_OP_REGISTER_MODEL);
    cr_assert_eq(dqd_validate_calibration(&m, PL(NULL, 0), &cal, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(cal.len, 0, "no calibration");

    uint64_t shape[1] = {1000};
    Dquant__Tensor t = tensor(DQUANT__DTYPE__RAW, shape, 1, 24, 1000);
    m.calibration = &t;
    lim.max_calibration = 1000;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(dqd_validate_calibration(&m, PL(payload, 4096), &cal, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(cal.len, 1000);
    cr_assert_eq(cal.data, payload + 24);
    lim.max_calibration = 999;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_TOO_LARGE);
    cr_assert(strstr(msg, "max_calibration_bytes"), "%s", msg);
    lim.max_calibration = 1000;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 1000), &lim, &op, msg, sizeof msg), DQ_OUT_OF_BOUNDS,
                 "past the payload's end");
    t.dtype = DQUANT__DTYPE__F16;
    shape[0] = 500;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), DQ_DTYPE);
    t.dtype = DQUANT__DTYPE__RAW;
    shape[0] = 1000;
    t.nccl = true;
    t.offset = 0;
    req.nccl_payload = 1000;
    int rc = dqd_request_validate(&req, &(dqd_payload){payload, 4096, payload, 1000, true}, &lim, &op, msg, sizeof msg);
    cr_assert_eq(rc, DQ_INVALID_ARGUMENT, "a calibration never travels on NCCL: %s (%s)", dq_err_name(rc), msg);
}

/* Keys of a codec without window headers (int, turbo, KVQ without +lr: mean_bytes 0) carry no
 * mean blocks: DECOMPRESS takes them without, and refuses any. */
Test(validate, decompress_keys_without_means)
{
    const dqd_profile_info p = {
        .kv_heads = 2, .head_dim = 64, .window = 128, .mean_bytes = 0, .record_bytes = {40, 36}};
    uint64_t rs[1] = {3 * 40}, ms[1] = {8};
    Dquant__Tensor recs = tensor(DQUANT__DTYPE__RAW, rs, 1, 0, 3 * 40),
                   means = tensor(DQUANT__DTYPE__RAW, ms, 1, 512, 8);
    static uint8_t prof[16];
    Dquant__Decompress d = DQUANT__DECOMPRESS__INIT;
    d.profile.data = prof;
    d.profile.len = sizeof prof;
    d.kind = 0;
    d.tokens = 3;
    d.records = &recs;
    d.out_dtype = DQUANT__DTYPE__F32;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_DECOMPRESS;
    req.decompress = &d;
    dqd_op op;
    dqd_tensor tm, tr;
    cr_assert_eq(dqd_request_validate(&req, PL(payload, 4096), &lim, &op, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(dqd_validate_decompress(&d, PL(payload, 4096), &p, &tm, &tr, msg, sizeof msg), 0, "%s", msg);
    d.means = &means;
    cr_assert_eq(dqd_validate_decompress(&d, PL(payload, 4096), &p, &tm, &tr, msg, sizeof msg), DQ_SHAPE);
    cr_assert(strstr(msg, "no means"), "%s", msg);
}

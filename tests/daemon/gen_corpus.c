/* Writes the seed corpus of fuzz_request.c: one valid frame of every request type, a pipelined
 * stream, and malformed inputs (garbage, bad magic / version / CRC, truncated frames, lying tensor
 * offsets and lengths, shape products that overflow). Usage: dqd_gen_corpus DIR. The output is
 * checked in as tests/daemon/corpus/; rerun it after changing the protocol. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "wire.h"

static const char *dir;

static void write_file(const char *name, const uint8_t *p, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(p, 1, len, f) != len)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void emit(const char *name, const Dquant__Request *req, const wire_payload *pl, uint64_t id)
{
    size_t len;
    uint8_t *f = wire_frame(req, pl ? pl->p : NULL, pl ? pl->len : 0, id, &len);
    write_file(name, f, len);
    free(f);
}

/* A frame of req whose header message has every from[0..n) replaced by to[0..n): bytes protobuf-c
 * would never write (a NUL inside a string). */
static void emit_patched(const char *name, const Dquant__Request *req, const char *from, const char *to, size_t n,
                         uint64_t id)
{
    size_t hlen;
    uint8_t *h = wire_pack(req, &hlen);
    for (size_t i = 0; i + n <= hlen; i++)
        if (memcmp(h + i, from, n) == 0)
            memcpy(h + i, to, n);
    uint8_t *f = malloc(DQ_FRAME_HEADER_BYTES + hlen);
    if (!f)
        exit(1);
    memcpy(f + DQ_FRAME_HEADER_BYTES, h, hlen);
    dq_frame_write_header(f, f + DQ_FRAME_HEADER_BYTES, (uint32_t)hlen, 0, id);
    write_file(name, f, DQ_FRAME_HEADER_BYTES + hlen);
    free(f);
    free(h);
}

/* Deterministic pseudo-random floats. */
static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int32_t)(rng >> 8) - (1 << 23)) / (float)(1 << 23);
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand();
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    enum { L = 2, T = 4, KV = 2, HD = 64, QH = 8 };
    static float k[L * T * KV * HD], v[L * T * KV * HD], q[QH * HD], ak[KV * HD], av[KV * HD];
    fill(k, sizeof k / 4);
    fill(v, sizeof v / 4);
    fill(q, sizeof q / 4);
    fill(ak, sizeof ak / 4);
    fill(av, sizeof av / 4);
    uint8_t key[] = {'s', 'e', 'q', '1'};
    Dquant__SeqRef seq = DQUANT__SEQ_REF__INIT;
    seq.ns = "engine-a";
    seq.key.data = key;
    seq.key.len = sizeof key;

    Dquant__Request req = DQUANT__REQUEST__INIT;

    Dquant__Hello hello = DQUANT__HELLO__INIT;
    hello.min_version = 1;
    hello.max_version = 1;
    hello.client_name = "corpus";
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &hello;
    emit("hello.bin", &req, NULL, 1);

    Dquant__ModelSpec spec = DQUANT__MODEL_SPEC__INIT;
    spec.name = "tiny";
    spec.layers = 4;
    spec.q_heads = QH;
    spec.kv_heads = KV;
    spec.head_dim = HD;
    spec.profile_name = "dq226";
    Dquant__RegisterModel reg = DQUANT__REGISTER_MODEL__INIT;
    reg.model = &spec;
    req.body_case = DQUANT__REQUEST__BODY_REGISTER_MODEL;
    req.register_model = &reg;
    emit("register_model.bin", &req, NULL, 2);

    /* with a KVQ calibration in the payload (not a valid one: the daemon's check refuses it), and
     * one that lies about its length */
    {
        static uint8_t junk[200];
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)(i * 37u + 11u);
        memcpy(junk, "DQKC", 4);
        wire_payload cpl = {0};
        Dquant__Tensor tc;
        uint64_t cshape[1] = {sizeof junk};
        wire_tensor(&cpl, &tc, DQUANT__DTYPE__RAW, cshape, 1, junk, sizeof junk);
        Dquant__ModelSpec cspec = spec;
        cspec.name = "tiny-pq";
        cspec.profile_name = "pq8x4";
        cspec.calibration = &tc;
        Dquant__RegisterModel creg = DQUANT__REGISTER_MODEL__INIT;
        creg.model = &cspec;
        req.register_model = &creg;
        emit("register_model_calibration.bin", &req, &cpl, 60);
        tc.length = sizeof junk + 1;
        emit("bad_register_calibration_length.bin", &req, &cpl, 61);
        wire_payload_free(&cpl);
        req.register_model = &reg;
    }

    /* PUT f32, and a bf16 variant */
    wire_payload pl = {0};
    Dquant__Tensor tk, tv;
    uint64_t shape4[4] = {L, T, KV, HD};
    wire_tensor(&pl, &tk, DQUANT__DTYPE__F32, shape4, 4, k, sizeof k);
    wire_tensor(&pl, &tv, DQUANT__DTYPE__F32, shape4, 4, v, sizeof v);
    Dquant__Put put = DQUANT__PUT__INIT;
    put.seq = &seq;
    put.model = "tiny";
    put.start_token = 0;
    put.first_layer = 1;
    put.num_layers = L;
    put.tokens = T;
    put.k = &tk;
    put.v = &tv;
    req.body_case = DQUANT__REQUEST__BODY_PUT;
    req.put = &put;
    emit("put_f32.bin", &req, &pl, 3);

    /* the same PUT with lies: offset past the payload, offset + length wrapping, a shape whose
     * product overflows, a length that disagrees with the shape, NaN data */
    Dquant__Tensor saved = tk;
    tk.offset = pl.len + 64;
    emit("bad_put_offset.bin", &req, &pl, 4);
    tk = saved;
    tk.offset = UINT64_MAX - 8;
    emit("bad_put_wrap.bin", &req, &pl, 5);
    tk = saved;
    uint64_t huge[4] = {1ull << 32, 1ull << 32, 1ull << 16, 3};
    tk.shape = huge;
    emit("bad_put_overflow.bin", &req, &pl, 6);
    tk = saved;
    tk.length -= 4;
    emit("bad_put_length.bin", &req, &pl, 7);
    tk = saved;
    tk.dtype = (Dquant__DType)7;
    emit("bad_put_dtype.bin", &req, &pl, 8);
    tk = saved;
    float nan = NAN;
    memcpy(pl.p + tk.offset + 12, &nan, 4);
    emit("put_nan.bin", &req, &pl, 9);
    wire_payload_free(&pl);

    uint16_t kb[L * T * KV * HD], vb[L * T * KV * HD];
    for (size_t i = 0; i < sizeof kb / 2; i++) {
        uint32_t u, w;
        memcpy(&u, &k[i], 4);
        memcpy(&w, &v[i], 4);
        kb[i] = (uint16_t)(u >> 16);
        vb[i] = (uint16_t)(w >> 16);
    }
    wire_tensor(&pl, &tk, DQUANT__DTYPE__BF16, shape4, 4, kb, sizeof kb);
    wire_tensor(&pl, &tv, DQUANT__DTYPE__BF16, shape4, 4, vb, sizeof vb);
    put.start_token = T;
    emit("put_bf16.bin", &req, &pl, 10);
    wire_payload_free(&pl);

    Dquant__Get get = DQUANT__GET__INIT;
    get.seq = &seq;
    get.first_layer = 1;
    get.num_layers = 2;
    get.tokens = 0;
    get.format = DQUANT__GET_FORMAT__GET_F16;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &get;
    emit("get_f16.bin", &req, NULL, 11);
    get.format = DQUANT__GET_FORMAT__GET_RAW;
    emit("get_raw.bin", &req, NULL, 12);

    Dquant__AttendItem it0 = DQUANT__ATTEND_ITEM__INIT, it1 = DQUANT__ATTEND_ITEM__INIT;
    Dquant__AttendItem *items[2] = {&it0, &it1};
    Dquant__Tensor tq0, tq1, tak, tav;
    uint64_t qshape[2] = {QH, HD}, kvshape[3] = {1, KV, HD};
    wire_tensor(&pl, &tq0, DQUANT__DTYPE__F32, qshape, 2, q, sizeof q);
    wire_tensor(&pl, &tq1, DQUANT__DTYPE__F32, qshape, 2, q, sizeof q);
    wire_tensor(&pl, &tak, DQUANT__DTYPE__F32, kvshape, 3, ak, sizeof ak);
    wire_tensor(&pl, &tav, DQUANT__DTYPE__F32, kvshape, 3, av, sizeof av);
    it0.seq = &seq;
    it0.layer = 1;
    it0.q = &tq0;
    it1.seq = &seq;
    it1.layer = 2;
    it1.q = &tq1;
    it1.append_k = &tak;
    it1.append_v = &tav;
    Dquant__Attend att = DQUANT__ATTEND__INIT;
    att.n_items = 2;
    att.items = items;
    req.body_case = DQUANT__REQUEST__BODY_ATTEND;
    req.attend = &att;
    emit("attend.bin", &req, &pl, 13);
    it1.append_v = NULL;
    emit("bad_attend_half_append.bin", &req, &pl, 14);
    wire_payload_free(&pl);

    Dquant__Tensor tx;
    uint64_t xshape[3] = {T, KV, HD};
    wire_tensor(&pl, &tx, DQUANT__DTYPE__F32, xshape, 3, k, T * KV * HD * 4);
    Dquant__Compress comp = DQUANT__COMPRESS__INIT;
    comp.profile_name = "dq226";
    comp.kv_heads = KV;
    comp.head_dim = HD;
    comp.kind = 0;
    comp.x = &tx;
    req.body_case = DQUANT__REQUEST__BODY_COMPRESS;
    req.compress = &comp;
    emit("compress.bin", &req, &pl, 15);
    wire_payload_free(&pl);

    uint8_t means[130] = {0}, records[T * 49] = {0}, profile[64] = {'D', 'Q', 'P', 'F'};
    Dquant__Tensor tm, tr;
    uint64_t mshape[2] = {1, sizeof means}, rshape[2] = {T, 49};
    wire_tensor(&pl, &tm, DQUANT__DTYPE__RAW, mshape, 2, means, sizeof means);
    wire_tensor(&pl, &tr, DQUANT__DTYPE__RAW, rshape, 2, records, sizeof records);
    Dquant__Decompress dec = DQUANT__DECOMPRESS__INIT;
    dec.profile.data = profile;
    dec.profile.len = sizeof profile;
    dec.kind = 0;
    dec.tokens = T;
    dec.means = &tm;
    dec.records = &tr;
    dec.out_dtype = DQUANT__DTYPE__F16;
    req.body_case = DQUANT__REQUEST__BODY_DECOMPRESS;
    req.decompress = &dec;
    emit("decompress.bin", &req, &pl, 16);
    wire_payload_free(&pl);

    Dquant__Delete del = DQUANT__DELETE__INIT;
    del.seq = &seq;
    req.body_case = DQUANT__REQUEST__BODY_DELETE;
    req.delete_ = &del;
    emit("delete.bin", &req, NULL, 17);
    Dquant__Pin pin = DQUANT__PIN__INIT;
    pin.seq = &seq;
    req.body_case = DQUANT__REQUEST__BODY_PIN;
    req.pin = &pin;
    emit("pin.bin", &req, NULL, 18);
    Dquant__Unpin unpin = DQUANT__UNPIN__INIT;
    unpin.seq = &seq;
    req.body_case = DQUANT__REQUEST__BODY_UNPIN;
    req.unpin = &unpin;
    emit("unpin.bin", &req, NULL, 19);
    Dquant__Stats stats = DQUANT__STATS__INIT;
    req.body_case = DQUANT__REQUEST__BODY_STATS;
    req.stats = &stats;
    emit("stats.bin", &req, NULL, 20);
    Dquant__Ping ping = DQUANT__PING__INIT;
    uint8_t pdata[] = "ping";
    ping.data.data = pdata;
    ping.data.len = 4;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &ping;
    emit("ping.bin", &req, NULL, 21);

    /* A request with no body, a pipelined stream, then broken framing. */
    Dquant__Request empty = DQUANT__REQUEST__INIT;
    emit("no_body.bin", &empty, NULL, 22);

    size_t l1, l2;
    uint8_t *f1 = wire_frame(&req, NULL, 0, 23, &l1);
    req.body_case = DQUANT__REQUEST__BODY_STATS;
    req.stats = &stats;
    uint8_t *f2 = wire_frame(&req, NULL, 0, 24, &l2);
    uint8_t *stream = malloc(l1 + l2 + l1);
    memcpy(stream, f1, l1);
    memcpy(stream + l1, f2, l2);
    memcpy(stream + l1 + l2, f1, l1);
    write_file("pipelined.bin", stream, l1 + l2 + l1);
    write_file("truncated.bin", stream, l1 + l2 / 2);

    uint8_t *bad = malloc(l1);
    memcpy(bad, f1, l1);
    bad[0] ^= 0xff;
    write_file("bad_magic.bin", bad, l1);
    memcpy(bad, f1, l1);
    bad[4] = 9;
    write_file("bad_version.bin", bad, l1);
    memcpy(bad, f1, l1);
    bad[12] ^= 1;
    write_file("bad_crc.bin", bad, l1);
    memcpy(bad, f1, l1);
    memset(bad + 16, 0xff, 8);
    write_file("bad_payload_len.bin", bad, l1);
    memcpy(bad, f1, l1);
    bad[8] = 0;
    bad[9] = 0;
    bad[10] = 0;
    bad[11] = 0;
    write_file("bad_zero_header.bin", bad, l1);
    free(bad);
    free(f1);
    free(f2);
    free(stream);

    uint8_t garbage[512];
    for (size_t i = 0; i < sizeof garbage; i++) {
        rng = rng * 1664525u + 1013904223u;
        garbage[i] = (uint8_t)(rng >> 24);
    }
    write_file("garbage.bin", garbage, sizeof garbage);
    write_file("garbage_http.bin", (const uint8_t *)"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    write_file("empty.bin", garbage, 0);
    /* The shared KV tier: PUT_CHUNKS (every layer of the 4-layer model, one chunk of T tokens: the
     * fuzz target checks it with chunk_tokens T), LOOKUP with a lease, a lease release, chunk
     * SeqRefs; then keys of the wrong length and a lease over the limit. */
    static float ck[4 * T * KV * HD], cv[4 * T * KV * HD];
    fill(ck, sizeof ck / 4);
    fill(cv, sizeof cv / 4);
    uint8_t ckey[2][16], cparent[16];
    for (int i = 0; i < 16; i++) {
        ckey[0][i] = (uint8_t)(0xa0 + i);
        ckey[1][i] = (uint8_t)(0xb0 + i);
        cparent[i] = (uint8_t)i;
    }
    ProtobufCBinaryData ckeys[2] = {{16, ckey[0]}, {16, ckey[1]}};
    wire_payload cpl = {0};
    Dquant__Tensor ctk, ctv;
    uint64_t cshape[4] = {4, T, KV, HD};
    wire_tensor(&cpl, &ctk, DQUANT__DTYPE__F32, cshape, 4, ck, sizeof ck);
    wire_tensor(&cpl, &ctv, DQUANT__DTYPE__F32, cshape, 4, cv, sizeof cv);
    Dquant__PutChunks pc = DQUANT__PUT_CHUNKS__INIT;
    pc.ns = "engine-a";
    pc.model = "tiny";
    pc.n_keys = 1;
    pc.keys = ckeys;
    pc.parent.data = cparent;
    pc.parent.len = sizeof cparent;
    pc.k = &ctk;
    pc.v = &ctv;
    req.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS;
    req.put_chunks = &pc;
    emit("put_chunks.bin", &req, &cpl, 30);
    pc.n_keys = 2; /* tokens for one chunk only */
    emit("bad_put_chunks_tokens.bin", &req, &cpl, 31);
    pc.n_keys = 1;
    ckeys[0].len = 15;
    emit("bad_put_chunks_key.bin", &req, &cpl, 32);
    ckeys[0].len = 16;
    wire_payload_free(&cpl);

    Dquant__Lookup lk = DQUANT__LOOKUP__INIT;
    lk.ns = "engine-a";
    lk.model = "tiny";
    lk.n_keys = 2;
    lk.keys = ckeys;
    lk.lease_ms = 1000;
    req.body_case = DQUANT__REQUEST__BODY_LOOKUP;
    req.lookup = &lk;
    emit("lookup_lease.bin", &req, NULL, 33);
    lk.lease_ms = 1u << 31;
    emit("bad_lookup_lease.bin", &req, NULL, 34);
    lk.lease_ms = 0;
    ckeys[1].len = 17;
    emit("bad_lookup_key.bin", &req, NULL, 35);
    ckeys[1].len = 16;
    Dquant__Lookup rel = DQUANT__LOOKUP__INIT;
    rel.release_lease = 7;
    req.lookup = &rel;
    emit("lookup_release.bin", &req, NULL, 36);

    Dquant__SeqRef cref = DQUANT__SEQ_REF__INIT;
    cref.ns = "engine-a";
    cref.key = ckeys[0];
    cref.kind = DQUANT__SEQ_KIND__CHUNK;
    Dquant__Get cget = DQUANT__GET__INIT;
    cget.seq = &cref;
    cget.format = DQUANT__GET_FORMAT__GET_RAW;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &cget;
    emit("get_chunk_raw.bin", &req, NULL, 37);
    del.seq = &cref;
    req.body_case = DQUANT__REQUEST__BODY_DELETE;
    req.delete_ = &del;
    emit("delete_chunk.bin", &req, NULL, 38);
    cref.key.len = 4;
    emit("bad_delete_chunk_key.bin", &req, NULL, 39);
    Dquant__Get cgets = DQUANT__GET__INIT;
    cgets.chunk_ns = "engine-a";
    cgets.n_chunk_keys = 2;
    cgets.chunk_keys = ckeys;
    cgets.format = DQUANT__GET_FORMAT__GET_BF16;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &cgets;
    emit("get_chunks.bin", &req, NULL, 40);
    cgets.format = DQUANT__GET_FORMAT__GET_RAW;
    emit("bad_get_chunks_raw.bin", &req, NULL, 41);

    /* PUT_RAW / PUT_CHUNKS_RAW: records sized for fuzz_request.c's profile (W 128, mean block 130,
     * key/value records 49/36 bytes: 10010 bytes a window; zeros, so the daemon would find them
     * CORRUPT), BF16 tails of 4 tokens of 128 values. */
    enum { WB = 130 + 128 * (49 + 36), TT = 4, ROWV = KV * HD };
    static uint8_t recs[4][WB];
    static uint16_t tail[TT * ROWV];
    for (size_t i = 0; i < TT * ROWV; i++)
        tail[i] = 0x3f80; /* 1.0 */
    uint8_t prof[64];
    memset(prof, 7, sizeof prof);
    wire_payload rpl = {0};
    Dquant__Tensor rt[4][3];
    uint64_t rawshape[4][5];
    Dquant__RawLayer rl[4], *rlp[4];
    for (int l = 0; l < 4; l++) {
        dquant__raw_layer__init(&rl[l]);
        rl[l].layer = (uint32_t)l;
        rl[l].windows = 1;
        rl[l].tokens = 128 + (l < L ? TT : 0);
        rawshape[l][0] = WB;
        wire_tensor(&rpl, &rt[l][0], DQUANT__DTYPE__RAW, rawshape[l], 1, recs[l], WB);
        rl[l].records = &rt[l][0];
        if (l < L) {
            rawshape[l][1] = rawshape[l][3] = TT;
            rawshape[l][2] = rawshape[l][4] = ROWV;
            wire_tensor(&rpl, &rt[l][1], DQUANT__DTYPE__BF16, &rawshape[l][1], 2, tail, sizeof tail);
            wire_tensor(&rpl, &rt[l][2], DQUANT__DTYPE__BF16, &rawshape[l][3], 2, tail, sizeof tail);
            rl[l].tail_k = &rt[l][1];
            rl[l].tail_v = &rt[l][2];
        }
        rlp[l] = &rl[l];
    }
    Dquant__PutRaw pr = DQUANT__PUT_RAW__INIT;
    pr.seq = &seq;
    pr.model = "tiny";
    pr.first_layer = 0;
    pr.num_layers = L;
    pr.n_layers = L;
    pr.layers = rlp;
    pr.profile.data = prof;
    pr.profile.len = sizeof prof;
    req.body_case = DQUANT__REQUEST__BODY_PUT_RAW;
    req.put_raw = &pr;
    emit("put_raw.bin", &req, &rpl, 42);
    rt[1][0].length = WB - 1; /* truncated: not a whole record */
    rawshape[1][0] = WB - 1;
    emit("bad_put_raw_truncated.bin", &req, &rpl, 43);
    rt[1][0].length = WB;
    rawshape[1][0] = WB;
    rl[0].windows = 0; /* oversized: more bytes than the windows say */
    emit("bad_put_raw_oversized.bin", &req, &rpl, 44);
    rl[0].windows = 1;
    rawshape[0][1] = 200; /* a tail longer than the payload, and than W */
    emit("bad_put_raw_tail.bin", &req, &rpl, 45);
    rawshape[0][1] = TT;
    pr.profile.len = 0;
    emit("bad_put_raw_no_profile.bin", &req, &rpl, 46);
    pr.profile.len = sizeof prof;
    pr.n_layers = 1; /* fewer layers than num_layers */
    emit("bad_put_raw_layers.bin", &req, &rpl, 47);
    pr.n_layers = L;

    /* Chunks: all 4 layers of fuzz_request.c's model, one window each, no tail. */
    for (int l = 0; l < L; l++)
        rl[l].tail_k = rl[l].tail_v = NULL;
    Dquant__PutChunksRaw pcr = DQUANT__PUT_CHUNKS_RAW__INIT;
    pcr.ns = "engine-a";
    pcr.model = "tiny";
    pcr.n_keys = 1;
    pcr.keys = ckeys;
    pcr.n_layers = 4;
    pcr.layers = rlp;
    pcr.profile.data = prof;
    pcr.profile.len = sizeof prof;
    req.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS_RAW;
    req.put_chunks_raw = &pcr;
    emit("put_chunks_raw.bin", &req, &rpl, 48);
    ckeys[0].len = 3;
    emit("bad_put_chunks_raw_key.bin", &req, &rpl, 49);
    ckeys[0].len = 16;
    wire_payload_free(&rpl);

    Dquant__UnregisterModel um = DQUANT__UNREGISTER_MODEL__INIT;
    um.name = "tiny";
    req.body_case = DQUANT__REQUEST__BODY_UNREGISTER_MODEL;
    req.unregister_model = &um;
    emit("unregister_model.bin", &req, NULL, 50);
    /* names on the wire: a NUL inside a namespace, invalid UTF-8 in a model name */
    seq.ns = "engine-a#x";
    req.body_case = DQUANT__REQUEST__BODY_DELETE;
    req.delete_ = &del;
    emit_patched("bad_ns_nul.bin", &req, "a#x", "a\0x", 3, 51);
    um.name = "tiny~";
    req.body_case = DQUANT__REQUEST__BODY_UNREGISTER_MODEL;
    req.unregister_model = &um;
    emit_patched("bad_name_utf8.bin", &req, "y~", "y\xc0", 2, 52);
    return 0;
}

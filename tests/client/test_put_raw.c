/* Compressed transfer end to end: libdquant-client against a real dquantd ($DQUANTD). Layers encoded
 * in-process with libdquant are stored by PUT_RAW and read back by GET_RAW bit-exact; GET and ATTEND
 * on them equal the in-process decode and a BF16 PUT of the same data; PUT continues a PUT_RAW
 * sequence; PUT_CHUNKS_RAW chunks are found by LOOKUP and dedupe with PUT_CHUNKS; and every bad input
 * (truncated, oversized, corrupt records, another profile, a long or NaN tail) is refused with its
 * code, stores nothing and is counted. Skipped when $DQUANTD is unset; $DQ_CHUNKS_BACKEND (e.g. cuda
 * for dquantd-fakecuda) is passed as --backend. */
#include <criterion/criterion.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/layer.h"
#include "dquant/profile.h"
#include "wire.h"

#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define W 128
#define MODEL "m"

static dqd_daemon D;
static dq_codec *codec;
static dq_workspace *ws;
static uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
static size_t plen, wb;

static void stop_daemon(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
    dq_workspace_free(ws);
    dq_codec_free(codec);
    ws = NULL;
    codec = NULL;
}

static uint16_t metrics_port; /* 0: no /metrics listener */

static dqc_client *start(void)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    static const char *args[8];
    static char metrics[64];
    size_t n = 0;
    if (metrics_port) {
        snprintf(metrics, sizeof metrics, "127.0.0.1:%u", metrics_port);
        args[n++] = "--metrics";
        args[n++] = metrics;
    }
    const char *backend = getenv("DQ_CHUNKS_BACKEND");
    if (backend) {
        args[n++] = "--backend";
        args[n++] = backend;
    }
    args[n] = NULL;
    const dqd_opts o = {.extra = args};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
    dqc_client *c = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(D.addr, NULL, &c, err, sizeof err), 0, "connect: %s", err);
    dqc_model_spec spec = {
        .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    dqc_model_info info;
    OK(c, dqc_register_model_ex(c, &spec, W, &info, NULL));
    /* The client's codec from the profile the daemon uses. */
    dq_profile p;
    cr_assert_eq(dq_profile_deserialize(info.profile, info.profile_len, &p), DQ_OK);
    cr_assert_eq(dq_codec_create(&p, NULL, &codec), DQ_OK);
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    cr_assert_eq(dq_profile_serialize(&p, pbytes, sizeof pbytes, &plen), DQ_OK);
    cr_assert(plen == info.profile_len && memcmp(pbytes, info.profile, plen) == 0);
    cr_assert_eq(p.window, W);
    wb = dq_codec_window_bytes(codec);
    return c;
}

TestSuite(put_raw, .fini = stop_daemon, .timeout = 240);

/* The body of GET /metrics (malloc'd). */
static char *get_metrics(void)
{
    int fd = wire_connect_tcp(metrics_port);
    cr_assert_geq(fd, 0);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(wire_send_all(fd, req, strlen(req)), 0);
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

/* K/V [L, ntok, KVH, HD] f32: keys with per-channel offsets, a function of (layer, token, seed). */
static float *kv(size_t ntok, int is_v, uint32_t seed)
{
    float *x = malloc((size_t)L * ntok * ROW * sizeof *x);
    for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < ntok; t++)
            for (size_t j = 0; j < ROW; j++) {
                uint32_t h = (uint32_t)(t * 40503u + j * 977u + l * 7919u + (size_t)is_v * 31u) ^ seed * 2654435761u;
                h ^= h >> 15;
                h *= 2246822519u;
                h ^= h >> 13;
                x[(l * ntok + t) * ROW + j] = (float)(h % 20001) / 10000.0f - 1.0f +
                                              (is_v ? 0.0f : 0.3f * (float)(j % 7));
            }
    return x;
}

/* In-process layers of tokens [0, ntok) and their parts in dqc_raw_layer form (records and tails
 * copied into rec/tk/tv; the tail starting at token `from`, which must be a multiple of W). */
typedef struct enc {
    dq_layer *layer[L];
    uint8_t *rec[L];
    uint16_t *tk[L], *tv[L];
    dqc_raw_layer raw[L];
} enc;

static void encode(enc *e, const float *k, const float *v, size_t ntok, size_t from_win)
{
    memset(e, 0, sizeof *e);
    for (int l = 0; l < L; l++) {
        cr_assert_eq(dq_layer_create(codec, &e->layer[l]), DQ_OK);
        cr_assert_eq(dq_layer_append(e->layer[l], ws, k + (size_t)l * ntok * ROW, v + (size_t)l * ntok * ROW,
                                     DQ_DTYPE_F32, ntok, NULL),
                     DQ_OK);
        const size_t nw = dq_layer_window_count(e->layer[l]) - from_win, tt = dq_layer_tail_tokens(e->layer[l]);
        e->rec[l] = malloc(nw * wb + 64);
        for (size_t i = 0; i < nw; i++)
            memcpy(e->rec[l] + i * wb, dq_layer_window(e->layer[l], from_win + i), wb);
        e->tk[l] = malloc(tt * ROW * 2 + 2);
        e->tv[l] = malloc(tt * ROW * 2 + 2);
        memcpy(e->tk[l], dq_layer_tail(e->layer[l], DQ_KIND_K), tt * ROW * 2);
        memcpy(e->tv[l], dq_layer_tail(e->layer[l], DQ_KIND_V), tt * ROW * 2);
        e->raw[l] = (dqc_raw_layer){.layer = (uint32_t)l,
                                    .windows = nw,
                                    .records = e->rec[l],
                                    .records_bytes = nw * wb,
                                    .tail_tokens = tt,
                                    .tail_k = tt ? e->tk[l] : NULL,
                                    .tail_v = tt ? e->tv[l] : NULL,
                                    .tail_bytes = tt * ROW * 2};
    }
}

static void enc_free(enc *e)
{
    for (int l = 0; l < L; l++) {
        dq_layer_free(e->layer[l]);
        free(e->rec[l]);
        free(e->tk[l]);
        free(e->tv[l]);
    }
}

static dqc_seq seq_of(const char *key)
{
    return (dqc_seq){.ns = "raw", .key = key, .key_len = strlen(key)};
}

static int put_raw(dqc_client *c, const char *key, uint64_t start, const dqc_raw_layer *layers, size_t n,
                   const uint8_t *prof, size_t prof_len)
{
    dqc_put_raw_args a = {.seq = seq_of(key),
                          .model = MODEL,
                          .start_token = start,
                          .first_layer = 0,
                          .layers = layers,
                          .nlayers = n,
                          .profile = prof,
                          .profile_len = prof_len};
    return dqc_put_raw(c, &a, NULL);
}

/* GET_RAW of key equals the in-process layers bit-exact: every window record and the tail. */
static void expect_raw_equal(dqc_client *c, const char *key, const enc *e)
{
    dqc_raw_result r = {0};
    dqc_seq s = seq_of(key);
    OK(c, dqc_get_raw(c, &s, 0, 0, &r));
    cr_assert_eq(r.nlayers, L);
    cr_assert(r.profile_len == plen && memcmp(r.profile, pbytes, plen) == 0, "GET_RAW's profile differs");
    for (int l = 0; l < L; l++) {
        const dqc_raw_layer *g = &r.layers[l];
        const dq_layer *x = e->layer[l];
        cr_assert_eq(g->windows, dq_layer_window_count(x), "layer %d", l);
        cr_assert_eq(g->tail_tokens, dq_layer_tail_tokens(x), "layer %d", l);
        for (size_t i = 0; i < g->windows; i++)
            cr_assert(memcmp(g->records + i * wb, dq_layer_window(x, i), wb) == 0, "layer %d window %zu differs", l, i);
        cr_assert(memcmp(g->tail_k, dq_layer_tail(x, DQ_KIND_K), g->tail_bytes) == 0, "layer %d tail K", l);
        cr_assert(memcmp(g->tail_v, dq_layer_tail(x, DQ_KIND_V), g->tail_bytes) == 0, "layer %d tail V", l);
    }
    dqc_raw_result_free(&r);
}

Test(put_raw, roundtrip_get_attend)
{
    dqc_client *c = start();
    const size_t T = 2 * W + 37;
    float *k = kv(T, 0, 1), *v = kv(T, 1, 1);
    enc e;
    encode(&e, k, v, T, 0);
    const uint64_t req0 = stat_counter(c, "put_raw_requests"), bytes0 = stat_counter(c, "put_raw_bytes");
    OK(c, put_raw(c, "a", 0, e.raw, L, pbytes, plen));
    expect_raw_equal(c, "a", &e);
    cr_assert_eq(stat_counter(c, "put_raw_requests"), req0 + 1);
    cr_assert_eq(stat_counter(c, "put_raw_bytes"), bytes0 + L * (2 * wb + 2 * 37 * ROW * 2));

    /* GET typed equals the in-process decode, bit-exact. */
    dqc_get_args ga = {.seq = seq_of("a"), .dtype = DQ_DTYPE_F32};
    dqc_get_result gr = {0};
    OK(c, dqc_get(c, &ga, &gr));
    cr_assert_eq(gr.tokens, T);
    float *dk = malloc(T * ROW * sizeof *dk), *dv = malloc(T * ROW * sizeof *dv);
    for (int l = 0; l < L; l++) {
        cr_assert_eq(dq_layer_decode(e.layer[l], ws, DQ_KIND_K, 0, T, dk, DQ_DTYPE_F32), DQ_OK);
        cr_assert_eq(dq_layer_decode(e.layer[l], ws, DQ_KIND_V, 0, T, dv, DQ_DTYPE_F32), DQ_OK);
        cr_assert(memcmp((const float *)gr.k + (size_t)l * T * ROW, dk, T * ROW * sizeof *dk) == 0, "GET K layer %d",
                  l);
        cr_assert(memcmp((const float *)gr.v + (size_t)l * T * ROW, dv, T * ROW * sizeof *dv) == 0, "GET V layer %d",
                  l);
    }
    dqc_get_result_free(&gr);

    /* A PUT of the same data builds the same containers; ATTEND agrees on both. */
    dqc_put_args pa = {.seq = seq_of("b"),
                       .model = MODEL,
                       .num_layers = L,
                       .tokens = T,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    OK(c, dqc_put(c, &pa, NULL));
    expect_raw_equal(c, "b", &e);
    float q[QH * HD];
    for (int i = 0; i < QH * HD; i++)
        q[i] = (float)sin(0.37 * i);
    dqc_attend_item it[2 * L];
    for (int l = 0; l < L; l++) {
        it[2 * l] = (dqc_attend_item){.seq = seq_of("a"), .layer = (uint32_t)l, .q = q};
        it[2 * l + 1] = (dqc_attend_item){.seq = seq_of("b"), .layer = (uint32_t)l, .q = q};
    }
    dqc_attend_args aa = {
        .items = it, .nitems = 2 * L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    float out[2 * L * QH * HD], lse[2 * L * QH];
    OK(c, dqc_attend(c, &aa, out, lse));
    for (int l = 0; l < L; l++)
        for (int i = 0; i < QH * HD; i++) {
            const float x = out[(2 * l) * QH * HD + i], y = out[(2 * l + 1) * QH * HD + i];
            cr_assert(fabsf(x - y) <= 1e-6f * fmaxf(1.0f, fabsf(y)), "ATTEND layer %d [%d]: %g vs %g", l, i, x, y);
        }
    enc_free(&e);
    free(dk);
    free(dv);
    free(k);
    free(v);
    dqc_free(c);
}

/* PUT of tokens [from, from + n) of k/v ([L, T, ...] f32) to key. */
static void put_rows(dqc_client *c, const char *key, const float *k, const float *v, size_t T, size_t from, size_t n)
{
    float *rk = malloc((size_t)L * n * ROW * sizeof *rk), *rv = malloc((size_t)L * n * ROW * sizeof *rv);
    for (int l = 0; l < L; l++) {
        memcpy(rk + (size_t)l * n * ROW, k + ((size_t)l * T + from) * ROW, n * ROW * sizeof *rk);
        memcpy(rv + (size_t)l * n * ROW, v + ((size_t)l * T + from) * ROW, n * ROW * sizeof *rv);
    }
    dqc_put_args pa = {.seq = seq_of(key),
                       .model = MODEL,
                       .start_token = from,
                       .num_layers = L,
                       .tokens = n,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = rk,
                       .v = rv};
    OK(c, dqc_put(c, &pa, NULL));
    free(rk);
    free(rv);
}

/* PUT_RAW, PUT and PUT_RAW again interleaved build the layer a single encode builds. On the cuda
 * backend the PUT moves the layers to the GPU and the next PUT_RAW brings them back to the host. */
Test(put_raw, appends_continue)
{
    dqc_client *c = start();
    const size_t T = 4 * W + 100;
    float *k = kv(T, 0, 2), *v = kv(T, 1, 2);
    enc e;
    encode(&e, k, v, T, 0);
    dqc_raw_layer first[L], second[L];
    for (int l = 0; l < L; l++) {
        first[l] = (dqc_raw_layer){.windows = 2, .records = e.rec[l], .records_bytes = 2 * wb};
        second[l] = (dqc_raw_layer){.windows = 1, .records = e.rec[l] + 3 * wb, .records_bytes = wb};
    }
    OK(c, put_raw(c, "s", 0, first, L, pbytes, plen));                            /* windows 0, 1 */
    FAILS(c, DQ_ORDER, put_raw(c, "s", 0, second, L, pbytes, plen));              /* not at the layer's end */
    FAILS(c, DQ_INVALID_ARGUMENT, put_raw(c, "s", 100, second, L, pbytes, plen)); /* not a multiple of W */
    const int cuda = getenv("DQ_CHUNKS_BACKEND") != NULL;
    const uint64_t promoted0 = stat_counter(c, "gpu_promotions"), spilled0 = stat_counter(c, "gpu_spills");
    put_rows(c, "s", k, v, T, 2 * W, W); /* window 2 by PUT */
    if (cuda)
        cr_assert_eq(stat_counter(c, "gpu_promotions"), promoted0 + L, "the PUT moves the raw layers to the GPU");
    OK(c, put_raw(c, "s", 3 * W, second, L, pbytes, plen)); /* window 3 */
    if (cuda)
        cr_assert_eq(stat_counter(c, "gpu_spills"), spilled0 + L, "PUT_RAW takes the GPU layers to the host");
    put_rows(c, "s", k, v, T, 4 * W, 100); /* the tail by PUT */
    expect_raw_equal(c, "s", &e);
    /* A layer with a tail takes no records. */
    FAILS(c, DQ_INVALID_ARGUMENT, put_raw(c, "s", T, second, L, pbytes, plen));
    enc_free(&e);
    free(k);
    free(v);
    dqc_free(c);
}

Test(put_raw, chunks_lookup_dedupe)
{
    dqc_client *c = start();
    const size_t T = 2 * W; /* two chunks of one window */
    float *k = kv(T, 0, 3), *v = kv(T, 1, 3);
    enc e;
    encode(&e, k, v, T, 0);
    uint32_t tok[2 * W];
    for (size_t i = 0; i < T; i++)
        tok[i] = (uint32_t)(i * 7 + 3);
    uint8_t keys[2 * DQC_CHUNK_KEY_BYTES];
    cr_assert_eq(dqc_chunk_keys("t", tok, T, W, NULL, keys, 2), 2);
    dqc_put_chunks_result pr;
    OK(c, dqc_put_chunks_raw(c, "t", MODEL, keys, 2, NULL, e.raw, L, pbytes, plen, &pr));
    cr_assert_eq(pr.stored, 2);
    cr_assert_eq(pr.deduped, 0);
    dqc_lookup_result lr;
    OK(c, dqc_lookup(c, "t", MODEL, keys, 2, 0, &lr));
    cr_assert_eq(lr.hits, 2);
    /* Chunk 1 as stored: window 1 of every layer. */
    dqc_raw_result rr = {0};
    OK(c, dqc_get_chunk_raw(c, "t", keys + DQC_CHUNK_KEY_BYTES, &rr));
    for (int l = 0; l < L; l++) {
        cr_assert_eq(rr.layers[l].windows, 1);
        cr_assert(memcmp(rr.layers[l].records, e.rec[l] + wb, wb) == 0, "chunk 1 layer %d", l);
    }
    dqc_raw_result_free(&rr);
    /* A BF16 PUT_CHUNKS of the same data is deduped; and the other way round on fresh keys. */
    dqc_put_chunks_args ca = {.ns = "t",
                              .model = MODEL,
                              .keys = keys,
                              .nkeys = 2,
                              .layers = L,
                              .chunk_tokens = W,
                              .kv_heads = KVH,
                              .head_dim = HD,
                              .dtype = DQ_DTYPE_F32,
                              .k = k,
                              .v = v};
    OK(c, dqc_put_chunks(c, &ca, &pr));
    cr_assert_eq(pr.deduped, 2);
    uint8_t keys2[2 * DQC_CHUNK_KEY_BYTES];
    cr_assert_eq(dqc_chunk_keys("u", tok, T, W, NULL, keys2, 2), 2);
    ca.ns = "u";
    ca.keys = keys2;
    OK(c, dqc_put_chunks(c, &ca, &pr));
    cr_assert_eq(pr.stored, 2);
    OK(c, dqc_put_chunks_raw(c, "u", MODEL, keys2, 2, NULL, e.raw, L, pbytes, plen, &pr));
    cr_assert_eq(pr.deduped, 2);
    OK(c, dqc_get_chunk_raw(c, "u", keys2, &rr));
    for (int l = 0; l < L; l++)
        cr_assert(memcmp(rr.layers[l].records, e.rec[l], wb) == 0, "PUT_CHUNKS and the records differ, layer %d", l);
    dqc_raw_result_free(&rr);
    /* A corrupt record in the second chunk: CORRUPT, and not even the first chunk is stored. */
    uint8_t keys4[2 * DQC_CHUNK_KEY_BYTES];
    cr_assert_eq(dqc_chunk_keys("w", tok, T, W, NULL, keys4, 2), 2);
    uint8_t *st = e.rec[1] + wb + 2 + ROW + 4; /* layer 1, window 1, key record 0: its rANS state */
    st[3] ^= 0x40;
    cr_assert_eq(dq_window_check(codec, e.rec[1] + wb), DQ_CORRUPT, "the flip must break the invariant");
    const uint64_t corrupt0 = stat_counter(c, "put_raw_corrupt");
    FAILS(c, DQ_CORRUPT, dqc_put_chunks_raw(c, "w", MODEL, keys4, 2, NULL, e.raw, L, pbytes, plen, NULL));
    cr_assert(strstr(dqc_last_error(c), "chunk 1 layer 1 window 1"), "%s", dqc_last_error(c));
    cr_assert_eq(stat_counter(c, "put_raw_corrupt"), corrupt0 + 1);
    st[3] ^= 0x40;
    OK(c, dqc_lookup(c, "w", MODEL, keys4, 2, 0, &lr));
    cr_assert_eq(lr.hits, 0);
    /* A chunk with a tail is refused, storing nothing. */
    uint8_t keys3[DQC_CHUNK_KEY_BYTES];
    cr_assert_eq(dqc_chunk_keys("v", tok, W, W, NULL, keys3, 1), 1);
    FAILS(c, DQ_SHAPE, dqc_put_chunks_raw(c, "v", MODEL, keys3, 1, NULL, e.raw, L, pbytes, plen, NULL));
    OK(c, dqc_lookup(c, "v", MODEL, keys3, 1, 0, &lr));
    cr_assert_eq(lr.hits, 0);
    enc_free(&e);
    free(k);
    free(v);
    dqc_free(c);
}

static void expect_absent(dqc_client *c, const char *key)
{
    dqc_raw_result r = {0};
    dqc_seq s = seq_of(key);
    FAILS(c, DQ_NOT_FOUND, dqc_get_raw(c, &s, 0, 0, &r));
    dqc_raw_result_free(&r);
}

Test(put_raw, bad_input_stores_nothing)
{
    /* below the kernel's ephemeral range; a port per process (criterion forks each test) */
    metrics_port = (uint16_t)(12000 + ((unsigned)getpid() * 13u + 4441u) % 20000u);
    dqc_client *c = start();
    const size_t T = 2 * W + 20;
    float *k = kv(T, 0, 4), *v = kv(T, 1, 4);
    enc e;
    encode(&e, k, v, T, 0);
    const uint64_t corrupt0 = stat_counter(c, "put_raw_corrupt"), req0 = stat_counter(c, "put_raw_requests");
    dqc_raw_layer bad[L];
    uint64_t nreq = 0;

    /* truncated: records_bytes not a multiple of the record size */
    memcpy(bad, e.raw, sizeof bad);
    bad[1].records_bytes = 2 * wb - 1;
    FAILS(c, DQ_SHAPE, put_raw(c, "x", 0, bad, L, pbytes, plen));
    nreq++;
    /* oversized: more bytes than the windows say */
    memcpy(bad, e.raw, sizeof bad);
    bad[0].records_bytes = 2 * wb + 64;
    FAILS(c, DQ_SHAPE, put_raw(c, "x", 0, bad, L, pbytes, plen));
    nreq++;
    /* tail_tokens >= W */
    uint16_t *longt = calloc((size_t)W * ROW, 2);
    memcpy(bad, e.raw, sizeof bad);
    bad[0].tail_tokens = W;
    bad[0].tail_k = bad[0].tail_v = longt;
    bad[0].tail_bytes = (size_t)W * ROW * 2;
    FAILS(c, DQ_SHAPE, put_raw(c, "x", 0, bad, L, pbytes, plen));
    nreq++;
    /* layers of different lengths */
    memcpy(bad, e.raw, sizeof bad);
    bad[1].windows = 1;
    bad[1].records_bytes = wb;
    FAILS(c, DQ_SHAPE, put_raw(c, "x", 0, bad, L, pbytes, plen));
    nreq++;
    /* NaN in a tail (layer 1): NONFINITE */
    memcpy(bad, e.raw, sizeof bad);
    uint16_t nan_tail[20 * ROW];
    memcpy(nan_tail, e.tk[1], sizeof nan_tail);
    nan_tail[5 * ROW + 3] = 0x7fc0;
    bad[1].tail_k = nan_tail;
    FAILS(c, DQ_NONFINITE, put_raw(c, "x", 0, bad, L, pbytes, plen));
    nreq++;

    /* another profile: dq196 records and profile against the dq226 model */
    dq_profile p196;
    cr_assert_eq(dq_profile_builtin("dq196", KVH, HD, &p196), DQ_OK);
    uint8_t pb196[DQ_PROFILE_SERIALIZED_MAX];
    size_t pl196;
    cr_assert_eq(dq_profile_serialize(&p196, pb196, sizeof pb196, &pl196), DQ_OK);
    dq_codec *c196;
    cr_assert_eq(dq_codec_create(&p196, NULL, &c196), DQ_OK);
    const size_t wb196 = dq_codec_window_bytes(c196);
    cr_assert_neq(wb196, wb);
    uint8_t *rec196 = malloc(wb196);
    dq_workspace *ws196;
    cr_assert_eq(dq_workspace_create(c196, &ws196), DQ_OK);
    cr_assert_eq(dq_window_encode(c196, ws196, k, v, DQ_DTYPE_F32, rec196, NULL), DQ_OK);
    cr_assert_eq(dq_window_check(c196, rec196), DQ_OK, "valid dq196 records");
    dq_workspace_free(ws196);
    dqc_raw_layer r196[L];
    for (int l = 0; l < L; l++)
        r196[l] = (dqc_raw_layer){.windows = 1, .records = rec196, .records_bytes = wb196};
    FAILS(c, DQ_INVALID_ARGUMENT, put_raw(c, "x", 0, r196, L, pb196, pl196));
    nreq++;
    cr_assert(strstr(dqc_last_error(c), "another profile"), "%s", dqc_last_error(c));
    free(rec196);
    dq_codec_free(c196);

    /* a flipped byte: the last (padding) byte of layer 1, window 1, value record 100 */
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K), rv = dq_codec_record_bytes(codec, DQ_KIND_V);
    uint8_t *w1 = e.rec[1] + wb;
    uint8_t *pad = w1 + 2 + (size_t)ROW + (size_t)W * rk + 100 * rv + rv - 1;
    cr_assert_eq(*pad, 0, "the container's last byte is padding");
    *pad = 0x01;
    cr_assert_eq(dq_window_check(codec, w1), DQ_CORRUPT, "the flip must break the invariant");
    FAILS(c, DQ_CORRUPT, put_raw(c, "x", 0, e.raw, L, pbytes, plen));
    nreq++;
    cr_assert(strstr(dqc_last_error(c), "layer 1 window 1"), "%s", dqc_last_error(c));
    expect_absent(c, "x");

    /* The same on an existing sequence: nothing changes (layer 0 is rolled back). */
    *pad = 0;
    dqc_raw_layer one[L];
    for (int l = 0; l < L; l++)
        one[l] = (dqc_raw_layer){.windows = 1, .records = e.rec[l], .records_bytes = wb};
    OK(c, put_raw(c, "y", 0, one, L, pbytes, plen));
    nreq++;
    for (int l = 0; l < L; l++)
        one[l] = (dqc_raw_layer){.windows = 1, .records = e.rec[l] + wb, .records_bytes = wb};
    w1[2 + ROW + 3 * rk] ^= 0xff; /* key record 3's fp16 scale */
    w1[2 + ROW + 3 * rk + 1] = 0x7c;
    cr_assert_eq(dq_window_check(codec, w1), DQ_CORRUPT);
    FAILS(c, DQ_CORRUPT, put_raw(c, "y", W, one, L, pbytes, plen));
    nreq++;
    dqc_raw_result r = {0};
    dqc_seq sy = seq_of("y");
    OK(c, dqc_get_raw(c, &sy, 0, 0, &r));
    for (int l = 0; l < L; l++) {
        cr_assert_eq(r.layers[l].windows, 1, "layer %d changed by a refused PUT_RAW", l);
        cr_assert(memcmp(r.layers[l].records, e.rec[l], wb) == 0);
    }
    dqc_raw_result_free(&r);

    expect_absent(c, "x");
    cr_assert_eq(stat_counter(c, "put_raw_corrupt"), corrupt0 + 2);
    cr_assert_eq(stat_counter(c, "put_raw_requests"), req0 + nreq);
    char *body = get_metrics(), want[96];
    cr_assert(strstr(body, "dquant_put_raw_corrupt_total 2\n"), "%s", body);
    snprintf(want, sizeof want, "dquant_put_raw_requests_total %llu\n", (unsigned long long)(req0 + nreq));
    cr_assert(strstr(body, want), "%s", body);
    snprintf(want, sizeof want, "dquant_put_raw_bytes_total %llu\n", (unsigned long long)(L * wb));
    cr_assert(strstr(body, want), "no %s in %s", want, body);
    free(body);
    free(longt);
    enc_free(&e);
    free(k);
    free(v);
    dqc_free(c);
}

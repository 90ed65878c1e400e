/* bench_transfer: a prefill's KV cache moved from a prefill process into dquantd and out to a
 * decode process, as BF16 (the daemon encodes and decodes) vs as raw containers (the processes
 * encode and decode in-process with libdquant; the daemon stores the records as they come).
 *
 *   prefill, bf16  PUT the BF16 K/V of every layer, --put-layers layers per request (the daemon
 *                  encodes one layer per worker task).
 *   prefill, raw   encode in-process (--threads threads, one dq_workspace each, layers handed out
 *                  in order) and PUT_RAW each group of --put-layers layers as soon as it is encoded.
 *   decode, bf16   GET typed BF16, --put-layers layers per request; the replies are the KV.
 *   decode, raw    GET_RAW per group of layers, decoded to BF16 by the threads while the next
 *                  group is fetched.
 * Each side is timed end to end, from its first request (encode included) to the last byte of
 * BF16 in its memory. Then, untimed, the decode side checks its result against what the daemon
 * holds: raw path, the in-process decode equals the daemon's BF16 GET bit for bit; bf16 path, the
 * GET equals the in-process decode of the daemon's GET_RAW. It prints an FNV-1a digest of the
 * decoded K/V: the two paths decode the same input, so equal digests show the daemon's encoder and
 * libdquant's made the same containers.
 *
 * Data: per layer and channel c, K = mu_c + s_c·g and V = s'_c·g with g ~ N(0, 1) (a 4096-entry
 * table of Box-Muller samples indexed by a PCG stream), s_c = 0.5·exp(0.7·z_c), mu_c = 1.5·s_c·z'_c
 * (z, z' fixed per channel ~ N(0, 1)): outlier channels in K as in real models; rounded to BF16.
 *
 * Usage: bench_transfer --role prefill|decode|both [--path bf16|raw|both] [--connect ADDR]
 *          [--dquantd PATH] [--secret-file F] [--tokens 32768] [--layers 36] [--kv-heads 8]
 *          [--head-dim 128] [--q-heads 32] [--profile dq226] [--threads N] [--put-layers 4]
 *          [--seq NAME] [--keep] [--no-verify]
 * --role both runs prefill then decode of each path in one process (against --connect, or a
 * dquantd it starts from --dquantd / $DQUANTD on a private Unix socket) and prints the ratios
 * bf16_s / raw_s for prefill, decode and the total; it exits 1 when a check fails. With separate
 * roles, tests/bench/transfer_netns.sh computes them. Output: one JSON line per measurement. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dquant/client.h"
#include "dquant/dquant.h"
#include "dqd_child.h"

typedef struct opts {
    const char *role, *path, *connect, *dquantd, *secret_file, *profile, *seq;
    uint64_t tokens;
    uint32_t layers, kv_heads, head_dim, q_heads, put_layers;
    int threads, keep, verify;
} opts;

static opts O = {.role = NULL,
                 .path = "both",
                 .profile = "dq226",
                 .tokens = 32768,
                 .layers = 36,
                 .kv_heads = 8,
                 .head_dim = 128,
                 .q_heads = 32,
                 .put_layers = 4,
                 .verify = 1};
static dqd_daemon DAEMON;
static char SECRET[4097];
static size_t SECRET_LEN;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void stop_daemon(void)
{
    if (DAEMON.pid)
        dqd_stop(&DAEMON);
}

static void die(const char *what, dqc_client *c, int rc)
{
    fprintf(stderr, "bench_transfer: %s failed: %s: %s\n", what, dqc_err_name(rc), c ? dqc_last_error(c) : "");
    stop_daemon();
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_transfer: out of memory (%zu bytes)\n", n);
        stop_daemon();
        exit(1);
    }
    return p;
}

static dqc_client *connect_or_die(const char *addr)
{
    dqc_options o;
    dqc_options_default(&o);
    o.io_timeout_ms = 600000;
    o.client_name = "bench_transfer";
    if (SECRET_LEN) {
        o.secret = SECRET;
        o.secret_len = SECRET_LEN;
    }
    dqc_client *c = NULL;
    char err[256];
    if (dqc_connect_ex(addr, &o, &c, err, sizeof err)) {
        fprintf(stderr, "bench_transfer: connect %s: %s\n", addr, err);
        stop_daemon();
        exit(1);
    }
    return c;
}

/* ---- the data ---- */

static size_t NV;       /* kv_heads × head_dim */
static size_t LAYER_EL; /* tokens × NV: elements of K (or V) of one layer */
static float GTAB[4096];

static uint64_t pcg_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = *s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static double gauss(uint64_t *s)
{
    double u1 = ((double)(pcg_next(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(pcg_next(s) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static void gen_init(void)
{
    uint64_t s = 0x5eed;
    for (size_t i = 0; i < 4096; i++)
        GTAB[i] = (float)gauss(&s);
}

/* K and V ([tokens, NV] BF16) of layer l. */
static void gen_layer(uint32_t l, uint16_t *k, uint16_t *v)
{
    float *sk = xmalloc(NV * sizeof *sk), *mk = xmalloc(NV * sizeof *mk), *sv = xmalloc(NV * sizeof *sv);
    uint64_t s = 0x9E3779B97F4A7C15ull * (l + 1);
    for (size_t c = 0; c < NV; c++) {
        sk[c] = (float)(0.5 * exp(0.7 * gauss(&s)));
        mk[c] = (float)(1.5 * sk[c] * gauss(&s));
        sv[c] = (float)(0.5 * exp(0.7 * gauss(&s)));
    }
    uint64_t r = 0;
    unsigned left = 0;
    for (size_t t = 0; t < O.tokens; t++) {
        for (size_t c = 0; c < NV; c++) {
            for (int kind = 0; kind < 2; kind++) {
                if (!left) {
                    r = pcg_next(&s);
                    left = 5;
                }
                float g = GTAB[r & 4095];
                r >>= 12;
                left--;
                if (kind == 0)
                    k[t * NV + c] = dq_f32_to_bf16(mk[c] + sk[c] * g);
                else
                    v[t * NV + c] = dq_f32_to_bf16(sv[c] * g);
            }
        }
    }
    free(sk);
    free(mk);
    free(sv);
}

/* ---- a pool of threads working on layers in order, each as soon as it is ready ---- */

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t n, next;
    unsigned char *ready, *done;
    int failed;
    void (*fn)(int tid, size_t i, void *arg);
    void *arg;
    int nthreads;
    pthread_t *th;
} pool;

typedef struct pool_thread {
    pool *p;
    int tid;
} pool_thread;

static void *pool_main(void *a)
{
    pool_thread *pt = a;
    pool *p = pt->p;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->next < p->n && !p->ready[p->next])
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->next >= p->n) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        size_t i = p->next++;
        pthread_mutex_unlock(&p->mu);
        p->fn(pt->tid, i, p->arg);
        pthread_mutex_lock(&p->mu);
        p->done[i] = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    free(pt);
    return NULL;
}

static void pool_start(pool *p, size_t n, int all_ready, int nthreads, void (*fn)(int, size_t, void *), void *arg)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->n = n;
    p->ready = xmalloc(n);
    p->done = xmalloc(n);
    memset(p->ready, all_ready, n);
    memset(p->done, 0, n);
    p->fn = fn;
    p->arg = arg;
    p->nthreads = nthreads;
    p->th = xmalloc((size_t)nthreads * sizeof *p->th);
    for (int t = 0; t < nthreads; t++) {
        pool_thread *pt = xmalloc(sizeof *pt);
        pt->p = p;
        pt->tid = t;
        pthread_create(&p->th[t], NULL, pool_main, pt);
    }
}

static void pool_set_ready(pool *p, size_t first, size_t count)
{
    pthread_mutex_lock(&p->mu);
    memset(p->ready + first, 1, count);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void pool_wait(pool *p, size_t first, size_t count)
{
    pthread_mutex_lock(&p->mu);
    for (size_t i = first; i < first + count; i++)
        while (!p->done[i])
            pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void pool_join(pool *p)
{
    for (int t = 0; t < p->nthreads; t++)
        pthread_join(p->th[t], NULL);
    free(p->th);
    free(p->ready);
    free(p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}

/* ---- shared state of one run ---- */

typedef struct codec_set {
    dq_codec *codec;
    dq_workspace **ws; /* one per thread */
    size_t win_bytes, rb_k, rb_v, W;
    atomic_int rc; /* first codec failure */
} codec_set;

static void codec_set_make(codec_set *cs, const uint8_t *profile, size_t profile_len)
{
    dq_profile p;
    int rc = dq_profile_deserialize(profile, profile_len, &p);
    if (!rc)
        rc = dq_codec_create(&p, NULL, &cs->codec);
    if (rc)
        die("codec", NULL, rc);
    cs->ws = xmalloc((size_t)O.threads * sizeof *cs->ws);
    for (int t = 0; t < O.threads; t++)
        if ((rc = dq_workspace_create(cs->codec, &cs->ws[t])))
            die("workspace", NULL, rc);
    cs->win_bytes = dq_codec_window_bytes(cs->codec);
    cs->rb_k = dq_codec_record_bytes(cs->codec, DQ_KIND_K);
    cs->rb_v = dq_codec_record_bytes(cs->codec, DQ_KIND_V);
    cs->W = p.window;
    atomic_init(&cs->rc, 0);
}

static void codec_set_free(codec_set *cs)
{
    for (int t = 0; t < O.threads; t++)
        dq_workspace_free(cs->ws[t]);
    free(cs->ws);
    dq_codec_free(cs->codec);
}

static void codec_fail(codec_set *cs, int rc)
{
    int zero = 0;
    atomic_compare_exchange_strong(&cs->rc, &zero, rc);
}

static uint16_t **KD, **VD; /* prefill: the input, per layer */

static void gen_task(int tid, size_t l, void *arg)
{
    (void)tid;
    (void)arg;
    gen_layer((uint32_t)l, KD[l], VD[l]);
}

static void gen_all(void)
{
    KD = xmalloc(O.layers * sizeof *KD);
    VD = xmalloc(O.layers * sizeof *VD);
    for (uint32_t l = 0; l < O.layers; l++) {
        KD[l] = xmalloc(LAYER_EL * 2);
        VD[l] = xmalloc(LAYER_EL * 2);
    }
    pool p;
    pool_start(&p, O.layers, 1, O.threads, gen_task, NULL);
    pool_wait(&p, 0, O.layers);
    pool_join(&p);
}

static dqc_seq seq_of(const char *path, char *buf, size_t cap)
{
    if (O.seq)
        snprintf(buf, cap, "%s", O.seq);
    else
        snprintf(buf, cap, "xfer-%s", path);
    return (dqc_seq){.ns = "bench", .key = buf, .key_len = strlen(buf)};
}

static char MODEL[128];

static void register_model(dqc_client *c, dqc_model_info *info)
{
    snprintf(MODEL, sizeof MODEL, "xfer-%s-%ux%u", O.profile, O.kv_heads, O.head_dim);
    dqc_model_spec spec = {.name = MODEL,
                           .layers = O.layers,
                           .q_heads = O.q_heads,
                           .kv_heads = O.kv_heads,
                           .head_dim = O.head_dim,
                           .profile_name = O.profile};
    int rc = dqc_register_model(c, &spec, info);
    if (rc)
        die("REGISTER_MODEL", c, rc);
}

static void print_shape(void)
{
    printf("\"tokens\":%llu,\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"q_heads\":%u,\"profile\":\"%s\","
           "\"threads\":%d,\"put_layers\":%u",
           (unsigned long long)O.tokens, O.layers, O.kv_heads, O.head_dim, O.q_heads, O.profile, O.threads,
           O.put_layers);
}

/* ---- prefill ---- */

static double prefill_bf16(const char *addr)
{
    dqc_client *c = connect_or_die(addr);
    char kb[128];
    dqc_seq seq = seq_of("bf16", kb, sizeof kb);
    dqc_delete(c, &seq);
    /* The request's tensors are [num_layers, tokens, ...]: a group's layers are copied next to each
     * other once, outside the timing, as an engine's KV cache would already hold them. */
    size_t gmax = O.put_layers;
    size_t ngroups = (O.layers + gmax - 1) / gmax;
    uint16_t **gk = xmalloc(ngroups * sizeof *gk), **gv = xmalloc(ngroups * sizeof *gv);
    for (size_t g = 0; g < ngroups; g++) {
        size_t first = g * gmax, n = O.layers - first < gmax ? O.layers - first : gmax;
        gk[g] = xmalloc(n * LAYER_EL * 2);
        gv[g] = xmalloc(n * LAYER_EL * 2);
        for (size_t i = 0; i < n; i++) {
            memcpy(gk[g] + i * LAYER_EL, KD[first + i], LAYER_EL * 2);
            memcpy(gv[g] + i * LAYER_EL, VD[first + i], LAYER_EL * 2);
            free(KD[first + i]);
            free(VD[first + i]);
            KD[first + i] = VD[first + i] = NULL;
        }
    }
    dqc_model_info info;
    double t0 = now_s();
    register_model(c, &info);
    uint64_t stored = 0;
    for (size_t g = 0; g < ngroups; g++) {
        size_t first = g * gmax, n = O.layers - first < gmax ? O.layers - first : gmax;
        dqc_put_args a = {.seq = seq,
                          .model = MODEL,
                          .start_token = 0,
                          .first_layer = (uint32_t)first,
                          .num_layers = (uint32_t)n,
                          .tokens = O.tokens,
                          .kv_heads = O.kv_heads,
                          .head_dim = O.head_dim,
                          .dtype = DQ_DTYPE_BF16,
                          .k = gk[g],
                          .v = gv[g]};
        dqc_put_result r;
        int rc = dqc_put(c, &a, &r);
        if (rc)
            die("PUT", c, rc);
        stored = r.stored_bytes;
    }
    double dt = now_s() - t0;
    for (size_t g = 0; g < ngroups; g++) {
        free(gk[g]);
        free(gv[g]);
    }
    free(gk);
    free(gv);
    free(KD);
    free(VD);
    KD = VD = NULL;
    printf("{\"bench\":\"transfer\",\"role\":\"prefill\",\"path\":\"bf16\",");
    print_shape();
    printf(",\"seconds\":%.4f,\"sent_bytes\":%llu,\"stored_bytes\":%llu}\n", dt,
           (unsigned long long)(2 * (uint64_t)O.layers * LAYER_EL * 2), (unsigned long long)stored);
    fflush(stdout);
    dqc_free(c);
    return dt;
}

static void free_input(void)
{
    for (uint32_t l = 0; l < O.layers; l++) {
        free(KD[l]);
        free(VD[l]);
    }
    free(KD);
    free(VD);
    KD = VD = NULL;
}

typedef struct enc_ctx {
    codec_set cs;
    uint8_t **rec; /* per layer: windows records back to back */
    size_t windows;
} enc_ctx;

static void encode_task(int tid, size_t l, void *arg)
{
    enc_ctx *e = arg;
    codec_set *cs = &e->cs;
    for (size_t w = 0; w < e->windows; w++) {
        size_t off = w * cs->W * NV;
        int rc = dq_window_encode(cs->codec, cs->ws[tid], KD[l] + off, VD[l] + off, DQ_DTYPE_BF16,
                                  e->rec[l] + w * cs->win_bytes, NULL);
        if (rc) {
            codec_fail(cs, rc);
            return;
        }
    }
}

static double prefill_raw(const char *addr)
{
    dqc_client *c = connect_or_die(addr);
    char kb[128];
    dqc_seq seq = seq_of("raw", kb, sizeof kb);
    dqc_delete(c, &seq);
    dqc_model_info info;
    double t0 = now_s();
    register_model(c, &info);
    enc_ctx e;
    memset(&e, 0, sizeof e);
    codec_set_make(&e.cs, info.profile, info.profile_len);
    e.windows = O.tokens / e.cs.W;
    size_t tail = O.tokens - e.windows * e.cs.W;
    e.rec = xmalloc(O.layers * sizeof *e.rec);
    for (uint32_t l = 0; l < O.layers; l++)
        e.rec[l] = xmalloc(e.windows * e.cs.win_bytes);
    pool p;
    pool_start(&p, O.layers, 1, O.threads, encode_task, &e);
    dqc_raw_layer *rl = xmalloc(O.put_layers * sizeof *rl);
    uint64_t sent = 0, stored = 0;
    double t_enc_wait = 0;
    for (uint32_t first = 0; first < O.layers; first += O.put_layers) {
        uint32_t n = O.layers - first < O.put_layers ? O.layers - first : O.put_layers;
        double tw = now_s();
        pool_wait(&p, first, n);
        t_enc_wait += now_s() - tw;
        if (atomic_load(&e.cs.rc))
            die("encode", NULL, atomic_load(&e.cs.rc));
        for (uint32_t i = 0; i < n; i++) {
            uint32_t l = first + i;
            rl[i] = (dqc_raw_layer){.layer = l,
                                    .tokens = O.tokens,
                                    .windows = e.windows,
                                    .records = e.rec[l],
                                    .records_bytes = e.windows * e.cs.win_bytes,
                                    .tail_tokens = tail,
                                    .tail_k = tail ? KD[l] + e.windows * e.cs.W * NV : NULL,
                                    .tail_v = tail ? VD[l] + e.windows * e.cs.W * NV : NULL,
                                    .tail_bytes = tail * NV * 2};
            sent += rl[i].records_bytes + 2 * rl[i].tail_bytes;
        }
        dqc_put_raw_args a = {.seq = seq,
                              .model = MODEL,
                              .start_token = 0,
                              .first_layer = first,
                              .layers = rl,
                              .nlayers = n,
                              .profile = info.profile,
                              .profile_len = info.profile_len};
        dqc_put_result r;
        int rc = dqc_put_raw(c, &a, &r);
        if (rc)
            die("PUT_RAW", c, rc);
        stored = r.stored_bytes;
    }
    double dt = now_s() - t0;
    pool_join(&p);
    printf("{\"bench\":\"transfer\",\"role\":\"prefill\",\"path\":\"raw\",");
    print_shape();
    printf(",\"seconds\":%.4f,\"encode_wait_s\":%.4f,\"sent_bytes\":%llu,\"stored_bytes\":%llu}\n", dt, t_enc_wait,
           (unsigned long long)sent, (unsigned long long)stored);
    fflush(stdout);
    for (uint32_t l = 0; l < O.layers; l++)
        free(e.rec[l]);
    free(e.rec);
    free(rl);
    codec_set_free(&e.cs);
    free_input();
    dqc_free(c);
    return dt;
}

/* ---- decode ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

typedef struct dec_ctx {
    codec_set cs;
    dqc_raw_result *res; /* per group */
    uint16_t **k, **v;   /* per layer: the decoded K/V */
} dec_ctx;

static void decode_task(int tid, size_t l, void *arg)
{
    dec_ctx *d = arg;
    codec_set *cs = &d->cs;
    const dqc_raw_layer *rl = &d->res[l / O.put_layers].layers[l % O.put_layers];
    if (rl->tokens != O.tokens) {
        codec_fail(cs, DQ_SHAPE);
        return;
    }
    for (size_t w = 0; w < rl->windows; w++) {
        const uint8_t *win = rl->records + w * cs->win_bytes;
        size_t off = w * cs->W * NV;
        int rc = dq_tokens_decode(cs->codec, cs->ws[tid], DQ_KIND_K, dq_window_mean(cs->codec, win),
                                  dq_window_record(cs->codec, win, DQ_KIND_K, 0), cs->rb_k, cs->W, d->k[l] + off,
                                  DQ_DTYPE_BF16);
        if (!rc)
            rc = dq_tokens_decode(cs->codec, cs->ws[tid], DQ_KIND_V, NULL,
                                  dq_window_record(cs->codec, win, DQ_KIND_V, 0), cs->rb_v, cs->W, d->v[l] + off,
                                  DQ_DTYPE_BF16);
        if (rc) {
            codec_fail(cs, rc);
            return;
        }
    }
    size_t off = rl->windows * cs->W * NV;
    memcpy(d->k[l] + off, rl->tail_k, rl->tail_bytes);
    memcpy(d->v[l] + off, rl->tail_v, rl->tail_bytes);
}

/* Fetches every group with GET_RAW into d->res and decodes it into d->k / d->v on the pool,
 * group g + 1 travelling while group g decodes. Returns the bytes received. */
static uint64_t raw_fetch_decode(dqc_client *c, const dqc_seq *seq, dec_ctx *d, double *t_codec)
{
    size_t ngroups = (O.layers + O.put_layers - 1) / O.put_layers;
    d->res = calloc(ngroups, sizeof *d->res);
    uint64_t got = 0;
    pool p;
    int started = 0;
    for (size_t g = 0; g < ngroups; g++) {
        uint32_t first = (uint32_t)(g * O.put_layers);
        uint32_t n = O.layers - first < O.put_layers ? O.layers - first : O.put_layers;
        int rc = dqc_get_raw(c, seq, first, n, &d->res[g]);
        if (rc)
            die("GET_RAW", c, rc);
        if (d->res[g].nlayers != n)
            die("GET_RAW (layer count)", c, DQ_SHAPE);
        for (uint32_t i = 0; i < n; i++)
            got += d->res[g].layers[i].records_bytes + 2 * d->res[g].layers[i].tail_bytes;
        if (!started) {
            double tc = now_s();
            codec_set_make(&d->cs, d->res[0].profile, d->res[0].profile_len);
            *t_codec = now_s() - tc;
            pool_start(&p, O.layers, 0, O.threads, decode_task, d);
            started = 1;
        }
        pool_set_ready(&p, first, n);
    }
    pool_wait(&p, 0, O.layers);
    pool_join(&p);
    if (atomic_load(&d->cs.rc))
        die("decode", NULL, atomic_load(&d->cs.rc));
    return got;
}

static void dec_ctx_free(dec_ctx *d)
{
    size_t ngroups = (O.layers + O.put_layers - 1) / O.put_layers;
    for (size_t g = 0; g < ngroups; g++)
        dqc_raw_result_free(&d->res[g]);
    free(d->res);
    codec_set_free(&d->cs);
}

static int CHECK_FAILED;

static void report_check(const char *path, const char *what, int ok, uint64_t digest)
{
    printf("{\"bench\":\"transfer\",\"role\":\"decode\",\"path\":\"%s\",\"check\":\"%s\",\"identical\":%s,"
           "\"digest\":\"%016llx\"}\n",
           path, what, ok ? "true" : "false", (unsigned long long)digest);
    fflush(stdout);
    if (!ok) {
        fprintf(stderr, "bench_transfer: %s path: %s differs\n", path, what);
        CHECK_FAILED = 1;
    }
}

static double decode_bf16(const char *addr, uint64_t *digest)
{
    dqc_client *c = connect_or_die(addr);
    char kb[128];
    dqc_seq seq = seq_of("bf16", kb, sizeof kb);
    size_t ngroups = (O.layers + O.put_layers - 1) / O.put_layers;
    dqc_get_result *res = calloc(ngroups, sizeof *res);
    double t0 = now_s();
    for (size_t g = 0; g < ngroups; g++) {
        uint32_t first = (uint32_t)(g * O.put_layers);
        uint32_t n = O.layers - first < O.put_layers ? O.layers - first : O.put_layers;
        dqc_get_args a = {.seq = seq, .first_layer = first, .num_layers = n, .dtype = DQ_DTYPE_BF16};
        int rc = dqc_get(c, &a, &res[g]);
        if (rc)
            die("GET", c, rc);
        if (res[g].tokens != O.tokens || res[g].num_layers != n)
            die("GET (shape)", c, DQ_SHAPE);
    }
    double dt = now_s() - t0;
    printf("{\"bench\":\"transfer\",\"role\":\"decode\",\"path\":\"bf16\",");
    print_shape();
    printf(",\"seconds\":%.4f,\"received_bytes\":%llu}\n", dt,
           (unsigned long long)(2 * (uint64_t)O.layers * LAYER_EL * 2));
    fflush(stdout);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t g = 0; g < ngroups; g++)
        for (uint32_t i = 0; i < res[g].num_layers; i++) {
            h = fnv1a(h, (const uint16_t *)res[g].k + i * LAYER_EL, LAYER_EL * 2);
            h = fnv1a(h, (const uint16_t *)res[g].v + i * LAYER_EL, LAYER_EL * 2);
        }
    *digest = h;
    if (O.verify) {
        /* The daemon's GET against libdquant's decode of the daemon's containers. */
        dec_ctx d;
        memset(&d, 0, sizeof d);
        d.k = xmalloc(O.layers * sizeof *d.k);
        d.v = xmalloc(O.layers * sizeof *d.v);
        for (uint32_t l = 0; l < O.layers; l++) {
            d.k[l] = xmalloc(LAYER_EL * 2);
            d.v[l] = xmalloc(LAYER_EL * 2);
        }
        double tc;
        raw_fetch_decode(c, &seq, &d, &tc);
        int ok = 1;
        for (uint32_t l = 0; l < O.layers; l++) {
            const dqc_get_result *r = &res[l / O.put_layers];
            size_t i = l % O.put_layers;
            ok &= !memcmp((const uint16_t *)r->k + i * LAYER_EL, d.k[l], LAYER_EL * 2);
            ok &= !memcmp((const uint16_t *)r->v + i * LAYER_EL, d.v[l], LAYER_EL * 2);
            free(d.k[l]);
            free(d.v[l]);
        }
        free(d.k);
        free(d.v);
        dec_ctx_free(&d);
        report_check("bf16", "get_vs_local_decode_of_get_raw", ok, h);
    } else {
        report_check("bf16", "none", 1, h);
    }
    for (size_t g = 0; g < ngroups; g++)
        dqc_get_result_free(&res[g]);
    free(res);
    if (!O.keep)
        dqc_delete(c, &seq);
    dqc_free(c);
    return dt;
}

static double decode_raw(const char *addr, uint64_t *digest)
{
    dqc_client *c = connect_or_die(addr);
    char kb[128];
    dqc_seq seq = seq_of("raw", kb, sizeof kb);
    dec_ctx d;
    memset(&d, 0, sizeof d);
    /* The destination (the engine's KV cache) exists before the transfer, as the GET replies'
     * memory of the bf16 path is allocated by the client library inside its timing. */
    d.k = xmalloc(O.layers * sizeof *d.k);
    d.v = xmalloc(O.layers * sizeof *d.v);
    for (uint32_t l = 0; l < O.layers; l++) {
        d.k[l] = xmalloc(LAYER_EL * 2);
        d.v[l] = xmalloc(LAYER_EL * 2);
        memset(d.k[l], 0, LAYER_EL * 2);
        memset(d.v[l], 0, LAYER_EL * 2);
    }
    double t0 = now_s(), tc = 0;
    uint64_t got = raw_fetch_decode(c, &seq, &d, &tc);
    double dt = now_s() - t0;
    printf("{\"bench\":\"transfer\",\"role\":\"decode\",\"path\":\"raw\",");
    print_shape();
    printf(",\"seconds\":%.4f,\"received_bytes\":%llu}\n", dt, (unsigned long long)got);
    fflush(stdout);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t l = 0; l < O.layers; l++) {
        h = fnv1a(h, d.k[l], LAYER_EL * 2);
        h = fnv1a(h, d.v[l], LAYER_EL * 2);
    }
    *digest = h;
    if (O.verify) {
        /* The in-process decode against the daemon's own BF16 GET of the same containers. */
        int ok = 1;
        dqc_get_result r = {0};
        for (uint32_t first = 0; first < O.layers; first += O.put_layers) {
            uint32_t n = O.layers - first < O.put_layers ? O.layers - first : O.put_layers;
            dqc_get_args a = {.seq = seq, .first_layer = first, .num_layers = n, .dtype = DQ_DTYPE_BF16};
            int rc = dqc_get(c, &a, &r);
            if (rc)
                die("GET (check)", c, rc);
            for (uint32_t i = 0; i < n; i++) {
                ok &= r.tokens == O.tokens;
                ok &= !memcmp((const uint16_t *)r.k + i * LAYER_EL, d.k[first + i], LAYER_EL * 2);
                ok &= !memcmp((const uint16_t *)r.v + i * LAYER_EL, d.v[first + i], LAYER_EL * 2);
            }
        }
        dqc_get_result_free(&r);
        report_check("raw", "local_decode_vs_get", ok, h);
    } else {
        report_check("raw", "none", 1, h);
    }
    for (uint32_t l = 0; l < O.layers; l++) {
        free(d.k[l]);
        free(d.v[l]);
    }
    free(d.k);
    free(d.v);
    dec_ctx_free(&d);
    if (!O.keep)
        dqc_delete(c, &seq);
    dqc_free(c);
    return dt;
}

/* ---- main ---- */

static void usage(void)
{
    fprintf(stderr, "usage: bench_transfer --role prefill|decode|both [--path bf16|raw|both] [--connect ADDR]\n"
                    "         [--dquantd PATH] [--secret-file F] [--tokens N] [--layers N] [--kv-heads N]\n"
                    "         [--head-dim N] [--q-heads N] [--profile NAME] [--threads N] [--put-layers N]\n"
                    "         [--seq NAME] [--keep] [--no-verify]\n");
}

static void read_secret(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    SECRET_LEN = fread(SECRET, 1, sizeof SECRET - 1, f);
    fclose(f);
    if (SECRET_LEN && SECRET[SECRET_LEN - 1] == '\n')
        SECRET_LEN--;
}

int main(int argc, char **argv)
{
    O.dquantd = getenv("DQUANTD");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    O.threads = ncpu > 0 ? (int)ncpu : 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--role") && val)
            O.role = val;
        else if (!strcmp(a, "--path") && val)
            O.path = val;
        else if (!strcmp(a, "--connect") && val)
            O.connect = val;
        else if (!strcmp(a, "--dquantd") && val)
            O.dquantd = val;
        else if (!strcmp(a, "--secret-file") && val)
            O.secret_file = val;
        else if (!strcmp(a, "--tokens") && val)
            O.tokens = strtoull(val, NULL, 10);
        else if (!strcmp(a, "--layers") && val)
            O.layers = (uint32_t)atoi(val);
        else if (!strcmp(a, "--kv-heads") && val)
            O.kv_heads = (uint32_t)atoi(val);
        else if (!strcmp(a, "--head-dim") && val)
            O.head_dim = (uint32_t)atoi(val);
        else if (!strcmp(a, "--q-heads") && val)
            O.q_heads = (uint32_t)atoi(val);
        else if (!strcmp(a, "--profile") && val)
            O.profile = val;
        else if (!strcmp(a, "--threads") && val)
            O.threads = atoi(val);
        else if (!strcmp(a, "--put-layers") && val)
            O.put_layers = (uint32_t)atoi(val);
        else if (!strcmp(a, "--seq") && val)
            O.seq = val;
        else {
            takes = 0;
            if (!strcmp(a, "--keep"))
                O.keep = 1;
            else if (!strcmp(a, "--no-verify"))
                O.verify = 0;
            else if (!strcmp(a, "--help")) {
                usage();
                return 0;
            } else {
                usage();
                return 2;
            }
        }
        i += takes;
    }
    int pb = !strcmp(O.path, "bf16") || !strcmp(O.path, "both");
    int pr = !strcmp(O.path, "raw") || !strcmp(O.path, "both");
    int rp = O.role && (!strcmp(O.role, "prefill") || !strcmp(O.role, "both"));
    int rd = O.role && (!strcmp(O.role, "decode") || !strcmp(O.role, "both"));
    if ((!pb && !pr) || (!rp && !rd) || !O.tokens || !O.layers || !O.kv_heads || !O.head_dim || O.threads < 1 ||
        O.put_layers < 1) {
        usage();
        return 2;
    }
    if (O.secret_file)
        read_secret(O.secret_file);
    NV = (size_t)O.kv_heads * O.head_dim;
    LAYER_EL = O.tokens * NV;
    const char *addr = O.connect;
    if (!addr) {
        if (strcmp(O.role, "both")) {
            fprintf(stderr, "bench_transfer: --role %s needs --connect\n", O.role);
            return 2;
        }
        if (!O.dquantd) {
            fprintf(stderr, "bench_transfer: no daemon: give --connect ADDR or --dquantd PATH ($DQUANTD)\n");
            return 2;
        }
        const char *extra[] = {"--host-memory", "16G", "--max-payload", "2G", "--max-frame", "3G", NULL};
        const dqd_opts o = {.bin = O.dquantd, .extra = extra};
        if (dqd_start(&DAEMON, &o))
            return 1;
        addr = DAEMON.addr;
    }
    gen_init();
    double tp[2] = {0, 0}, td[2] = {0, 0};
    uint64_t dg[2] = {0, 0};
    for (int path = 0; path < 2; path++) {
        if (!(path ? pr : pb))
            continue;
        if (rp) {
            gen_all();
            tp[path] = path ? prefill_raw(addr) : prefill_bf16(addr);
        }
        if (rd)
            td[path] = path ? decode_raw(addr, &dg[path]) : decode_bf16(addr, &dg[path]);
    }
    if (pb && pr && rd) {
        int same = dg[0] == dg[1];
        printf("{\"bench\":\"transfer\",\"check\":\"bf16_digest_eq_raw_digest\",\"identical\":%s}\n",
               same ? "true" : "false");
        if (!same) {
            fprintf(stderr, "bench_transfer: the two paths decoded different K/V\n");
            CHECK_FAILED = 1;
        }
    }
    if (pb && pr && rp && rd) {
        printf("{\"bench\":\"transfer\",\"ratios\":\"bf16_s/raw_s\",");
        print_shape();
        printf(",\"prefill\":%.3f,\"decode\":%.3f,\"total\":%.3f}\n", tp[0] / tp[1], td[0] / td[1],
               (tp[0] + td[0]) / (tp[1] + td[1]));
    }
    stop_daemon();
    return CHECK_FAILED ? 1 : 0;
}

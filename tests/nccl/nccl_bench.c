/* The NCCL data path on a two-GPU host: this process is the client on one GPU, dquantd (started by
 * tests/nccl/nccl_gpu.sh) runs on the other.
 *
 *   nccl_bench --addr unix:/path [options]     benchmark + checks (JSON lines on stdout, table on stderr)
 *   nccl_bench --failure-tests --addr ...      clients that die or stall mid-transfer; the daemon survives
 *   nccl_bench --raw-peer ... / --die-mid-put MODE ...   internal: the children the two modes above start
 *
 * Benchmark, on a Qwen3-8B-shaped model (36 layers, 32 query heads, 8 KV heads × 128, dq226) and a
 * 32K-token BF16 prefill held on the client GPU (generated once, ~N(0,1), deterministic):
 *   put     dqc_put_dev (NCCL) vs dqc_put (socket, from host memory), per group of layers per call
 *   get     dqc_get_dev vs dqc_get; results byte-identical (device result copied back to compare)
 *   raw     plain ncclSend/ncclRecv of the same bytes in the same chunks between the two GPUs, with a
 *           peer process on the daemon's GPU (--raw-peer; ncclUniqueId through a file): the ceiling
 *   attend  dqc_attend_dev vs dqc_attend: one decode step = one ATTEND per layer; outputs identical;
 *           then steps with appends on two copies of the sequence, one per path: identical again
 * Times are wall clock around synchronous calls (each call returns after its transfers finished),
 * warm-up first, medians of the repetitions. GB/s counts BF16 bytes moved (K + V). */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dquant.pb-c.h"
#include "dquant/client.h"
#include "dquant/client_nccl.h"
#include "wire.h"

extern char **environ;

#define MODEL "qwen3-8b-nccl-bench"
#define Q_HEADS 32
#define KV_HEADS 8
#define HEAD_DIM 128
#define ROW_ELEMS ((size_t)KV_HEADS * HEAD_DIM) /* one token of one layer */

/* ---- options ---- */

typedef struct opts {
    const char *addr;
    int device, peer_device;
    uint64_t tokens;
    uint32_t layers;
    int groups[8]; /* layers per call */
    int ngroups;
    int reps, warmup;
    int batches[8];
    int nbatches;
    int attend_steps;
    int append_steps;
    int skip_raw;
    int io_timeout_ms;
    /* internal modes */
    int raw_peer;
    const char *id_file;
    int failure_tests;
    const char *die_mode; /* before | partial | stall */
    const char *key;
} opts;

static int failures;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nccl_bench[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* A failed check: one JSON line saying what and why, and a non-zero exit in the end. */
static void fail_json(const char *step, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_json(const char *step, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 32)
            *p = '\'';
    printf("{\"step\":\"%s\",\"ok\":false,\"error\":\"%s\"}\n", step, msg);
    fflush(stdout);
    say("FAILED %s: %s", step, msg);
    failures++;
}

#define CUDA_OR_DIE(x)                                                                         \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fail_json("cuda", "%s:%d %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

#define NCCL_OR_DIE(x)                                                                         \
    do {                                                                                       \
        ncclResult_t r_ = (x);                                                                 \
        if (r_ != ncclSuccess && r_ != ncclInProgress) {                                       \
            fail_json("nccl", "%s:%d %s: %s", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void usage(void)
{
    fprintf(stderr, "usage: nccl_bench --addr unix:/path [--device N] [--peer-device N] [--tokens N] [--layers N]\n"
                    "                  [--groups 1,12] [--reps N] [--warmup N] [--batches 1,32] [--attend-steps N]\n"
                    "                  [--append-steps N] [--skip-raw] [--io-timeout-ms N]\n"
                    "       nccl_bench --failure-tests --addr unix:/path [--device N]\n");
    exit(64);
}

static void parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = 0;
    o->peer_device = 1;
    o->tokens = 32768;
    o->layers = 36;
    o->ngroups = parse_list("1,12", o->groups, 8);
    o->reps = 3;
    o->warmup = 1;
    o->nbatches = parse_list("1,32", o->batches, 8);
    o->attend_steps = 10;
    o->append_steps = 2;
    o->io_timeout_ms = 120000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
        if (ARG("--addr"))
            o->addr = v;
        else if (ARG("--device"))
            o->device = atoi(v);
        else if (ARG("--peer-device"))
            o->peer_device = atoi(v);
        else if (ARG("--tokens"))
            o->tokens = strtoull(v, NULL, 10);
        else if (ARG("--layers"))
            o->layers = (uint32_t)atoi(v);
        else if (ARG("--groups"))
            o->ngroups = parse_list(v, o->groups, 8);
        else if (ARG("--reps"))
            o->reps = atoi(v);
        else if (ARG("--warmup"))
            o->warmup = atoi(v);
        else if (ARG("--batches"))
            o->nbatches = parse_list(v, o->batches, 8);
        else if (ARG("--attend-steps"))
            o->attend_steps = atoi(v);
        else if (ARG("--append-steps"))
            o->append_steps = atoi(v);
        else if (ARG("--io-timeout-ms"))
            o->io_timeout_ms = atoi(v);
        else if (ARG("--id-file"))
            o->id_file = v;
        else if (ARG("--die-mid-put"))
            o->die_mode = v;
        else if (ARG("--key"))
            o->key = v;
        else if (strcmp(a, "--skip-raw") == 0)
            o->skip_raw = 1;
        else if (strcmp(a, "--raw-peer") == 0)
            o->raw_peer = 1;
        else if (strcmp(a, "--failure-tests") == 0)
            o->failure_tests = 1;
        else
            usage();
#undef ARG
    }
    if (o->ngroups <= 0 || o->nbatches <= 0 || o->reps < 1 || o->warmup < 0 || !o->tokens || !o->layers)
        usage();
    if (!o->raw_peer && !o->addr)
        usage();
}

/* ---- data ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even; inputs are finite */
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of stream `seed`: the sum of four 16-bit uniforms of one hash, centred and scaled to
 * unit variance (Irwin–Hall, within ±3.5): close enough to N(0,1) for the codec, and cheap. */
static uint16_t gauss_bf16(uint64_t seed, uint64_t i)
{
    uint64_t h = mix64(seed * 0xD1B54A32D192ED03ull ^ i);
    double s = (double)(h & 0xFFFF) + (double)((h >> 16) & 0xFFFF) + (double)((h >> 32) & 0xFFFF) + (double)(h >> 48);
    double u = s / 65536.0 - 2.0;
    return f32_to_bf16((float)(u * 1.7320508075688772));
}

typedef struct gen_job {
    uint16_t *dst;
    uint64_t seed, begin, end;
} gen_job;

static void *gen_thread(void *arg)
{
    gen_job *j = arg;
    for (uint64_t i = j->begin; i < j->end; i++)
        j->dst[i] = gauss_bf16(j->seed, i);
    return NULL;
}

static void fill_gauss(uint16_t *dst, uint64_t n, uint64_t seed)
{
    long nt = sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > 64)
        nt = 64;
    pthread_t th[64];
    gen_job jobs[64];
    for (long t = 0; t < nt; t++) {
        jobs[t] = (gen_job){dst, seed, n * (uint64_t)t / (uint64_t)nt, n * (uint64_t)(t + 1) / (uint64_t)nt};
        pthread_create(&th[t], NULL, gen_thread, &jobs[t]);
    }
    for (long t = 0; t < nt; t++)
        pthread_join(th[t], NULL);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fail_json("alloc", "no memory for %zu bytes", n);
        exit(2);
    }
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- results ---- */

#define MAX_ROWS 64
typedef struct row {
    char what[24];
    int param;                      /* layers per call, or batch */
    double socket_s, nccl_s, raw_s; /* medians; 0: not measured */
    double bytes;
} row;

static row rows[MAX_ROWS];
static int nrows;

static row *row_get(const char *what, int param, double bytes)
{
    for (int i = 0; i < nrows; i++)
        if (strcmp(rows[i].what, what) == 0 && rows[i].param == param)
            return &rows[i];
    if (nrows == MAX_ROWS)
        return &rows[MAX_ROWS - 1];
    row *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s", what);
    r->param = param;
    r->bytes = bytes;
    return r;
}

static void emit(const char *bench, const char *path, const char *pname, int param, double bytes, int calls,
                 double *times, int n)
{
    double mn = times[0];
    for (int i = 1; i < n; i++)
        mn = times[i] < mn ? times[i] : mn;
    double med = median(times, n);
    printf("{\"bench\":\"%s\",\"path\":\"%s\",\"%s\":%d,\"calls\":%d,\"bytes\":%.0f,\"reps\":%d,"
           "\"median_s\":%.6f,\"min_s\":%.6f,\"gbps\":%.3f,\"us_per_call\":%.1f}\n",
           bench, path, pname, param, calls, bytes, n, med, mn, bytes / med / 1e9, med / calls * 1e6);
    fflush(stdout);
    row *r = row_get(bench, param, bytes);
    if (strcmp(path, "socket") == 0)
        r->socket_s = med;
    else if (strcmp(path, "nccl") == 0)
        r->nccl_s = med;
    else
        r->raw_s = med;
}

static void emit_ratios(void)
{
    for (int i = 0; i < nrows; i++) {
        row *r = &rows[i];
        if (r->socket_s > 0 && r->nccl_s > 0)
            printf("{\"bench\":\"%s\",\"param\":%d,\"ratio\":\"nccl_speedup_over_socket\",\"value\":%.3f}\n", r->what,
                   r->param, r->socket_s / r->nccl_s);
        if (r->raw_s > 0 && r->nccl_s > 0)
            printf("{\"bench\":\"%s\",\"param\":%d,\"ratio\":\"nccl_fraction_of_raw\",\"value\":%.3f}\n", r->what,
                   r->param, r->raw_s / r->nccl_s);
    }
    fflush(stdout);
}

static void print_table(void)
{
    fprintf(stderr, "\n%-8s %7s %12s %12s %12s %12s %10s %10s\n", "bench", "param", "MB/call", "socket", "nccl",
            "raw nccl", "nccl/sock", "nccl/raw");
    fprintf(stderr, "%-8s %7s %12s %12s %12s %12s %10s %10s\n", "", "", "", "GB/s", "GB/s", "GB/s", "speedup",
            "fraction");
    for (int i = 0; i < nrows; i++) {
        row *r = &rows[i];
        int is_attend = strncmp(r->what, "attend", 6) == 0;
        char s[3][32];
        double t[3] = {r->socket_s, r->nccl_s, r->raw_s};
        for (int k = 0; k < 3; k++) {
            if (t[k] <= 0)
                snprintf(s[k], sizeof s[k], "-");
            else if (is_attend)
                snprintf(s[k], sizeof s[k], "%.0f us/step", t[k] * 1e6);
            else
                snprintf(s[k], sizeof s[k], "%.2f", r->bytes / t[k] / 1e9);
        }
        char sp[16] = "-", fr[16] = "-";
        if (r->socket_s > 0 && r->nccl_s > 0)
            snprintf(sp, sizeof sp, "%.2fx", r->socket_s / r->nccl_s);
        if (r->raw_s > 0 && r->nccl_s > 0)
            snprintf(fr, sizeof fr, "%.2f", r->raw_s / r->nccl_s);
        fprintf(stderr, "%-8s %7d %12s %12s %12s %12s %10s %10s\n", r->what, r->param, is_attend ? "-" : "", s[0], s[1],
                s[2], sp, fr);
    }
    fprintf(stderr, "(param: layers per call for put/get/raw, batch for attend; attend rows: one decode step = one "
                    "ATTEND per layer)\n\n");
}

/* ---- helpers around the client ---- */

static dqc_client *connect_or_die(const opts *o)
{
    dqc_options co;
    dqc_options_default(&co);
    co.io_timeout_ms = o->io_timeout_ms;
    co.client_name = "nccl_bench";
    co.auto_reconnect = 0; /* a reconnect would void the communicator: show it instead */
    dqc_client *c = NULL;
    char err[512];
    int rc = dqc_connect_ex(o->addr, &co, &c, err, sizeof err);
    if (rc) {
        fail_json("connect", "%s: %s: %s", o->addr, dqc_err_name(rc), err);
        exit(2);
    }
    return c;
}

static void setup_or_die(dqc_client *c, int device)
{
    double t0 = now_s();
    int rc = dqc_nccl_setup(c, device);
    if (rc) {
        dqc_server_info si;
        dqc_server(c, &si);
        char feats[256] = "";
        for (size_t i = 0; i < si.nfeatures; i++)
            snprintf(feats + strlen(feats), sizeof feats - strlen(feats), "%s%s", i ? "," : "", si.features[i]);
        fail_json("nccl_setup", "%s: %s (server backend %s, features [%s])", dqc_err_name(rc), dqc_last_error(c),
                  si.backend, feats);
        exit(2);
    }
    printf("{\"step\":\"nccl_setup\",\"ok\":true,\"device\":%d,\"seconds\":%.3f}\n", device, now_s() - t0);
    fflush(stdout);
}

static dqc_seq seq_of(const char *key)
{
    dqc_seq s = {.ns = "nccl-bench", .key = key, .key_len = strlen(key)};
    return s;
}

static void register_or_die(dqc_client *c, uint32_t layers)
{
    dqc_model_spec m = {.name = MODEL,
                        .layers = layers,
                        .q_heads = Q_HEADS,
                        .kv_heads = KV_HEADS,
                        .head_dim = HEAD_DIM,
                        .profile_name = "dq226"};
    dqc_model_info info;
    int rc = dqc_register_model(c, &m, &info);
    if (rc) {
        fail_json("register_model", "%s: %s", dqc_err_name(rc), dqc_last_error(c));
        exit(2);
    }
}

typedef struct prefill {
    uint64_t tokens;
    uint32_t layers;
    size_t layer_bytes; /* one layer of K (or V) */
    uint16_t *k_host, *v_host;
    void *k_dev, *v_dev;
} prefill;

static dqc_put_args put_args(const prefill *p, dqc_seq seq, uint32_t first, uint32_t n, int dev)
{
    dqc_put_args a = {.seq = seq,
                      .model = MODEL,
                      .start_token = 0,
                      .first_layer = first,
                      .num_layers = n,
                      .tokens = p->tokens,
                      .kv_heads = KV_HEADS,
                      .head_dim = HEAD_DIM,
                      .dtype = DQ_DTYPE_BF16};
    size_t off = (size_t)first * p->layer_bytes;
    a.k = dev ? (const void *)((uint8_t *)p->k_dev + off) : (const void *)((uint8_t *)p->k_host + off);
    a.v = dev ? (const void *)((uint8_t *)p->v_dev + off) : (const void *)((uint8_t *)p->v_host + off);
    return a;
}

/* PUTs the whole prefill in calls of `group` layers. Returns the seconds, or -1 after a failure. */
static double put_all(dqc_client *c, const prefill *p, const char *key, int group, int dev)
{
    dqc_seq seq = seq_of(key);
    double t0 = now_s();
    for (uint32_t l = 0; l < p->layers; l += (uint32_t)group) {
        uint32_t n = p->layers - l < (uint32_t)group ? p->layers - l : (uint32_t)group;
        dqc_put_args a = put_args(p, seq, l, n, dev);
        dqc_put_result r;
        int rc = dev ? dqc_put_dev(c, &a, &r) : dqc_put(c, &a, &r);
        if (rc) {
            fail_json(dev ? "put_nccl" : "put_socket", "%s layers %u..%u: %s: %s", key, l, l + n - 1, dqc_err_name(rc),
                      dqc_last_error(c));
            return -1;
        }
        if (r.tokens != p->tokens) {
            fail_json(dev ? "put_nccl" : "put_socket", "%s layer %u: PUT reply says %llu tokens, sent %llu", key, l,
                      (unsigned long long)r.tokens, (unsigned long long)p->tokens);
            return -1;
        }
    }
    return now_s() - t0;
}

/* GETs the whole sequence in calls of `group` layers, to device (kd/vd, group layers each) or through
 * the socket (into gr). Returns the seconds, or -1. */
static double get_all(dqc_client *c, const prefill *p, const char *key, int group, int dev, void *kd, void *vd,
                      dqc_get_result *gr)
{
    dqc_seq seq = seq_of(key);
    double t0 = now_s();
    for (uint32_t l = 0; l < p->layers; l += (uint32_t)group) {
        uint32_t n = p->layers - l < (uint32_t)group ? p->layers - l : (uint32_t)group;
        dqc_get_args a = {.seq = seq, .first_layer = l, .num_layers = n, .dtype = DQ_DTYPE_BF16};
        int rc = dev ? dqc_get_dev(c, &a, kd, vd, (size_t)group * p->layer_bytes, gr) : dqc_get(c, &a, gr);
        if (rc) {
            fail_json(dev ? "get_nccl" : "get_socket", "%s layers %u..%u: %s: %s", key, l, l + n - 1, dqc_err_name(rc),
                      dqc_last_error(c));
            return -1;
        }
        if (gr->tokens != p->tokens || gr->num_layers != n || gr->bytes != (size_t)n * p->layer_bytes) {
            fail_json(dev ? "get_nccl" : "get_socket", "%s layers %u..%u: reply of %llu tokens, %u layers, %zu bytes",
                      key, l, l + n - 1, (unsigned long long)gr->tokens, gr->num_layers, gr->bytes);
            return -1;
        }
    }
    return now_s() - t0;
}

static void delete_quiet(dqc_client *c, const char *key)
{
    dqc_seq s = seq_of(key);
    dqc_delete(c, &s);
}

/* ---- the raw NCCL ceiling: a peer process on the daemon's GPU ---- */

typedef struct raw_plan {
    int reps, warmup;
    uint32_t layers;
    size_t layer_bytes;
    int groups[8];
    int ngroups;
} raw_plan;

/* Both sides run the same schedule: per group size, per repetition (warm-up first), a barrier,
 * then every chunk sent (client → peer, like PUT) and then every chunk received (like GET), each
 * chunk one group of two operations (k and v) waited for before the next, as the calls do. */
static void raw_chunks(ncclComm_t comm, cudaStream_t st, int peer, int send, void *k, void *v, size_t layer_bytes,
                       uint32_t layers, int group, int fixed_buffers)
{
    for (uint32_t l = 0; l < layers; l += (uint32_t)group) {
        uint32_t n = layers - l < (uint32_t)group ? layers - l : (uint32_t)group;
        size_t off = fixed_buffers ? 0 : (size_t)l * layer_bytes;
        size_t len = (size_t)n * layer_bytes;
        NCCL_OR_DIE(ncclGroupStart());
        if (send) {
            NCCL_OR_DIE(ncclSend((uint8_t *)k + off, len, ncclUint8, peer, comm, st));
            NCCL_OR_DIE(ncclSend((uint8_t *)v + off, len, ncclUint8, peer, comm, st));
        } else {
            NCCL_OR_DIE(ncclRecv((uint8_t *)k + off, len, ncclUint8, peer, comm, st));
            NCCL_OR_DIE(ncclRecv((uint8_t *)v + off, len, ncclUint8, peer, comm, st));
        }
        NCCL_OR_DIE(ncclGroupEnd());
        CUDA_OR_DIE(cudaStreamSynchronize(st));
    }
}

static void raw_barrier(ncclComm_t comm, cudaStream_t st, float *one)
{
    NCCL_OR_DIE(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm, st));
    CUDA_OR_DIE(cudaStreamSynchronize(st));
}

static void raw_plan_args(const raw_plan *rp, char *buf, size_t cap)
{
    char g[64] = "";
    for (int i = 0; i < rp->ngroups; i++)
        snprintf(g + strlen(g), sizeof g - strlen(g), "%s%d", i ? "," : "", rp->groups[i]);
    snprintf(buf, cap, "%s", g);
}

/* Blocking NCCL calls wait forever for a peer that never comes: a deadline ends the process with a
 * line saying so instead. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "{\"step\":\"raw\",\"ok\":false,\"error\":\"the raw NCCL exchange did not finish in "
                            "time (peer gone or hung)\"}\n";
    ssize_t w = write(1, m, sizeof m - 1);
    (void)w;
    _exit(3);
}

/* The peer: rank 1 on its device, the receiving end of "put" chunks and the sending end of "get". */
static int raw_peer_main(const opts *o)
{
    signal(SIGALRM, on_alarm);
    alarm(300);
    CUDA_OR_DIE(cudaSetDevice(o->device));
    ncclUniqueId id;
    int fd = -1;
    for (int i = 0; i < 600 && fd < 0; i++) { /* the file appears by rename: whole or not at all */
        fd = open(o->id_file, O_RDONLY);
        if (fd < 0)
            nap_ms(50);
    }
    if (fd < 0 || read(fd, &id, sizeof id) != (ssize_t)sizeof id) {
        fail_json("raw_peer", "no NCCL id in %s", o->id_file);
        return 2;
    }
    close(fd);
    ncclComm_t comm;
    NCCL_OR_DIE(ncclCommInitRank(&comm, 2, id, 1));
    cudaStream_t st;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    size_t layer_bytes = (size_t)o->tokens * ROW_ELEMS * 2;
    int gmax = 0;
    for (int i = 0; i < o->ngroups; i++)
        gmax = o->groups[i] > gmax ? o->groups[i] : gmax;
    void *k, *v;
    float *one;
    CUDA_OR_DIE(cudaMalloc(&k, (size_t)gmax * layer_bytes));
    CUDA_OR_DIE(cudaMalloc(&v, (size_t)gmax * layer_bytes));
    CUDA_OR_DIE(cudaMemset(k, 0x3c, (size_t)gmax * layer_bytes));
    CUDA_OR_DIE(cudaMemset(v, 0x3c, (size_t)gmax * layer_bytes));
    CUDA_OR_DIE(cudaMalloc((void **)&one, sizeof *one));
    CUDA_OR_DIE(cudaMemset(one, 0, sizeof *one));
    for (int g = 0; g < o->ngroups; g++)
        for (int r = 0; r < o->warmup + o->reps; r++) {
            raw_barrier(comm, st, one);
            raw_chunks(comm, st, 0, 0, k, v, layer_bytes, o->layers, o->groups[g], 1);
            raw_barrier(comm, st, one);
            raw_chunks(comm, st, 0, 1, k, v, layer_bytes, o->layers, o->groups[g], 1);
        }
    raw_barrier(comm, st, one);
    ncclCommDestroy(comm);
    cudaFree(k);
    cudaFree(v);
    cudaFree(one);
    cudaStreamDestroy(st);
    return failures ? 1 : 0;
}

static void raw_bench(const opts *o, const prefill *p, void *kg, void *vg)
{
    char idfile[256];
    snprintf(idfile, sizeof idfile, "%s/nccl-bench-id-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", idfile);
    ncclUniqueId id;
    NCCL_OR_DIE(ncclGetUniqueId(&id));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, &id, sizeof id) != (ssize_t)sizeof id || close(fd) != 0 || rename(tmp, idfile) != 0) {
        fail_json("raw", "cannot write the NCCL id to %s: %s", idfile, strerror(errno));
        return;
    }
    raw_plan rp = {.reps = o->reps,
                   .warmup = o->warmup,
                   .layers = p->layers,
                   .layer_bytes = p->layer_bytes,
                   .ngroups = o->ngroups};
    memcpy(rp.groups, o->groups, sizeof rp.groups);
    char groups[64], dev[16], tokens[32], layers[16], reps[16], warm[16];
    raw_plan_args(&rp, groups, sizeof groups);
    snprintf(dev, sizeof dev, "%d", o->peer_device);
    snprintf(tokens, sizeof tokens, "%llu", (unsigned long long)p->tokens);
    snprintf(layers, sizeof layers, "%u", p->layers);
    snprintf(reps, sizeof reps, "%d", o->reps);
    snprintf(warm, sizeof warm, "%d", o->warmup);
    char *argv[] = {"nccl_bench", "--raw-peer", "--id-file", idfile, "--device", dev,
                    "--tokens",   tokens,       "--layers",  layers, "--groups", groups,
                    "--reps",     reps,         "--warmup",  warm,   NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
    if (rc) {
        fail_json("raw", "cannot start the raw peer: %s", strerror(rc));
        unlink(idfile);
        return;
    }
    say("raw NCCL peer: pid %d on device %d", (int)pid, o->peer_device);
    signal(SIGALRM, on_alarm);
    alarm(240);

    ncclComm_t comm;
    double t0 = now_s();
    NCCL_OR_DIE(ncclCommInitRank(&comm, 2, id, 0));
    unlink(idfile);
    cudaStream_t st;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *one;
    CUDA_OR_DIE(cudaMalloc((void **)&one, sizeof *one));
    CUDA_OR_DIE(cudaMemset(one, 0, sizeof *one));
    say("raw NCCL communicator up in %.2f s", now_s() - t0);
    double total = 2.0 * (double)p->layers * (double)p->layer_bytes;
    for (int g = 0; g < o->ngroups; g++) {
        int group = o->groups[g];
        int calls = (int)((p->layers + (uint32_t)group - 1) / (uint32_t)group);
        double ts[64], tr[64];
        int n = 0;
        for (int r = 0; r < o->warmup + o->reps; r++) {
            raw_barrier(comm, st, one);
            double a = now_s();
            raw_chunks(comm, st, 1, 1, p->k_dev, p->v_dev, p->layer_bytes, p->layers, group, 0);
            double b = now_s();
            raw_barrier(comm, st, one);
            double c2 = now_s();
            raw_chunks(comm, st, 1, 0, kg, vg, p->layer_bytes, p->layers, group, 1);
            double d = now_s();
            if (r >= o->warmup && n < 64) {
                ts[n] = b - a;
                tr[n] = d - c2;
                n++;
            }
        }
        emit("put", "raw", "layers_per_call", group, total, calls, ts, n);
        emit("get", "raw", "layers_per_call", group, total, calls, tr, n);
    }
    raw_barrier(comm, st, one);
    ncclCommDestroy(comm);
    cudaFree(one);
    cudaStreamDestroy(st);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_json("raw", "the raw peer ended with status 0x%x", status);
    alarm(0);
}

/* ---- benchmark ---- */

/* Largest |a - b| over n f32 values, and whether they are byte-identical. */
static double max_diff_f32(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d; /* NaN propagates */
    }
    return m;
}

/* Relative RMS error of the decoded cache against the original (lossy: ~0.1-0.3 at 2.26 bits per
 * value; garbage or zeros would read near 1 or above). */
static double rel_rms(const uint16_t *orig, const uint16_t *dec, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i += 7) { /* a sample is plenty */
        double x = bf16_to_f32(orig[i]), y = bf16_to_f32(dec[i]);
        e += (x - y) * (x - y);
        s += x * x;
    }
    return s > 0 ? sqrt(e / s) : INFINITY;
}

static int bench_main(const opts *o)
{
    CUDA_OR_DIE(cudaSetDevice(o->device));
    dqc_client *c = connect_or_die(o);
    dqc_server_info si;
    dqc_server(c, &si);
    say("server %s, backend %s, max payload %llu", si.server_version, si.backend,
        (unsigned long long)si.max_payload_bytes);
    setup_or_die(c, o->device);
    register_or_die(c, o->layers);

    prefill p = {.tokens = o->tokens, .layers = o->layers};
    p.layer_bytes = (size_t)o->tokens * ROW_ELEMS * 2;
    size_t total = (size_t)o->layers * p.layer_bytes;
    double t0 = now_s();
    p.k_host = xmalloc(total);
    p.v_host = xmalloc(total);
    fill_gauss(p.k_host, total / 2, 1);
    fill_gauss(p.v_host, total / 2, 2);
    CUDA_OR_DIE(cudaMalloc(&p.k_dev, total));
    CUDA_OR_DIE(cudaMalloc(&p.v_dev, total));
    CUDA_OR_DIE(cudaMemcpy(p.k_dev, p.k_host, total, cudaMemcpyHostToDevice));
    CUDA_OR_DIE(cudaMemcpy(p.v_dev, p.v_host, total, cudaMemcpyHostToDevice));
    int gmax = 0;
    for (int i = 0; i < o->ngroups; i++)
        gmax = o->groups[i] > gmax ? o->groups[i] : gmax;
    if ((uint32_t)gmax > o->layers)
        gmax = (int)o->layers;
    size_t gbytes = (size_t)gmax * p.layer_bytes;
    void *kg, *vg;
    CUDA_OR_DIE(cudaMalloc(&kg, gbytes));
    CUDA_OR_DIE(cudaMalloc(&vg, gbytes));
    uint8_t *hk = xmalloc(gbytes), *hv = xmalloc(gbytes);
    printf("{\"step\":\"prefill\",\"tokens\":%llu,\"layers\":%u,\"bytes\":%zu,\"seconds\":%.2f}\n",
           (unsigned long long)o->tokens, o->layers, 2 * total, now_s() - t0);
    fflush(stdout);
    say("prefill: %llu tokens x %u layers, %.2f GB of BF16 K+V on device %d", (unsigned long long)o->tokens, o->layers,
        2.0 * total / 1e9, o->device);

    /* PUT: the two paths interleaved repetition by repetition, so drift hits both alike. The last
     * repetition's sequences of the first group size stay for GET and ATTEND. */
    const char *keep_n = "seq-nccl", *keep_s = "seq-socket";
    delete_quiet(c, keep_n);
    delete_quiet(c, keep_s);
    for (int g = 0; g < o->ngroups; g++) {
        int group = o->groups[g];
        int calls = (int)((o->layers + (uint32_t)group - 1) / (uint32_t)group);
        int sock_ok = !si.max_payload_bytes || 2 * (uint64_t)group * p.layer_bytes <= si.max_payload_bytes;
        if (!sock_ok)
            say("put: %d layers per call exceed the server's max payload %llu: socket path skipped", group,
                (unsigned long long)si.max_payload_bytes);
        double tn[64], ts[64];
        int n = 0, bad = 0;
        for (int r = 0; r < o->warmup + o->reps && !bad; r++) {
            int last = g == 0 && r == o->warmup + o->reps - 1;
            char kn[64], ks[64];
            snprintf(kn, sizeof kn, "%s", last ? keep_n : "put-nccl");
            snprintf(ks, sizeof ks, "%s", last ? keep_s : "put-socket");
            double a = sock_ok ? put_all(c, &p, ks, group, 0) : 0;
            double b = put_all(c, &p, kn, group, 1);
            if (a < 0 || b < 0)
                bad = 1;
            if (r >= o->warmup && n < 64) {
                ts[n] = a;
                tn[n] = b;
                n++;
            }
            if (!last) {
                delete_quiet(c, kn);
                delete_quiet(c, ks);
            }
        }
        if (bad)
            continue;
        if (sock_ok)
            emit("put", "socket", "layers_per_call", group, 2.0 * total, calls, ts, n);
        emit("put", "nccl", "layers_per_call", group, 2.0 * total, calls, tn, n);
    }

    /* GET of the sequence stored through NCCL, both ways. */
    dqc_get_result gr = {0};
    for (int g = 0; g < o->ngroups; g++) {
        int group = o->groups[g] > (int)o->layers ? (int)o->layers : o->groups[g];
        int calls = (int)((o->layers + (uint32_t)group - 1) / (uint32_t)group);
        int sock_ok = !si.max_payload_bytes || 2 * (uint64_t)group * p.layer_bytes <= si.max_payload_bytes;
        double tn[64], ts[64];
        int n = 0, bad = 0;
        for (int r = 0; r < o->warmup + o->reps && !bad; r++) {
            double a = sock_ok ? get_all(c, &p, keep_n, group, 0, NULL, NULL, &gr) : 0;
            double b = get_all(c, &p, keep_n, group, 1, kg, vg, &gr);
            if (a < 0 || b < 0)
                bad = 1;
            if (r >= o->warmup && n < 64) {
                ts[n] = a;
                tn[n] = b;
                n++;
            }
        }
        if (bad)
            continue;
        if (sock_ok)
            emit("get", "socket", "layers_per_call", group, 2.0 * total, calls, ts, n);
        emit("get", "nccl", "layers_per_call", group, 2.0 * total, calls, tn, n);
    }

    /* Checks, layer by layer: NCCL GET == socket GET of the same sequence (the transport), and
     * == socket GET of the sequence PUT through the socket (the PUT paths store the same). */
    {
        int same_transport = 1, same_put = 1;
        double worst = 0;
        dqc_get_result gs = {0};
        for (uint32_t l = 0; l < o->layers; l++) {
            dqc_get_args a = {.seq = seq_of(keep_n), .first_layer = l, .num_layers = 1, .dtype = DQ_DTYPE_BF16};
            int rc = dqc_get_dev(c, &a, kg, vg, gbytes, &gr);
            if (!rc) {
                CUDA_OR_DIE(cudaMemcpy(hk, kg, p.layer_bytes, cudaMemcpyDeviceToHost));
                CUDA_OR_DIE(cudaMemcpy(hv, vg, p.layer_bytes, cudaMemcpyDeviceToHost));
                rc = dqc_get(c, &a, &gr);
            }
            if (rc) {
                fail_json("get_check", "layer %u: %s: %s", l, dqc_err_name(rc), dqc_last_error(c));
                same_transport = 0;
                break;
            }
            if (gr.bytes != p.layer_bytes || memcmp(hk, gr.k, p.layer_bytes) || memcmp(hv, gr.v, p.layer_bytes)) {
                if (same_transport)
                    fail_json("get_check", "layer %u: the NCCL GET differs from the socket GET", l);
                same_transport = 0;
            }
            dqc_get_args b = a;
            b.seq = seq_of(keep_s);
            rc = dqc_get(c, &b, &gs);
            if (rc || memcmp(gs.k, gr.k, p.layer_bytes) || memcmp(gs.v, gr.v, p.layer_bytes)) {
                if (same_put)
                    fail_json("get_check",
                              "layer %u: the sequence PUT through NCCL differs from the one PUT "
                              "through the socket (%s)",
                              l, rc ? dqc_last_error(c) : "bytes differ");
                same_put = 0;
            }
            double e = fmax(
                rel_rms(p.k_host + (size_t)l * p.layer_bytes / 2, (const uint16_t *)gr.k, p.layer_bytes / 2),
                rel_rms(p.v_host + (size_t)l * p.layer_bytes / 2, (const uint16_t *)gr.v, p.layer_bytes / 2));
            worst = e > worst || isnan(e) ? e : worst;
        }
        if (!(worst < 0.5))
            fail_json("get_check", "decoded cache too far from the input: relative RMS error %.3f", worst);
        printf("{\"step\":\"get_check\",\"ok\":%s,\"nccl_equals_socket\":%s,\"put_paths_equal\":%s,"
               "\"worst_rel_rms\":%.4f}\n",
               same_transport && same_put && worst < 0.5 ? "true" : "false", same_transport ? "true" : "false",
               same_put ? "true" : "false", worst);
        fflush(stdout);
        dqc_get_result_free(&gs);
    }

    /* ATTEND: one decode step = one call per layer, batch items all on the NCCL-stored sequence. */
    int bmax = 0;
    for (int i = 0; i < o->nbatches; i++)
        bmax = o->batches[i] > bmax ? o->batches[i] : bmax;
    size_t qelems = (size_t)Q_HEADS * HEAD_DIM;
    size_t qb = qelems * 2, ob = (size_t)bmax * qelems * 4, lb = (size_t)bmax * Q_HEADS * 4;
    size_t ab = ROW_ELEMS * 2;
    uint16_t *q_host = xmalloc((size_t)bmax * o->layers * qb);
    fill_gauss(q_host, (size_t)bmax * o->layers * qelems, 3);
    void *q_dev;
    float *out_dev, *lse_dev;
    CUDA_OR_DIE(cudaMalloc(&q_dev, (size_t)bmax * o->layers * qb));
    CUDA_OR_DIE(cudaMemcpy(q_dev, q_host, (size_t)bmax * o->layers * qb, cudaMemcpyHostToDevice));
    CUDA_OR_DIE(cudaMalloc((void **)&out_dev, ob));
    CUDA_OR_DIE(cudaMalloc((void **)&lse_dev, lb));
    float *out_s = xmalloc(ob), *lse_s = xmalloc(lb), *out_n = xmalloc(ob), *lse_n = xmalloc(lb);
    dqc_attend_item *items = xmalloc((size_t)bmax * sizeof *items);
    for (int bi = 0; bi < o->nbatches; bi++) {
        int B = o->batches[bi];
        double tn[256], ts[256];
        int n = 0, bad = 0, equal = 1;
        double worst = 0;
        int steps = o->attend_steps < 256 ? o->attend_steps : 256;
        for (int s = 0; s < 2 + steps && !bad; s++) { /* two warm-up steps */
            double st[2] = {0, 0};
            for (int dev = 0; dev < 2 && !bad; dev++) {
                double a0 = now_s();
                for (uint32_t l = 0; l < o->layers; l++) {
                    for (int i = 0; i < B; i++) {
                        size_t qo = ((size_t)l * bmax + (size_t)i) * qb;
                        items[i] = (dqc_attend_item){.seq = seq_of(keep_n),
                                                     .layer = l,
                                                     .q = dev ? (const void *)((uint8_t *)q_dev + qo)
                                                              : (const void *)((uint8_t *)q_host + qo)};
                    }
                    dqc_attend_args aa = {.items = items,
                                          .nitems = (size_t)B,
                                          .q_heads = Q_HEADS,
                                          .kv_heads = KV_HEADS,
                                          .head_dim = HEAD_DIM,
                                          .dtype = DQ_DTYPE_BF16};
                    int rc = dev ? dqc_attend_dev(c, &aa, out_dev, lse_dev) : dqc_attend(c, &aa, out_s, lse_s);
                    if (rc) {
                        fail_json(dev ? "attend_nccl" : "attend_socket", "batch %d layer %u: %s: %s", B, l,
                                  dqc_err_name(rc), dqc_last_error(c));
                        bad = 1;
                        break;
                    }
                }
                st[dev] = now_s() - a0;
            }
            if (s >= 2 && n < 256) {
                ts[n] = st[0];
                tn[n] = st[1];
                n++;
            }
        }
        /* The check: per layer, socket then NCCL, outputs byte-compared. */
        for (uint32_t l = 0; l < o->layers && !bad; l++) {
            for (int i = 0; i < B; i++) {
                size_t qo = ((size_t)l * bmax + (size_t)i) * qb;
                items[i] = (dqc_attend_item){.seq = seq_of(keep_n), .layer = l, .q = (uint8_t *)q_host + qo};
            }
            dqc_attend_args aa = {.items = items,
                                  .nitems = (size_t)B,
                                  .q_heads = Q_HEADS,
                                  .kv_heads = KV_HEADS,
                                  .head_dim = HEAD_DIM,
                                  .dtype = DQ_DTYPE_BF16};
            int rc = dqc_attend(c, &aa, out_s, lse_s);
            for (int i = 0; !rc && i < B; i++)
                items[i].q = (uint8_t *)q_dev + ((size_t)l * bmax + (size_t)i) * qb;
            if (!rc)
                rc = dqc_attend_dev(c, &aa, out_dev, lse_dev);
            if (rc) {
                fail_json("attend_check", "batch %d layer %u: %s: %s", B, l, dqc_err_name(rc), dqc_last_error(c));
                bad = 1;
                break;
            }
            CUDA_OR_DIE(cudaMemcpy(out_n, out_dev, (size_t)B * qelems * 4, cudaMemcpyDeviceToHost));
            CUDA_OR_DIE(cudaMemcpy(lse_n, lse_dev, (size_t)B * Q_HEADS * 4, cudaMemcpyDeviceToHost));
            double d = fmax(max_diff_f32(out_s, out_n, (size_t)B * qelems),
                            max_diff_f32(lse_s, lse_n, (size_t)B * Q_HEADS));
            worst = d > worst || isnan(d) ? d : worst;
            if (memcmp(out_s, out_n, (size_t)B * qelems * 4) || memcmp(lse_s, lse_n, (size_t)B * Q_HEADS * 4))
                equal = 0;
        }
        if (bad)
            continue;
        if (!equal)
            fail_json("attend_check", "batch %d: NCCL and socket outputs differ (max |diff| %.3g)", B, worst);
        printf("{\"step\":\"attend_check\",\"batch\":%d,\"ok\":%s,\"identical\":%s,\"max_abs_diff\":%.3g}\n", B,
               equal ? "true" : "false", equal ? "true" : "false", worst);
        double bytes = (double)o->layers * (double)B * (double)(qb + qelems * 4 + Q_HEADS * 4);
        emit("attend", "socket", "batch", B, bytes, (int)o->layers, ts, n);
        emit("attend", "nccl", "batch", B, bytes, (int)o->layers, tn, n);
    }

    /* Decode steps with appends: the NCCL path on one copy of the sequence, the socket path on the
     * other, the same appended K/V and queries: outputs identical, and the caches after it too. */
    if (o->append_steps > 0) {
        uint16_t *app_host = xmalloc(2 * ab);
        void *app_dev;
        CUDA_OR_DIE(cudaMalloc(&app_dev, 2 * ab));
        int equal = 1, bad = 0;
        for (int s = 0; s < o->append_steps && !bad; s++)
            for (uint32_t l = 0; l < o->layers && !bad; l++) {
                fill_gauss(app_host, 2 * ROW_ELEMS, 1000 + (uint64_t)s * o->layers + l);
                CUDA_OR_DIE(cudaMemcpy(app_dev, app_host, 2 * ab, cudaMemcpyHostToDevice));
                size_t qo = (size_t)l * bmax * qb;
                dqc_attend_item is = {.seq = seq_of(keep_s),
                                      .layer = l,
                                      .q = (uint8_t *)q_host + qo,
                                      .append_k = app_host,
                                      .append_v = (uint8_t *)app_host + ab};
                dqc_attend_item in = {.seq = seq_of(keep_n),
                                      .layer = l,
                                      .q = (uint8_t *)q_dev + qo,
                                      .append_k = app_dev,
                                      .append_v = (uint8_t *)app_dev + ab};
                dqc_attend_args aa = {.nitems = 1,
                                      .q_heads = Q_HEADS,
                                      .kv_heads = KV_HEADS,
                                      .head_dim = HEAD_DIM,
                                      .dtype = DQ_DTYPE_BF16};
                aa.items = &is;
                int rc = dqc_attend(c, &aa, out_s, lse_s);
                aa.items = &in;
                if (!rc)
                    rc = dqc_attend_dev(c, &aa, out_dev, lse_dev);
                if (rc) {
                    fail_json("append_check", "step %d layer %u: %s: %s", s, l, dqc_err_name(rc), dqc_last_error(c));
                    bad = 1;
                    break;
                }
                CUDA_OR_DIE(cudaMemcpy(out_n, out_dev, qelems * 4, cudaMemcpyDeviceToHost));
                CUDA_OR_DIE(cudaMemcpy(lse_n, lse_dev, Q_HEADS * 4, cudaMemcpyDeviceToHost));
                if (memcmp(out_s, out_n, qelems * 4) || memcmp(lse_s, lse_n, Q_HEADS * 4))
                    equal = 0;
            }
        /* The appended tails read back the same through both sequences. */
        dqc_get_result g1 = {0}, g2 = {0};
        for (uint32_t l = 0; l < o->layers && !bad && equal; l++) {
            dqc_get_args a = {.seq = seq_of(keep_n),
                              .first_layer = l,
                              .num_layers = 1,
                              .start_token = o->tokens,
                              .dtype = DQ_DTYPE_BF16};
            dqc_get_args b = a;
            b.seq = seq_of(keep_s);
            int rc = dqc_get(c, &a, &g1);
            if (!rc)
                rc = dqc_get(c, &b, &g2);
            if (rc || g1.tokens != (uint64_t)o->append_steps || g1.bytes != g2.bytes || memcmp(g1.k, g2.k, g1.bytes) ||
                memcmp(g1.v, g2.v, g1.bytes)) {
                fail_json("append_check", "layer %u: appended tokens differ between the two sequences (%s)", l,
                          rc ? dqc_last_error(c) : "bytes or lengths differ");
                bad = 1;
            }
        }
        dqc_get_result_free(&g1);
        dqc_get_result_free(&g2);
        if (!equal)
            fail_json("append_check", "ATTEND outputs with appends differ between NCCL and socket");
        printf("{\"step\":\"append_check\",\"steps\":%d,\"ok\":%s}\n", o->append_steps,
               equal && !bad ? "true" : "false");
        cudaFree(app_dev);
        free(app_host);
    }

    /* The ceiling: the same bytes in the same chunks, plain NCCL between the two GPUs. Last, since a
     * peer that fails to come up ends this process (see on_alarm). */
    if (!o->skip_raw)
        raw_bench(o, &p, kg, vg);

    emit_ratios();
    print_table();
    delete_quiet(c, keep_n);
    delete_quiet(c, keep_s);
    dqc_get_result_free(&gr);
    dqc_free(c);
    cudaFree(p.k_dev);
    cudaFree(p.v_dev);
    cudaFree(kg);
    cudaFree(vg);
    cudaFree(q_dev);
    cudaFree(out_dev);
    cudaFree(lse_dev);
    free(p.k_host);
    free(p.v_host);
    free(hk);
    free(hv);
    free(q_host);
    free(out_s);
    free(lse_s);
    free(out_n);
    free(lse_n);
    free(items);
    printf("{\"step\":\"bench\",\"ok\":%s,\"failures\":%d}\n", failures ? "false" : "true", failures);
    return failures ? 1 : 0;
}

/* ---- failure tests ---- */

/* The dying client speaks raw frames, since the library never leaves a request half done. */
static int raw_call(int fd, const Dquant__Request *req, uint64_t id, Dquant__Response **resp, int timeout_ms)
{
    if (wire_send(fd, req, NULL, id))
        return -1;
    uint64_t rid = 0;
    if (wire_recv_within(fd, timeout_ms, &rid, resp, NULL, NULL))
        return -1;
    return rid == id ? 0 : -1;
}

/* Child: sets up NCCL by hand, sends a PUT frame announcing its NCCL payload, then, by mode:
 *   before   dies (SIGKILL) before sending any of it
 *   partial  sends k, not v, then dies
 *   stall    sends k, not v, stays alive: expects the daemon's error reply after its deadline */
static int die_main(const opts *o)
{
    CUDA_OR_DIE(cudaSetDevice(o->device));
    const char *path = strncmp(o->addr, "unix:", 5) == 0 ? o->addr + 5 : o->addr;
    int fd = wire_connect_unix(path);
    if (fd < 0) {
        fail_json("die", "cannot connect to %s", path);
        return 2;
    }
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    h.client_name = "nccl_bench-die";
    char *feat[] = {"nccl"};
    h.features = feat;
    h.n_features = 1;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    Dquant__Response *resp = NULL;
    if (raw_call(fd, &req, 1, &resp, 10000) || resp->body_case != DQUANT__RESPONSE__BODY_HELLO) {
        fail_json("die", "HELLO failed");
        return 2;
    }
    dquant__response__free_unpacked(resp, NULL);
    Dquant__NcclSetup ns = DQUANT__NCCL_SETUP__INIT;
    ns.client_device = o->device;
    req = (Dquant__Request)DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_NCCL_SETUP;
    req.nccl_setup = &ns;
    if (raw_call(fd, &req, 2, &resp, 10000) || resp->body_case != DQUANT__RESPONSE__BODY_NCCL_SETUP ||
        resp->nccl_setup->unique_id.len != sizeof(ncclUniqueId)) {
        fail_json("die", "NCCL_SETUP failed (%s)",
                  resp && resp->body_case == DQUANT__RESPONSE__BODY_ERROR ? resp->error->message : "no reply");
        return 2;
    }
    ncclUniqueId id;
    memcpy(&id, resp->nccl_setup->unique_id.data, sizeof id);
    dquant__response__free_unpacked(resp, NULL);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm;
    NCCL_OR_DIE(ncclCommInitRankConfig(&comm, 2, id, 1, &cfg));
    ncclResult_t st = ncclInProgress;
    for (int i = 0; i < 30000 && st == ncclInProgress; i++) {
        ncclCommGetAsyncError(comm, &st);
        if (st == ncclInProgress)
            nap_ms(1);
    }
    if (st != ncclSuccess) {
        fail_json("die", "joining the daemon's communicator: %s", ncclGetErrorString(st));
        return 2;
    }
    cudaStream_t stream;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    /* One layer of a 32K-token cache: 64 MiB of k, 64 MiB of v. */
    uint64_t tokens = o->tokens;
    size_t bytes = (size_t)tokens * ROW_ELEMS * 2;
    uint16_t *host = xmalloc(bytes);
    fill_gauss(host, bytes / 2, 7);
    void *k, *v;
    CUDA_OR_DIE(cudaMalloc(&k, bytes));
    CUDA_OR_DIE(cudaMalloc(&v, bytes));
    CUDA_OR_DIE(cudaMemcpy(k, host, bytes, cudaMemcpyHostToDevice));
    CUDA_OR_DIE(cudaMemcpy(v, host, bytes, cudaMemcpyHostToDevice));
    uint64_t shape[4] = {1, tokens, KV_HEADS, HEAD_DIM};
    Dquant__Tensor tk = DQUANT__TENSOR__INIT, tv = DQUANT__TENSOR__INIT;
    tk.dtype = tv.dtype = DQUANT__DTYPE__BF16;
    tk.shape = tv.shape = shape;
    tk.n_shape = tv.n_shape = 4;
    tk.offset = 0;
    tv.offset = bytes;
    tk.length = tv.length = bytes;
    tk.nccl = tv.nccl = 1;
    Dquant__SeqRef seq = DQUANT__SEQ_REF__INIT;
    seq.ns = "nccl-bench";
    seq.key.data = (uint8_t *)o->key;
    seq.key.len = strlen(o->key);
    Dquant__Put put = DQUANT__PUT__INIT;
    put.seq = &seq;
    put.model = MODEL;
    put.num_layers = 1;
    put.tokens = tokens;
    put.k = &tk;
    put.v = &tv;
    req = (Dquant__Request)DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT;
    req.put = &put;
    req.nccl_payload = 2 * (uint64_t)bytes;
    if (wire_send(fd, &req, NULL, 3)) {
        fail_json("die", "sending the PUT frame failed");
        return 2;
    }
    if (strcmp(o->die_mode, "before") == 0) {
        say("die-mid-put before: PUT frame sent, no NCCL bytes; SIGKILL");
        raise(SIGKILL);
    }
    /* k only: the daemon posted receives for k and v, so k can complete while v never comes. */
    NCCL_OR_DIE(ncclSend(k, bytes, ncclUint8, 0, comm, stream));
    double t0 = now_s();
    for (;;) {
        ncclCommGetAsyncError(comm, &st);
        if (st == ncclSuccess && cudaStreamQuery(stream) == cudaSuccess)
            break;
        if (now_s() - t0 > 5 || (st != ncclSuccess && st != ncclInProgress))
            break;
        nap_ms(1);
    }
    int k_done = st == ncclSuccess && cudaStreamQuery(stream) == cudaSuccess;
    if (strcmp(o->die_mode, "partial") == 0) {
        say("die-mid-put partial: k %s, v never sent; SIGKILL", k_done ? "sent" : "not completed in 5 s");
        raise(SIGKILL);
    }
    /* stall: alive, socket open; the daemon must give up on v by its deadline and say so. */
    say("die-mid-put stall: k %s, v withheld; waiting for the daemon's reply", k_done ? "sent" : "pending");
    uint64_t rid = 0;
    int rc = wire_recv_within(fd, 60000, &rid, &resp, NULL, NULL);
    double waited = now_s() - t0;
    int ok = rc == 0 && rid == 3 && resp->body_case == DQUANT__RESPONSE__BODY_ERROR;
    printf("{\"step\":\"stall_reply\",\"ok\":%s,\"k_sent\":%s,\"waited_s\":%.2f,\"reply\":\"%s\",\"code\":\"%s\"}\n",
           ok ? "true" : "false", k_done ? "true" : "false", waited,
           rc                                                ? "none"
           : resp->body_case == DQUANT__RESPONSE__BODY_ERROR ? "error"
                                                             : "not an error",
           ok ? resp->error->name : "");
    fflush(stdout);
    if (!ok)
        fail_json("stall_reply", "expected an error reply to the stalled PUT, got %s",
                  rc ? "no reply within 60 s" : "a non-error reply");
    if (rc == 0)
        dquant__response__free_unpacked(resp, NULL);
    ncclCommAbort(comm);
    close(fd);
    cudaStreamDestroy(stream);
    cudaFree(k);
    cudaFree(v);
    free(host);
    return ok ? 0 : 1;
}

typedef struct nccl_counters {
    int n;
    char name[64][96];
    uint64_t value[64];
} nccl_counters;

static void stats_nccl(dqc_client *c, nccl_counters *out)
{
    memset(out, 0, sizeof *out);
    dqc_stats_result st = {0};
    if (dqc_stats(c, &st)) {
        fail_json("stats", "%s", dqc_last_error(c));
        return;
    }
    for (size_t i = 0; i < st.ncounters && out->n < 64; i++)
        if (strstr(st.counters[i].name, "nccl")) {
            snprintf(out->name[out->n], sizeof out->name[0], "%s", st.counters[i].name);
            out->value[out->n++] = st.counters[i].value;
        }
    dqc_stats_result_free(&st);
}

/* Counters that name a failure (abort, fail, error, timeout) and grew between a and b. */
static int failure_counted(const nccl_counters *a, const nccl_counters *b, char *which, size_t cap)
{
    which[0] = 0;
    int grew = 0;
    for (int i = 0; i < b->n; i++) {
        const char *nm = b->name[i];
        if (!strstr(nm, "abort") && !strstr(nm, "fail") && !strstr(nm, "error") && !strstr(nm, "timeout"))
            continue;
        uint64_t before = 0;
        for (int j = 0; j < a->n; j++)
            if (strcmp(a->name[j], nm) == 0)
                before = a->value[j];
        if (b->value[i] > before) {
            grew = 1;
            snprintf(which + strlen(which), cap - strlen(which), "%s%s+%llu", which[0] ? "," : "", nm,
                     (unsigned long long)(b->value[i] - before));
        }
    }
    return grew;
}

static int failure_main(const opts *o)
{
    CUDA_OR_DIE(cudaSetDevice(o->device));
    dqc_client *c = connect_or_die(o);
    register_or_die(c, o->layers);
    const char *modes[] = {"before", "partial", "stall"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        const char *mode = modes[m];
        char key[64], tokens[32], dev[16];
        snprintf(key, sizeof key, "die-%s", mode);
        snprintf(tokens, sizeof tokens, "%llu", (unsigned long long)o->tokens);
        snprintf(dev, sizeof dev, "%d", o->device);
        nccl_counters before, after;
        stats_nccl(c, &before);
        char *argv[] = {"nccl_bench",    "--die-mid-put", (char *)mode, "--addr",
                        (char *)o->addr, "--device",      dev,          "--tokens",
                        tokens,          "--key",         key,          NULL};
        pid_t pid;
        double t0 = now_s();
        int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
        if (rc) {
            fail_json("failure", "%s: cannot start the child: %s", mode, strerror(rc));
            continue;
        }
        int status = 0;
        pid_t w = 0;
        while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() - t0 < 90)
            nap_ms(20);
        if (w == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_json("failure", "%s: the child did not finish within 90 s", mode);
            continue;
        }
        int want_kill = strcmp(mode, "stall") != 0;
        int child_ok = want_kill ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                 : WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!child_ok)
            fail_json("failure", "%s: the child ended with status 0x%x (%s)", mode, status,
                      want_kill ? "expected SIGKILL after its partial request"
                                : "expected exit 0 after an error reply");

        /* The daemon notices (socket closed, or its deadline) and counts the failure. */
        char which[512] = "";
        int counted = 0;
        double t1 = now_s();
        while (!counted && now_s() - t1 < 30) {
            stats_nccl(c, &after);
            counted = failure_counted(&before, &after, which, sizeof which);
            if (!counted)
                nap_ms(200);
        }
        int alive = dqc_ping(c, "x", 1) == 0;
        dqc_seq s = seq_of(key);
        dqc_get_args ga = {.seq = s, .dtype = DQ_DTYPE_BF16};
        dqc_get_result gr = {0};
        int grc = dqc_get(c, &ga, &gr);
        dqc_get_result_free(&gr);

        /* A fresh client sets up NCCL and PUTs (and reads back) through it. */
        int fresh_ok = 0;
        char fresh_err[512] = "";
        {
            dqc_client *f = connect_or_die(o);
            int frc = dqc_nccl_setup(f, o->device);
            uint64_t ft = 4096;
            size_t fb = (size_t)ft * ROW_ELEMS * 2;
            uint16_t *h = xmalloc(fb);
            fill_gauss(h, fb / 2, 11 + m);
            void *kd = NULL, *vd = NULL, *kr = NULL, *vr = NULL;
            CUDA_OR_DIE(cudaMalloc(&kd, fb));
            CUDA_OR_DIE(cudaMalloc(&vd, fb));
            CUDA_OR_DIE(cudaMalloc(&kr, fb));
            CUDA_OR_DIE(cudaMalloc(&vr, fb));
            CUDA_OR_DIE(cudaMemcpy(kd, h, fb, cudaMemcpyHostToDevice));
            CUDA_OR_DIE(cudaMemcpy(vd, h, fb, cudaMemcpyHostToDevice));
            char fkey[80];
            snprintf(fkey, sizeof fkey, "%s-after", key);
            dqc_put_args pa = {.seq = seq_of(fkey),
                               .model = MODEL,
                               .num_layers = 1,
                               .tokens = ft,
                               .kv_heads = KV_HEADS,
                               .head_dim = HEAD_DIM,
                               .dtype = DQ_DTYPE_BF16,
                               .k = kd,
                               .v = vd};
            if (!frc)
                frc = dqc_put_dev(f, &pa, NULL);
            dqc_get_args fa = {.seq = seq_of(fkey), .num_layers = 1, .dtype = DQ_DTYPE_BF16};
            dqc_get_result fr = {0};
            if (!frc)
                frc = dqc_get_dev(f, &fa, kr, vr, fb, &fr);
            if (!frc)
                frc = dqc_get(f, &fa, &fr);
            if (!frc) {
                uint8_t *back = xmalloc(fb);
                CUDA_OR_DIE(cudaMemcpy(back, kr, fb, cudaMemcpyDeviceToHost));
                fresh_ok = fr.bytes == fb && memcmp(back, fr.k, fb) == 0;
                if (!fresh_ok)
                    snprintf(fresh_err, sizeof fresh_err, "NCCL and socket GET of the new sequence differ");
                free(back);
            } else {
                snprintf(fresh_err, sizeof fresh_err, "%s: %s", dqc_err_name(frc), dqc_last_error(f));
            }
            dqc_get_result_free(&fr);
            dqc_seq fs = seq_of(fkey);
            dqc_delete(f, &fs);
            dqc_free(f);
            cudaFree(kd);
            cudaFree(vd);
            cudaFree(kr);
            cudaFree(vr);
            free(h);
        }
        char names[1024] = "";
        for (int i = 0; i < after.n; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s=%llu", i ? "," : "", after.name[i],
                     (unsigned long long)after.value[i]);
        int ok = child_ok && counted && alive && grc == DQ_NOT_FOUND && fresh_ok;
        printf("{\"step\":\"failure_%s\",\"ok\":%s,\"child_ok\":%s,\"daemon_alive\":%s,\"seq_absent\":%s,"
               "\"failure_counted\":\"%s\",\"fresh_client_ok\":%s,\"seconds\":%.2f,\"nccl_counters\":\"%s\"}\n",
               mode, ok ? "true" : "false", child_ok ? "true" : "false", alive ? "true" : "false",
               grc == DQ_NOT_FOUND ? "true" : "false", which, fresh_ok ? "true" : "false", now_s() - t0, names);
        fflush(stdout);
        if (!counted)
            fail_json("failure", "%s: no NCCL failure counter grew in STATS within 30 s (nccl counters: %s)", mode,
                      names[0] ? names : "none");
        if (!alive)
            fail_json("failure", "%s: the daemon does not answer PING: %s", mode, dqc_last_error(c));
        if (grc != DQ_NOT_FOUND)
            fail_json("failure", "%s: GET of the half-sent sequence returned %s, expected NOT_FOUND", mode,
                      dqc_err_name(grc));
        if (!fresh_ok)
            fail_json("failure", "%s: a fresh client could not use NCCL afterwards: %s", mode, fresh_err);
        if (!alive)
            break;
    }
    dqc_free(c);
    printf("{\"step\":\"failure_tests\",\"ok\":%s,\"failures\":%d}\n", failures ? "false" : "true", failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    /* NVLink multicast stays off (mandatory on the shared GPU hosts); children inherit it. */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    opts o;
    parse_opts(argc, argv, &o);
    if (o.raw_peer)
        return raw_peer_main(&o);
    if (o.die_mode) {
        if (!o.key || (strcmp(o.die_mode, "before") && strcmp(o.die_mode, "partial") && strcmp(o.die_mode, "stall")))
            usage();
        return die_main(&o);
    }
    if (o.failure_tests)
        return failure_main(&o);
    return bench_main(&o);
}

/* dquantd's cuda backend end to end, through libdquant-client over a Unix socket.
 *
 *   gpu_e2e check --dquantd PATH --workdir DIR [--scale small|full] [--expect-backend cuda|cpu]
 *       Starts dquantd (--backend cuda) itself and checks, against in-process libdquant on the
 *       same inputs: PUT (several splits and dtypes, multi-layer, R > W profiles) leaves
 *       byte-identical GET_RAW records and tails; typed GET returns byte-identical values; ATTEND
 *       (with appends that seal windows on the GPU) is within 1e-3 of dq_attend; bad input fails
 *       with the codes libdquant gives and changes nothing. Then, with small --gpu-memory,
 *       sequences move to host memory and back without changing a byte, pinned ones stay, and
 *       with small host memory too, sequences are evicted and counted.
 *       --layout containers|hot|hot-only (default containers) runs every daemon with
 *       --gpu-attention-layout LAYOUT; with hot the check also compares a hot daemon with a
 *       containers one on the same data: ATTEND results (bit-identical with --exact 1, as the CPU
 *       emulation gives; else within 1e-3), hot windows and their bytes in STATS and in
 *       gpu_memory_used, and a model the hot kernel refuses (head_dim 64) holding no hot windows.
 *       --layout hot-only runs the same against a daemon that keeps no records on the GPU (GET_RAW,
 *       GET, moves between tiers rebuild them), checks that gpu_memory_used counts only the hot
 *       windows and tails, that the same --gpu-memory holds >= 1.7x the tokens of the hot layout
 *       (bytes per token-layer from the metrics), and a restart from the disk tier.
 *
 *   gpu_e2e bench --dquantd PATH --workdir DIR [--tokens 32768] [--layers 36] [--batches 1,32]
 *                 [--steps 10] [--put-conns 4] [--time-budget 420] [--workers N] [--trace 0|1]
 *       (built with libdquant-cuda, or its CPU emulation) PUT of a prefill of --tokens tokens x
 *       --layers layers in Qwen3-8B shape (8 KV heads x 128, 32 query heads), then decode steps of
 *       --layers sequential ATTEND calls (one per layer, each appending the new token) at each
 *       batch size, through the daemon and in-process with libdquant-cuda on the same data.
 *       --trace 1 runs the daemon at debug level and ends with the medians of its ATTEND trace
 *       lines: where a call's time went inside the daemon. --daemon-arg ARG (up to 8) passes ARG
 *       on to the daemon (e.g. --daemon-arg --frame-cache --daemon-arg 0).
 *
 * Every result is one JSON line on stdout; progress and failures go to stderr. Exit status 0 when
 * every check passed (bench: when everything ran), 1 otherwise. The daemon's log is
 * WORKDIR/<name>.log. */
#define _GNU_SOURCE /* nftw */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dquant/attention.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/hot.h"
#include "dquant/layer.h"
#include "dquant/profile.h"
#include "dquant/types.h"
#include "dqd_child.h"

#ifdef DQD_E2E_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "dquant/cuda.h"
#endif

/* ---- small utilities ---- */

static int g_failures;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpu_e2e: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpu_e2e: fatal: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

/* One check's result as a JSON line; a failure is counted. detail must not need escaping. */
static bool report(const char *check, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool report(const char *check, bool ok, const char *fmt, ...)
{
    char detail[512] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    for (char *p = detail; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            *p = '\'';
    printf("{\"check\":\"%s\",\"ok\":%s,\"detail\":\"%s\"}\n", check, ok ? "true" : "false", detail);
    fflush(stdout);
    if (!ok) {
        g_failures++;
        say("FAILED %s: %s", check, detail);
    }
    return ok;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) * 0x1p-53;
}

static float rng_normal(uint64_t *s)
{
    double u1 = rng_unit(s), u2 = rng_unit(s);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* count values of dtype, normal(0, 1) (keys get per-channel scales and offsets, like real keys). */
static void *random_tensor(size_t count, uint32_t n, dq_dtype dtype, bool keys, uint64_t seed)
{
    uint8_t *p = xmalloc(count * dq_dtype_size(dtype));
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
    for (size_t i = 0; i < count; i++) {
        float x = rng_normal(&s);
        if (keys) {
            uint32_t c = (uint32_t)(i % n);
            x = x * (0.5f + (float)(c * 37u % 11u) * 0.25f) + (float)((int)(c * 13u % 9u) - 4) * 0.5f;
        }
        if (dtype == DQ_DTYPE_F32)
            ((float *)(void *)p)[i] = x;
        else if (dtype == DQ_DTYPE_F16)
            ((uint16_t *)(void *)p)[i] = dq_f32_to_f16(x);
        else
            ((uint16_t *)(void *)p)[i] = dq_f32_to_bf16(x);
    }
    return p;
}

/* ---- the daemon as a child process (tests/support/dqd_child.h) ---- */

typedef dqd_daemon daemon_proc;

static const char *g_dquantd, *g_workdir;
static const char *g_dargs[8]; /* more arguments for every daemon started (--daemon-arg) */
static int g_ndargs;
static const char *g_layout = "containers"; /* --gpu-attention-layout of every daemon (--layout) */
static const char *g_layout_now;            /* that of the next daemon_start when set */
static bool g_exact;                        /* --exact 1: hot and containers results bit-identical */

/* The layout keeps hot windows (hot or hot-only). */
static bool layout_hot(void)
{
    return strcmp(g_layout, "hot") == 0 || strcmp(g_layout, "hot-only") == 0;
}

static bool layout_hot_only(void)
{
    return strcmp(g_layout, "hot-only") == 0;
}
static volatile pid_t g_child;

/* Killed (a time limit): take the daemon along. */
static void on_term(int sig)
{
    if (g_child > 0)
        kill(g_child, SIGTERM);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Starts the daemon as NAME (WORKDIR/NAME.sock, its log WORKDIR/NAME.log). */
static void daemon_start(daemon_proc *d, const char *name, const char *const *extra)
{
    const char *args[48];
    char layout[64];
    int n = 0;
    snprintf(layout, sizeof layout, "--gpu-attention-layout=%s", g_layout_now ? g_layout_now : g_layout);
    args[n++] = layout;
    for (int i = 0; extra && extra[i] && n < 38; i++)
        args[n++] = extra[i];
    for (int i = 0; i < g_ndargs && n < 46; i++)
        args[n++] = g_dargs[i];
    args[n] = NULL;
    const dqd_opts o = {.bin = g_dquantd,
                        .dir = g_workdir,
                        .name = name,
                        .log_level = "info",
                        .start_timeout_ms = 30000,
                        .stop_timeout_ms = 60000,
                        .extra = args};
    if (dqd_start(d, &o) != 0)
        die("dquantd '%s' did not start; see %s/%s.log", name, g_workdir, name);
    g_child = d->pid;
    say("%s up (log %s)", name, d->log);
}

/* SIGTERM and wait; a clean exit (0) is part of the checks (the CPU emulation of CUDA exits 99
 * when device or pinned memory leaked). */
static int daemon_stop(daemon_proc *d)
{
    int st = dqd_stop(d);
    g_child = 0;
    return st;
}

static bool log_contains(const daemon_proc *d, const char *needle)
{
    return dqd_log_contains(d, needle);
}

static dqc_client *client_open(const daemon_proc *d)
{
    dqc_options o;
    dqc_options_default(&o);
    o.io_timeout_ms = 600000;
    o.client_name = "gpu_e2e";
    dqc_client *c;
    char err[256];
    int rc = dqc_connect_ex(d->addr, &o, &c, err, sizeof err);
    if (rc)
        die("connect %s: %s", d->addr, err);
    return c;
}

static uint64_t stat_counter(dqc_client *c, const char *name)
{
    dqc_stats_result st = {0};
    if (dqc_stats(c, &st))
        die("STATS: %s", dqc_last_error(c));
    uint64_t v = 0;
    double g;
    if (dqc_stats_counter(&st, name, &v) != 0 && dqc_stats_gauge(&st, name, &g) == 0)
        v = (uint64_t)g;
    dqc_stats_result_free(&st);
    return v;
}

/* ---- a model and its in-process reference ---- */

typedef struct model {
    const char *name;
    uint32_t layers, q_heads, kv_heads, head_dim, n;
    dq_profile profile;
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
    dq_codec *codec;
    dq_workspace *ws;
} model;

static void model_init(model *m, const char *name, uint32_t layers, uint32_t q_heads, uint32_t kv_heads,
                       uint32_t head_dim, uint32_t window, uint32_t residual)
{
    memset(m, 0, sizeof *m);
    m->name = name;
    m->layers = layers;
    m->q_heads = q_heads;
    m->kv_heads = kv_heads;
    m->head_dim = head_dim;
    m->n = kv_heads * head_dim;
    if (dq_profile_builtin("dq226", kv_heads, head_dim, &m->profile))
        die("no dq226 profile for %u x %u", kv_heads, head_dim);
    if (window) {
        m->profile.window = window;
        m->profile.residual = residual;
        snprintf(m->profile.name, sizeof m->profile.name, "dq226-w%u-r%u", window, residual);
    }
    if (dq_profile_serialize(&m->profile, m->pbytes, sizeof m->pbytes, &m->plen))
        die("profile serialize");
    if (dq_codec_create(&m->profile, NULL, &m->codec) || dq_workspace_create(m->codec, &m->ws))
        die("codec");
}

/* The calling thread's workspace for the reference (the stress check runs several threads). */
static __thread dq_workspace *t_ws;

static dq_workspace *WS(const model *m)
{
    return t_ws ? t_ws : m->ws;
}

static void model_free(model *m)
{
    dq_workspace_free(m->ws);
    dq_codec_free(m->codec);
}

static void model_register(dqc_client *c, const model *m)
{
    dqc_model_spec spec = {m->name, m->layers, m->q_heads, m->kv_heads, m->head_dim, NULL, m->pbytes, m->plen};
    dqc_model_info info;
    if (dqc_register_model(c, &spec, &info))
        die("REGISTER_MODEL %s: %s", m->name, dqc_last_error(c));
    if (info.profile_len != m->plen || memcmp(info.profile, m->pbytes, m->plen))
        die("the daemon uses another profile than the one registered");
}

/* A sequence: its key and its reference layers. */
typedef struct refseq {
    model *m;
    char key[32];
    dq_layer **layers;
} refseq;

static void refseq_init(refseq *s, model *m, const char *key)
{
    s->m = m;
    snprintf(s->key, sizeof s->key, "%s", key);
    s->layers = calloc(m->layers, sizeof *s->layers);
    for (uint32_t i = 0; i < m->layers; i++)
        if (dq_layer_create(m->codec, &s->layers[i]))
            die("dq_layer_create");
}

static void refseq_free(refseq *s)
{
    for (uint32_t i = 0; s->layers && i < s->m->layers; i++)
        dq_layer_free(s->layers[i]);
    free(s->layers);
    s->layers = NULL;
}

static dqc_seq seqref(const refseq *s)
{
    return (dqc_seq){"gpu", s->key, strlen(s->key)};
}

/* PUT the same [nl, t, n] tokens to the daemon and, when it took them and apply_ref is set, to
 * the reference (which must take them too). Returns the daemon's code. */
static int put_both(dqc_client *c, refseq *s, uint32_t first, uint32_t nl, uint64_t t, dq_dtype dtype, const void *k,
                    const void *v, bool apply_ref)
{
    model *m = s->m;
    uint64_t start = dq_layer_tokens(s->layers[first]);
    dqc_put_args a = {seqref(s), m->name, start, first, nl, t, m->kv_heads, m->head_dim, dtype, k, v};
    dqc_put_result r;
    int rc = dqc_put(c, &a, &r);
    if (!apply_ref || rc)
        return rc;
    size_t lb = (size_t)t * m->n * dq_dtype_size(dtype);
    int ref = 0;
    for (uint32_t i = 0; i < nl && ref == 0; i++) {
        /* dq_layer_append is all-or-nothing per layer; the daemon is all-or-nothing per PUT */
        ref = dq_layer_append(s->layers[first + i], WS(m), (const uint8_t *)k + i * lb, (const uint8_t *)v + i * lb,
                              dtype, t, NULL);
    }
    if (ref && rc == 0)
        die("the reference refused a PUT the daemon took (%s)", dq_err_name(ref));
    return rc;
}

/* GET_RAW of every layer against the reference, byte for byte. */
static bool same_raw(dqc_client *c, const refseq *s, char *why, size_t whylen)
{
    const model *m = s->m;
    dqc_seq q = seqref(s);
    dqc_raw_result r = {0};
    int rc = dqc_get_raw(c, &q, 0, 0, &r);
    bool ok = rc == 0 && r.nlayers == m->layers;
    if (!ok)
        snprintf(why, whylen, "GET_RAW %s: %s", s->key, rc ? dqc_last_error(c) : "layer count");
    size_t wb = dq_codec_window_bytes(m->codec);
    for (uint32_t i = 0; ok && i < m->layers; i++) {
        const dq_layer *l = s->layers[i];
        const dqc_raw_layer *rl = &r.layers[i];
        size_t nwin = dq_layer_window_count(l), tail = dq_layer_tail_tokens(l);
        if (rl->tokens != dq_layer_tokens(l) || rl->windows != nwin || rl->tail_tokens != tail ||
            rl->records_bytes != nwin * wb) {
            snprintf(why, whylen, "%s layer %u: daemon %llu tokens (%llu windows + %llu), reference %zu (%zu + %zu)",
                     s->key, i, (unsigned long long)rl->tokens, (unsigned long long)rl->windows,
                     (unsigned long long)rl->tail_tokens, dq_layer_tokens(l), nwin, tail);
            ok = false;
            break;
        }
        for (size_t w = 0; w < nwin; w++) {
            const uint8_t *a = rl->records + w * wb, *b = dq_layer_window(l, w);
            if (memcmp(a, b, wb)) {
                size_t at = 0;
                while (a[at] == b[at])
                    at++;
                snprintf(why, whylen, "%s layer %u window %zu differs at byte %zu of %zu", s->key, i, w, at, wb);
                ok = false;
                break;
            }
        }
        size_t tb = tail * m->n * 2;
        if (ok && tail &&
            (rl->tail_bytes != tb || memcmp(rl->tail_k, dq_layer_tail(l, DQ_KIND_K), tb) ||
             memcmp(rl->tail_v, dq_layer_tail(l, DQ_KIND_V), tb))) {
            snprintf(why, whylen, "%s layer %u: the BF16 tail differs", s->key, i);
            ok = false;
        }
    }
    dqc_raw_result_free(&r);
    return ok;
}

/* Typed GET of [start, start + tokens) of every layer against dq_layer_decode, byte for byte. */
static bool same_get(dqc_client *c, const refseq *s, dq_dtype dtype, uint64_t start, uint64_t tokens, char *why,
                     size_t whylen)
{
    const model *m = s->m;
    dqc_get_args a = {seqref(s), 0, 0, start, tokens, dtype};
    dqc_get_result r = {0};
    int rc = dqc_get(c, &a, &r);
    if (rc) {
        snprintf(why, whylen, "GET %s: %s", s->key, dqc_last_error(c));
        return false;
    }
    if (!tokens)
        tokens = r.tokens;
    size_t per = (size_t)tokens * m->n * dq_dtype_size(dtype);
    uint8_t *ref = xmalloc(per);
    bool ok = r.tokens == tokens && r.num_layers == m->layers;
    if (!ok)
        snprintf(why, whylen, "GET %s: %llu tokens x %u layers", s->key, (unsigned long long)r.tokens, r.num_layers);
    for (uint32_t i = 0; ok && i < m->layers; i++) {
        for (int kind = 0; kind < 2 && ok; kind++) {
            if (dq_layer_decode(s->layers[i], WS(m), (dq_kind)kind, start, tokens, ref, dtype))
                die("dq_layer_decode");
            const uint8_t *got = (const uint8_t *)(kind ? r.v : r.k) + i * per;
            if (memcmp(got, ref, per)) {
                snprintf(why, whylen, "%s layer %u %s (%s, tokens %llu+%llu) differ", s->key, i, kind ? "V" : "K",
                         dq_dtype_name(dtype), (unsigned long long)start, (unsigned long long)tokens);
                ok = false;
            }
        }
    }
    free(ref);
    dqc_get_result_free(&r);
    return ok;
}

/* ATTEND one batch: items (sequence, layer), appending a fresh token to those with append[i],
 * against dq_layer_append + dq_attend. Returns the largest relative error. */
typedef struct att_case {
    refseq *seq;
    uint32_t layer;
    bool append;
} att_case;

/* An ATTEND request's inputs: random queries and appended tokens (where cases[i].append), the
 * items pointing at them, room for the outputs. */
typedef struct att_inputs {
    float *q, *ak, *av, *out, *lse;
    dqc_attend_item *items;
    dqc_attend_args args;
} att_inputs;

static void att_inputs_make(att_inputs *in, const att_case *cases, size_t n, uint64_t seed)
{
    model *m = cases[0].seq->m;
    size_t qs = (size_t)m->q_heads * m->head_dim;
    in->q = random_tensor(n * qs, m->head_dim, DQ_DTYPE_F32, false, seed);
    in->ak = random_tensor(n * m->n, m->n, DQ_DTYPE_F32, true, seed + 1);
    in->av = random_tensor(n * m->n, m->n, DQ_DTYPE_F32, false, seed + 2);
    in->items = calloc(n, sizeof *in->items);
    for (size_t i = 0; i < n; i++) {
        in->items[i].seq = seqref(cases[i].seq);
        in->items[i].layer = cases[i].layer;
        in->items[i].q = in->q + i * qs;
        if (cases[i].append) {
            in->items[i].append_k = in->ak + i * m->n;
            in->items[i].append_v = in->av + i * m->n;
        }
    }
    in->args = (dqc_attend_args){in->items, n, m->q_heads, m->kv_heads, m->head_dim, DQ_DTYPE_F32, 0.0f};
    in->out = xmalloc(n * qs * sizeof(float));
    in->lse = xmalloc(n * m->q_heads * sizeof(float));
}

static void att_inputs_free(att_inputs *in)
{
    free(in->q);
    free(in->ak);
    free(in->av);
    free(in->items);
    free(in->out);
    free(in->lse);
}

static double attend_both(dqc_client *c, const att_case *cases, size_t n, uint64_t seed, int *rc_out)
{
    model *m = cases[0].seq->m;
    size_t qs = (size_t)m->q_heads * m->head_dim;
    att_inputs in;
    att_inputs_make(&in, cases, n, seed);
    const float *q = in.q, *ak = in.ak, *av = in.av, *out = in.out, *lse = in.lse;
    float *rout = xmalloc(n * qs * sizeof(float)), *rlse = xmalloc(n * m->q_heads * sizeof(float));
    *rc_out = dqc_attend(c, &in.args, in.out, in.lse);
    double worst = 0;
    if (*rc_out == 0) {
        for (size_t i = 0; i < n; i++)
            if (cases[i].append && dq_layer_append(cases[i].seq->layers[cases[i].layer], WS(m), ak + i * m->n,
                                                   av + i * m->n, DQ_DTYPE_F32, 1, NULL))
                die("reference append");
        for (size_t i = 0; i < n; i++) {
            dq_attn_item it = {cases[i].seq->layers[cases[i].layer], q + i * qs, rout + i * qs, rlse + i * m->q_heads};
            if (dq_attend(m->codec, WS(m), m->q_heads, 1.0f / sqrtf((float)m->head_dim), &it, 1))
                die("dq_attend");
        }
        for (size_t i = 0; i < n; i++) {
            double mx = 0, d = 0;
            for (size_t j = 0; j < qs; j++) {
                mx = fmax(mx, fabs(rout[i * qs + j]));
                d = fmax(d, fabs((double)out[i * qs + j] - rout[i * qs + j]));
            }
            worst = fmax(worst, d / fmax(mx, 1e-6));
            for (uint32_t h = 0; h < m->q_heads; h++) {
                float a1 = lse[i * m->q_heads + h], b1 = rlse[i * m->q_heads + h];
                double e = isinf(b1) ? (a1 == b1 ? 0 : 1) : fabs((double)a1 - b1) / fmax(1.0, fabs(b1));
                worst = fmax(worst, e);
            }
        }
    }
    att_inputs_free(&in);
    free(rout);
    free(rlse);
    return worst;
}

/* An ATTEND of cases (all appending), with value `bad` planted in item `which`'s k or v at `at`:
 * the daemon's code, and libdquant's for that token (dq_layer_append on a fresh layer). */
static void attend_bad_append(dqc_client *c, const att_case *cases, size_t n, size_t which, bool in_v, size_t at,
                              float bad, uint64_t seed, int *rc_daemon, int *rc_lib)
{
    model *m = cases[0].seq->m;
    att_inputs in;
    att_inputs_make(&in, cases, n, seed);
    (in_v ? in.av : in.ak)[which * m->n + at] = bad;
    *rc_daemon = dqc_attend(c, &in.args, in.out, in.lse);
    dq_layer *probe;
    if (dq_layer_create(m->codec, &probe))
        die("probe");
    *rc_lib = dq_layer_append(probe, WS(m), in.ak + which * m->n, in.av + which * m->n, DQ_DTYPE_F32, 1, NULL);
    dq_layer_free(probe);
    att_inputs_free(&in);
}

/* PUTs tokens random tokens to every layer of a sequence (bf16, one PUT). */
static int put_seq(dqc_client *c, refseq *s, uint64_t tokens, uint64_t seed)
{
    model *m = s->m;
    void *k = random_tensor(m->layers * tokens * m->n, m->n, DQ_DTYPE_BF16, true, seed);
    void *v = random_tensor(m->layers * tokens * m->n, m->n, DQ_DTYPE_BF16, false, seed + 1);
    int rc = put_both(c, s, 0, m->layers, tokens, DQ_DTYPE_BF16, k, v, true);
    free(k);
    free(v);
    return rc;
}

/* ---- check mode ---- */

typedef struct scale {
    uint32_t big_layers;   /* Qwen-shaped model */
    uint64_t splits[6];    /* PUT token counts, in order */
    int decode_steps;      /* ATTEND steps with appends */
    uint64_t evict_tokens; /* per sequence in the eviction checks */
} scale;

static const char *g_expect = "cuda";

/* PUTs, GET_RAW, GET, ATTEND and error semantics on one model. */
static void check_model(dqc_client *c, model *m, const scale *sc, const char *tag)
{
    char why[512], name[96];
    model_register(c, m);
    refseq s1, s2;
    char k1[32], k2[32];
    snprintf(k1, sizeof k1, "%s-s1", tag);
    snprintf(k2, sizeof k2, "%s-s2", tag);
    refseq_init(&s1, m, k1);
    refseq_init(&s2, m, k2);
    static const dq_dtype dts[3] = {DQ_DTYPE_F32, DQ_DTYPE_BF16, DQ_DTYPE_F16};

    /* splits: all layers in one PUT, then one PUT per layer, dtypes rotating */
    bool ok = true;
    for (int i = 0; ok && sc->splits[i]; i++) {
        uint64_t t = sc->splits[i];
        dq_dtype dt = dts[i % 3];
        void *k = random_tensor(m->layers * t * m->n, m->n, dt, true, 100 + (uint64_t)i);
        void *v = random_tensor(m->layers * t * m->n, m->n, dt, false, 200 + (uint64_t)i);
        int rc;
        if (i % 2 == 0) {
            rc = put_both(c, &s1, 0, m->layers, t, dt, k, v, true);
        } else {
            size_t lb = t * m->n * dq_dtype_size(dt);
            rc = 0;
            for (uint32_t l = 0; l < m->layers && rc == 0; l++)
                rc = put_both(c, &s1, l, 1, t, dt, (uint8_t *)k + l * lb, (uint8_t *)v + l * lb, true);
        }
        if (rc) {
            snprintf(name, sizeof name, "%s_put", tag);
            ok = report(name, false, "PUT %d (%llu tokens %s): %s", i, (unsigned long long)t, dq_dtype_name(dt),
                        dqc_last_error(c));
        }
        free(k);
        free(v);
    }
    /* a second sequence, one PUT */
    {
        uint64_t t = sc->splits[0] + sc->splits[1];
        void *k = random_tensor(m->layers * t * m->n, m->n, DQ_DTYPE_BF16, true, 300);
        void *v = random_tensor(m->layers * t * m->n, m->n, DQ_DTYPE_BF16, false, 301);
        if (put_both(c, &s2, 0, m->layers, t, DQ_DTYPE_BF16, k, v, true))
            ok = report("put_s2", false, "%s", dqc_last_error(c));
        free(k);
        free(v);
    }
    if (!ok)
        goto out;
    snprintf(name, sizeof name, "%s_put_get_raw_identical", tag);
    why[0] = 0;
    ok = same_raw(c, &s1, why, sizeof why) && same_raw(c, &s2, why, sizeof why);
    report(name, ok, "%s", ok ? "window records and tails byte-identical to dq_layer_append" : why);

    snprintf(name, sizeof name, "%s_get_typed_identical", tag);
    why[0] = 0;
    bool gok = true;
    for (int d = 0; d < 3 && gok; d++)
        gok = same_get(c, &s1, dts[d], 0, 0, why, sizeof why);
    uint64_t total = dq_layer_tokens(s1.layers[0]);
    if (gok)
        gok = same_get(c, &s1, DQ_DTYPE_F32, 37, total - 37 - 5, why, sizeof why);
    report(name, gok, "%s", gok ? "f32/bf16/f16, whole range and a sub-range" : why);

    /* ATTEND: a mixed batch, then decode steps whose appends seal windows on the GPU */
    {
        att_case cases[8];
        size_t nc = 0;
        for (uint32_t l = 0; l < m->layers && nc < 6; l++) {
            cases[nc++] = (att_case){&s1, l, l % 2 == 0};
            cases[nc++] = (att_case){&s2, l, false};
        }
        int rc;
        double err = attend_both(c, cases, nc, 400, &rc);
        snprintf(name, sizeof name, "%s_attend_batch", tag);
        report(name, rc == 0 && err <= 1e-3, "%zu items, max relative error %.3g%s%s", nc, err, rc ? ": " : "",
               rc ? dqc_last_error(c) : "");
        double worst = 0;
        int bad = 0;
        for (int step = 0; step < sc->decode_steps && !bad; step++) {
            att_case dc[4];
            size_t nd = 0;
            dc[nd++] = (att_case){&s1, 0, true};
            dc[nd++] = (att_case){&s2, 0, true};
            dc[nd++] = (att_case){&s1, m->layers - 1, true};
            err = attend_both(c, dc, nd, 500 + (uint64_t)step, &rc);
            worst = fmax(worst, err);
            if (rc)
                bad = rc;
        }
        snprintf(name, sizeof name, "%s_attend_decode_steps", tag);
        report(name, !bad && worst <= 1e-3, "%d steps with appends (s1 now %zu tokens), max relative error %.3g%s%s",
               sc->decode_steps, dq_layer_tokens(s1.layers[0]), worst, bad ? ": " : "", bad ? dqc_last_error(c) : "");
        snprintf(name, sizeof name, "%s_attend_appends_identical", tag);
        why[0] = 0;
        ok = same_raw(c, &s1, why, sizeof why) && same_raw(c, &s2, why, sizeof why);
        report(name, ok, "%s", ok ? "records sealed by ATTEND appends byte-identical" : why);

        /* a bad appended token in the last item: libdquant's code, no item appended, nothing changed */
        struct {
            const char *what;
            bool in_v;
            size_t at;
            float value;
            int want;
        } bad_tok[] = {
            {"nan in k", false, 5, NAN, DQ_NONFINITE},
            {"beyond bf16 in v", true, 9, 3.4e38f, DQ_NONFINITE},
            {"out of range in k", false, 2, 1.0e6f, DQ_RANGE},
            {"out of range in v", true, m->n - 1, 1.0e6f, DQ_RANGE},
        };
        bool all = true;
        why[0] = 0;
        for (size_t b = 0; b < sizeof bad_tok / sizeof bad_tok[0]; b++) {
            att_case dc[3] = {{&s1, 0, true}, {&s2, 0, true}, {&s1, m->layers - 1, true}};
            int rd, rl;
            attend_bad_append(c, dc, 3, 2, bad_tok[b].in_v, bad_tok[b].at, bad_tok[b].value, 700 + b, &rd, &rl);
            if (rd != rl || rl != bad_tok[b].want) {
                all = false;
                snprintf(why, sizeof why, "%s: daemon %s, libdquant %s", bad_tok[b].what, dq_err_name(rd),
                         dq_err_name(rl));
            }
        }
        if (all && !(same_raw(c, &s1, why, sizeof why) && same_raw(c, &s2, why, sizeof why)))
            all = false;
        snprintf(name, sizeof name, "%s_attend_bad_append", tag);
        report(name, all, "%s", all ? "NONFINITE and RANGE as libdquant, no layer changed" : why);
    }

    /* bad input: the codes libdquant gives, nothing changed, also across layers (a fresh sequence,
     * so that every layer has the same length) */
    {
        refseq s3;
        char k3[32];
        snprintf(k3, sizeof k3, "%s-s3", tag);
        refseq_init(&s3, m, k3);
        if (put_seq(c, &s3, sc->splits[1], 590))
            report("put_s3", false, "%s", dqc_last_error(c));
        uint64_t t = 5;
        size_t cnt = (size_t)m->layers * t * m->n;
        float *k = random_tensor(cnt, m->n, DQ_DTYPE_F32, true, 600);
        float *v = random_tensor(cnt, m->n, DQ_DTYPE_F32, false, 601);
        struct {
            const char *what;
            size_t at;
            float value;
            int want;
        } bad[] = {
            {"nan", 3 * m->n + 7, NAN, DQ_NONFINITE},
            {"beyond bf16", 2 * m->n + 1, 3.4e38f, DQ_NONFINITE},
            {"out of range", 4 * m->n + 2, 1.0e6f, DQ_RANGE},
        };
        bool all = true;
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            float *kk = xmalloc(cnt * sizeof(float));
            memcpy(kk, k, cnt * sizeof(float));
            /* in the last layer, so that the layers before are applied and rolled back */
            kk[(size_t)(m->layers - 1) * t * m->n + bad[b].at] = bad[b].value;
            int rc = put_both(c, &s3, 0, m->layers, t, DQ_DTYPE_F32, kk, v, false);
            dq_layer *probe;
            if (dq_layer_create(m->codec, &probe))
                die("probe");
            int want = dq_layer_append(probe, WS(m), kk + (size_t)(m->layers - 1) * t * m->n,
                                       v + (size_t)(m->layers - 1) * t * m->n, DQ_DTYPE_F32, t, NULL);
            dq_layer_free(probe);
            snprintf(name, sizeof name, "%s_bad_input_%zu", tag, b);
            all &= report(name, rc == want && want == bad[b].want,
                          "%s in the last layer of a multi-layer PUT: daemon %s, "
                          "libdquant %s",
                          bad[b].what, dq_err_name(rc), dq_err_name(want));
            why[0] = 0;
            snprintf(name, sizeof name, "%s_bad_input_%zu_changes_nothing", tag, b);
            bool same = same_raw(c, &s3, why, sizeof why);
            all &= report(name, same, "%s", same ? "records unchanged" : why);
            free(kk);
        }
        /* a large value the exact rotation check must accept (its head's norm is over the limit) */
        float *kk = xmalloc(cnt * sizeof(float));
        memcpy(kk, k, cnt * sizeof(float));
        kk[(size_t)(m->layers - 1) * t * m->n + m->n + 3] = 20000.0f;
        int rc = put_both(c, &s3, 0, m->layers, t, DQ_DTYPE_F32, kk, v, true);
        if (rc) {
            all = false;
            snprintf(why, sizeof why, "a value of 20000 (in range after rotation) was refused: %s", dq_err_name(rc));
        }
        free(kk);
        uint64_t have = dq_layer_tokens(s3.layers[0]);
        dqc_put_args a = {seqref(&s3), m->name, have + 1, 0, 1, t, m->kv_heads, m->head_dim, DQ_DTYPE_F32, k, v};
        rc = dqc_put(c, &a, NULL);
        if (rc != DQ_ORDER) {
            all = false;
            snprintf(why, sizeof why, "a PUT past the end gave %s, not ORDER", dq_err_name(rc));
        }
        snprintf(name, sizeof name, "%s_bad_input", tag);
        report(name, all, "%s", all ? "NONFINITE, RANGE, ORDER as libdquant; in-range large value accepted" : why);
        snprintf(name, sizeof name, "%s_after_bad_input_identical", tag);
        why[0] = 0;
        bool same = same_raw(c, &s3, why, sizeof why);
        report(name, same, "%s", same ? "records identical" : why);
        free(k);
        free(v);
        refseq_free(&s3);
    }
    /* a decode step's token filling the window in every layer, NaN in the last one: the layers
     * before sealed their window and are rolled back (with W == R the GPU append keeps no copy of
     * the tail it only read); the same step again, valid, seals byte-identical windows */
    {
        refseq s4;
        char k4[32];
        snprintf(k4, sizeof k4, "%s-s4", tag);
        refseq_init(&s4, m, k4);
        const uint32_t R = dq_codec_profile(m->codec)->residual;
        bool all = put_seq(c, &s4, R - 1, 700) == 0;
        if (!all)
            snprintf(why, sizeof why, "PUT of R - 1 = %u tokens: %s", R - 1, dqc_last_error(c));
        size_t cnt = (size_t)m->layers * m->n;
        float *k = random_tensor(cnt, m->n, DQ_DTYPE_F32, true, 701);
        float *v = random_tensor(cnt, m->n, DQ_DTYPE_F32, false, 702);
        float *kk = xmalloc(cnt * sizeof(float));
        memcpy(kk, k, cnt * sizeof(float));
        kk[(size_t)(m->layers - 1) * m->n + 5] = NAN;
        int rc = all ? put_both(c, &s4, 0, m->layers, 1, DQ_DTYPE_F32, kk, v, false) : DQ_OK;
        if (all && rc != DQ_NONFINITE) {
            all = false;
            snprintf(why, sizeof why, "a NaN in the last layer's sealing token gave %s", dq_err_name(rc));
        }
        if (all && !same_raw(c, &s4, why, sizeof why))
            all = false;
        rc = all ? put_both(c, &s4, 0, m->layers, 1, DQ_DTYPE_F32, k, v, true) : DQ_OK;
        if (all && rc) {
            all = false;
            snprintf(why, sizeof why, "the valid sealing token after the rollback: %s", dq_err_name(rc));
        }
        if (all && !same_raw(c, &s4, why, sizeof why))
            all = false;
        snprintf(name, sizeof name, "%s_sealing_rollback", tag);
        report(name, all, "%s", all ? "rolled back unchanged, then sealed identical to libdquant" : why);
        free(kk);
        free(k);
        free(v);
        refseq_free(&s4);
    }
    /* a decode step in which every item's token fills its window (three sequences at R - 1
     * tokens, two layers each): the daemon seals them together (dqd_gpu_append_seal_tokens); a NaN
     * in one item's token first: the whole ATTEND refused, nothing changed */
    {
        refseq sq[3];
        char kq[32];
        att_case cases[6];
        size_t nc = 0;
        const uint32_t R = dq_codec_profile(m->codec)->residual;
        bool all = true;
        for (int i = 0; i < 3; i++) {
            snprintf(kq, sizeof kq, "%s-q%d", tag, i);
            refseq_init(&sq[i], m, kq);
            if (all && put_seq(c, &sq[i], R - 1, 800 + 2 * (uint64_t)i)) {
                all = false;
                snprintf(why, sizeof why, "PUT of R - 1 = %u tokens: %s", R - 1, dqc_last_error(c));
            }
            cases[nc++] = (att_case){&sq[i], 0, true};
            cases[nc++] = (att_case){&sq[i], m->layers - 1, true};
        }
        int rc = DQ_OK, rl = DQ_OK;
        if (all)
            attend_bad_append(c, cases, nc, 4, false, 9, NAN, 810, &rc, &rl);
        if (all && (rc != rl || rc != DQ_NONFINITE)) {
            all = false;
            snprintf(why, sizeof why, "a NaN in one sealing item: daemon %s, libdquant %s", dq_err_name(rc),
                     dq_err_name(rl));
        }
        for (int i = 0; all && i < 3; i++)
            all = same_raw(c, &sq[i], why, sizeof why);
        double err = all ? attend_both(c, cases, nc, 820, &rc) : 0.0;
        if (all && (rc || err > 1e-3)) {
            all = false;
            snprintf(why, sizeof why, "the sealing step: %s, max relative error %.3g", rc ? dqc_last_error(c) : "ok",
                     err);
        }
        for (int i = 0; all && i < 3; i++)
            all = same_raw(c, &sq[i], why, sizeof why);
        snprintf(name, sizeof name, "%s_attend_sealing_together", tag);
        report(name, all, "%s",
               all ? "6 windows sealed in one ATTEND identical to libdquant; a NaN changed nothing" : why);
        for (int i = 0; i < 3; i++)
            refseq_free(&sq[i]);
    }
out:
    refseq_free(&s1);
    refseq_free(&s2);
}

/* Several clients at once on a GPU budget far below their sequences: PUTs, ATTENDs with appends,
 * GET_RAW, PIN/UNPIN race with the moves between tiers; every sequence must end byte-identical. */
typedef struct stress_arg {
    const daemon_proc *d;
    model *m;
    const scale *sc;
    int id, iters;
    int errors;
    char why[512];
    refseq s[2];
} stress_arg;

static void *stress_thread(void *arg)
{
    stress_arg *a = arg;
    model *m = a->m;
    if (dq_workspace_create(m->codec, &t_ws))
        die("workspace");
    dqc_client *c = client_open(a->d);
    uint64_t rs = 0x5eed0000u + (uint64_t)a->id;
    for (int j = 0; j < 2; j++) {
        char key[16];
        snprintf(key, sizeof key, "st%d-%d", a->id, j);
        refseq_init(&a->s[j], m, key);
        if (put_seq(c, &a->s[j], a->sc->evict_tokens / 2, 900 + (uint64_t)a->id * 10 + (uint64_t)j)) {
            snprintf(a->why, sizeof a->why, "PUT %s: %s", key, dqc_last_error(c));
            a->errors++;
        }
    }
    for (int it = 0; it < a->iters && !a->errors; it++) {
        uint64_t r = rng_next(&rs);
        refseq *s = &a->s[r & 1];
        uint32_t layer = (uint32_t)((r >> 8) % m->layers);
        int action = (int)((r >> 16) % 10);
        if (action < 5) {
            int rc;
            att_case cs[2] = {{s, layer, true}, {&a->s[!(r & 1)], (layer + 1) % m->layers, false}};
            double err = attend_both(c, cs, 2, r, &rc);
            if (rc || err > 1e-3) {
                snprintf(a->why, sizeof a->why, "ATTEND %s: %s, error %.3g", s->key, rc ? dqc_last_error(c) : "ok",
                         err);
                a->errors++;
            }
        } else if (action < 7) {
            void *k = random_tensor(37 * m->n, m->n, DQ_DTYPE_F16, true, r);
            void *v = random_tensor(37 * m->n, m->n, DQ_DTYPE_F16, false, r + 1);
            if (put_both(c, s, layer, 1, 37, DQ_DTYPE_F16, k, v, true)) {
                snprintf(a->why, sizeof a->why, "PUT %s layer %u: %s", s->key, layer, dqc_last_error(c));
                a->errors++;
            }
            free(k);
            free(v);
        } else if (action < 9) {
            if (!same_raw(c, s, a->why, sizeof a->why))
                a->errors++;
        } else {
            dqc_seq q = seqref(s);
            if ((r >> 32) & 1 ? dqc_pin(c, &q) : dqc_unpin(c, &q)) {
                snprintf(a->why, sizeof a->why, "PIN/UNPIN %s: %s", s->key, dqc_last_error(c));
                a->errors++;
            }
        }
    }
    for (int j = 0; j < 2 && !a->errors; j++)
        if (!same_raw(c, &a->s[j], a->why, sizeof a->why))
            a->errors++;
    for (int j = 0; j < 2; j++)
        refseq_free(&a->s[j]);
    dqc_free(c);
    dq_workspace_free(t_ws);
    t_ws = NULL;
    return NULL;
}

static void check_stress(model *m, const scale *sc, uint64_t per_seq)
{
    enum { NT = 4 };
    char gpu_mem[32];
    /* 8 sequences of half the probe's tokens; room for about 3 of them */
    snprintf(gpu_mem, sizeof gpu_mem, "%llu", (unsigned long long)(per_seq * 3 / 2));
    const char *args[] = {"--backend", "cuda", "--workers", "4", "--gpu-memory", gpu_mem, "--host-memory", "2G", NULL};
    daemon_proc d;
    daemon_start(&d, "stress", args);
    dqc_client *c = client_open(&d);
    model_register(c, m);
    stress_arg a[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i] = (stress_arg){&d, m, sc, i, sc->decode_steps, 0, "", {{0}}};
        pthread_create(&th[i], NULL, stress_thread, &a[i]);
    }
    int errors = 0;
    const char *why = "";
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        if (a[i].errors) {
            errors += a[i].errors;
            why = a[i].why;
        }
    }
    uint64_t dem = stat_counter(c, "gpu_demotions"), pro = stat_counter(c, "gpu_promotions");
    uint64_t ev = stat_counter(c, "evictions"), sp = stat_counter(c, "gpu_spills");
    dqc_free(c);
    int st = daemon_stop(&d);
    report("stress_concurrent_clients_and_moves", errors == 0 && dem > 0 && pro > 0 && ev == 0 && st == 0,
           "%d clients x %d operations on 8 sequences, GPU room for about 3: %llu moved to host, %llu layers back, "
           "%llu spilled, %llu evicted, exit %d%s%s",
           NT, sc->decode_steps, (unsigned long long)dem, (unsigned long long)pro, (unsigned long long)sp,
           (unsigned long long)ev, st, errors ? "; " : "", why);
}

/* A GPU budget of exactly one sequence: growing it finds no room on the GPU (nothing else to move),
 * so its layers go to the host and the write succeeds there. */
static void check_spill(model *m, const scale *sc, uint64_t per_seq)
{
    char gpu_mem[32], why[512] = "";
    snprintf(gpu_mem, sizeof gpu_mem, "%llu", (unsigned long long)(per_seq > (1u << 20) ? per_seq : (1u << 20)));
    const char *args[] = {"--backend", "cuda", "--workers", "4", "--gpu-memory", gpu_mem, NULL};
    daemon_proc d;
    daemon_start(&d, "spill", args);
    dqc_client *c = client_open(&d);
    model_register(c, m);
    refseq s;
    refseq_init(&s, m, "spill");
    int rc = put_seq(c, &s, sc->evict_tokens, 950);
    uint64_t on_gpu = stat_counter(c, "gpu_memory_used");
    if (!rc)
        rc = put_seq(c, &s, 300, 952);
    uint64_t spills = stat_counter(c, "gpu_spills"), after = stat_counter(c, "gpu_memory_used");
    bool same = rc == 0 && same_raw(c, &s, why, sizeof why);
    int arc = -1;
    att_case ac = {&s, 0, true};
    double err = same ? attend_both(c, &ac, 1, 953, &arc) : 1;
    report("tiers_spill_when_gpu_is_full",
           rc == 0 && on_gpu > 0 && spills == m->layers && after == 0 && same && arc == 0 && err <= 1e-3,
           "GPU budget %s: first PUT on the GPU (%llu bytes), the next one %s with %llu layers moved to the host "
           "(GPU now %llu bytes)%s%s; ATTEND %s, error %.3g",
           gpu_mem, (unsigned long long)on_gpu, rc ? dqc_last_error(c) : "ok", (unsigned long long)spills,
           (unsigned long long)after, same ? "" : "; ", why, arc ? dqc_last_error(c) : "ok", err);
    /* the same for ATTEND appends: a sequence alone on the GPU fills its last window slot */
    refseq b;
    refseq_init(&b, m, "spill-b");
    rc = put_seq(c, &b, sc->evict_tokens, 960);
    uint64_t sp0 = stat_counter(c, "gpu_spills");
    double worst = 0;
    uint32_t W = m->profile.window;
    for (uint32_t i = 0; i < W && rc == 0; i++) {
        att_case bc = {&b, 0, true};
        worst = fmax(worst, attend_both(c, &bc, 1, 970 + i, &rc));
    }
    uint64_t sp1 = stat_counter(c, "gpu_spills");
    why[0] = 0;
    same = rc == 0 && same_raw(c, &b, why, sizeof why);
    report("tiers_spill_on_attend_append", rc == 0 && sp1 == sp0 + 1 && worst <= 1e-3 && same,
           "%u ATTEND appends, the last seals a window the GPU has no room for: %s, %llu layer moved to the host, "
           "error %.3g%s%s",
           W, rc ? dqc_last_error(c) : "ok", (unsigned long long)(sp1 - sp0), worst, same ? "" : "; ", why);
    refseq_free(&b);
    refseq_free(&s);
    dqc_free(c);
    int st = daemon_stop(&d);
    report("spill_daemon_exit", st == 0, "exit status %d", st);
}

static void check_tiers(model *m, const scale *sc)
{
    char why[512] = "";
    const char *base[] = {"--backend", "cuda", "--workers", "4", NULL};
    /* 1. how much GPU memory one sequence takes */
    daemon_proc d;
    daemon_start(&d, "probe", base);
    dqc_client *c = client_open(&d);
    model_register(c, m);
    refseq probe;
    refseq_init(&probe, m, "probe");
    if (put_seq(c, &probe, sc->evict_tokens, 700))
        die("probe PUT: %s", dqc_last_error(c));
    uint64_t per = stat_counter(c, "gpu_memory_used");
    uint64_t host0 = stat_counter(c, "host_memory_used");
    refseq_free(&probe);
    dqc_free(c);
    int st = daemon_stop(&d);
    report("tiers_probe", per > 0 && st == 0, "one sequence holds %llu GPU bytes; daemon exit %d",
           (unsigned long long)per, st);
    if (!per)
        return;

    /* 2. room for two sequences on the GPU, plenty of host memory: moves, never drops */
    char gpu_mem[32];
    snprintf(gpu_mem, sizeof gpu_mem, "%llu", (unsigned long long)(per * 5 / 2));
    const char *evict_args[] = {"--backend", "cuda",          "--workers", "4", "--gpu-memory",
                                gpu_mem,     "--host-memory", "2G",        NULL};
    daemon_start(&d, "tiers", evict_args);
    c = client_open(&d);
    model_register(c, m);
    enum { NSEQ = 5 };
    refseq s[NSEQ];
    bool ok = true;
    for (int i = 0; i < NSEQ && ok; i++) {
        char key[16];
        snprintf(key, sizeof key, "t%d", i);
        refseq_init(&s[i], m, key);
        if (put_seq(c, &s[i], sc->evict_tokens, 710 + 2 * (uint64_t)i)) {
            ok = report("tiers_put", false, "%s: %s", key, dqc_last_error(c));
        }
        if (i == 1) {
            dqc_seq q = seqref(&s[1]);
            if (dqc_pin(c, &q))
                ok = report("tiers_pin", false, "%s", dqc_last_error(c));
        }
    }
    uint64_t host_used = stat_counter(c, "host_memory_used");
    uint64_t demoted = stat_counter(c, "gpu_demotions");
    if (ok) {
        uint64_t dem = stat_counter(c, "gpu_demotions"), ev = stat_counter(c, "evictions");
        uint64_t gseq = stat_counter(c, "gpu_sequences"), used = stat_counter(c, "gpu_memory_used");
        report("tiers_demote_to_host", dem >= 3 && ev == 0 && gseq <= 2 && used <= per * 5 / 2,
               "%d sequences, GPU room for 2: %llu moved to host, %llu evicted, %llu on the GPU using %llu bytes", NSEQ,
               (unsigned long long)dem, (unsigned long long)ev, (unsigned long long)gseq, (unsigned long long)used);
        if (layout_hot()) {
            /* hot copies live and die with the GPU layers: only the resident sequences have them */
            uint64_t per_w = 0;
            for (uint32_t l = 0; l < m->layers; l++)
                per_w += dq_layer_window_count(s[0].layers[l]);
            uint64_t hw = stat_counter(c, "gpu_hot_windows"), hb = stat_counter(c, "gpu_hot_bytes");
            report("tiers_hot_copies_follow_layers", per_w > 0 && hw == gseq * per_w && hb > 0 && hb < used,
                   "%llu sequences on the GPU x %llu windows: %llu hot windows, %llu of %llu bytes",
                   (unsigned long long)gseq, (unsigned long long)per_w, (unsigned long long)hw, (unsigned long long)hb,
                   (unsigned long long)used);
        }
        bool same = true;
        for (int i = 0; i < NSEQ && same; i++)
            same = same_raw(c, &s[i], why, sizeof why);
        report("tiers_records_identical_in_both_tiers", same, "%s", same ? "GET_RAW of every sequence" : why);
        /* the pinned one never left the GPU: attending it moves nothing */
        uint64_t pro0 = stat_counter(c, "gpu_promotions");
        int rc;
        att_case pc = {&s[1], 0, true};
        double err = attend_both(c, &pc, 1, 720, &rc);
        uint64_t pro1 = stat_counter(c, "gpu_promotions");
        report("tiers_pinned_stays_on_gpu", rc == 0 && err <= 1e-3 && pro1 == pro0,
               "ATTEND on the pinned sequence: %llu promotions, error %.3g", (unsigned long long)(pro1 - pro0), err);
        /* the oldest came back to the GPU on use, the same bytes */
        att_case oc[2] = {{&s[0], 0, true}, {&s[0], m->layers - 1, false}};
        const uint64_t hi0 = stat_counter(c, "gpu_hot_attend_items");
        err = attend_both(c, oc, 2, 721, &rc);
        uint64_t pro2 = stat_counter(c, "gpu_promotions");
        /* with the hot layout, promoted layers are transcoded again and attended over the copies */
        const uint64_t hot_items = stat_counter(c, "gpu_hot_attend_items") - hi0;
        const bool hot_ok = !layout_hot() || hot_items == 2;
        why[0] = 0;
        bool back = same_raw(c, &s[0], why, sizeof why);
        report("tiers_promote_on_use", rc == 0 && err <= 1e-3 && pro2 >= pro1 + 2 && back && hot_ok,
               "ATTEND on a host-tier sequence: %llu layers promoted, error %.3g, %llu items over hot windows%s%s",
               (unsigned long long)(pro2 - pro1), err, (unsigned long long)hot_items, back ? "" : "; ", why);
        /* a PUT to a host-tier sequence brings its layers back too */
        uint64_t dem1 = stat_counter(c, "gpu_demotions");
        void *k = random_tensor(m->layers * 3 * m->n, m->n, DQ_DTYPE_F32, true, 730);
        void *v = random_tensor(m->layers * 3 * m->n, m->n, DQ_DTYPE_F32, false, 731);
        rc = put_both(c, &s[2], 0, m->layers, 3, DQ_DTYPE_F32, k, v, true);
        free(k);
        free(v);
        why[0] = 0;
        back = rc == 0 && same_raw(c, &s[2], why, sizeof why);
        report("tiers_put_to_host_tier", back && stat_counter(c, "gpu_promotions") > pro2,
               "PUT on a moved sequence: %s%s (demotions %llu -> %llu)", rc ? dqc_last_error(c) : "ok", why,
               (unsigned long long)dem1, (unsigned long long)stat_counter(c, "gpu_demotions"));
        /* one sequence larger than the whole GPU budget still fits on the host */
        refseq big;
        refseq_init(&big, m, "big");
        rc = put_seq(c, &big, sc->evict_tokens * 3, 740);
        why[0] = 0;
        bool bok = rc == 0 && same_raw(c, &big, why, sizeof why);
        att_case bc = {&big, 1, true};
        double berr = bok ? attend_both(c, &bc, 1, 741, &rc) : 1;
        report("tiers_larger_than_gpu_budget", bok && rc == 0 && berr <= 1e-3,
               "a PUT beyond the GPU budget is served from host memory: %s%s, attend error %.3g",
               rc ? dqc_last_error(c) : "ok", why, berr);
        refseq_free(&big);
    }
    for (int i = 0; i < NSEQ; i++)
        refseq_free(&s[i]);
    dqc_free(c);
    st = daemon_stop(&d);
    report("tiers_daemon_exit", st == 0, "exit status %d (the CPU emulation exits 99 on leaked device memory)", st);

    check_stress(m, sc, per);
    check_spill(m, sc, per);

    /* 3. little host memory as well: a GPU victim that does not fit on the host either is evicted
     * outright (host room for half a sequence), and with room for one and a half, moving a victim
     * evicts older host-tier sequences first (the LRU order goes on across tiers) */
    uint64_t per_host = demoted && host_used > host0 ? (host_used - host0) / demoted : per;
    for (int variant = 0; variant < 2; variant++) {
        char host_mem[32];
        uint64_t hb = host0 + (variant == 0 ? per_host / 2 : per_host * 3 / 2);
        snprintf(host_mem, sizeof host_mem, "%llu", (unsigned long long)(hb > (1u << 20) ? hb : (1u << 20)));
        const char *drop_args[] = {"--backend", "cuda",          "--workers", "4", "--gpu-memory",
                                   gpu_mem,     "--host-memory", host_mem,    NULL};
        daemon_start(&d, variant == 0 ? "drops" : "cascade", drop_args);
        c = client_open(&d);
        model_register(c, m);
        ok = true;
        for (int i = 0; i < NSEQ && ok; i++) {
            char key[16];
            snprintf(key, sizeof key, "d%d", i);
            refseq_init(&s[i], m, key);
            int rc = put_seq(c, &s[i], sc->evict_tokens, 750 + 2 * (uint64_t)i);
            if (rc)
                ok = report(variant == 0 ? "drops_put" : "cascade_put", false, "%s: %s", key, dqc_last_error(c));
        }
        if (ok) {
            uint64_t drops = stat_counter(c, "gpu_drops"), ev = stat_counter(c, "evictions");
            uint64_t dem = stat_counter(c, "gpu_demotions");
            int gone = 0, same = 0;
            bool last_kept = false;
            for (int i = 0; i < NSEQ; i++) {
                dqc_seq q = seqref(&s[i]);
                dqc_raw_result r = {0};
                int rc = dqc_get_raw(c, &q, 0, 1, &r);
                dqc_raw_result_free(&r);
                if (rc == DQ_NOT_FOUND)
                    gone++;
                else if (same_raw(c, &s[i], why, sizeof why))
                    same++;
                if (i == NSEQ - 1)
                    last_kept = rc == 0;
            }
            if (variant == 0)
                report("drops_evict_when_host_is_full",
                       drops >= 1 && ev >= drops && gone == (int)ev && same + gone == NSEQ && last_kept,
                       "host budget %s: %llu GPU sequences dropped, %llu moved (evictions %llu), %d not found, "
                       "%d identical",
                       host_mem, (unsigned long long)drops, (unsigned long long)dem, (unsigned long long)ev, gone,
                       same);
            else
                report("cascade_host_lru", ev >= 1 && dem >= 1 && gone == (int)ev && same + gone == NSEQ && last_kept,
                       "host budget %s: %llu moved to host, %llu evicted (%llu of them straight from the GPU), "
                       "%d not found, %d identical",
                       host_mem, (unsigned long long)dem, (unsigned long long)ev, (unsigned long long)drops, gone,
                       same);
        }
        for (int i = 0; i < NSEQ; i++)
            refseq_free(&s[i]);
        dqc_free(c);
        st = daemon_stop(&d);
        report(variant == 0 ? "drops_daemon_exit" : "cascade_daemon_exit", st == 0, "exit status %d", st);
    }
}

/* ATTEND of cases (nothing appended unless cases[i].append) on a daemon: out and lse, the code. */
static int attend_get(dqc_client *c, const att_case *cases, size_t n, uint64_t seed, float *out, float *lse)
{
    model *m = cases[0].seq->m;
    att_inputs in;
    att_inputs_make(&in, cases, n, seed);
    int rc = dqc_attend(c, &in.args, in.out, in.lse);
    if (rc == 0) {
        memcpy(out, in.out, n * m->q_heads * m->head_dim * sizeof(float));
        memcpy(lse, in.lse, n * m->q_heads * sizeof(float));
    }
    att_inputs_free(&in);
    return rc;
}

/* Largest difference of a against b relative to b's largest magnitude (lse: to max(1, |b|)); 0
 * only when bit-identical with exact. */
static double att_diff(const float *a, const float *b, size_t count, const float *la, const float *lb, size_t nl,
                       bool exact)
{
    if (exact)
        return memcmp(a, b, count * sizeof(float)) || memcmp(la, lb, nl * sizeof(float)) ? 1.0 : 0.0;
    double mx = 1e-6, d = 0, e = 0;
    for (size_t j = 0; j < count; j++) {
        mx = fmax(mx, fabs(b[j]));
        d = fmax(d, fabs((double)a[j] - b[j]));
    }
    for (size_t h = 0; h < nl; h++)
        e = fmax(e, fabs((double)la[h] - lb[h]) / fmax(1.0, fabs(lb[h])));
    return fmax(d / mx, e);
}

/* The hot layout against the containers layout on the same data (see the top of the file). */
static void check_hot(model *big, model *refused, const scale *sc)
{
    const char *base[] = {"--backend", "cuda", "--workers", "4", NULL};
    daemon_proc dh, dcn;
    g_layout_now = "containers";
    daemon_start(&dcn, "layout-containers", base);
    g_layout_now = g_layout;
    daemon_start(&dh, layout_hot_only() ? "layout-hot-only" : "layout-hot", base);
    g_layout_now = NULL;
    dqc_client *ch = client_open(&dh), *cc = client_open(&dcn);
    model_register(ch, big);
    model_register(cc, big);
    model_register(ch, refused);
    model_register(cc, refused);
    refseq sh, sc_, rh, rc_;
    refseq_init(&sh, big, "hot-big");
    refseq_init(&sc_, big, "hot-big");
    refseq_init(&rh, refused, "hot-d64");
    refseq_init(&rc_, refused, "hot-d64");
    /* a tail of R - 3 tokens after whole windows, so that the decode steps below seal one */
    const uint64_t W = big->profile.window, R = big->profile.residual;
    const uint64_t tokens = (sc->evict_tokens / W) * W + R - 3;
    if (put_seq(ch, &sh, tokens, 1300) || put_seq(cc, &sc_, tokens, 1300))
        die("hot check PUT: %s / %s", dqc_last_error(ch), dqc_last_error(cc));
    uint64_t wins = 0;
    for (uint32_t l = 0; l < big->layers; l++)
        wins += dq_layer_window_count(sh.layers[l]);
    const uint64_t hw = stat_counter(ch, "gpu_hot_windows"), hb = stat_counter(ch, "gpu_hot_bytes");
    const uint64_t uh = stat_counter(ch, "gpu_memory_used"), uc = stat_counter(cc, "gpu_memory_used");
    const size_t hwb = dq_hot_window_bytes(big->codec);
    report("hot_windows_counted", hw == wins && stat_counter(cc, "gpu_hot_windows") == 0,
           "%llu hot windows on the hot daemon (the sequence seals %llu), %llu on the containers one",
           (unsigned long long)hw, (unsigned long long)wins, (unsigned long long)stat_counter(cc, "gpu_hot_windows"));
    if (!layout_hot_only()) {
        report("hot_memory_accounted", hb >= wins * hwb && uh == uc + hb && stat_counter(cc, "gpu_hot_bytes") == 0,
               "gpu_memory_used %llu (hot) = %llu (containers) + %llu hot bytes (%llu windows of %zu B and slack)",
               (unsigned long long)uh, (unsigned long long)uc, (unsigned long long)hb, (unsigned long long)wins, hwb);
    } else {
        /* only what is held: the BF16 tail buffers (R tokens of K and V per layer) and the hot bytes */
        const uint64_t tails = (uint64_t)big->layers * 2u * big->profile.residual * big->n * sizeof(uint16_t);
        const uint64_t ho = stat_counter(ch, "gpu_hot_only_windows");
        report("hot_only_memory_accounted",
               hb >= wins * hwb && uh == tails + hb && ho == wins && stat_counter(cc, "gpu_hot_only_windows") == 0,
               "gpu_memory_used %llu = %llu (tails) + %llu hot bytes (%llu hot-only windows of %zu B and slack; "
               "the containers daemon holds %llu); %.1f B per token-layer in hot windows, %.1f in records",
               (unsigned long long)uh, (unsigned long long)tails, (unsigned long long)hb, (unsigned long long)ho, hwb,
               (unsigned long long)uc, (double)hb / (double)(wins * W),
               (double)dq_codec_window_bytes(big->codec) / (double)W);
    }

    char why[512] = "";
    const uint64_t rb0 = stat_counter(ch, "gpu_records_rebuilt");
    const uint64_t rg0 = stat_counter(ch, "gpu_records_rebuilt_gpu"), rc0 = stat_counter(ch, "gpu_records_rebuilt_cpu");
    bool same = same_raw(ch, &sh, why, sizeof why);
    report("hot_records_unchanged", same, "%s", same ? "GET_RAW byte-identical to dq_layer_append" : why);
    if (layout_hot_only()) {
        const uint64_t rb1 = stat_counter(ch, "gpu_records_rebuilt");
        const uint64_t rg1 = stat_counter(ch, "gpu_records_rebuilt_gpu");
        const uint64_t rc1 = stat_counter(ch, "gpu_records_rebuilt_cpu");
        report("hot_only_get_raw_rebuilds", same && rb1 - rb0 == wins && rg1 - rg0 == wins && rc1 == rc0,
               "GET_RAW of %llu windows held as hot windows only: %llu records rebuilt, %llu of them on the GPU "
               "(dqcu_rebuild_hot), %llu on the CPU",
               (unsigned long long)wins, (unsigned long long)(rb1 - rb0), (unsigned long long)(rg1 - rg0),
               (unsigned long long)(rc1 - rc0));
        same = same_get(ch, &sh, DQ_DTYPE_F32, 0, dq_layer_tokens(sh.layers[0]), why, sizeof why);
        const uint64_t rg2 = stat_counter(ch, "gpu_records_rebuilt_gpu");
        report("hot_only_get_equals", same && rg2 > rg1 && stat_counter(ch, "gpu_records_rebuilt_cpu") == rc0,
               "%s; %llu records rebuilt on the GPU for it",
               same ? "typed GET of every token identical to dq_layer_decode" : why, (unsigned long long)(rg2 - rg1));
    }

    /* ATTEND on both, then decode steps whose appends seal a window on each side (layers 0, last) */
    const size_t qs = (size_t)big->q_heads * big->head_dim;
    float *oh = xmalloc(4 * qs * sizeof(float)), *oc = xmalloc(4 * qs * sizeof(float));
    float *lh = xmalloc(4 * big->q_heads * sizeof(float)), *lc = xmalloc(4 * big->q_heads * sizeof(float));
    double worst = 0;
    int bad = 0;
    const uint64_t it0 = stat_counter(ch, "gpu_hot_attend_items");
    for (int step = 0; step < 6 && !bad; step++) {
        att_case ah[2] = {{&sh, 0, step > 0}, {&sh, big->layers - 1, step > 0}};
        att_case ac[2] = {{&sc_, 0, step > 0}, {&sc_, big->layers - 1, step > 0}};
        int r1 = attend_get(ch, ah, 2, 1400 + (uint64_t)step, oh, lh);
        int r2 = attend_get(cc, ac, 2, 1400 + (uint64_t)step, oc, lc);
        if (r1 || r2)
            bad = r1 ? r1 : r2;
        else
            worst = fmax(worst, att_diff(oh, oc, 2 * qs, lh, lc, 2 * (size_t)big->q_heads, g_exact));
    }
    const uint64_t hw2 = stat_counter(ch, "gpu_hot_windows");
    const uint64_t it1 = stat_counter(ch, "gpu_hot_attend_items"), itc = stat_counter(cc, "gpu_hot_attend_items");
    report("hot_attend_equals_containers",
           !bad && worst <= (g_exact ? 0.0 : 1e-3) && hw2 == wins + 2 && it1 - it0 == 12 && itc == 0,
           "6 ATTEND steps (5 appending to 2 layers, sealing a window each): %s difference %.3g, hot windows %llu -> "
           "%llu, items over hot windows %llu (containers daemon %llu)%s%s",
           g_exact ? "bit-exact" : "relative", worst, (unsigned long long)wins, (unsigned long long)hw2,
           (unsigned long long)(it1 - it0), (unsigned long long)itc, bad ? ": " : "", bad ? dq_err_name(bad) : "");

    /* a model the hot kernel refuses: records only, the same results */
    if (put_seq(ch, &rh, 300, 1500) || put_seq(cc, &rc_, 300, 1500))
        die("hot check PUT (d64): %s / %s", dqc_last_error(ch), dqc_last_error(cc));
    const size_t rqs = (size_t)refused->q_heads * refused->head_dim;
    float *ro1 = xmalloc(rqs * sizeof(float)), *ro2 = xmalloc(rqs * sizeof(float));
    float *rl1 = xmalloc(refused->q_heads * sizeof(float)), *rl2 = xmalloc(refused->q_heads * sizeof(float));
    att_case r1c = {&rh, 0, false}, r2c = {&rc_, 0, false};
    int ra = attend_get(ch, &r1c, 1, 1600, ro1, rl1), rb = attend_get(cc, &r2c, 1, 1600, ro2, rl2);
    double rd = ra || rb ? 1 : att_diff(ro1, ro2, rqs, rl1, rl2, refused->q_heads, g_exact);
    const uint64_t it2 = stat_counter(ch, "gpu_hot_attend_items");
    report("hot_refused_shape_uses_records",
           stat_counter(ch, "gpu_hot_windows") == hw2 && !(ra || rb) && rd <= (g_exact ? 0.0 : 1e-3) && it2 == it1,
           "head_dim %u: hot windows %llu (unchanged: %llu), items over hot windows +%llu, ATTEND %s, difference "
           "to the containers daemon %.3g",
           refused->head_dim, (unsigned long long)stat_counter(ch, "gpu_hot_windows"), (unsigned long long)hw2,
           (unsigned long long)(it2 - it1), ra || rb ? "failed" : "ok", rd);
    free(ro1);
    free(ro2);
    free(rl1);
    free(rl2);
    if (g_exact) {
        /* the emulation only: a launch the hot kernel refuses to plan runs over the records */
        daemon_proc dr;
        setenv("DQCU_FAKE_HOT_MAX_TOKENS", "64", 1);
        g_layout_now = g_layout;
        daemon_start(&dr, "layout-hot-unplanned", base);
        g_layout_now = NULL;
        unsetenv("DQCU_FAKE_HOT_MAX_TOKENS");
        dqc_client *cr = client_open(&dr);
        model_register(cr, big);
        refseq u1, u2;
        refseq_init(&u1, big, "hot-unplanned");
        refseq_init(&u2, big, "hot-unplanned");
        if (put_seq(cr, &u1, tokens, 1700) || put_seq(cc, &u2, tokens, 1700))
            die("hot check PUT (unplanned): %s / %s", dqc_last_error(cr), dqc_last_error(cc));
        att_case uc1[2] = {{&u1, 0, true}, {&u1, big->layers - 1, false}};
        att_case uc2[2] = {{&u2, 0, true}, {&u2, big->layers - 1, false}};
        int ua = attend_get(cr, uc1, 2, 1800, oh, lh), ub = attend_get(cc, uc2, 2, 1800, oc, lc);
        double ud = ua || ub ? 1 : att_diff(oh, oc, 2 * qs, lh, lc, 2 * (size_t)big->q_heads, true);
        const uint64_t uw = stat_counter(cr, "gpu_hot_windows"), ui = stat_counter(cr, "gpu_hot_attend_items");
        report("hot_unplanned_launch_uses_records", !(ua || ub) && ud == 0 && uw == wins && ui == 0,
               "hot kernel refusing more than 64 tokens: ATTEND %s, difference %.3g, hot windows %llu, items over "
               "hot windows %llu",
               ua || ub ? "failed" : "ok", ud, (unsigned long long)uw, (unsigned long long)ui);
        refseq_free(&u1);
        refseq_free(&u2);
        dqc_free(cr);
        int s3 = daemon_stop(&dr);
        report("hot_unplanned_daemon_exit", s3 == 0, "exit status %d", s3);
    }
    free(oh);
    free(oc);
    free(lh);
    free(lc);
    refseq_free(&sh);
    refseq_free(&sc_);
    refseq_free(&rh);
    refseq_free(&rc_);
    dqc_free(ch);
    dqc_free(cc);
    int s1 = daemon_stop(&dh), s2 = daemon_stop(&dcn);
    report("hot_daemon_exit", s1 == 0 && s2 == 0, "exit status %d (hot), %d (containers)", s1, s2);
}

/* Sequences of one layer of T tokens (the same data) PUT to a daemon of the layout until NS are
 * stored; how many stay on the GPU and its bytes. */
static void fill_gpu(const char *name, const char *layout, const char *gpu_mem, model *m, uint64_t T, int ns,
                     const void *k, const void *v, uint64_t *gseq, uint64_t *used, uint64_t *tokens)
{
    const char *args[] = {"--backend", "cuda", "--workers", "2", "--gpu-memory", gpu_mem, "--host-memory", "1G", NULL};
    const char *const *a = args;
    if (!gpu_mem)
        args[4] = NULL;
    daemon_proc d;
    g_layout_now = layout;
    daemon_start(&d, name, a);
    g_layout_now = NULL;
    dqc_client *c = client_open(&d);
    model_register(c, m);
    for (int i = 0; i < ns; i++) {
        refseq s;
        char key[32];
        snprintf(key, sizeof key, "%s-%d", name, i);
        refseq_init(&s, m, key);
        if (put_both(c, &s, 0, 1, T, DQ_DTYPE_BF16, k, v, false))
            die("%s PUT %d: %s", name, i, dqc_last_error(c));
        refseq_free(&s);
    }
    *gseq = stat_counter(c, "gpu_sequences");
    *used = stat_counter(c, "gpu_memory_used");
    *tokens = stat_counter(c, "tokens_stored");
    dqc_free(c);
    int st = daemon_stop(&d);
    report("hot_only_capacity_daemon_exit", st == 0, "%s: exit status %d", name, st);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* An empty directory at path (what an earlier run left there removed). */
static void fresh_dir(const char *path)
{
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) && errno != ENOENT)
        die("cannot empty %s: %s", path, strerror(errno));
    if (mkdir(path, 0700))
        die("mkdir %s: %s", path, strerror(errno));
}

/* --layout hot-only: the GPU memory it saves and a restart from the disk tier (top of the file). */
static void check_hot_only(model *big)
{
    /* 1. one layer of 1 x 128 (n = 128, dq226), 16384 tokens per sequence: 128 windows, so the BF16
     * tail buffer (R tokens, allocated whole) weighs little. A budget of 10.7 hot sequences. */
    model cap;
    model_init(&cap, "cap", 1, 2, 1, 128, 0, 0);
    const uint64_t T = 16384;
    enum { NS = 20 };
    void *k = random_tensor(T * cap.n, cap.n, DQ_DTYPE_BF16, true, 1900);
    void *v = random_tensor(T * cap.n, cap.n, DQ_DTYPE_BF16, false, 1901);
    uint64_t g1, per_hot, t1;
    fill_gpu("cap-probe", "hot", NULL, &cap, T, 1, k, v, &g1, &per_hot, &t1);
    char gpu_mem[32];
    snprintf(gpu_mem, sizeof gpu_mem, "%llu", (unsigned long long)(per_hot * 107 / 10));
    uint64_t gh, uh, th, go, uo, to;
    fill_gpu("cap-hot", "hot", gpu_mem, &cap, T, NS, k, v, &gh, &uh, &th);
    fill_gpu("cap-hot-only", "hot-only", gpu_mem, &cap, T, NS, k, v, &go, &uo, &to);
    free(k);
    free(v);
    const double bh = gh ? (double)uh / (double)(gh * T) : 0, bo = go ? (double)uo / (double)(go * T) : 0;
    report("hot_only_holds_more_tokens", gh >= 10 && go * 10 >= gh * 17 && th == NS * T && to == NS * T,
           "--gpu-memory %s (10.7x one hot sequence of %llu tokens): hot keeps %llu sequences on the GPU "
           "(%llu B, %.1f B per token-layer), hot-only %llu (%llu B, %.1f B per token-layer): %.2fx the tokens",
           gpu_mem, (unsigned long long)T, (unsigned long long)gh, (unsigned long long)uh, bh, (unsigned long long)go,
           (unsigned long long)uo, bo, gh ? (double)go / (double)gh : 0.0);
    model_free(&cap);

    /* 2. the disk tier: a shutdown writes the GPU-resident (hot-only) layers as records, a restart
     * reads them back, ATTEND brings them to the GPU again */
    char dir[4096], why[512] = "";
    snprintf(dir, sizeof dir, "%s/hot-only-disk", g_workdir);
    fresh_dir(dir);
    const char *dargs[] = {"--backend", "cuda", "--workers", "2", "--disk-dir", dir, NULL};
    daemon_proc d;
    daemon_start(&d, "hot-only-disk", dargs);
    dqc_client *c = client_open(&d);
    model_register(c, big);
    refseq s;
    refseq_init(&s, big, "disk");
    const uint64_t W = big->profile.window;
    if (put_seq(c, &s, 3 * W + 17, 2000))
        die("disk PUT: %s", dqc_last_error(c));
    const uint64_t ho = stat_counter(c, "gpu_hot_only_windows");
    dqc_free(c);
    int st = daemon_stop(&d);
    daemon_start(&d, "hot-only-disk-2", dargs);
    c = client_open(&d);
    model_register(c, big);
    const uint64_t rec = stat_counter(c, "disk_recovered");
    bool same = same_raw(c, &s, why, sizeof why);
    int rc = -1;
    att_case ac[2] = {{&s, 0, true}, {&s, big->layers - 1, false}};
    double err = same ? attend_both(c, ac, 2, 2010, &rc) : 1;
    const uint64_t ho2 = stat_counter(c, "gpu_hot_only_windows"), rb0 = stat_counter(c, "gpu_records_rebuilt");
    why[0] = 0;
    bool again = rc == 0 && same_raw(c, &s, why, sizeof why);
    const uint64_t rb1 = stat_counter(c, "gpu_records_rebuilt");
    report(
        "hot_only_disk_restart",
        st == 0 && ho == 3 * big->layers && rec == 1 && same && rc == 0 && err <= 1e-3 && ho2 > 0 && again && rb1 > rb0,
        "%llu hot-only windows written at shutdown (exit %d), %llu sequence recovered, GET_RAW %s; ATTEND %s "
        "(error %.3g) brings %llu windows back as hot windows, GET_RAW rebuilds %llu records: %s%s",
        (unsigned long long)ho, st, (unsigned long long)rec, same ? "identical" : "differs", rc ? "failed" : "ok", err,
        (unsigned long long)ho2, (unsigned long long)(rb1 - rb0), again ? "identical" : "differs", why[0] ? why : "");
    refseq_free(&s);
    dqc_free(c);
    st = daemon_stop(&d);
    report("hot_only_disk_daemon_exit", st == 0, "exit status %d", st);

    /* 3. while running: a GPU tier of about one sequence and 5 MiB of host memory, so that older
     * sequences go GPU -> host -> disk; every one reads back identical, and ATTEND brings the
     * oldest from the disk to the GPU as hot-only windows again */
    enum { NSP = 6 };
    snprintf(dir, sizeof dir, "%s/hot-only-spill", g_workdir);
    fresh_dir(dir);
    const char *sargs[] = {"--backend",    "cuda", "--workers",     "2",  "--disk-dir", dir,
                           "--gpu-memory", "3M",   "--host-memory", "5M", NULL};
    daemon_start(&d, "hot-only-spill", sargs);
    c = client_open(&d);
    model_register(c, big);
    refseq sp[NSP];
    for (int i = 0; i < NSP; i++) {
        char key[16];
        snprintf(key, sizeof key, "sp%d", i);
        refseq_init(&sp[i], big, key);
        if (put_seq(c, &sp[i], 3 * W + 17, 2100 + 2 * (uint64_t)i))
            die("spill PUT %d: %s", i, dqc_last_error(c));
    }
    const uint64_t dsp = stat_counter(c, "disk_spills"), dem = stat_counter(c, "gpu_demotions");
    const uint64_t rbs0 = stat_counter(c, "gpu_records_rebuilt");
    /* the demotions rebuilt their records on the GPU, none on the CPU */
    const uint64_t rgs0 = stat_counter(c, "gpu_records_rebuilt_gpu"), rcs0 = stat_counter(c, "gpu_records_rebuilt_cpu");
    bool all = true;
    why[0] = 0;
    for (int i = 0; i < NSP && all; i++)
        all = same_raw(c, &sp[i], why, sizeof why);
    const uint64_t loads = stat_counter(c, "disk_loads");
    att_case oc = {&sp[0], 0, true};
    rc = -1;
    err = all ? attend_both(c, &oc, 1, 2200, &rc) : 1;
    why[0] = 0;
    again = rc == 0 && same_raw(c, &sp[0], why, sizeof why);
    report("hot_only_spill_to_disk_and_back",
           dsp > 0 && dem >= big->layers && all && loads > 0 && rc == 0 && err <= 1e-3 && again &&
               stat_counter(c, "gpu_records_rebuilt") > rbs0 && rgs0 > 0 && rcs0 == 0,
           "%d sequences, GPU 3 MiB, host 5 MiB: %llu layers moved off the GPU (%llu records rebuilt on the GPU, "
           "%llu on the CPU), %llu records "
           "spilled to disk, GET_RAW of every sequence %s (%llu disk loads); ATTEND on the oldest %s (error %.3g), "
           "GET_RAW after it %s%s%s",
           NSP, (unsigned long long)dem, (unsigned long long)rgs0, (unsigned long long)rcs0, (unsigned long long)dsp,
           all ? "identical" : "differs", (unsigned long long)loads, rc ? "failed" : "ok", err,
           again ? "identical" : "differs", why[0] ? ": " : "", why);
    for (int i = 0; i < NSP; i++)
        refseq_free(&sp[i]);
    dqc_free(c);
    st = daemon_stop(&d);
    report("hot_only_spill_daemon_exit", st == 0, "exit status %d", st);
}

static int run_check(const char *scale_name)
{
    scale sc;
    if (strcmp(scale_name, "small") == 0)
        sc = (scale){2, {100, 157, 1, 260, 0}, 70, 512};
    else
        sc = (scale){4, {100, 257, 1, 700, 3000, 0}, 140, 2048};

    const char *args[] = {"--backend", "cuda", "--workers", "4", NULL};
    daemon_proc d;
    daemon_start(&d, "check", args);
    dqc_client *c = client_open(&d);
    dqc_server_info info;
    dqc_server(c, &info);
    bool backend_ok = strcmp(g_expect, "any") == 0 || strcmp(info.backend, g_expect) == 0;
    report("backend", backend_ok, "HELLO says backend '%s' (expected %s)", info.backend, g_expect);
    if (strcmp(info.backend, "cuda") == 0)
        report("backend_log", log_contains(&d, "backend cuda:"), "the daemon logs its device");

    model qwen, small;
    model_init(&qwen, "qwen-shape", sc.big_layers, 32, 8, 128, 0, 0);
    model_init(&small, "w64-r192", 3, 8, 2, 64, 64, 192);
    check_model(c, &qwen, &sc, "qwen");
    check_model(c, &small, &sc, "w64r192");
    dqc_free(c);
    int st = daemon_stop(&d);
    report("check_daemon_exit", st == 0, "exit status %d", st);
    model_free(&small);

    if (strcmp(info.backend, "cuda") == 0)
        check_tiers(&qwen, &sc);
    if (strcmp(info.backend, "cuda") == 0 && layout_hot()) {
        model d64;
        model_init(&d64, "d64", 2, 8, 2, 64, 0, 0);
        check_hot(&qwen, &d64, &sc);
        model_free(&d64);
    }
    if (strcmp(info.backend, "cuda") == 0 && layout_hot_only())
        check_hot_only(&qwen);
    model_free(&qwen);
    printf("{\"summary\":\"check\",\"failures\":%d}\n", g_failures);
    return g_failures ? 1 : 0;
}

/* ---- bench mode ---- */

#ifdef DQD_E2E_HAVE_CUDA

#define CK(call)                                                                      \
    do {                                                                              \
        cudaError_t ck_e = (call);                                                    \
        if (ck_e != cudaSuccess)                                                      \
            die("%s:%d %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(ck_e)); \
    } while (0)
#define DQ(call)                                                                                                  \
    do {                                                                                                          \
        int dq_rc = (call);                                                                                       \
        if (dq_rc < 0)                                                                                            \
            die("%s:%d %s: %s (CUDA %d)", __FILE__, __LINE__, #call, dq_err_name(dq_rc), dqcu_last_cuda_error()); \
    } while (0)

typedef struct bench_cfg {
    uint32_t tokens, layers;
    uint32_t batches[4];
    int nbatches;
    int steps;
    int put_conns;
    double budget; /* seconds for the whole bench */
    double t0;
    bool trace; /* daemon at debug level; its ATTEND trace summarized at the end */
} bench_cfg;

/* Random BF16 K and V pools; (sequence, layer) reads tokens [off, off + ctx) with off from a hash. */
typedef struct pool {
    uint32_t n, ctx, extra;
    uint16_t *k, *v;
} pool;

static size_t pool_off(const pool *p, uint32_t seq, uint32_t layer)
{
    uint64_t s = (uint64_t)seq * 1000003u + layer;
    return (size_t)(rng_next(&s) % p->extra) * p->n;
}

/* One in-process layer on the device: its window records in one block, the pointer array, the tail. */
typedef struct ip_layer {
    uint8_t *recs;
    uint8_t **d_win;
    uint16_t *tail;
    uint32_t nwin, ntail;
} ip_layer;

typedef struct ip_state {
    model *m;
    dqcu_codec *dc;
    size_t wb;
    cudaStream_t s[8];
    uint8_t *pin[8]; /* pinned staging per stream */
    size_t pin_bytes;
    uint16_t *stage[8]; /* device staging per stream (K then V) */
    int32_t *status[8];
} ip_state;

static void ip_init(ip_state *ip, model *m, uint32_t chunk_tokens)
{
    memset(ip, 0, sizeof *ip);
    ip->m = m;
    DQ(dqcu_codec_create(m->codec, &ip->dc));
    ip->wb = dq_codec_window_bytes(m->codec);
    ip->pin_bytes = (size_t)chunk_tokens * m->n * 2 * 2;
    for (int i = 0; i < 8; i++) {
        CK(cudaStreamCreateWithFlags(&ip->s[i], cudaStreamNonBlocking));
        CK(cudaMallocHost((void **)&ip->pin[i], ip->pin_bytes));
        CK(cudaMalloc((void **)&ip->stage[i], ip->pin_bytes));
        CK(cudaMalloc((void **)&ip->status[i], chunk_tokens / m->profile.window * sizeof(int32_t) + 64));
    }
}

static void ip_free(ip_state *ip)
{
    for (int i = 0; i < 8; i++) {
        CK(cudaStreamSynchronize(ip->s[i]));
        CK(cudaFree(ip->stage[i]));
        CK(cudaFree(ip->status[i]));
        CK(cudaFreeHost(ip->pin[i]));
        CK(cudaStreamDestroy(ip->s[i]));
    }
    dqcu_codec_free(ip->dc);
}

static void ip_layer_alloc(ip_state *ip, ip_layer *l, uint32_t nwin, uint32_t extra_win)
{
    const model *m = ip->m;
    memset(l, 0, sizeof *l);
    CK(cudaMalloc((void **)&l->recs, (size_t)(nwin + extra_win) * ip->wb));
    CK(cudaMalloc((void **)&l->d_win, (size_t)(nwin + extra_win) * sizeof(uint8_t *)));
    CK(cudaMalloc((void **)&l->tail, (size_t)m->profile.residual * m->n * 2 * sizeof(uint16_t)));
    uint8_t **h = xmalloc((size_t)(nwin + extra_win) * sizeof *h);
    for (uint32_t i = 0; i < nwin + extra_win; i++)
        h[i] = l->recs + (size_t)i * ip->wb;
    CK(cudaMemcpy(l->d_win, h, (size_t)(nwin + extra_win) * sizeof *h, cudaMemcpyHostToDevice));
    free(h);
}

static void ip_layer_free(ip_layer *l)
{
    CK(cudaFree(l->recs));
    CK(cudaFree(l->d_win));
    CK(cudaFree(l->tail));
}

/* What PUT does, in-process: the layer's tokens (host, BF16) through pinned memory to the device,
 * encoded window by window as they arrive. ctx must be a multiple of W (= R): no tail remains. */
static void ip_put_layer(ip_state *ip, int si, ip_layer *l, const uint16_t *k, const uint16_t *v, uint32_t ctx)
{
    const model *m = ip->m;
    const uint32_t W = m->profile.window, n = m->n;
    const uint32_t chunk = (uint32_t)(ip->pin_bytes / (n * 4u)) / W * W;
    cudaStream_t s = ip->s[si];
    for (uint32_t t = 0; t < ctx; t += chunk) {
        uint32_t cnt = ctx - t < chunk ? ctx - t : chunk;
        CK(cudaStreamSynchronize(s)); /* the pinned buffer is free again */
        uint16_t *pk = (uint16_t *)(void *)ip->pin[si], *pv = pk + (size_t)cnt * n;
        memcpy(pk, k + (size_t)t * n, (size_t)cnt * n * 2);
        memcpy(pv, v + (size_t)t * n, (size_t)cnt * n * 2);
        uint16_t *dk = ip->stage[si], *dv = dk + (size_t)cnt * n;
        CK(cudaMemcpyAsync(dk, pk, (size_t)cnt * n * 4, cudaMemcpyHostToDevice, s));
        DQ(dqcu_encode_windows(ip->dc, dk, dv, DQ_DTYPE_BF16, cnt / W, l->d_win + t / W, ip->status[si], NULL, s));
    }
    l->nwin = ctx / W;
    l->ntail = 0;
}

/* In-process PUT of sequences' layers: one host thread per stream, like the daemon's workers. */
typedef struct ip_put_job {
    ip_state *ip;
    ip_layer **L; /* [nseq][layers] */
    const pool *p;
    uint32_t seq0, nseq, ctx;
    int si;
} ip_put_job;

static void *ip_put_thread(void *arg)
{
    ip_put_job *j = arg;
    const model *m = j->ip->m;
    CK(cudaSetDevice(0));
    for (uint32_t i = (uint32_t)j->si; i < j->nseq * m->layers; i += 8) {
        uint32_t b = i / m->layers, l = i % m->layers;
        size_t off = pool_off(j->p, j->seq0 + b, l);
        ip_put_layer(j->ip, j->si, &j->L[b][l], j->p->k + off, j->p->v + off, j->ctx);
    }
    CK(cudaStreamSynchronize(j->ip->s[j->si]));
    return NULL;
}

static double ip_put(ip_state *ip, ip_layer **L, const pool *p, uint32_t seq0, uint32_t nseq, uint32_t ctx)
{
    const model *m = ip->m;
    for (uint32_t b = 0; b < nseq; b++)
        for (uint32_t l = 0; l < m->layers; l++)
            ip_layer_alloc(ip, &L[b][l], ctx / m->profile.window, 1);
    ip_put_job jobs[8];
    pthread_t th[8];
    double t0 = now_s();
    for (int i = 0; i < 8; i++) {
        jobs[i] = (ip_put_job){ip, L, p, seq0, nseq, ctx, i};
        pthread_create(&th[i], NULL, ip_put_thread, &jobs[i]);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    return now_s() - t0;
}

static ip_layer **ip_layers_new(uint32_t nseq, uint32_t layers)
{
    ip_layer **L = calloc(nseq, sizeof *L);
    for (uint32_t b = 0; b < nseq; b++)
        L[b] = calloc(layers, sizeof **L);
    return L;
}

static void ip_layers_free(ip_layer **L, uint32_t nseq, uint32_t layers)
{
    for (uint32_t b = 0; b < nseq; b++) {
        for (uint32_t l = 0; l < layers; l++)
            ip_layer_free(&L[b][l]);
        free(L[b]);
    }
    free(L);
}

typedef struct put_job {
    const bench_cfg *cfg;
    const daemon_proc *d;
    const model *m;
    const pool *p;
    uint32_t seq0, nseq;
    _Atomic uint32_t next;
    _Atomic int failed;
} put_job;

static void *put_worker(void *arg)
{
    put_job *j = arg;
    dqc_client *c = client_open(j->d);
    const model *m = j->m;
    uint32_t total = j->nseq * m->layers;
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        if (i >= total)
            break;
        uint32_t seq = j->seq0 + i / m->layers, layer = i % m->layers;
        char key[32];
        snprintf(key, sizeof key, "b%u", seq);
        size_t off = pool_off(j->p, seq, layer);
        dqc_put_args a = {{"bench", key, strlen(key)},
                          m->name,
                          0,
                          layer,
                          1,
                          j->p->ctx,
                          m->kv_heads,
                          m->head_dim,
                          DQ_DTYPE_BF16,
                          j->p->k + off,
                          j->p->v + off};
        if (dqc_put(c, &a, NULL)) {
            say("PUT %s layer %u: %s", key, layer, dqc_last_error(c));
            atomic_store(&j->failed, 1);
            break;
        }
    }
    dqc_free(c);
    return NULL;
}

/* PUT sequences [seq0, seq0 + nseq) of the pool's context through put_conns connections. */
static double daemon_put(const bench_cfg *cfg, const daemon_proc *d, const model *m, const pool *p, uint32_t seq0,
                         uint32_t nseq)
{
    put_job j = {cfg, d, m, p, seq0, nseq, 0, 0};
    pthread_t th[16];
    int nt = cfg->put_conns < 16 ? cfg->put_conns : 16;
    double t0 = now_s();
    for (int i = 0; i < nt; i++)
        pthread_create(&th[i], NULL, put_worker, &j);
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&j.failed))
        die("PUT failed");
    return now_s() - t0;
}

static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && x[k] < x[k - 1]; k--) {
            double t = x[k];
            x[k] = x[k - 1];
            x[k - 1] = t;
        }
    return n ? (n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2])) : 0;
}

/* Query and new token of (sequence, layer) at a decode step (BF16). */
static void step_inputs(const model *m, uint32_t seq, uint32_t layer, int step, uint16_t *q, uint16_t *k, uint16_t *v)
{
    uint64_t s = ((uint64_t)seq << 40) ^ ((uint64_t)layer << 20) ^ (uint64_t)step;
    size_t qs = (size_t)m->q_heads * m->head_dim;
    for (size_t i = 0; i < qs; i++)
        q[i] = dq_f32_to_bf16(rng_normal(&s));
    for (size_t i = 0; i < m->n; i++) {
        k[i] = dq_f32_to_bf16(rng_normal(&s));
        v[i] = dq_f32_to_bf16(rng_normal(&s));
    }
}

/* A decode step's queries and new tokens for every layer and sequence: q [layers][batch][q_heads *
 * head_dim], k and v [layers][batch][n], made before the clock starts. */
static void step_gen(const model *m, uint32_t seq0, uint32_t batch, int step, uint16_t *q, uint16_t *k, uint16_t *v)
{
    size_t qs = (size_t)m->q_heads * m->head_dim;
    for (uint32_t layer = 0; layer < m->layers; layer++)
        for (uint32_t b = 0; b < batch; b++) {
            size_t i = (size_t)layer * batch + b;
            step_inputs(m, seq0 + b, layer, step, q + i * qs, k + i * m->n, v + i * m->n);
        }
}

/* One decode step through the daemon: one ATTEND per layer over the batch, each appending. */
static void daemon_step(dqc_client *c, const model *m, uint32_t seq0, uint32_t batch, float *out, float *lse,
                        const uint16_t *q, const uint16_t *k, const uint16_t *v, dqc_attend_item *items,
                        char (*keys)[32], double *call_s)
{
    size_t qs = (size_t)m->q_heads * m->head_dim;
    for (uint32_t layer = 0; layer < m->layers; layer++) {
        for (uint32_t b = 0; b < batch; b++) {
            size_t i = (size_t)layer * batch + b;
            snprintf(keys[b], 32, "b%u", seq0 + b);
            items[b] = (dqc_attend_item){
                {"bench", keys[b], strlen(keys[b])}, layer, q + i * qs, k + i * m->n, v + i * m->n};
        }
        dqc_attend_args a = {items, batch, m->q_heads, m->kv_heads, m->head_dim, DQ_DTYPE_BF16, 0.0f};
        double t0 = now_s();
        if (dqc_attend(c, &a, out + (size_t)layer * batch * qs, lse + (size_t)layer * batch * m->q_heads))
            die("ATTEND: %s", dqc_last_error(c));
        *call_s += now_s() - t0;
    }
}

/* The same step in-process: per layer, the new tokens into the tails, one dqcu_attend. */
typedef struct ip_batch {
    dqcu_attn_seq *h_seqs, *d_seqs;
    float *h_q, *d_q, *d_out, *d_lse, *h_out, *h_lse;
    uint16_t *h_tok;
    void *ws;
    size_t ws_bytes;
} ip_batch;

static void ip_step(ip_state *ip, ip_layer **L, uint32_t batch, ip_batch *B, float *out, float *lse, const uint16_t *q,
                    const uint16_t *k, const uint16_t *v)
{
    const model *m = ip->m;
    size_t qs = (size_t)m->q_heads * m->head_dim;
    cudaStream_t s = ip->s[0];
    for (uint32_t layer = 0; layer < m->layers; layer++) {
        uint32_t max_tokens = 0;
        for (uint32_t b = 0; b < batch; b++) {
            size_t i = (size_t)layer * batch + b;
            ip_layer *l = &L[b][layer];
            uint16_t *tk = B->h_tok + (size_t)b * 2 * m->n;
            memcpy(tk, k + i * m->n, m->n * 2);
            memcpy(tk + m->n, v + i * m->n, m->n * 2);
            CK(cudaMemcpyAsync(l->tail + (size_t)l->ntail * m->n, tk, m->n * 2, cudaMemcpyHostToDevice, s));
            CK(cudaMemcpyAsync(l->tail + (size_t)m->profile.residual * m->n + (size_t)l->ntail * m->n, tk + m->n,
                               m->n * 2, cudaMemcpyHostToDevice, s));
            l->ntail++;
            B->h_seqs[b] = (dqcu_attn_seq){(const uint8_t *const *)l->d_win, l->tail,
                                           l->tail + (size_t)m->profile.residual * m->n, l->nwin, l->ntail};
            uint32_t tok = l->nwin * m->profile.window + l->ntail;
            if (tok > max_tokens)
                max_tokens = tok;
            for (size_t j = 0; j < qs; j++)
                B->h_q[b * qs + j] = dq_bf16_to_f32(q[i * qs + j]);
        }
        CK(cudaMemcpyAsync(B->d_seqs, B->h_seqs, batch * sizeof *B->h_seqs, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(B->d_q, B->h_q, batch * qs * sizeof(float), cudaMemcpyHostToDevice, s));
        size_t wsb = dqcu_attend_workspace_size(ip->dc, m->q_heads, batch, max_tokens);
        if (wsb > B->ws_bytes) {
            CK(cudaStreamSynchronize(s));
            CK(cudaFree(B->ws));
            CK(cudaMalloc(&B->ws, wsb));
            B->ws_bytes = wsb;
        }
        DQ(dqcu_attend(ip->dc, m->q_heads, 1.0f / sqrtf((float)m->head_dim), B->d_seqs, batch, max_tokens, B->d_q,
                       B->d_out, B->d_lse, B->ws, B->ws_bytes, s));
        CK(cudaMemcpyAsync(B->h_out, B->d_out, batch * qs * sizeof(float), cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(B->h_lse, B->d_lse, batch * m->q_heads * sizeof(float), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        memcpy(out + (size_t)layer * batch * qs, B->h_out, batch * qs * sizeof(float));
        memcpy(lse + (size_t)layer * batch * m->q_heads, B->h_lse, batch * m->q_heads * sizeof(float));
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* With --trace: the daemon's "ATTEND trace" lines (debug level) per batch size, as medians of
 * where a call's time went on the daemon's side (microseconds). */
static void trace_summary(const char *log)
{
    enum { NF = 7, MAXL = 1 << 16 };
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    static double v[NF][MAXL];
    size_t sizes[8] = {0}, nsizes = 0;
    char line[512];
    /* first pass: the batch sizes seen */
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "ATTEND trace: ");
        size_t items;
        if (!p || sscanf(p, "ATTEND trace: %zu items", &items) != 1)
            continue;
        size_t k = 0;
        while (k < nsizes && sizes[k] != items)
            k++;
        if (k == nsizes && nsizes < 8)
            sizes[nsizes++] = items;
    }
    for (size_t k = 0; k < nsizes; k++) {
        rewind(f);
        size_t n = 0;
        while (fgets(line, sizeof line, f) && n < MAXL) {
            const char *p = strstr(line, "ATTEND trace: ");
            size_t items;
            if (!p || sscanf(p, "ATTEND trace: %zu items", &items) != 1 || items != sizes[k])
                continue;
            const char *q = strstr(p, "access ");
            double a, in, b0, b1, c0, c1, r;
            if (!q || sscanf(q, "access %lf us, inputs %lf, GPU B %lf-%lf, GPU C %lf-%lf, reply %lf", &a, &in, &b0, &b1,
                             &c0, &c1, &r) != NF)
                continue;
            const double x[NF] = {a, in - a, b0 ? b0 - in : 0, b1 - b0, c1 - c0, r - (c1 ? c1 : in), r};
            for (int j = 0; j < NF; j++)
                v[j][n] = x[j];
            n++;
        }
        if (!n)
            continue;
        double med[NF];
        for (int j = 0; j < NF; j++) {
            qsort(v[j], n, sizeof(double), cmp_double);
            med[j] = v[j][n / 2];
        }
        printf("{\"bench\":\"attend_trace\",\"items\":%zu,\"calls\":%zu,\"median_us\":{\"to_access\":%.1f,"
               "\"inputs\":%.1f,\"to_gpu_task\":%.1f,\"gpu_appends\":%.1f,\"gpu_attend\":%.1f,\"to_reply\":%.1f,"
               "\"total\":%.1f}}\n",
               sizes[k], n, med[0], med[1], med[2], med[3], med[4], med[5], med[6]);
    }
    fclose(f);
}

static int run_bench(bench_cfg *cfg, const char *workers)
{
    model m;
    model_init(&m, "qwen3-8b-shape", cfg->layers, 32, 8, 128, 0, 0);
    const uint32_t W = m.profile.window;
    if (m.profile.residual != W || cfg->tokens % W)
        die("--tokens must be a multiple of the window (%u)", W);
    uint32_t maxb = 1;
    for (int i = 0; i < cfg->nbatches; i++)
        maxb = cfg->batches[i] > maxb ? cfg->batches[i] : maxb;

    /* data */
    pool p = {m.n, cfg->tokens, 4096, NULL, NULL};
    size_t pool_vals = (size_t)(p.ctx + p.extra) * m.n;
    p.k = random_tensor(pool_vals, m.n, DQ_DTYPE_BF16, true, 1);
    p.v = random_tensor(pool_vals, m.n, DQ_DTYPE_BF16, false, 2);
    double bf16_bytes = (double)cfg->tokens * m.n * 2 * 2 * m.layers;

    const char *args[12 + 8] = {"--backend", "cuda", "--host-memory", "16G", "--max-payload", "512M"};
    int na = 6;
    if (workers) {
        args[na++] = "--workers";
        args[na++] = workers;
    }
    if (cfg->trace) {
        args[na++] = "--log-level";
        args[na++] = "debug";
    }
    daemon_proc d;
    daemon_start(&d, "bench", args);
    dqc_client *c = client_open(&d);
    dqc_server_info info;
    dqc_server(c, &info);
    say("daemon backend %s", info.backend);
    model_register(c, &m);

    ip_state ip;
    ip_init(&ip, &m, 4096);
    CK(cudaSetDevice(0));

    /* PUT of the prefill, daemon then in-process */
    double t_put = daemon_put(cfg, &d, &m, &p, 0, 1);
    printf("{\"bench\":\"put_prefill\",\"path\":\"daemon\",\"backend\":\"%s\",\"tokens\":%u,\"layers\":%u,"
           "\"connections\":%d,\"seconds\":%.4f,\"bf16_gbps\":%.3f,\"token_layers_per_s\":%.0f}\n",
           info.backend, cfg->tokens, m.layers, cfg->put_conns, t_put, bf16_bytes / t_put * 1e-9,
           (double)cfg->tokens * m.layers / t_put);
    fflush(stdout);
    ip_layer **L1 = ip_layers_new(1, m.layers);
    double t_ip = ip_put(&ip, L1, &p, 0, 1, cfg->tokens);
    printf("{\"bench\":\"put_prefill\",\"path\":\"inprocess\",\"tokens\":%u,\"layers\":%u,\"streams\":8,"
           "\"seconds\":%.4f,\"bf16_gbps\":%.3f,\"daemon_over_inprocess\":%.3f}\n",
           cfg->tokens, m.layers, t_ip, bf16_bytes / t_ip * 1e-9, t_put / t_ip);
    fflush(stdout);

    /* the daemon's records are the in-process ones */
    {
        dqc_seq q = {"bench", "b0", 2};
        dqc_raw_result r = {0};
        bool same = dqc_get_raw(c, &q, 0, 1, &r) == 0 && r.nlayers == 1 && r.layers[0].windows == L1[0][0].nwin;
        if (same) {
            uint8_t *h = xmalloc(r.layers[0].records_bytes);
            CK(cudaMemcpy(h, L1[0][0].recs, r.layers[0].records_bytes, cudaMemcpyDeviceToHost));
            same = memcmp(h, r.layers[0].records, r.layers[0].records_bytes) == 0;
            free(h);
        }
        dqc_raw_result_free(&r);
        report("bench_records_identical", same, "layer 0 of the prefill: daemon GET_RAW vs in-process GPU encode");
    }

    /* decode steps */
    size_t qs = (size_t)m.q_heads * m.head_dim;
    uint16_t *q = xmalloc((size_t)m.layers * maxb * qs * 2), *k = xmalloc((size_t)m.layers * maxb * m.n * 2);
    uint16_t *v = xmalloc((size_t)m.layers * maxb * m.n * 2);
    dqc_attend_item *items = calloc(maxb, sizeof *items);
    char(*keys)[32] = calloc(maxb, sizeof *keys);
    float *out_d = xmalloc((size_t)m.layers * maxb * qs * 4), *lse_d = xmalloc((size_t)m.layers * maxb * m.q_heads * 4);
    float *out_i = xmalloc((size_t)m.layers * maxb * qs * 4), *lse_i = xmalloc((size_t)m.layers * maxb * m.q_heads * 4);
    ip_batch B = {0};
    CK(cudaMallocHost((void **)&B.h_seqs, maxb * sizeof *B.h_seqs));
    CK(cudaMallocHost((void **)&B.h_q, maxb * qs * 4));
    CK(cudaMallocHost((void **)&B.h_out, maxb * qs * 4));
    CK(cudaMallocHost((void **)&B.h_lse, maxb * m.q_heads * 4));
    CK(cudaMallocHost((void **)&B.h_tok, (size_t)maxb * m.n * 4));
    CK(cudaMalloc((void **)&B.d_seqs, maxb * sizeof *B.d_seqs));
    CK(cudaMalloc((void **)&B.d_q, maxb * qs * 4));
    CK(cudaMalloc((void **)&B.d_out, maxb * qs * 4));
    CK(cudaMalloc((void **)&B.d_lse, maxb * m.q_heads * 4));

    uint32_t next_seq = 1;
    for (int bi = 0; bi < cfg->nbatches; bi++) {
        uint32_t batch = cfg->batches[bi], seq0 = 0, ctx = cfg->tokens;
        ip_layer **L = L1;
        if (batch > 1) {
            /* fresh sequences for a larger batch, with a context that fits the time left */
            seq0 = next_seq;
            next_seq += batch;
            double left = cfg->budget - (now_s() - cfg->t0);
            double est = (t_put + t_ip) * batch * 1.3;
            if (est > left * 0.5) {
                ctx = (uint32_t)(cfg->tokens * (left * 0.5 / est)) / W * W;
                if (ctx < 8 * W)
                    ctx = 8 * W;
                say("batch %u: context cut to %u tokens to fit the time budget (%.0f s left)", batch, ctx, left);
            }
            pool pb = p;
            pb.ctx = ctx;
            double tp = daemon_put(cfg, &d, &m, &pb, seq0, batch);
            L = ip_layers_new(batch, m.layers);
            double ti = ip_put(&ip, L, &pb, seq0, batch, ctx);
            say("batch %u: %u sequences of %u tokens: daemon PUT %.1f s, in-process %.1f s", batch, batch, ctx, tp, ti);
        }
        int steps = cfg->steps, warm = 2;
        double *tsd = xmalloc((size_t)(steps + warm) * sizeof *tsd),
               *tsi = xmalloc((size_t)(steps + warm) * sizeof *tsi);
        double calls = 0, worst = 0;
        for (int st = 0; st < steps + warm; st++) {
            /* both paths append the same token to their own copy of the sequence */
            step_gen(&m, seq0, batch, st, q, k, v);
            double c0 = calls, t0 = now_s();
            daemon_step(c, &m, seq0, batch, out_d, lse_d, q, k, v, items, keys, &calls);
            tsd[st] = now_s() - t0;
            if (st < warm)
                calls = c0;
            t0 = now_s();
            ip_step(&ip, L, batch, &B, out_i, lse_i, q, k, v);
            tsi[st] = now_s() - t0;
            size_t tot = (size_t)m.layers * batch * qs;
            double mx = 0, dd = 0;
            for (size_t i = 0; i < tot; i++) {
                mx = fmax(mx, fabs(out_i[i]));
                dd = fmax(dd, fabs((double)out_d[i] - out_i[i]));
            }
            worst = fmax(worst, dd / fmax(mx, 1e-6));
        }
        double md = median(tsd + warm, steps), mi = median(tsi + warm, steps);
        double sd = 0, si = 0;
        for (int st = warm; st < steps + warm; st++) {
            sd += tsd[st];
            si += tsi[st];
        }
        sd /= steps;
        si /= steps;
        printf("{\"bench\":\"decode_step\",\"path\":\"daemon\",\"backend\":\"%s\",\"layout\":\"%s\",\"batch\":%u,"
               "\"ctx\":%u,\"layers\":%u,\"steps\":%d,\"step_ms_median\":%.3f,\"step_ms_mean\":%.3f,"
               "\"attend_call_us_mean\":%.1f}\n",
               info.backend, g_layout, batch, ctx, m.layers, steps, md * 1e3, sd * 1e3, calls / steps / m.layers * 1e6);
        printf("{\"bench\":\"decode_step\",\"path\":\"inprocess\",\"batch\":%u,\"ctx\":%u,\"layers\":%u,\"steps\":%d,"
               "\"step_ms_median\":%.3f,\"step_ms_mean\":%.3f,\"daemon_over_inprocess\":%.3f,"
               "\"max_rel_diff_daemon_vs_inprocess\":%.3g}\n",
               batch, ctx, m.layers, steps, mi * 1e3, si * 1e3, md / mi, worst);
        fflush(stdout);
        report("bench_attend_agrees", worst <= 1e-3, "batch %u: daemon vs in-process outputs, max relative %.3g", batch,
               worst);
        free(tsd);
        free(tsi);
        if (batch > 1) {
            /* device memory back before the next batch size */
            ip_layers_free(L, batch, m.layers);
            for (uint32_t b = 0; b < batch; b++) {
                char key[32];
                snprintf(key, sizeof key, "b%u", seq0 + b);
                dqc_seq sq = {"bench", key, strlen(key)};
                if (dqc_delete(c, &sq))
                    say("DELETE %s: %s", key, dqc_last_error(c));
            }
        }
    }
    printf("{\"bench\":\"gpu_stats\",\"gpu_memory_used\":%llu,\"gpu_budget\":%llu,\"gpu_sequences\":%llu,"
           "\"gpu_demotions\":%llu}\n",
           (unsigned long long)stat_counter(c, "gpu_memory_used"), (unsigned long long)stat_counter(c, "gpu_budget"),
           (unsigned long long)stat_counter(c, "gpu_sequences"), (unsigned long long)stat_counter(c, "gpu_demotions"));

    ip_layers_free(L1, 1, m.layers);
    CK(cudaFreeHost(B.h_seqs));
    CK(cudaFreeHost(B.h_q));
    CK(cudaFreeHost(B.h_out));
    CK(cudaFreeHost(B.h_lse));
    CK(cudaFreeHost(B.h_tok));
    CK(cudaFree(B.d_seqs));
    CK(cudaFree(B.d_q));
    CK(cudaFree(B.d_out));
    CK(cudaFree(B.d_lse));
    CK(cudaFree(B.ws));
    ip_free(&ip);
    dqc_free(c);
    int st = daemon_stop(&d);
    report("bench_daemon_exit", st == 0, "exit status %d", st);
    if (cfg->trace)
        trace_summary(d.log);
    free(q);
    free(k);
    free(v);
    free(items);
    free(keys);
    free(out_d);
    free(lse_d);
    free(out_i);
    free(lse_i);
    free(p.k);
    free(p.v);
    model_free(&m);
    printf("{\"summary\":\"bench\",\"failures\":%d,\"seconds\":%.1f}\n", g_failures, now_s() - cfg->t0);
    return g_failures ? 1 : 0;
}
#endif

static void usage(void)
{
    fprintf(stderr,
            "usage: gpu_e2e check --dquantd PATH --workdir DIR [--scale small|full] [--expect-backend cuda|cpu|any]\n"
            "                     [--layout containers|hot|hot-only] [--exact 0|1] [--daemon-arg ARG]...\n"
            "       gpu_e2e bench --dquantd PATH --workdir DIR [--tokens N] [--layers N] [--batches 1,32]\n"
            "                     [--steps N] [--put-conns N] [--time-budget SECONDS] [--workers N] [--trace 0|1]\n"
            "                     [--daemon-arg ARG]...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *mode = argv[1], *scale_name = "full", *workers = NULL;
#ifdef DQD_E2E_HAVE_CUDA
    bench_cfg cfg = {32768, 36, {1, 32}, 2, 10, 4, 420, 0, false};
#endif
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--dquantd"))
            g_dquantd = v;
        else if (!strcmp(a, "--workdir"))
            g_workdir = v;
        else if (!strcmp(a, "--scale"))
            scale_name = v;
        else if (!strcmp(a, "--expect-backend"))
            g_expect = v;
        else if (!strcmp(a, "--workers"))
            workers = v;
        else if (!strcmp(a, "--daemon-arg") && g_ndargs < 8)
            g_dargs[g_ndargs++] = v;
        else if (!strcmp(a, "--layout") && (!strcmp(v, "containers") || !strcmp(v, "hot") || !strcmp(v, "hot-only")))
            g_layout = v;
        else if (!strcmp(a, "--exact"))
            g_exact = atoi(v) != 0;
#ifdef DQD_E2E_HAVE_CUDA
        else if (!strcmp(a, "--tokens"))
            cfg.tokens = (uint32_t)atoi(v);
        else if (!strcmp(a, "--layers"))
            cfg.layers = (uint32_t)atoi(v);
        else if (!strcmp(a, "--steps"))
            cfg.steps = atoi(v);
        else if (!strcmp(a, "--put-conns"))
            cfg.put_conns = atoi(v);
        else if (!strcmp(a, "--time-budget"))
            cfg.budget = atof(v);
        else if (!strcmp(a, "--trace"))
            cfg.trace = atoi(v) != 0;
        else if (!strcmp(a, "--batches")) {
            cfg.nbatches = 0;
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t && cfg.nbatches < 4; t = strtok(NULL, ","))
                cfg.batches[cfg.nbatches++] = (uint32_t)atoi(t);
        }
#endif
        else
            usage();
    }
    if (!g_dquantd || !g_workdir)
        usage();
    mkdir(g_workdir, 0755);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (!strcmp(mode, "check"))
        return run_check(scale_name);
#ifdef DQD_E2E_HAVE_CUDA
    if (!strcmp(mode, "bench")) {
        cfg.t0 = now_s();
        /* the decode steps stay in the BF16 tail (R = 128 tokens after a prefill of whole windows) */
        if (cfg.steps < 1 || cfg.steps > 100 || cfg.put_conns < 1 || !cfg.nbatches || !cfg.layers || !cfg.tokens)
            usage();
        return run_bench(&cfg, workers);
    }
#endif
    usage();
}

/* Benchmark of dquantd's disk tier (not a test): how fast sequences go to disk and come back,
 * each figure beside its in-memory reference from the same run.
 *
 *   bench_disk [--dquantd PATH] [--seqs N] [--layers L] [--tokens T] [--kv-heads H] [--head-dim D]
 *              [--records N] [--workdir DIR]
 *
 * 1. spill: PUT_RAW of N sequences (records encoded in-process once, so the daemon does no
 *    encoding) into a daemon whose host budget holds an eighth of them, with the disk tier on
 *    (every eviction writes a record) and off (evictions drop): ingest MB/s of both, and the bytes
 *    spilled per second of the disk run.
 * 2. shutdown: a daemon holding all N in memory stops (SIGTERM): the records it writes, MB/s.
 * 3. recovery: it starts again on that directory: the time to index N records (its log line), and
 *    the time until it serves.
 * 4. read back: GET_RAW of every sequence, all on disk (read, checksummed, restored), then again
 *    with all of them in memory: MB/s of both and the ratio. Reads come from the page cache.
 * 5. recovery at scale: --records small records (one layer of 2 x 64, one window: 11 KiB)
 *    written by a shutdown, then the start's indexing time.
 * Prints one JSON line per figure group. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/layer.h"

static struct {
    uint32_t seqs, layers, tokens, kvh, hd, records;
    const char *workdir;
} A = {64, 8, 1024, 8, 128, 20000, NULL};

static char WORK[256];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_disk: %s\n", what);
    exit(1);
}

/* One layer encoded in-process, as PUT_RAW sends it. */
typedef struct raw_layer {
    uint8_t *records;
    size_t windows, records_bytes, tail, tail_bytes;
    uint16_t *tk, *tv;
} raw_layer;

static void encode(uint32_t kvh, uint32_t hd, uint32_t tokens, raw_layer *out, uint8_t *profile, size_t *plen)
{
    dq_profile p;
    dq_codec *codec;
    dq_workspace *ws;
    dq_layer *l;
    if (dq_profile_builtin("dq226", kvh, hd, &p) < 0 || dq_codec_create(&p, NULL, &codec) < 0 ||
        dq_workspace_create(codec, &ws) < 0 || dq_layer_create(codec, &l) < 0 ||
        dq_profile_serialize(&p, profile, DQ_PROFILE_SERIALIZED_MAX, plen) < 0)
        die("codec");
    const size_t n = (size_t)kvh * hd;
    float *k = malloc(tokens * n * sizeof *k), *v = malloc(tokens * n * sizeof *v);
    uint32_t s = 12345;
    for (size_t i = 0; i < tokens * n; i++) {
        s = s * 1664525u + 1013904223u;
        k[i] = (float)((s >> 8) % 2001) / 500.0f - 2.0f;
        v[i] = (float)((s >> 12) % 2001) / 500.0f - 2.0f;
    }
    if (dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, tokens, NULL) < 0)
        die("encode");
    const size_t wb = dq_codec_window_bytes(codec);
    out->windows = dq_layer_window_count(l);
    out->records_bytes = out->windows * wb;
    out->records = malloc(out->records_bytes ? out->records_bytes : 1);
    for (size_t w = 0; w < out->windows; w++)
        memcpy(out->records + w * wb, dq_layer_window(l, w), wb);
    out->tail = dq_layer_tail_tokens(l);
    out->tail_bytes = out->tail * n * 2;
    out->tk = malloc(out->tail_bytes + 2);
    out->tv = malloc(out->tail_bytes + 2);
    memcpy(out->tk, dq_layer_tail(l, DQ_KIND_K), out->tail_bytes);
    memcpy(out->tv, dq_layer_tail(l, DQ_KIND_V), out->tail_bytes);
    free(k);
    free(v);
    dq_layer_free(l);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

static dqd_daemon D;
static int RUNS;

static void start(const char *disk, const char *host_memory)
{
    static const char *args[12];
    int n = 0;
    args[n++] = "--host-memory";
    args[n++] = host_memory;
    if (disk) {
        args[n++] = "--disk-dir";
        args[n++] = disk;
    }
    args[n] = NULL;
    char name[16];
    snprintf(name, sizeof name, "b%d", ++RUNS);
    dqd_opts o = {.dir = WORK,
                  .name = name,
                  .extra = args,
                  .log_level = "info",
                  .start_timeout_ms = 600000,
                  .stop_timeout_ms = 600000};
    if (dqd_start(&D, &o) < 0)
        die("the daemon did not start");
}

static dqc_client *cli(void)
{
    dqc_client *c;
    if (dqc_connect(D.addr, NULL, &c) < 0)
        die("connect");
    return c;
}

static void register_model(dqc_client *c, uint32_t layers)
{
    dqc_model_spec spec = {.name = "bench",
                           .layers = layers,
                           .q_heads = A.kvh * 4,
                           .kv_heads = A.kvh,
                           .head_dim = A.hd,
                           .profile_name = "dq226"};
    if (dqc_register_model(c, &spec, NULL) < 0)
        die(dqc_last_error(c));
}

/* PUT_RAW of sequences [first, first + n), every layer the same records; returns the bytes sent. */
static double put_all(dqc_client *c, uint32_t first, uint32_t n, uint32_t layers, const raw_layer *rl,
                      const uint8_t *profile, size_t plen)
{
    dqc_raw_layer *ls = calloc(layers, sizeof *ls);
    for (uint32_t l = 0; l < layers; l++)
        ls[l] = (dqc_raw_layer){.windows = rl->windows,
                                .records = rl->records,
                                .records_bytes = rl->records_bytes,
                                .tail_tokens = rl->tail,
                                .tail_k = rl->tail ? rl->tk : NULL,
                                .tail_v = rl->tail ? rl->tv : NULL,
                                .tail_bytes = rl->tail_bytes};
    double bytes = 0;
    for (uint32_t i = first; i < first + n; i++) {
        char key[32];
        snprintf(key, sizeof key, "s%u", i);
        dqc_put_raw_args a = {.seq = {"b", key, strlen(key)},
                              .model = "bench",
                              .layers = ls,
                              .nlayers = layers,
                              .profile = profile,
                              .profile_len = plen};
        if (dqc_put_raw(c, &a, NULL) < 0)
            die(dqc_last_error(c));
        bytes += (double)layers * (double)(rl->records_bytes + 2 * rl->tail_bytes);
    }
    free(ls);
    return bytes;
}

static double get_all(dqc_client *c, uint32_t n)
{
    dqc_raw_result r = {0};
    double bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "s%u", i);
        dqc_seq s = {"b", key, strlen(key)};
        if (dqc_get_raw(c, &s, 0, 0, &r) < 0)
            die(dqc_last_error(c));
        for (size_t l = 0; l < r.nlayers; l++)
            bytes += (double)(r.layers[l].records_bytes + 2 * r.layers[l].tail_bytes);
    }
    dqc_raw_result_free(&r);
    return bytes;
}

static uint64_t counter(dqc_client *c, const char *name)
{
    dqc_stats_result r = {0};
    uint64_t v = 0;
    if (dqc_stats(c, &r) == 0)
        dqc_stats_counter(&r, name, &v);
    dqc_stats_result_free(&r);
    return v;
}

/* "... <what> ... (X MiB) ... in T s" from the last log line holding what: T (and X). */
static double log_seconds(const char *what, double *mib)
{
    FILE *f = fopen(D.log, "r");
    if (!f)
        return -1;
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, f))
        if (strstr(line, what))
            snprintf(last, sizeof last, "%s", line);
    fclose(f);
    const char *p = strstr(last, " in ");
    const char *q = strstr(last, "(");
    if (mib && q)
        *mib = atof(q + 1);
    return p ? atof(p + 4) : -1;
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        if (!strcmp(o, "--dquantd"))
            setenv("DQUANTD", v, 1);
        else if (!strcmp(o, "--seqs"))
            A.seqs = (uint32_t)atoi(v);
        else if (!strcmp(o, "--layers"))
            A.layers = (uint32_t)atoi(v);
        else if (!strcmp(o, "--tokens"))
            A.tokens = (uint32_t)atoi(v);
        else if (!strcmp(o, "--kv-heads"))
            A.kvh = (uint32_t)atoi(v);
        else if (!strcmp(o, "--head-dim"))
            A.hd = (uint32_t)atoi(v);
        else if (!strcmp(o, "--records"))
            A.records = (uint32_t)atoi(v);
        else if (!strcmp(o, "--workdir"))
            A.workdir = v;
        else
            die("unknown option (see the comment at the top of bench_disk.c)");
    }
    if (!dqd_path())
        die("set $DQUANTD or --dquantd");
    snprintf(WORK, sizeof WORK, "%s", A.workdir ? A.workdir : dqd_tmpdir());
    mkdir(WORK, 0755);
    char disk[300];
    snprintf(disk, sizeof disk, "%s/disk", WORK);
    uint8_t profile[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
    raw_layer rl;
    encode(A.kvh, A.hd, A.tokens, &rl, profile, &plen);
    const double seq_bytes = (double)A.layers * (double)(rl.records_bytes + 2 * rl.tail_bytes);
    const double total = seq_bytes * A.seqs, MiB = 1024.0 * 1024.0;
    char small_budget[32], big_budget[32];
    snprintf(small_budget, sizeof small_budget, "%.0fM", total / 8 / MiB + 8);
    /* every layer also holds a BF16 tail buffer of R = 128 tokens */
    snprintf(big_budget, sizeof big_budget, "%.0fM",
             (total * 1.5 + (double)A.seqs * A.layers * 128.0 * A.kvh * A.hd * 4.0) / MiB + 64);
    printf("bench_disk: %u sequences of %u layers x %u tokens (%u x %u), %.1f MiB stored, host budget %s\n", A.seqs,
           A.layers, A.tokens, A.kvh, A.hd, total / MiB, small_budget);

    /* 1. spill: disk tier on vs off under a budget of an eighth. */
    double put_s[2], spilled = 0;
    for (int on = 1; on >= 0; on--) {
        rm_rf(disk);
        start(on ? disk : NULL, small_budget);
        dqc_client *c = cli();
        register_model(c, A.layers);
        double t0 = now_s();
        put_all(c, 0, A.seqs, A.layers, &rl, profile, plen);
        if (on) {
            /* the last spills finish on the workers: wait for them */
            uint64_t before;
            do {
                before = counter(c, "disk_spills");
                usleep(20000);
            } while (counter(c, "disk_spills") != before);
            spilled = (double)counter(c, "disk_spill_bytes");
        }
        put_s[on] = now_s() - t0;
        dqc_free(c);
        dqd_stop(&D);
    }
    printf("{\"figure\":\"spill\",\"ingest_mb_s_disk_on\":%.1f,\"ingest_mb_s_disk_off\":%.1f,\"ratio\":%.3f,"
           "\"spilled_mib\":%.1f,\"spill_mb_s\":%.1f}\n",
           total / put_s[1] / 1e6, total / put_s[0] / 1e6, put_s[0] / put_s[1], spilled / MiB,
           spilled / put_s[1] / 1e6);

    /* 2. shutdown writes everything; 3. recovery; 4. read back from disk vs memory. */
    rm_rf(disk);
    start(disk, big_budget);
    dqc_client *c = cli();
    register_model(c, A.layers);
    put_all(c, 0, A.seqs, A.layers, &rl, profile, plen);
    dqc_free(c);
    dqd_stop(&D);
    double wrote_mib = 0, wrote_s = log_seconds("at shutdown", &wrote_mib);
    double t0 = now_s();
    start(disk, big_budget);
    double serve_s = now_s() - t0, rec_mib = 0, rec_s = log_seconds("recovered", &rec_mib);
    printf("{\"figure\":\"shutdown_and_recovery\",\"records\":%u,\"written_mib\":%.1f,\"write_mb_s\":%.1f,"
           "\"recovery_index_s\":%.4f,\"start_to_serving_s\":%.3f}\n",
           A.seqs, wrote_mib, wrote_mib * MiB / wrote_s / 1e6, rec_s, serve_s);
    c = cli();
    t0 = now_s();
    double got = get_all(c, A.seqs);
    double disk_s = now_s() - t0;
    t0 = now_s();
    get_all(c, A.seqs);
    double mem_s = now_s() - t0;
    printf("{\"figure\":\"read_back\",\"mib\":%.1f,\"get_raw_mb_s_from_disk\":%.1f,\"get_raw_mb_s_from_memory\":%.1f,"
           "\"ratio\":%.3f,\"loads\":%llu}\n",
           got / MiB, got / disk_s / 1e6, got / mem_s / 1e6, disk_s / mem_s,
           (unsigned long long)counter(c, "disk_loads"));
    dqc_free(c);
    dqd_stop(&D);

    /* 5. recovery of many small records (one layer, one window each). */
    if (A.records) {
        rm_rf(disk);
        raw_layer one;
        encode(2, 64, 128, &one, profile, &plen);
        start(disk, "16G");
        c = cli();
        dqc_model_spec spec = {
            .name = "bench", .layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .profile_name = "dq226"};
        if (dqc_register_model(c, &spec, NULL) < 0)
            die(dqc_last_error(c));
        put_all(c, 0, A.records, 1, &one, profile, plen);
        dqc_free(c);
        dqd_stop(&D);
        t0 = now_s();
        start(disk, "16G");
        serve_s = now_s() - t0;
        rec_s = log_seconds("recovered", &rec_mib);
        printf("{\"figure\":\"recovery_at_scale\",\"records\":%u,\"mib\":%.1f,\"recovery_index_s\":%.4f,"
               "\"us_per_record\":%.2f,\"start_to_serving_s\":%.3f}\n",
               A.records, rec_mib, rec_s, rec_s * 1e6 / A.records, serve_s);
        dqd_stop(&D);
        free(one.records);
        free(one.tk);
        free(one.tv);
    }
    if (!A.workdir)
        rm_rf(WORK);
    free(rl.records);
    free(rl.tk);
    free(rl.tv);
    return 0;
}

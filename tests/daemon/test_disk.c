/* dquantd's disk tier end to end (--disk-dir), through libdquant-client against a real dquantd
 * ($DQUANTD) whose host budget is small enough to make it spill: sequences and chunks written to
 * disk on eviction and read back bit-exact by GET, GET_RAW, ATTEND and LOOKUP (against the same
 * K/V encoded in-process by libdquant); a restart keeps the cache (models included), a kill -9
 * keeps what was on disk; flipped bits in the record files are misses counted as disk_corrupt,
 * never data; the capacity is kept; ENOSPC (a 1 MiB tmpfs), EFBIG (RLIMIT_FSIZE) and a read-only
 * directory are misses, not crashes. Skipped when $DQUANTD is unset; the tmpfs and read-only cases
 * skip where mount namespaces are not available. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/attention.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/layer.h"

#define L 3
#define QH 4
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define CT 128 /* chunk_tokens: one window of dq226 */
#define MODEL "m"
#define NS "ns"
#define HOST_MEM "6M" /* room for a few sequences beside the codec's own memory */
#define MAXSEQ 64

static dqd_daemon D;
static char WORK[200];  /* the test's directory: the daemon's socket and logs, and disk/ */
static char DISK[256];  /* the disk tier's directory */
static dq_codec *CODEC; /* the in-process reference */
static dq_workspace *WS;
static int RUN; /* daemons started by this test (their log names) */

/* ---- the reference: every sequence's layers, encoded in-process from the same K/V ---- */

typedef struct ref_seq {
    uint32_t id;
    uint64_t tokens;
    dq_layer *layers[L];
    int gone; /* deleted */
} ref_seq;

static ref_seq REFS[MAXSEQ];

static float val(uint32_t id, uint32_t l, uint64_t t, uint32_t j, int is_v)
{
    uint32_t h = id * 2654435761u ^ (uint32_t)(t * 40503u + j * 977u + l * 7919u + (uint32_t)is_v * 31u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 20001) / 5000.0f - 2.0f + (is_v ? 0.0f : 0.5f);
}

/* K or V of sequence id, tokens [start, start + n) of every layer: [L, n, KVH, HD] */
static float *kv(uint32_t id, uint64_t start, uint64_t n, int is_v)
{
    float *x = malloc(L * n * ROW * sizeof *x);
    cr_assert(x);
    for (uint32_t l = 0; l < L; l++)
        for (uint64_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < ROW; j++)
                x[(l * n + t) * ROW + j] = val(id, l, start + t, j, is_v);
    return x;
}

static void ref_init(void)
{
    dq_profile p;
    cr_assert_eq(dq_profile_builtin("dq226", KVH, HD, &p), 0);
    cr_assert_eq(dq_codec_create(&p, NULL, &CODEC), 0);
    cr_assert_eq(dq_workspace_create(CODEC, &WS), 0);
    memset(REFS, 0, sizeof REFS);
}

static void ref_free(void)
{
    for (int i = 0; i < MAXSEQ; i++)
        for (int l = 0; l < L; l++)
            dq_layer_free(REFS[i].layers[l]);
    memset(REFS, 0, sizeof REFS);
    dq_workspace_free(WS);
    dq_codec_free(CODEC);
    WS = NULL;
    CODEC = NULL;
}

static void key_of(uint32_t id, char *buf)
{
    sprintf(buf, "seq-%u", id);
}

/* PUT of n more tokens of sequence id (and the same appended to its reference). */
static void put_seq(dqc_client *c, uint32_t id, uint64_t n)
{
    ref_seq *r = &REFS[id];
    r->id = id;
    char key[32];
    key_of(id, key);
    float *k = kv(id, r->tokens, n, 0), *v = kv(id, r->tokens, n, 1);
    dqc_put_args a = {.seq = {NS, key, strlen(key)},
                      .model = MODEL,
                      .start_token = r->tokens,
                      .num_layers = L,
                      .tokens = n,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    for (uint32_t l = 0; l < L; l++) {
        if (!r->layers[l])
            cr_assert_eq(dq_layer_create(CODEC, &r->layers[l]), 0);
        cr_assert_eq(dq_layer_append(r->layers[l], WS, k + l * n * ROW, v + l * n * ROW, DQ_DTYPE_F32, n, NULL), 0);
    }
    r->tokens += n;
    free(k);
    free(v);
}

static dqc_seq seq_ref(uint32_t id, char *key)
{
    key_of(id, key);
    return (dqc_seq){NS, key, strlen(key)};
}

/* The stored layers equal the reference's byte for byte. */
static void check_raw(const dqc_raw_result *raw, dq_layer *const *layers, size_t nlayers, const char *what)
{
    const size_t wb = dq_codec_window_bytes(CODEC);
    cr_assert_eq(raw->nlayers, nlayers, "%s", what);
    for (size_t l = 0; l < nlayers; l++) {
        const dqc_raw_layer *rl = &raw->layers[l];
        const dq_layer *ref = layers[l];
        cr_assert_eq(rl->windows, dq_layer_window_count(ref), "%s layer %zu", what, l);
        cr_assert_eq(rl->tail_tokens, dq_layer_tail_tokens(ref), "%s layer %zu", what, l);
        for (size_t w = 0; w < rl->windows; w++)
            cr_assert(memcmp(rl->records + w * wb, dq_layer_window(ref, w), wb) == 0, "%s layer %zu window %zu", what,
                      l, w);
        size_t tb = rl->tail_tokens * ROW * 2;
        cr_assert_eq(rl->tail_bytes, tb);
        cr_assert(!tb || memcmp(rl->tail_k, dq_layer_tail(ref, DQ_KIND_K), tb) == 0, "%s layer %zu tail K", what, l);
        cr_assert(!tb || memcmp(rl->tail_v, dq_layer_tail(ref, DQ_KIND_V), tb) == 0, "%s layer %zu tail V", what, l);
    }
}

/* GET_RAW, GET (f32) and ATTEND of sequence id give exactly what the reference gives. */
static void check_seq(dqc_client *c, uint32_t id)
{
    const ref_seq *r = &REFS[id];
    char key[32], what[64];
    dqc_seq s = seq_ref(id, key);
    snprintf(what, sizeof what, "sequence %u", id);

    dqc_raw_result raw = {0};
    OK(c, dqc_get_raw(c, &s, 0, 0, &raw));
    check_raw(&raw, r->layers, L, what);
    dqc_raw_result_free(&raw);

    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = s, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, r->tokens, "%s", what);
    float *ref = malloc(r->tokens * ROW * sizeof *ref);
    for (uint32_t l = 0; l < L; l++) {
        for (int kind = 0; kind < 2; kind++) {
            cr_assert_eq(dq_layer_decode(r->layers[l], WS, (dq_kind)kind, 0, r->tokens, ref, DQ_DTYPE_F32), 0);
            const float *got = (const float *)(kind ? g.v : g.k) + l * r->tokens * ROW;
            cr_assert(memcmp(got, ref, r->tokens * ROW * sizeof *ref) == 0, "%s layer %u %s differs", what, l,
                      kind ? "V" : "K");
        }
    }
    free(ref);
    dqc_get_result_free(&g);

    float q[QH * HD], out[QH * HD], lse[QH], rout[QH * HD], rlse[QH];
    for (int i = 0; i < QH * HD; i++)
        q[i] = val(id + 1000, 0, 0, (uint32_t)i, 0);
    dqc_attend_item it = {.seq = s, .layer = L - 1, .q = q};
    dqc_attend_args aa = {
        .items = &it, .nitems = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out, lse));
    dq_attn_item ri = {r->layers[L - 1], q, rout, rlse};
    cr_assert_eq(dq_attend(CODEC, WS, QH, 1.0f / sqrtf(HD), &ri, 1), 0);
    cr_assert(memcmp(out, rout, sizeof out) == 0 && memcmp(lse, rlse, sizeof lse) == 0, "%s: ATTEND differs", what);
}

/* ---- the daemon ---- */

static void stop_daemon(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

static void cleanup(void)
{
    stop_daemon();
    ref_free();
    if (WORK[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", WORK);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", WORK);
    }
    WORK[0] = 0;
}

static void setup(void)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    snprintf(WORK, sizeof WORK, "%s", dqd_tmpdir());
    snprintf(DISK, sizeof DISK, "%s/disk", WORK);
    RUN = 0;
    ref_init();
}

TestSuite(disk, .init = setup, .fini = cleanup, .timeout = 240);

/* Starts the daemon on DISK with extra arguments (NULL-terminated) through bin (NULL: $DQUANTD);
 * returns -1 when it did not come up. */
static int try_start(const char *bin, const char *const *extra)
{
    static const char *args[32];
    size_t n = 0;
    args[n++] = "--disk-dir";
    args[n++] = DISK;
    /* $DQ_DISK_BACKEND=cuda: dquantd-fakecuda's cuda backend, with a GPU tier of 1 MiB in front of
     * a host budget as much smaller (sequences reach the disk through both tiers) */
    const char *backend = getenv("DQ_DISK_BACKEND");
    args[n++] = "--host-memory";
    args[n++] = backend ? "5M" : HOST_MEM;
    args[n++] = "--workers";
    args[n++] = "2";
    if (backend) {
        args[n++] = "--backend";
        args[n++] = backend;
        args[n++] = "--gpu-memory";
        args[n++] = "1M";
    }
    for (size_t i = 0; extra && extra[i] && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    char name[16];
    snprintf(name, sizeof name, "d%d", ++RUN);
    const dqd_opts o = {.bin = bin, .dir = WORK, .name = name, .extra = args, .log_level = "info"};
    return dqd_start(&D, &o);
}

static void start(const char *const *extra)
{
    cr_assert_eq(try_start(NULL, extra), 0, "could not start the daemon");
}

static void kill9(void)
{
    cr_assert(D.pid > 0);
    kill(D.pid, SIGKILL);
    int st;
    waitpid(D.pid, &st, 0);
    D.pid = 0;
}

static dqc_client *cli(void)
{
    dqc_client *c = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(D.addr, NULL, &c, err, sizeof err), 0, "connect: %s", err);
    return c;
}

static int register_model(dqc_client *c)
{
    dqc_model_spec spec = {
        .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    dqc_model_info info;
    uint32_t ct = 0;
    OK(c, dqc_register_model_ex(c, &spec, CT, &info, &ct));
    cr_assert_eq(ct, CT);
    return info.existed;
}

/* Record files (*.dqr) in DISK, and their bytes; *tmp counts leftovers (*.tmp). */
static size_t records(uint64_t *bytes, size_t *tmp)
{
    DIR *dir = opendir(DISK);
    cr_assert(dir, "%s: %s", DISK, strerror(errno));
    size_t n = 0;
    if (bytes)
        *bytes = 0;
    if (tmp)
        *tmp = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".dqr") == 0) {
            n++;
            if (bytes) {
                char p[600];
                struct stat st;
                snprintf(p, sizeof p, "%s/%s", DISK, e->d_name);
                cr_assert_eq(stat(p, &st), 0);
                *bytes += (uint64_t)st.st_size;
            }
        } else if (tmp && len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0) {
            (*tmp)++;
        }
    }
    closedir(dir);
    return n;
}

/* Where sequence id's record lives: DISK/<XXH3-128 of (kind, ns length, ns, key) in hex>.dqr. */
static void record_path(uint32_t id, char *out)
{
    char key[32];
    key_of(id, key);
    uint8_t buf[64];
    const size_t ns_len = strlen(NS), key_len = strlen(key);
    buf[0] = 0; /* DQD_KIND_SEQUENCE */
    for (int i = 0; i < 4; i++)
        buf[1 + i] = (uint8_t)(ns_len >> (8 * i));
    memcpy(buf + 5, NS, ns_len);
    memcpy(buf + 5 + ns_len, key, key_len);
    XXH128_hash_t h = XXH3_128bits(buf, 5 + ns_len + key_len);
    sprintf(out, "%s/%016llx%016llx.dqr", DISK, (unsigned long long)h.high64, (unsigned long long)h.low64);
}

static int get_status(dqc_client *c, uint32_t id)
{
    char key[32];
    dqc_seq s = seq_ref(id, key);
    dqc_raw_result raw = {0};
    int rc = dqc_get_raw(c, &s, 0, 0, &raw);
    dqc_raw_result_free(&raw);
    return rc;
}

/* ---- tests ---- */

/* Sequences past the host budget go to disk and come back bit-exact through every read; a write
 * to one read back makes its record stale (removed before the reply); DELETE of one on disk removes
 * its record without reading it back. */
Test(disk, spill_and_read_back)
{
    start(NULL);
    dqc_client *c = cli();
    cr_assert_eq(register_model(c), 0);
    const uint32_t n = 24;
    for (uint32_t id = 0; id < n; id++) {
        put_seq(c, id, 200);
        put_seq(c, id, 150 + id); /* tails of many lengths, 2..3 windows */
    }
    uint64_t spills = stat_counter(c, "disk_spills"), stubs = (uint64_t)stat_gauge(c, "disk_stubs");
    cr_assert_gt(spills, 0, "nothing was spilled");
    cr_assert_gt(stubs, 0);
    cr_assert_eq(records(NULL, NULL), stat_gauge(c, "disk_records"));
    cr_assert_eq(stat_counter(c, "disk_spill_failures"), 0);
    /* Oldest first: they are on disk. */
    for (uint32_t id = 0; id < n; id++)
        check_seq(c, id);
    uint64_t loads = stat_counter(c, "disk_loads");
    cr_assert_geq(loads, stubs, "%llu loads for %llu sequences on disk", (unsigned long long)loads,
                  (unsigned long long)stubs);
    cr_assert_eq(stat_counter(c, "disk_corrupt"), 0);
    /* (On the cuda backend ATTEND moves layers to the GPU, a write that makes the record stale.) */
    if (!getenv("DQ_DISK_BACKEND"))
        cr_assert_gt(stat_counter(c, "disk_clean_evictions"), 0, "reading back evicted clean copies without a write");

    /* An append to a sequence read back from disk: its record goes before the reply. */
    check_seq(c, 0); /* resident now, with its record as a clean copy */
    char path[400];
    record_path(0, path);
    if (!getenv("DQ_DISK_BACKEND"))
        cr_assert_eq(access(path, F_OK), 0, "no clean copy of sequence 0 (%s)", path);
    put_seq(c, 0, 77);
    cr_assert_neq(access(path, F_OK), 0, "the stale record of sequence 0 was not removed");
    check_seq(c, 0);

    /* DELETE of a sequence on disk: no load, record removed. */
    for (uint32_t id = 1; id < n; id++)
        check_seq(c, id); /* pushes sequence 0 and the first ones out again */
    loads = stat_counter(c, "disk_loads");
    uint64_t recs = records(NULL, NULL);
    char key[32];
    dqc_seq s = seq_ref(1, key);
    OK(c, dqc_delete(c, &s));
    cr_assert_eq(stat_counter(c, "disk_loads"), loads, "DELETE read the sequence back");
    cr_assert_eq(records(NULL, NULL), recs - 1);
    FAILS(c, DQ_NOT_FOUND, get_status(c, 1));
    REFS[1].gone = 1;
    dqc_free(c);
}

/* Chunks of the shared tier on disk: LOOKUP still counts them held (and a lease brings them back
 * ahead of the GET), GET of chunks is bit-exact, a PUT_CHUNKS of a chunk on disk is deduped without
 * reading it, a sequence built on chunks attends over them. */
Test(disk, chunks)
{
    start(NULL);
    dqc_client *c = cli();
    register_model(c);
    enum { NCH = 48 };
    uint32_t tok[NCH * CT];
    for (size_t i = 0; i < NCH * CT; i++)
        tok[i] = (uint32_t)(i * 7 + 3) % 30000;
    uint8_t keys[NCH * DQC_CHUNK_KEY_BYTES];
    cr_assert_eq(dqc_chunk_keys(NS, tok, NCH * CT, CT, NULL, keys, NCH), NCH);
    /* Chunk i holds the tokens of "sequence" 100 + i (its reference). */
    dq_layer *ref[NCH][L];
    for (uint32_t i = 0; i < NCH; i++) {
        float *k = kv(100 + i, 0, CT, 0), *v = kv(100 + i, 0, CT, 1);
        dqc_put_chunks_args a = {.ns = NS,
                                 .model = MODEL,
                                 .keys = keys + i * DQC_CHUNK_KEY_BYTES,
                                 .nkeys = 1,
                                 .parent = i ? keys + (i - 1) * DQC_CHUNK_KEY_BYTES : NULL,
                                 .layers = L,
                                 .chunk_tokens = CT,
                                 .kv_heads = KVH,
                                 .head_dim = HD,
                                 .dtype = DQ_DTYPE_F32,
                                 .k = k,
                                 .v = v};
        dqc_put_chunks_result res;
        OK(c, dqc_put_chunks(c, &a, &res));
        cr_assert_eq(res.stored, 1);
        for (uint32_t l = 0; l < L; l++) {
            cr_assert_eq(dq_layer_create(CODEC, &ref[i][l]), 0);
            cr_assert_eq(dq_layer_append(ref[i][l], WS, k + l * CT * ROW, v + l * CT * ROW, DQ_DTYPE_F32, CT, NULL), 0);
        }
        /* Dedupe of the first chunk, on disk by now: acknowledged without a read. */
        if (i == NCH - 1) {
            uint64_t loads = stat_counter(c, "disk_loads");
            a.keys = keys;
            a.parent = NULL;
            OK(c, dqc_put_chunks(c, &a, &res));
            cr_assert_eq(res.deduped, 1);
            cr_assert_eq(stat_counter(c, "disk_loads"), loads, "the dedupe read the chunk back");
        }
        free(k);
        free(v);
    }
    cr_assert_gt(stat_gauge(c, "disk_stubs"), 0);
    dqc_lookup_result lr;
    uint64_t loads = stat_counter(c, "disk_loads");
    OK(c, dqc_lookup(c, NS, MODEL, keys, 2, 10000, &lr)); /* leased: the first two come back meanwhile */
    cr_assert_eq(lr.hits, 2);
    for (int i = 0; i < 500 && stat_counter(c, "disk_loads") < loads + 2; i++)
        usleep(10000);
    cr_assert_geq(stat_counter(c, "disk_loads"), loads + 2, "a leased chunk on disk was not read back");
    OK(c, dqc_release_lease(c, lr.lease_id));
    OK(c, dqc_lookup(c, NS, MODEL, keys, NCH, 0, &lr));
    cr_assert_eq(lr.hits, NCH, "LOOKUP sees %llu of %d chunks", (unsigned long long)lr.hits, NCH);
    for (uint32_t i = 0; i < NCH; i++) {
        dqc_raw_result raw = {0};
        OK(c, dqc_get_chunk_raw(c, NS, keys + i * DQC_CHUNK_KEY_BYTES, &raw));
        char what[32];
        snprintf(what, sizeof what, "chunk %u", i);
        check_raw(&raw, ref[i], L, what);
        dqc_raw_result_free(&raw);
    }
    /* A sequence on the first 4 chunks; pushed to disk and back, it attends as it did. */
    float *k = kv(200, 0, 50, 0), *v = kv(200, 0, 50, 1);
    dqc_put_args pa = {.seq = {NS, "on-prefix", 9},
                       .model = MODEL,
                       .num_layers = L,
                       .tokens = 50,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    OK(c, dqc_put_on_prefix(c, &pa, keys, 4, NULL));
    float q[QH * HD], out0[QH * HD], out1[QH * HD], lse0[QH], lse1[QH];
    for (int i = 0; i < QH * HD; i++)
        q[i] = val(7, 1, 2, (uint32_t)i, 1);
    dqc_attend_item it = {.seq = pa.seq, .layer = 1, .q = q};
    dqc_attend_args aa = {
        .items = &it, .nitems = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out0, lse0));
    for (uint32_t i = 4; i < NCH; i++) {
        dqc_raw_result raw = {0};
        OK(c, dqc_get_chunk_raw(c, NS, keys + i * DQC_CHUNK_KEY_BYTES, &raw)); /* evicts the sequence */
        dqc_raw_result_free(&raw);
    }
    OK(c, dqc_attend(c, &aa, out1, lse1));
    cr_assert(memcmp(out0, out1, sizeof out0) == 0 && memcmp(lse0, lse1, sizeof lse0) == 0);
    free(k);
    free(v);
    for (uint32_t i = 0; i < NCH; i++)
        for (uint32_t l = 0; l < L; l++)
            dq_layer_free(ref[i][l]);
    dqc_free(c);
}

/* A clean restart keeps the whole cache (what was in memory is written at shutdown), registers the
 * model from the records, and reads it all back bit-exact; with --disk-sync on as well. */
static void restart_keeps(const char *const *extra)
{
    start(extra);
    dqc_client *c = cli();
    register_model(c);
    const uint32_t n = 16;
    for (uint32_t id = 0; id < n; id++)
        put_seq(c, id, 130 + 9 * id);
    dqc_free(c);
    stop_daemon();
    cr_assert_eq(records(NULL, NULL), n, "the shutdown did not write every sequence");
    start(extra);
    c = cli();
    cr_assert_eq(stat_gauge(c, "models"), 1, "the model was not registered from the records");
    cr_assert_eq(stat_counter(c, "disk_recovered"), n);
    cr_assert_eq(register_model(c), 1, "registering the same model again must find it");
    for (uint32_t id = 0; id < n; id++)
        check_seq(c, id);
    /* and appends go on where they were */
    put_seq(c, 3, 300);
    check_seq(c, 3);
    dqc_free(c);
}

Test(disk, restart_keeps_the_cache)
{
    restart_keeps(NULL);
}

Test(disk, restart_keeps_the_cache_with_fsync)
{
    static const char *const extra[] = {"--disk-sync", "on", NULL};
    restart_keeps(extra);
}

/* A second daemon on the same directory refuses to start (it would remove the first's records). */
Test(disk, one_daemon_per_directory)
{
    start(NULL);
    char disk_arg[300];
    snprintf(disk_arg, sizeof disk_arg, "--disk-dir=%s", DISK);
    const char *const args[] = {"--listen", "unix:/dev/null/x", disk_arg, NULL};
    int err_fd;
    pid_t pid = dqd_spawn(args, NULL, &err_fd);
    int st = dqd_wait(pid, 20000);
    char *err = dqd_read_all(err_fd);
    cr_assert_eq(st, 1, "the second daemon exited with %d: %s", st, err);
    cr_assert(strstr(err, "in use by another process"), "%s", err);
    free(err);
}

/* kill -9: what was on disk comes back bit-exact, what was only in memory is cleanly absent. */
Test(disk, kill9_keeps_what_was_on_disk)
{
    start(NULL);
    dqc_client *c = cli();
    register_model(c);
    const uint32_t n = 30;
    for (uint32_t id = 0; id < n; id++)
        put_seq(c, id, 400 + id);
    size_t on_disk = records(NULL, NULL); /* a spill may finish after this: more may come back */
    cr_assert_gt(on_disk, 0);
    dqc_free(c);
    kill9();
    start(NULL);
    c = cli();
    size_t back = 0, absent = 0;
    for (uint32_t id = 0; id < n; id++) {
        int rc = get_status(c, id);
        if (rc == 0) {
            check_seq(c, id);
            back++;
        } else {
            cr_assert_eq(rc, DQ_NOT_FOUND, "sequence %u: %s", id, dqc_err_name(rc));
            absent++;
        }
    }
    cr_assert_geq(back, on_disk, "%zu sequences back, %zu records were on disk", back, on_disk);
    cr_assert_gt(absent, 0);
    dqc_free(c);
}

/* One bit flipped in each record file (at spread positions: meta and body): every one of them is a
 * miss at start or on read, counted; none is served. */
Test(disk, flipped_bits_are_misses)
{
    start(NULL);
    dqc_client *c = cli();
    register_model(c);
    const uint32_t n = 12;
    for (uint32_t id = 0; id < n; id++)
        put_seq(c, id, 140 + 31 * id);
    dqc_free(c);
    stop_daemon();
    cr_assert_eq(records(NULL, NULL), n);
    /* Flip bits in all but the last record. */
    DIR *dir = opendir(DISK);
    cr_assert(dir);
    size_t flipped = 0;
    char names[16][600];
    for (struct dirent *e; (e = readdir(dir));) {
        if (strlen(e->d_name) < 5 || strcmp(e->d_name + strlen(e->d_name) - 4, ".dqr") != 0)
            continue;
        if (flipped == n - 1)
            break;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", DISK, e->d_name);
        snprintf(names[flipped], sizeof names[flipped], "%s", p);
        int fd = open(p, O_RDWR);
        cr_assert(fd >= 0);
        struct stat st;
        cr_assert_eq(fstat(fd, &st), 0);
        /* record i: the first bytes (magic, lengths), the meta, the body's start, middle, end */
        uint64_t pos;
        switch (flipped % 5) {
        case 0:
            pos = flipped;
            break;
        case 1:
            pos = 100 + flipped;
            break;
        case 2:
            pos = (uint64_t)st.st_size / 3;
            break;
        case 3:
            pos = (uint64_t)st.st_size / 2 + flipped;
            break;
        default:
            pos = (uint64_t)st.st_size - 1 - flipped;
            break;
        }
        uint8_t b;
        cr_assert_eq(pread(fd, &b, 1, (off_t)pos), 1);
        b ^= (uint8_t)(1u << (flipped % 8));
        cr_assert_eq(pwrite(fd, &b, 1, (off_t)pos), 1);
        close(fd);
        flipped++;
    }
    closedir(dir);
    start(NULL);
    c = cli();
    size_t good = 0;
    for (uint32_t id = 0; id < n; id++) {
        int rc = get_status(c, id);
        if (rc == 0) {
            check_seq(c, id); /* a record served is the right one, bit for bit */
            good++;
        } else {
            cr_assert_eq(rc, DQ_NOT_FOUND, "sequence %u: %s", id, dqc_err_name(rc));
        }
    }
    cr_assert_eq(good, n - flipped, "%zu of %u served with %zu bits flipped", good, n, flipped);
    cr_assert_eq(stat_counter(c, "disk_corrupt"), flipped, "every flipped record is counted");
    for (size_t i = 0; i < flipped; i++)
        cr_assert_neq(access(names[i], F_OK), 0, "the bad record %s is still there", names[i]);
    dqc_free(c);
}

/* --disk-capacity: least recently written records go; the newest are kept and read back. */
Test(disk, capacity_is_kept)
{
    static const char *const extra[] = {"--disk-capacity", "1M", NULL};
    start(extra);
    dqc_client *c = cli();
    register_model(c);
    const uint32_t n = 40;
    for (uint32_t id = 0; id < n; id++)
        put_seq(c, id, 256);
    uint64_t bytes;
    size_t nrec = records(&bytes, NULL);
    cr_assert_gt(stat_counter(c, "disk_evictions"), 0);
    cr_assert_leq(bytes, 1u << 20, "%llu bytes of records for a 1 MiB capacity", (unsigned long long)bytes);
    cr_assert_leq(stat_gauge(c, "disk_bytes"), 1u << 20);
    cr_assert_gt(nrec, 0);
    FAILS(c, DQ_NOT_FOUND, get_status(c, 0)); /* the oldest went */
    check_seq(c, n - 1);
    /* Reading some back pushes others out to disk, and the capacity then takes older records. */
    size_t back = 0;
    for (uint32_t id = 0; id < n; id++)
        if (get_status(c, id) == 0) {
            check_seq(c, id);
            back++;
        }
    cr_assert_gt(back, nrec / 2);
    cr_assert_leq(records(&bytes, NULL), nrec + 1);
    cr_assert_leq(bytes, 1u << 20);
    dqc_free(c);
}

/* Writes a shell script in WORK that runs the daemon under a wrapper (body uses "$@" for the
 * daemon's command line) and returns its path. */
static const char *wrapper(const char *name, const char *body)
{
    static char path[300];
    snprintf(path, sizeof path, "%s/%s.sh", WORK, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(path, 0755);
    return path;
}

/* Fills the store past the budget with sequences of two sizes: small records fit where large
 * ones fail; everything PUT was acknowledged, every read is bit-exact or NOT_FOUND, and the daemon
 * keeps serving (it exits cleanly at the end). Returns the spill failures counted. */
static uint64_t fill_under_failures(dqc_client *c, uint32_t n)
{
    register_model(c);
    for (uint32_t id = 0; id < n; id++)
        put_seq(c, id, id % 2 ? 40 : 400);
    size_t back = 0;
    for (uint32_t id = 0; id < n; id++) {
        int rc = get_status(c, id);
        if (rc == 0) {
            check_seq(c, id);
            back++;
        } else {
            cr_assert_eq(rc, DQ_NOT_FOUND, "sequence %u: %s", id, dqc_err_name(rc));
        }
    }
    cr_assert_gt(back, 0);
    size_t tmp;
    records(NULL, &tmp);
    cr_assert_eq(tmp, 0, "a failed write left its temporary file");
    return stat_counter(c, "disk_spill_failures");
}

/* ENOSPC: the directory is a 1 MiB tmpfs (a private mount namespace) under a larger capacity. */
Test(disk, enospc_is_a_miss)
{
    if (system("unshare -Urm true 2>/dev/null") != 0)
        cr_skip_test("no user and mount namespaces (unshare -Urm) here");
    cr_assert_eq(mkdir(DISK, 0755), 0);
    char body[600];
    snprintf(body, sizeof body,
             "exec unshare -Urm sh -c 'mount -t tmpfs -o size=1m tmpfs \"%s\" && exec \"$0\" \"$@\"' \"%s\" \"$@\"",
             DISK, dqd_path());
    static const char *const extra[] = {"--disk-capacity", "64M", NULL};
    cr_assert_eq(try_start(wrapper("tmpfs", body), extra), 0, "could not start the daemon on a tmpfs");
    dqc_client *c = cli();
    uint64_t failures = fill_under_failures(c, 40);
    cr_assert_gt(failures, 0, "the 1 MiB tmpfs never filled up");
    cr_assert(dqd_log_contains(&D, "No space left on device"));
    dqc_free(c);
}

/* EFBIG: RLIMIT_FSIZE of 64 KiB (SIGXFSZ ignored): small records are written, large ones fail. */
Test(disk, file_size_limit_is_a_miss)
{
    char body[600];
    snprintf(body, sizeof body, "exec prlimit --fsize=65536 \"%s\" \"$@\"", dqd_path());
    cr_assert_eq(try_start(wrapper("fsize", body), NULL), 0, "could not start the daemon under prlimit");
    dqc_client *c = cli();
    uint64_t failures = fill_under_failures(c, 40);
    cr_assert_gt(failures, 0);
    cr_assert_gt(stat_counter(c, "disk_spills"), 0, "small records fit under the limit");
    cr_assert(dqd_log_contains(&D, "File too large"));
    dqc_free(c);
}

/* A read-only directory (a read-only bind mount): the records in it are served, nothing new is
 * written (every spill fails and is counted), nothing crashes. */
Test(disk, read_only_directory)
{
    if (system("unshare -m true 2>/dev/null") != 0)
        cr_skip_test("no mount namespaces (unshare -m) here");
    start(NULL);
    dqc_client *c = cli();
    register_model(c);
    for (uint32_t id = 0; id < 4; id++)
        put_seq(c, id, 200);
    dqc_free(c);
    stop_daemon();
    char body[1200];
    snprintf(body, sizeof body,
             "exec unshare -m sh -c 'mount --bind \"%s\" \"%s\" && mount -o remount,bind,ro \"%s\" && "
             "exec \"$0\" \"$@\"' \"%s\" \"$@\"",
             DISK, DISK, DISK, dqd_path());
    cr_assert_eq(try_start(wrapper("ro", body), NULL), 0, "could not start the daemon on a read-only directory");
    c = cli();
    for (uint32_t id = 0; id < 4; id++)
        check_seq(c, id);
    for (uint32_t id = 4; id < 40; id++)
        put_seq(c, id, 200);
    cr_assert_gt(stat_counter(c, "disk_spill_failures"), 0);
    cr_assert_eq(stat_counter(c, "disk_spills"), 0);
    FAILS(c, DQ_NOT_FOUND, get_status(c, 4)); /* evicted without a record */
    check_seq(c, 39);
    dqc_free(c);
}

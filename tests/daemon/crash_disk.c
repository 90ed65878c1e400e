/* Crash test of dquantd's disk tier, in the style of RocksDB's db_crashtest: a loop that runs a
 * PUT/DELETE/GET load against a dquantd ($DQUANTD or --dquantd) whose host budget is small enough
 * to spill all the time, kills it with SIGKILL at a random moment (now and then SIGTERM first, so
 * that the kill lands in the shutdown's flush; now and then a clean stop), restarts it on the same
 * --disk-dir, and checks every key against an expected-state oracle kept here.
 *
 * The guarantee checked (disktier.h): after a crash every sequence is absent or exactly as after
 * its last acknowledged write, or after the one write in flight on it when the daemon died — never
 * an older version, a part of a write, a deleted sequence, or data other than what was written.
 * After a clean stop nothing acknowledged is missing. Live reads during the load must return
 * exactly the acknowledged state (or NOT_FOUND, a cache miss). "Exactly" is byte for byte against
 * the same K/V encoded in-process by libdquant (GET_RAW: window records and BF16 tails). The
 * daemon must also never find a corrupt record (disk_corrupt stays 0) nor leave a temporary file
 * behind a restart.
 *
 * The oracle: per key (NKEYS keys, each owned by one of NTHREADS client threads, so at most one
 * write per key is in flight) the acknowledged state — absent, or its segments and their
 * in-process layers — and the write in flight when the kill came (a PUT of one more segment, or a
 * DELETE). After each restart the state found becomes the expected one (a lost sequence is
 * allowed after a kill and counted).
 *
 * Prints one line of figures (kills, restarts, checks, violations, operations, records recovered,
 * mean restart time) and exits 0 when no violation was seen, 1 otherwise, 77 without a daemon. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/layer.h"

#define L 2
#define QH 2
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define MODEL "crash"
#define NS "c"
#define NKEYS 32
#define NTHREADS 4
#define MAXTOK 1100
#define MAXSEG 64

typedef struct seg {
    uint32_t seed, ntok;
} seg;

enum { NONE = 0, PEND_PUT = 1, PEND_DELETE = 2 };

typedef struct kstate {
    bool present;
    seg segs[MAXSEG];
    int nseg;
    uint64_t tokens;
    dq_layer *layers[L]; /* the acknowledged content, encoded in-process */
    int pending;
    seg pend;
} kstate;

static kstate KEYS[NKEYS];
static dq_codec *CODEC;
static atomic_uint SEED = 1;
static atomic_bool STOP;
static atomic_ulong VIOLATIONS, CHECKS, PUTS, DELETES, GETS, MISSES;
static dqd_daemon D;
static char WORK[200], DISK[256];

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint32_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 11);
}

#define VIOLATION(...)                                  \
    do {                                                \
        if (atomic_fetch_add(&VIOLATIONS, 1) < 20) {    \
            fprintf(stderr, "VIOLATION: " __VA_ARGS__); \
            fputc('\n', stderr);                        \
        }                                               \
    } while (0)

/* K or V of one segment: tokens [start, start + n) of every layer, [L, n, KVH, HD] f32. */
static float *segment_kv(int key, const seg *s, uint64_t start, int is_v)
{
    float *x = malloc((size_t)L * s->ntok * ROW * sizeof *x);
    if (!x)
        abort();
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < s->ntok; t++)
            for (uint32_t j = 0; j < ROW; j++) {
                uint32_t h = (uint32_t)key * 2654435761u ^ s->seed * 40503u ^ (uint32_t)((start + t) * 977u) ^
                             (j * 7919u + l * 131u + (uint32_t)is_v * 31u);
                h ^= h >> 15;
                h *= 2246822519u;
                h ^= h >> 13;
                x[((size_t)l * s->ntok + t) * ROW + j] = (float)(h % 20001) / 5000.0f - 2.0f;
            }
    return x;
}

static void key_name(int key, char *buf)
{
    sprintf(buf, "key-%d", key);
}

static void forget(kstate *st)
{
    for (int l = 0; l < L; l++)
        dq_layer_free(st->layers[l]);
    memset(st->layers, 0, sizeof st->layers);
    st->present = false;
    st->nseg = 0;
    st->tokens = 0;
}

/* Appends a segment to the key's in-process layers (its state becomes present). */
static void apply(int key, kstate *st, const seg *s, dq_workspace *ws)
{
    float *k = segment_kv(key, s, st->tokens, 0), *v = segment_kv(key, s, st->tokens, 1);
    for (int l = 0; l < L; l++) {
        if (!st->layers[l] && dq_layer_create(CODEC, &st->layers[l]) < 0)
            abort();
        if (dq_layer_append(st->layers[l], ws, k + (size_t)l * s->ntok * ROW, v + (size_t)l * s->ntok * ROW,
                            DQ_DTYPE_F32, s->ntok, NULL) < 0)
            abort();
    }
    free(k);
    free(v);
    st->present = true;
    if (st->nseg < MAXSEG)
        st->segs[st->nseg++] = *s;
    st->tokens += s->ntok;
}

/* Whether raw holds exactly the key's expected state. */
static bool same(const kstate *st, const dqc_raw_result *raw)
{
    const size_t wb = dq_codec_window_bytes(CODEC);
    if (raw->nlayers != L)
        return false;
    for (int l = 0; l < L; l++) {
        const dqc_raw_layer *rl = &raw->layers[l];
        const dq_layer *ref = st->layers[l];
        if (rl->tokens != st->tokens || rl->windows != dq_layer_window_count(ref) ||
            rl->tail_tokens != dq_layer_tail_tokens(ref))
            return false;
        for (size_t w = 0; w < rl->windows; w++)
            if (memcmp(rl->records + w * wb, dq_layer_window(ref, w), wb) != 0)
                return false;
        size_t tb = rl->tail_tokens * ROW * 2;
        if (tb && (memcmp(rl->tail_k, dq_layer_tail(ref, DQ_KIND_K), tb) != 0 ||
                   memcmp(rl->tail_v, dq_layer_tail(ref, DQ_KIND_V), tb) != 0))
            return false;
    }
    return true;
}

static bool transport_error(int rc)
{
    return rc == DQ_CONNECTION || rc == DQ_IO || rc == DQ_TIMEOUT || rc == DQ_PROTOCOL || rc == DQ_SHUTTING_DOWN;
}

/* ---- the load ---- */

typedef struct worker {
    int first, count;
    uint64_t rng;
    dq_workspace *ws;
} worker;

/* A live read: exactly the acknowledged state, or NOT_FOUND (then the key is absent from now on).
 * Returns the call's code. */
static int live_get(dqc_client *c, int key, kstate *st)
{
    char name[32];
    key_name(key, name);
    dqc_seq s = {NS, name, strlen(name)};
    dqc_raw_result raw = {0};
    int rc = dqc_get_raw(c, &s, 0, 0, &raw);
    if (rc == 0) {
        atomic_fetch_add(&CHECKS, 1);
        if (!st->present)
            VIOLATION("live GET of %s found a sequence that is absent (deleted or never written)", name);
        else if (!same(st, &raw))
            VIOLATION("live GET of %s differs from its acknowledged state (%llu tokens)", name,
                      (unsigned long long)st->tokens);
    } else if (rc == DQ_NOT_FOUND) {
        atomic_fetch_add(&CHECKS, 1);
        if (st->present)
            atomic_fetch_add(&MISSES, 1);
        forget(st);
    }
    dqc_raw_result_free(&raw);
    atomic_fetch_add(&GETS, 1);
    return rc;
}

static void *work(void *arg)
{
    worker *w = arg;
    dqc_options o;
    dqc_options_default(&o);
    o.auto_reconnect = 0;
    o.io_timeout_ms = 20000;
    dqc_client *c = NULL;
    if (dqc_connect(D.addr, &o, &c) < 0)
        return NULL;
    while (!atomic_load(&STOP)) {
        int key = w->first + (int)(rnd(&w->rng) % (uint32_t)w->count);
        kstate *st = &KEYS[key];
        char name[32];
        key_name(key, name);
        dqc_seq s = {NS, name, strlen(name)};
        uint32_t dice = rnd(&w->rng) % 100;
        int rc;
        if (st->present && (dice < 15 || st->tokens > MAXTOK - 300)) {
            st->pending = PEND_DELETE;
            rc = dqc_delete(c, &s);
            if (transport_error(rc))
                break;
            st->pending = NONE;
            if (rc == 0 || rc == DQ_NOT_FOUND)
                forget(st);
            atomic_fetch_add(&DELETES, 1);
        } else if (st->present && dice < 35) {
            rc = live_get(c, key, st);
            if (transport_error(rc))
                break;
        } else {
            seg g = {atomic_fetch_add(&SEED, 1), 1 + rnd(&w->rng) % 300};
            float *k = segment_kv(key, &g, st->tokens, 0), *v = segment_kv(key, &g, st->tokens, 1);
            dqc_put_args a = {.seq = s,
                              .model = MODEL,
                              .start_token = st->tokens,
                              .num_layers = L,
                              .tokens = g.ntok,
                              .kv_heads = KVH,
                              .head_dim = HD,
                              .dtype = DQ_DTYPE_F32,
                              .k = k,
                              .v = v};
            st->pending = PEND_PUT;
            st->pend = g;
            rc = dqc_put(c, &a, NULL);
            free(k);
            free(v);
            if (transport_error(rc))
                break;
            st->pending = NONE;
            atomic_fetch_add(&PUTS, 1);
            if (rc == 0) {
                apply(key, st, &g, w->ws);
            } else if (rc != DQ_RESOURCE_EXHAUSTED) {
                /* The daemon lost the sequence (a miss) or holds one we took for absent: read it. */
                rc = live_get(c, key, st);
                if (transport_error(rc))
                    break;
            }
        }
    }
    dqc_free(c);
    return NULL;
}

/* ---- after a restart ---- */

typedef struct cycle_figures {
    uint64_t lost, present;
} cycle_figures;

static void verify_key(dqc_client *c, int key, bool clean, dq_workspace *ws, cycle_figures *cf)
{
    kstate *st = &KEYS[key];
    char name[32];
    key_name(key, name);
    dqc_seq s = {NS, name, strlen(name)};
    dqc_raw_result raw = {0};
    int rc = dqc_get_raw(c, &s, 0, 0, &raw);
    atomic_fetch_add(&CHECKS, 1);
    if (rc == DQ_NOT_FOUND) {
        if (st->present && st->pending != PEND_DELETE) {
            cf->lost++;
            if (clean)
                VIOLATION("%s (%llu tokens, acknowledged) is missing after a clean stop", name,
                          (unsigned long long)st->tokens);
        }
        forget(st);
    } else if (rc != 0) {
        VIOLATION("GET of %s after the restart: %s (%s)", name, dqc_err_name(rc), dqc_last_error(c));
    } else {
        cf->present++;
        uint64_t tokens = raw.nlayers ? raw.layers[0].tokens : 0;
        for (size_t l = 1; l < raw.nlayers; l++)
            if (raw.layers[l].tokens != tokens)
                VIOLATION("%s has layers of %llu and %llu tokens: a half-applied write", name,
                          (unsigned long long)tokens, (unsigned long long)raw.layers[l].tokens);
        if (st->present && tokens == st->tokens) {
            if (!same(st, &raw))
                VIOLATION("%s differs from its acknowledged state (%llu tokens)", name, (unsigned long long)tokens);
        } else if (st->pending == PEND_PUT && tokens == st->tokens + st->pend.ntok) {
            apply(key, st, &st->pend, ws); /* the write in flight made it */
            if (!same(st, &raw))
                VIOLATION("%s differs from its state after the write in flight (%llu tokens)", name,
                          (unsigned long long)tokens);
        } else {
            VIOLATION("%s holds %llu tokens; expected %s%llu%s", name, (unsigned long long)tokens,
                      st->present ? "" : "absent or ", (unsigned long long)st->tokens,
                      st->pending == PEND_PUT ? " or that plus the write in flight" : "");
            forget(st);
        }
    }
    st->pending = NONE;
    dqc_raw_result_free(&raw);
}

static uint64_t stat_of(dqc_client *c, const char *name)
{
    dqc_stats_result r = {0};
    uint64_t v = 0;
    if (dqc_stats(c, &r) == 0)
        dqc_stats_counter(&r, name, &v);
    dqc_stats_result_free(&r);
    return v;
}

static size_t tmp_files(void)
{
    DIR *d = opendir(DISK);
    size_t n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        n += len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0;
    }
    closedir(d);
    return n;
}

static int start(uint64_t *restart_us)
{
    static const char *args[] = {"--disk-dir", NULL, "--host-memory", "2M", "--workers", "2", NULL};
    args[1] = DISK;
    const dqd_opts o = {.dir = WORK, .name = "crash", .extra = args, .log_level = "warn", .start_timeout_ms = 60000};
    uint64_t t0 = now_us();
    if (dqd_start(&D, &o) < 0)
        return -1;
    *restart_us += now_us() - t0;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: crash_disk [--kills N] [--seed S] [--dquantd PATH] [--workdir DIR]\n");
}

int main(int argc, char **argv)
{
    unsigned kills_wanted = 200;
    uint64_t seed = (uint64_t)time(NULL);
    const char *workdir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kills") == 0 && i + 1 < argc)
            kills_wanted = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--dquantd") == 0 && i + 1 < argc)
            setenv("DQUANTD", argv[++i], 1);
        else if (strcmp(argv[i], "--workdir") == 0 && i + 1 < argc)
            workdir = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    if (!dqd_path()) {
        fprintf(stderr, "crash_disk: $DQUANTD is not set; skipping\n");
        return 77;
    }
    if (!seed)
        seed = 1;
    snprintf(WORK, sizeof WORK, "%s", workdir ? workdir : dqd_tmpdir());
    mkdir(WORK, 0755);
    snprintf(DISK, sizeof DISK, "%s/disk", WORK);
    dq_profile p;
    dq_workspace *ws;
    if (dq_profile_builtin("dq226", KVH, HD, &p) < 0 || dq_codec_create(&p, NULL, &CODEC) < 0 ||
        dq_workspace_create(CODEC, &ws) < 0)
        return 1;
    printf("crash_disk: seed %llu, %u kills, %d keys on %d threads, work dir %s\n", (unsigned long long)seed,
           kills_wanted, NKEYS, NTHREADS, WORK);
    fflush(stdout);

    uint64_t rng = seed * 0x9E3779B97F4A7C15ull | 1, restart_us = 0, t_start = now_us();
    unsigned kills = 0, restarts = 0, clean_stops = 0, term_kills = 0;
    bool last_clean = false; /* the run before this restart ended with a clean stop */
    uint64_t recovered = 0, lost = 0, present = 0;
    worker workers[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        workers[t] = (worker){t * (NKEYS / NTHREADS), NKEYS / NTHREADS, seed + 17u * (uint64_t)t + 1, NULL};
        if (dq_workspace_create(CODEC, &workers[t].ws) < 0)
            return 1;
    }
    while (kills < kills_wanted) {
        if (start(&restart_us) < 0) {
            VIOLATION("the daemon did not come back up (log: %s)", D.log);
            break;
        }
        restarts++;
        dqc_client *c = NULL;
        if (dqc_connect(D.addr, NULL, &c) < 0) {
            VIOLATION("cannot connect after the restart");
            break;
        }
        dqc_model_spec spec = {
            .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
        int rc = dqc_register_model(c, &spec, NULL);
        if (rc < 0)
            VIOLATION("REGISTER_MODEL after the restart: %s (%s)", dqc_err_name(rc), dqc_last_error(c));
        uint64_t corrupt0 = stat_of(c, "disk_corrupt");
        recovered += stat_of(c, "disk_recovered");
        if (corrupt0)
            VIOLATION("%llu corrupt records found at start", (unsigned long long)corrupt0);
        if (tmp_files())
            VIOLATION("%zu temporary files left after the start", tmp_files());
        /* Every key against the oracle. */
        cycle_figures cf = {0, 0};
        for (int k = 0; k < NKEYS; k++)
            verify_key(c, k, last_clean, ws, &cf);
        lost += cf.lost;
        present += cf.present;
        if (stat_of(c, "disk_corrupt") != corrupt0)
            VIOLATION("a record failed its checksum when read back");
        dqc_free(c);

        /* The load, then the kill at a random moment. */
        atomic_store(&STOP, false);
        pthread_t th[NTHREADS];
        for (int t = 0; t < NTHREADS; t++)
            pthread_create(&th[t], NULL, work, &workers[t]);
        uint32_t how = rnd(&rng) % 16;
        usleep(5000 + rnd(&rng) % 250000);
        last_clean = false;
        if (how == 0) {
            /* A clean stop: everything acknowledged must come back. */
            atomic_store(&STOP, true);
            for (int t = 0; t < NTHREADS; t++)
                pthread_join(th[t], NULL);
            int st = dqd_stop(&D);
            if (st != 0)
                VIOLATION("the daemon exited with %d on SIGTERM", st);
            clean_stops++;
            last_clean = true;
            continue;
        }
        if (how < 4) {
            /* SIGTERM, then SIGKILL during the drain or the shutdown's flush. */
            kill(D.pid, SIGTERM);
            usleep(rnd(&rng) % 30000);
            term_kills++;
        }
        kill(D.pid, SIGKILL);
        int st;
        waitpid(D.pid, &st, 0);
        D.pid = 0;
        kills++;
        atomic_store(&STOP, true);
        for (int t = 0; t < NTHREADS; t++)
            pthread_join(th[t], NULL);
        if (kills % 25 == 0) {
            printf("  %u kills, %lu checks, %lu violations\n", kills, atomic_load(&CHECKS), atomic_load(&VIOLATIONS));
            fflush(stdout);
        }
    }
    /* A last restart checks the last kill. */
    if (atomic_load(&VIOLATIONS) == 0 && start(&restart_us) == 0) {
        restarts++;
        dqc_client *c = NULL;
        if (dqc_connect(D.addr, NULL, &c) == 0) {
            cycle_figures cf = {0, 0};
            for (int k = 0; k < NKEYS; k++)
                verify_key(c, k, false, ws, &cf);
            lost += cf.lost;
            present += cf.present;
            dqc_free(c);
        }
        dqd_stop(&D);
    }
    double secs = (double)(now_us() - t_start) * 1e-6;
    printf("crash_disk: %u kills (%u during a shutdown), %u clean stops, %u restarts, %lu checks, %lu violations; "
           "%lu PUTs, %lu DELETEs, %lu live GETs acknowledged (%lu cache misses); %llu records recovered, "
           "%llu sequences found after restarts, %llu lost (only in memory at a kill); mean restart %.1f ms; "
           "%.1f s\n",
           kills, term_kills, clean_stops, restarts, atomic_load(&CHECKS), atomic_load(&VIOLATIONS), atomic_load(&PUTS),
           atomic_load(&DELETES), atomic_load(&GETS), atomic_load(&MISSES), (unsigned long long)recovered,
           (unsigned long long)present, (unsigned long long)lost,
           restarts ? (double)restart_us / restarts / 1000.0 : 0.0, secs);
    for (int k = 0; k < NKEYS; k++)
        forget(&KEYS[k]);
    for (int t = 0; t < NTHREADS; t++)
        dq_workspace_free(workers[t].ws);
    dq_workspace_free(ws);
    dq_codec_free(CODEC);
    if (atomic_load(&VIOLATIONS) == 0 && !workdir) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", WORK);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", WORK);
    }
    return atomic_load(&VIOLATIONS) ? 1 : 0;
}

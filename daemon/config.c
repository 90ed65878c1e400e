/* dquantd configuration (see config.h). One table describes every setting: its INI section and
 * key, its flag, its type and bounds, and its help text. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dquant/error.h"
#include "dquant/version.h"
#include "logging.h"

#ifndef DQD_VERSION
#define DQD_VERSION DQ_VERSION_STRING
#endif

#define KiB (1024ull)
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define TiB (1024ull * GiB)

typedef enum opt_type {
    OPT_LISTEN,
    OPT_METRICS,
    OPT_SIZE,
    OPT_U32,
    OPT_BACKEND,
    OPT_LOG_LEVEL,
    OPT_SECRET,
    OPT_SECRET_FILE,
    OPT_TOKEN,
    OPT_TOKEN_FILE,
    OPT_KERNEL,
    OPT_SCHEDULE,
    OPT_LAYOUT,
    OPT_MASS,
    OPT_PATH,
    OPT_BOOL,
} opt_type;

typedef struct dqd_option {
    const char *flag; /* without the leading "--" */
    const char *section;
    const char *key;
    opt_type type;
    size_t offset; /* of the field for OPT_SIZE / OPT_U32 */
    uint64_t min, max;
    const char *arg; /* name of the option's value in --help, e.g. "SIZE" */
    const char *def; /* default, as shown in --help */
    const char *help;
} dqd_option;

#define FIELD(f) offsetof(dqd_config, f)

static const dqd_option options[] = {
    {"listen", "server", "listen", OPT_LISTEN, 0, 0, 0, "ADDR", "unix:/tmp/dquantd.sock, tcp://127.0.0.1:7733",
     "Listen on ADDR: unix:/path or tcp://host:port (IPv6: tcp://[::1]:7733). Repeatable; the first "
     "one replaces the defaults. TCP on a non-loopback address requires TLS (--tls-cert) or "
     "--allow-plaintext, and a secret or client certificates (--tls-client-ca)."},
    {"secret", "server", "secret", OPT_SECRET, 0, 0, 0, "SECRET", "none",
     "Shared secret every TCP client must present in HELLO (compared in constant time)."},
    {"secret-file", "server", "secret_file", OPT_SECRET_FILE, 0, 0, 0, "FILE", "none",
     "Read the shared secret from FILE (one trailing newline is stripped); keeps it out of ps."},
    {"tls-cert", "server", "tls_cert", OPT_PATH, FIELD(tls_cert), 0, 0, "FILE", "none (plaintext TCP)",
     "TLS for every TCP listener: the server's certificate chain (PEM, leaf first). Unix sockets stay "
     "plaintext; the metrics listener too."},
    {"tls-key", "server", "tls_key", OPT_PATH, FIELD(tls_key), 0, 0, "FILE", "in --tls-cert",
     "The private key (PEM) of --tls-cert."},
    {"tls-client-ca", "server", "tls_client_ca", OPT_PATH, FIELD(tls_client_ca), 0, 0, "FILE", "none",
     "Mutual TLS: TCP clients must present a certificate signed by a CA in FILE (PEM) or the handshake "
     "fails. A verified client certificate authenticates the connection instead of the shared secret: "
     "HELLO on such a listener needs no secret (the secret still guards nothing else there)."},
    {"allow-plaintext", "server", "allow_plaintext", OPT_BOOL, FIELD(allow_plaintext), 0, 0, "[on|off]", "off",
     "Allow plaintext TCP (no --tls-cert) on a non-loopback address, which is refused otherwise (a shared "
     "secret is still required there)."},
    {"auth-fail-burst", "server", "auth_fail_burst", OPT_U32, FIELD(auth_fail_burst), 1, 1000000, "N", "10",
     "HELLOs with a wrong or missing secret one peer address (an IPv6 /64) may send before it is throttled; "
     "a throttled address has its HELLOs refused unchecked, and logged at most 5 times in 10 s."},
    {"auth-fail-per-min", "server", "auth_fail_per_min", OPT_U32, FIELD(auth_fail_per_min), 1, 10000000, "N", "60",
     "Failed HELLOs a peer address is given back per minute once throttled."},
    {"workers", "server", "workers", OPT_U32, FIELD(workers), 1, 256, "N", "number of CPUs",
     "Worker threads for encoding, decoding and attention."},
    {"backend", "server", "backend", OPT_BACKEND, 0, 0, 0, "cpu|cuda", "cpu",
     "Codec backend. cuda falls back to cpu (with a log line) when not built with CUDA or no GPU. On cuda, "
     "models of the D-Quant codec live on the GPU; every other profile (bf16, int-b, kivi, turbo and the "
     "KVQuant++ family lm/lmh/ip/ol/pq, with or without +lr/+d) is served on the host path with the cpu "
     "codec: PUT, GET, ATTEND, COMPRESS and DECOMPRESS give the same answers as on the cpu backend."},
    {"io-threads", "server", "io_threads", OPT_U32, FIELD(io_threads), 0, 64, "N", "4",
     "Threads that read the rest of a large frame (1 MiB or more still to come) straight from its socket "
     "while the data flows, so that several connections' large PUTs are read at once; a connection whose "
     "data stalls goes back to the event loop. 0: the event loop reads every socket."},
    {"gpu-device", "server", "gpu_device", OPT_U32, FIELD(gpu_device), 0, 1023, "N", "0",
     "CUDA device the cuda backend uses."},
    {"gpu-threads", "server", "gpu_threads", OPT_U32, FIELD(gpu_threads), 0, 64, "N", "2",
     "Threads of their own for ATTEND requests whose items are all in GPU memory (cuda backend); 0 runs "
     "them on the workers."},
    {"gpu-spin-us", "server", "gpu_spin_us", OPT_U32, FIELD(gpu_spin_us), 0, 100000, "US", "200",
     "After a GPU task, how long its thread keeps polling for the next one before it sleeps (a decode "
     "step's ATTEND calls come ~150 us apart; waking a sleeping thread costs ~45 us). 0: it sleeps at once."},
    /* OPT_KERNEL: "auto" (0) or one of the versions in arg, libdquant-cuda's (dqcu_settings) */
    {"attend-kernel", "server", "attend_kernel", OPT_KERNEL, FIELD(attend_kernel), 0, 0, "auto|7|5|3", "auto",
     "Decode-attention kernel of the cuda backend: auto runs the fastest one that takes the model's shape "
     "(7, else 5, else 3); a version runs it, or the newest older one, where it takes the shape. For "
     "comparisons; every version gives the same result within float rounding."},
    {"encode-kernel", "server", "encode_kernel", OPT_KERNEL, FIELD(encode_kernel), 0, 0, "auto|5|4", "auto",
     "Encoder kernel of the cuda backend (auto = 5). For comparisons; every version writes the same bytes."},
    {"encode-schedule", "server", "encode_schedule", OPT_SCHEDULE, FIELD(encode_schedule), 0, 0, "planned|plain",
     "planned",
     "How the cuda backend's encoder spreads an encode call's streams over warps: planned shares the last "
     "waves out evenly; plain gives every warp the same number (for comparisons)."},
    {"gpu-attention-layout", "server", "gpu_attention_layout", OPT_LAYOUT, FIELD(gpu_attention_layout), 0, 0,
     "containers|hot|hot-only", "containers",
     "What decode attention on the GPU tier reads (cuda backend). containers: the window records "
     "(rANS decoded in the attention kernel); the fixed-width family (fixed226, fixed196, fixedkAvB) "
     "stays on the host tier. hot: each sealed window of a model the hot kernel takes (D-Quant or "
     "fixed-width, head_dim 128 or 256, 3+3 or 4+4 bits per level as dq226 and dq196, 3+2 or 2+1 as "
     "fixed226 and fixed196, 1, 2, 4 or 8 query heads per KV head) also keeps a lossless fixed-width copy on the GPU, "
     "and ATTEND runs over those: "
     "3-6x faster per layer on an H200 (tests/bench/GPU_NOTES.md); the copies add 1.36x the records' "
     "GPU memory for dq226, counted in --gpu-memory. The records stay for GET, GET_RAW and the host and "
     "disk tiers; the copies are dropped when a layer leaves the GPU and rebuilt when it comes back. "
     "hot-only: the GPU tier keeps such windows only as hot copies (784 B per token and layer for dq226 "
     "at n = 1024 instead of 1362 with hot, 1.74x the tokens in the same --gpu-memory); GET, GET_RAW, "
     "moves to the host and disk tiers and an ATTEND the hot kernel refuses rebuild the records exactly "
     "on the GPU (dqcu_rebuild_hot; the fixed-width family on the CPU, dq_hot_rebuild), which makes "
     "those paths slower than with containers or hot. With hot and hot-only the fixed-width family "
     "lives on the GPU tier: its records are encoded (PUT) and decoded (GET) on the host, ATTEND runs "
     "over its hot windows. Container format version 2 (dq226p, dq196p) lives on the GPU tier with every "
     "layout (encoded and decoded on the GPU); ATTEND runs over its hot windows with hot and hot-only, and "
     "over its records with containers (attention v7 decoding the pairs; on the host for custom version-2 "
     "profiles of more than 8 levels). Other models use the records. "
     "Results equal within float rounding."},
    {"attention-value-mass", "server", "attention_value_mass", OPT_MASS, FIELD(attention_value_mass), 0, 0, "off|TAU",
     "off",
     "Certified value skipping in ATTEND (dquant/vskip.h): with TAU in (0, 1), e.g. 0.999, every key is "
     "scored but a value stream is decoded only for tokens in the smallest set holding TAU of some query "
     "head's softmax mass (the BF16 tail always counts); the others are left out, with a proven bound on the "
     "output error from their stored scale and offset (0.999 on bytellama-19m at 1K tokens: ~85% of value "
     "streams decoded, ~3e-4 relative error). off, 0 or 1: exact. D-Quant and fixed-width models on the host "
     "path only: "
     "the cuda backend's GPU kernels ignore it (GPU-resident layers stay exact: their values are computed 16 "
     "tokens at a time, and on bytellama-n1024 every such block holds a token to keep at 0.999, so a GPU "
     "kernel would skip nothing; tests/eval/RESULTS.md), other codecs are always exact. Metrics "
     "attend_value_streams_decoded / _skipped count the sealed value streams."},
    {"nccl-timeout", "server", "nccl_timeout_ms", OPT_U32, FIELD(nccl_timeout_ms), 100, 3600000, "MS", "10000",
     "NCCL data path: longest wait for a communicator to form or a transfer to finish (plus 1 s per GB); "
     "past it the connection's communicator is aborted and the request fails."},
    {"log-level", "server", "log_level", OPT_LOG_LEVEL, 0, 0, 0, "LEVEL", "info", "error, warn, info or debug."},
    {"shutdown-timeout", "server", "shutdown_timeout", OPT_U32, FIELD(shutdown_timeout), 1, 3600, "SECONDS", "30",
     "On SIGTERM/SIGINT, how long to wait for in-flight requests before closing connections."},
    {"host-memory", "store", "host_memory", OPT_SIZE, FIELD(host_memory), 1 * MiB, 64 * TiB, "SIZE", "4G",
     "Host-memory budget of the store; least recently used unpinned sequences are evicted to stay "
     "within it."},
    {"gpu-memory", "store", "gpu_memory", OPT_SIZE, FIELD(gpu_memory), 1 * MiB, 64 * TiB, "SIZE",
     "80% of the free GPU memory at start",
     "GPU-memory budget of the store on the cuda backend (window records, tails and pointer arrays of "
     "GPU-resident layers). Least recently used unpinned sequences move to host memory when the host "
     "budget allows, else they are evicted; they come back to the GPU when next used by PUT or ATTEND."},
    {"disk-dir", "store", "disk_dir", OPT_PATH, FIELD(disk_dir), 0, 0, "DIR", "none (no disk tier)",
     "Disk tier: sequences and chunks evicted from host memory are written to record files in DIR (created "
     "if missing) instead of being dropped, and read back transparently when next used; a restart finds "
     "them there (models included), a clean shutdown writes every sequence held. Every record is checksummed "
     "and checked when read: a bad one is a miss, never wrong data."},
    {"disk-capacity", "store", "disk_capacity", OPT_SIZE, FIELD(disk_capacity), 1 * MiB, 1024 * TiB, "SIZE",
     "80% of the free space of --disk-dir at start",
     "Bytes of records the disk tier keeps; least recently used records are removed to stay within it."},
    {"disk-sync", "store", "disk_sync", OPT_BOOL, FIELD(disk_sync), 0, 0, "on|off", "off",
     "fsync each record before it is published and the directory after every change, so that records also "
     "survive a power loss (a process crash loses nothing written either way)."},
    {"max-models", "store", "max_models", OPT_U32, FIELD(max_models), 1, 1u << 20, "N", "256",
     "Registered models at most."},
    {"max-models-per-client", "store", "max_models_per_client", OPT_U32, FIELD(max_models_per_client), 0, 1u << 20, "N",
     "64",
     "Models one client (by its HELLO client_name) may have registered at a time, so that no client can fill "
     "the registry for the others (UNREGISTER_MODEL frees a place); 0: no per-client limit."},
    {"max-frame", "limits", "max_frame", OPT_SIZE, FIELD(max_frame), 64, 1 * TiB, "SIZE",
     "32 + max-header + max-payload", "Largest frame (fixed header + header message + payload)."},
    {"max-header", "limits", "max_header", OPT_SIZE, FIELD(max_header), 64, 256 * MiB, "SIZE", "1M",
     "Largest protobuf header message of a frame."},
    {"max-payload", "limits", "max_payload", OPT_SIZE, FIELD(max_payload), 0, 1 * TiB, "SIZE", "256M",
     "Largest tensor payload of a frame (requests and replies)."},
    {"max-connections", "limits", "max_connections", OPT_U32, FIELD(max_connections), 1, 1u << 20, "N", "1024",
     "Client connections at most; further ones are closed at once."},
    {"max-output-queue", "limits", "max_output_queue", OPT_SIZE, FIELD(max_output_queue), 1 * KiB, 1 * TiB, "SIZE",
     "64M", "Reply bytes queued on one connection before the daemon stops reading from it."},
    {"max-io-memory", "limits", "max_io_memory", OPT_SIZE, FIELD(max_io_memory), 1 * MiB, 64 * TiB, "SIZE",
     "1G, or twice max-frame when that is larger",
     "Bytes all client connections together may make the daemon hold: request frames being received or "
     "waiting for their operation, reply buffers of operations in progress, replies queued for sending. "
     "Past it connections stop being read until bytes are released, and a reply that does not fit fails "
     "with RESOURCE_EXHAUSTED; the last eighth is kept for connections that hold nothing else. At least "
     "max-frame."},
    {"frame-cache", "limits", "frame_cache", OPT_SIZE, FIELD(frame_cache), 0, 64 * TiB, "SIZE", "512M",
     "Freed buffers of large frames (1 MiB and up) kept for the next ones: a fresh buffer costs the "
     "socket read a page fault per 4 KB it fills. 0 keeps none."},
    {"max-inflight", "limits", "max_inflight", OPT_U32, FIELD(max_inflight), 1, 1u << 16, "N", "64",
     "Requests of one connection in progress before the daemon stops reading from it."},
    {"handshake-timeout", "limits", "handshake_timeout", OPT_U32, FIELD(handshake_timeout), 1, 3600, "SECONDS", "10",
     "A connection must complete a successful HELLO within this long of being accepted, else it is closed "
     "(silent connections cannot hold the max-connections slots)."},
    {"idle-timeout", "limits", "idle_timeout", OPT_U32, FIELD(idle_timeout), 0, 86400, "SECONDS", "300",
     "A connection with no request in progress, no reply to send and no frame started for this long is "
     "closed (libdquant-client reconnects transparently); one with an NCCL communicator is kept. 0: never."},
    {"frame-timeout", "limits", "frame_timeout", OPT_U32, FIELD(frame_timeout), 1, 3600, "SECONDS", "30",
     "A frame whose first byte has arrived must be complete within this long, plus its size over "
     "frame-min-rate, else the connection is closed (time the daemon itself stops reading does not count)."},
    {"frame-min-rate", "limits", "frame_min_rate", OPT_SIZE, FIELD(frame_min_rate), 1 * KiB, 1 * TiB, "SIZE", "1M",
     "Bytes per second a frame is given on top of frame-timeout: a 256 MiB PUT gets 30 + 256 s."},
    {"write-timeout", "limits", "write_timeout", OPT_U32, FIELD(write_timeout), 1, 3600, "SECONDS", "60",
     "A connection whose replies are queued and that takes none of their bytes for this long is closed, "
     "so that clients which stop reading give their memory back."},
    {"max-batch-items", "limits", "max_batch_items", OPT_U32, FIELD(max_batch_items), 1, 1u << 20, "N", "4096",
     "Items of one ATTEND request at most."},
    {"max-lookup-keys", "limits", "max_lookup_keys", OPT_U32, FIELD(max_lookup_keys), 1, 1u << 24, "N", "65536",
     "Chunk keys of one LOOKUP or PUT_CHUNKS request at most."},
    {"max-lease-ms", "limits", "max_lease_ms", OPT_U32, FIELD(max_lease_ms), 1, 1u << 30, "MS", "60000",
     "Longest lease a LOOKUP may take on the chunks it found."},
    {"max-calibration-bytes", "limits", "max_calibration_bytes", OPT_SIZE, FIELD(max_calibration), 0, 1 * TiB, "SIZE",
     "64M",
     "Largest KVQuant++ calibration REGISTER_MODEL takes (the per-layer codebooks and outlier channels "
     "dq_kvq_calibrate writes, sent in the frame's payload; the model keeps a copy). Also bounded by "
     "max-payload."},
    {"max-leases", "limits", "max_leases", OPT_U32, FIELD(max_leases), 1, 1u << 20, "N", "1024",
     "Live LOOKUP leases of one connection at most."},
    {"metrics", "metrics", "listen", OPT_METRICS, 0, 0, 0, "HOST:PORT|off", "127.0.0.1:9733",
     "Prometheus endpoint (GET /metrics, GET /healthz); off disables it."},
    {"metrics-max-connections", "metrics", "max_connections", OPT_U32, FIELD(metrics_max_connections), 2, 4096, "N",
     "16",
     "Connections the metrics endpoint serves at once. A new one is always accepted: the oldest that has not "
     "sent its request yet is closed to make room, so idle connections cannot keep a health probe out."},
    {"metrics-timeout-ms", "metrics", "timeout_ms", OPT_U32, FIELD(metrics_timeout_ms), 100, 60000, "MS", "2000",
     "How long a metrics connection may take to send its request and read the answer."},
    {"metrics-token", "metrics", "token", OPT_TOKEN, 0, 0, 0, "TOKEN", "none",
     "Bearer token GET /metrics must present (Authorization: Bearer TOKEN; compared in constant time); "
     "/healthz stays open to probes."},
    {"metrics-token-file", "metrics", "token_file", OPT_TOKEN_FILE, 0, 0, 0, "FILE", "none",
     "Read the metrics bearer token from FILE (one trailing newline is stripped)."},
};

#define NOPTIONS (sizeof options / sizeof options[0])

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return DQ_INVALID_ARGUMENT;
}

static void set_default_listeners(dqd_config *cfg)
{
    memset(cfg->listen, 0, sizeof cfg->listen);
    cfg->listen[0].kind = DQD_LISTEN_UNIX;
    snprintf(cfg->listen[0].path, sizeof cfg->listen[0].path, "/tmp/dquantd.sock");
    cfg->listen[1].kind = DQD_LISTEN_TCP;
    snprintf(cfg->listen[1].host, sizeof cfg->listen[1].host, "127.0.0.1");
    cfg->listen[1].port = 7733;
    cfg->nlisten = 2;
}

void dqd_config_default(dqd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    set_default_listeners(cfg);
    cfg->metrics_enabled = true;
    snprintf(cfg->metrics_host, sizeof cfg->metrics_host, "127.0.0.1");
    cfg->metrics_port = 9733;
    cfg->metrics_max_connections = 16;
    cfg->metrics_timeout_ms = 2000;
    cfg->host_memory = 4 * GiB;
    cfg->backend = DQD_BACKEND_CPU;
    cfg->log_level = DQ_LOG_INFO;
    cfg->max_frame = 0;
    cfg->max_header = 1 * MiB;
    cfg->max_payload = 256 * MiB;
    cfg->max_output_queue = 64 * MiB;
    cfg->frame_cache = 512 * MiB;
    cfg->max_connections = 1024;
    cfg->max_inflight = 64;
    cfg->auth_fail_burst = 10;
    cfg->auth_fail_per_min = 60;
    cfg->handshake_timeout = 10;
    cfg->idle_timeout = 300;
    cfg->frame_timeout = 30;
    cfg->frame_min_rate = 1 * MiB;
    cfg->write_timeout = 60;
    cfg->max_batch_items = 4096;
    cfg->max_lookup_keys = 65536;
    cfg->max_lease_ms = 60000;
    cfg->max_calibration = 64 * MiB;
    cfg->max_leases = 1024;
    cfg->max_models = 256;
    cfg->max_models_per_client = 64;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cfg->workers = ncpu < 1 ? 1 : ncpu > 256 ? 256 : (uint32_t)ncpu;
    cfg->shutdown_timeout = 30;
    cfg->nccl_timeout_ms = 10000;
    cfg->gpu_threads = 2;
    cfg->io_threads = 4;
    cfg->gpu_spin_us = 200;
}

static void drop_secret(char **s, size_t *len)
{
    if (*s) {
        memset(*s, 0, *len);
        free(*s);
    }
    *s = NULL;
    *len = 0;
}

void dqd_config_free(dqd_config *cfg)
{
    free(cfg->disk_dir);
    cfg->disk_dir = NULL;
    free(cfg->tls_cert);
    free(cfg->tls_key);
    free(cfg->tls_client_ca);
    cfg->tls_cert = cfg->tls_key = cfg->tls_client_ca = NULL;
    drop_secret(&cfg->secret, &cfg->secret_len);
    drop_secret(&cfg->metrics_token, &cfg->metrics_token_len);
}

int dqd_parse_size(const char *s, uint64_t *out)
{
    if (!s)
        return DQ_INVALID_ARGUMENT;
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s))
        return DQ_INVALID_ARGUMENT;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        unsigned d = (unsigned)(*s++ - '0');
        if (v > (UINT64_MAX - d) / 10)
            return DQ_INVALID_ARGUMENT;
        v = v * 10 + d;
    }
    uint64_t mult = 1;
    switch (toupper((unsigned char)*s)) {
    case 'K':
        mult = KiB;
        s++;
        break;
    case 'M':
        mult = MiB;
        s++;
        break;
    case 'G':
        mult = GiB;
        s++;
        break;
    case 'T':
        mult = TiB;
        s++;
        break;
    default:
        break;
    }
    if (mult != 1 && (*s == 'i' || *s == 'I'))
        s++;
    if (*s == 'B' || *s == 'b')
        s++;
    while (isspace((unsigned char)*s))
        s++;
    if (*s)
        return DQ_INVALID_ARGUMENT;
    if (v > UINT64_MAX / mult)
        return DQ_INVALID_ARGUMENT;
    *out = v * mult;
    return DQ_OK;
}

static int parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    /* Plain integers only: reuse the size parser but refuse suffixes. */
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p))
            return DQ_INVALID_ARGUMENT;
    if (dqd_parse_size(s, &v) < 0 || v > UINT32_MAX)
        return DQ_INVALID_ARGUMENT;
    *out = (uint32_t)v;
    return DQ_OK;
}

bool dqd_host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&a6))
            return true;
        if (IN6_IS_ADDR_V4MAPPED(&a6))
            return a6.s6_addr[12] == 127;
    }
    return false;
}

int dqd_hostport_parse(const char *s, char host[DQD_HOST_MAX], uint16_t *port, char *err, size_t errlen)
{
    const char *colon;
    size_t hlen;
    const char *h = s;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return fail(err, errlen, "'%s': expected [IPv6]:PORT", s);
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return fail(err, errlen, "'%s': expected HOST:PORT", s);
        hlen = (size_t)(colon - s);
        if (memchr(s, ':', hlen))
            return fail(err, errlen, "'%s': write IPv6 addresses in brackets, [::1]:PORT", s);
    }
    if (hlen == 0 || hlen >= DQD_HOST_MAX)
        return fail(err, errlen, "'%s': missing or overlong host", s);
    char tmp[DQD_HOST_MAX];
    memcpy(tmp, h, hlen);
    tmp[hlen] = 0;
    if (strcmp(tmp, "localhost") == 0)
        snprintf(tmp, sizeof tmp, "127.0.0.1");
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, tmp, &a4) != 1 && inet_pton(AF_INET6, tmp, &a6) != 1)
        return fail(err, errlen, "'%s': host must be a numeric IPv4/IPv6 address or localhost", s);
    uint32_t p;
    if (parse_u32(colon + 1, &p) < 0 || p == 0 || p > 65535)
        return fail(err, errlen, "'%s': port must be 1..65535", s);
    snprintf(host, DQD_HOST_MAX, "%s", tmp);
    *port = (uint16_t)p;
    return DQ_OK;
}

int dqd_listen_parse(const char *s, dqd_listen_addr *out, char *err, size_t errlen)
{
    dqd_listen_addr a;
    memset(&a, 0, sizeof a);
    if (strncmp(s, "unix:", 5) == 0) {
        const char *path = s + 5;
        if (strncmp(path, "//", 2) == 0)
            path += 2;
        size_t n = strlen(path);
        if (n == 0 || n >= sizeof a.path)
            return fail(err, errlen, "'%s': unix socket path empty or longer than %zu bytes", s, sizeof a.path - 1);
        a.kind = DQD_LISTEN_UNIX;
        memcpy(a.path, path, n + 1);
    } else if (strncmp(s, "tcp://", 6) == 0) {
        a.kind = DQD_LISTEN_TCP;
        int rc = dqd_hostport_parse(s + 6, a.host, &a.port, err, errlen);
        if (rc < 0)
            return rc;
    } else {
        return fail(err, errlen, "'%s': expected unix:/path or tcp://host:port", s);
    }
    *out = a;
    return DQ_OK;
}

void dqd_listen_format(const dqd_listen_addr *a, char *buf, size_t len)
{
    if (a->kind == DQD_LISTEN_UNIX)
        snprintf(buf, len, "unix:%s", a->path);
    else if (strchr(a->host, ':'))
        snprintf(buf, len, "tcp://[%s]:%u", a->host, a->port);
    else
        snprintf(buf, len, "tcp://%s:%u", a->host, a->port);
}

/* Replaces *dst (the shared secret or the metrics token) with a copy of s[0..n). */
static int set_secret(char **dst, size_t *dst_len, const char *s, size_t n, char *err, size_t errlen)
{
    if (n == 0)
        return fail(err, errlen, "the secret must not be empty");
    if (n > 4096)
        return fail(err, errlen, "the secret is longer than 4096 bytes");
    char *copy = malloc(n + 1);
    if (!copy)
        return fail(err, errlen, "out of memory");
    memcpy(copy, s, n);
    copy[n] = 0;
    drop_secret(dst, dst_len);
    *dst = copy;
    *dst_len = n;
    return DQ_OK;
}

static int read_secret_file(char **dst, size_t *dst_len, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, "cannot open secret file '%s': %s", path, strerror(errno));
    char buf[4098];
    size_t n = fread(buf, 1, sizeof buf, f);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return fail(err, errlen, "cannot read secret file '%s'", path);
    if (n == sizeof buf)
        return fail(err, errlen, "secret file '%s' is longer than 4096 bytes", path);
    if (n && buf[n - 1] == '\n')
        n--;
    if (n && buf[n - 1] == '\r')
        n--;
    int rc = set_secret(dst, dst_len, buf, n, err, errlen);
    memset(buf, 0, sizeof buf);
    return rc;
}

/* Whether version v is one of the '|'-separated numbers of list ("auto|7|5|3"). */
static bool version_listed(const char *list, uint32_t v)
{
    for (const char *p = list; *p;) {
        uint32_t x = 0;
        bool digits = false;
        for (; *p >= '0' && *p <= '9'; p++, digits = true)
            x = x * 10 + (uint32_t)(*p - '0');
        if (digits && x == v && (*p == '|' || *p == 0))
            return true;
        while (*p && *p != '|')
            p++;
        if (*p == '|')
            p++;
    }
    return false;
}

static int apply(dqd_config *cfg, const dqd_option *o, const char *value, bool from_flag, char *err, size_t errlen)
{
    const char *name = o->key;
    char flagname[64];
    if (from_flag) {
        snprintf(flagname, sizeof flagname, "--%s", o->flag);
        name = flagname;
    }
    if (!value)
        return fail(err, errlen, "%s: missing value", name);

    switch (o->type) {
    case OPT_LISTEN: {
        dqd_listen_addr a;
        char why[256];
        if (dqd_listen_parse(value, &a, why, sizeof why) < 0)
            return fail(err, errlen, "%s: %s", name, why);
        bool *seen = from_flag ? &cfg->listen_from_flags : &cfg->listen_from_file;
        if (!*seen) {
            cfg->nlisten = 0;
            *seen = true;
        }
        if (cfg->nlisten >= DQD_MAX_LISTENERS)
            return fail(err, errlen, "%s: more than %d listeners", name, DQD_MAX_LISTENERS);
        cfg->listen[cfg->nlisten++] = a;
        return DQ_OK;
    }
    case OPT_METRICS: {
        if (strcasecmp(value, "off") == 0 || strcasecmp(value, "none") == 0 || strcasecmp(value, "false") == 0) {
            cfg->metrics_enabled = false;
            return DQ_OK;
        }
        char why[256];
        if (dqd_hostport_parse(value, cfg->metrics_host, &cfg->metrics_port, why, sizeof why) < 0)
            return fail(err, errlen, "%s: %s", name, why);
        cfg->metrics_enabled = true;
        return DQ_OK;
    }
    case OPT_SIZE: {
        uint64_t v;
        if (dqd_parse_size(value, &v) < 0)
            return fail(err, errlen, "%s: invalid size '%s' (expected e.g. 4096, 64K, 512M, 4G)", name, value);
        if (v < o->min || v > o->max)
            return fail(err, errlen, "%s: %s is out of range (%llu .. %llu bytes)", name, value,
                        (unsigned long long)o->min, (unsigned long long)o->max);
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_U32: {
        uint32_t v;
        if (parse_u32(value, &v) < 0)
            return fail(err, errlen, "%s: invalid number '%s'", name, value);
        if (v < o->min || v > o->max)
            return fail(err, errlen, "%s: %s is out of range (%llu .. %llu)", name, value, (unsigned long long)o->min,
                        (unsigned long long)o->max);
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_BACKEND:
        if (strcasecmp(value, "cpu") == 0)
            cfg->backend = DQD_BACKEND_CPU;
        else if (strcasecmp(value, "cuda") == 0)
            cfg->backend = DQD_BACKEND_CUDA;
        else
            return fail(err, errlen, "%s: unknown backend '%s' (cpu or cuda)", name, value);
        return DQ_OK;
    case OPT_KERNEL: {
        uint32_t v = 0;
        if (strcasecmp(value, "auto") != 0 && (parse_u32(value, &v) < 0 || v == 0 || !version_listed(o->arg, v)))
            return fail(err, errlen, "%s: unknown value '%s' (%s)", name, value, o->arg);
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_SCHEDULE: {
        uint32_t v;
        if (strcasecmp(value, "planned") == 0)
            v = DQD_ENCODE_PLANNED;
        else if (strcasecmp(value, "plain") == 0)
            v = DQD_ENCODE_PLAIN;
        else
            return fail(err, errlen, "%s: unknown value '%s' (%s)", name, value, o->arg);
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_LAYOUT: {
        uint32_t v;
        if (strcasecmp(value, "containers") == 0)
            v = DQD_GPU_LAYOUT_CONTAINERS;
        else if (strcasecmp(value, "hot") == 0)
            v = DQD_GPU_LAYOUT_HOT;
        else if (strcasecmp(value, "hot-only") == 0)
            v = DQD_GPU_LAYOUT_HOT_ONLY;
        else
            return fail(err, errlen, "%s: unknown value '%s' (%s)", name, value, o->arg);
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_MASS: {
        double v = 0;
        char *end = NULL;
        if (strcasecmp(value, "off") != 0) {
            errno = 0;
            v = strtod(value, &end);
            if (end == value || *end || errno || !(v >= 0.0 && v <= 1.0))
                return fail(err, errlen, "%s: expected off or a mass target in [0, 1], not '%s'", name, value);
        }
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_PATH: {
        size_t n = strlen(value);
        if (n == 0 || n >= 4096)
            return fail(err, errlen, "%s: the path must be 1..4095 bytes", name);
        char *copy = strdup(value);
        if (!copy)
            return fail(err, errlen, "out of memory");
        char **field = (char **)((char *)cfg + o->offset);
        free(*field);
        *field = copy;
        return DQ_OK;
    }
    case OPT_BOOL: {
        bool v;
        if (strcasecmp(value, "on") == 0 || strcasecmp(value, "true") == 0 || strcmp(value, "1") == 0)
            v = true;
        else if (strcasecmp(value, "off") == 0 || strcasecmp(value, "false") == 0 || strcmp(value, "0") == 0)
            v = false;
        else
            return fail(err, errlen, "%s: expected on or off, not '%s'", name, value);
        memcpy((char *)cfg + o->offset, &v, sizeof v);
        return DQ_OK;
    }
    case OPT_LOG_LEVEL:
        if (dqd_log_level_parse(value, &cfg->log_level) < 0)
            return fail(err, errlen, "%s: unknown level '%s' (error, warn, info or debug)", name, value);
        return DQ_OK;
    case OPT_SECRET:
    case OPT_TOKEN: {
        char why[256];
        char **dst = o->type == OPT_SECRET ? &cfg->secret : &cfg->metrics_token;
        size_t *dst_len = o->type == OPT_SECRET ? &cfg->secret_len : &cfg->metrics_token_len;
        if (set_secret(dst, dst_len, value, strlen(value), why, sizeof why) < 0)
            return fail(err, errlen, "%s: %s", name, why);
        return DQ_OK;
    }
    case OPT_SECRET_FILE:
    case OPT_TOKEN_FILE: {
        char why[512];
        char **dst = o->type == OPT_SECRET_FILE ? &cfg->secret : &cfg->metrics_token;
        size_t *dst_len = o->type == OPT_SECRET_FILE ? &cfg->secret_len : &cfg->metrics_token_len;
        if (read_secret_file(dst, dst_len, value, why, sizeof why) < 0)
            return fail(err, errlen, "%s: %s", name, why);
        return DQ_OK;
    }
    }
    return fail(err, errlen, "%s: internal error", name);
}

int dqd_config_set(dqd_config *cfg, const char *section, const char *key, const char *value, bool from_flag, char *err,
                   size_t errlen)
{
    bool any_section = !section || !*section;
    bool section_known = any_section;
    for (size_t i = 0; i < NOPTIONS; i++) {
        const dqd_option *o = &options[i];
        if (!any_section && strcmp(o->section, section) != 0)
            continue;
        section_known = true;
        if (strcmp(o->key, key) == 0)
            return apply(cfg, o, value, from_flag, err, errlen);
    }
    if (!section_known)
        return fail(err, errlen, "unknown section [%s]", section);
    return fail(err, errlen, "unknown key '%s'%s%s%s", key, any_section ? "" : " in [", any_section ? "" : section,
                any_section ? "" : "]");
}

typedef struct ini_ctx {
    dqd_config *cfg;
    char *err;
    size_t errlen;
    int failed;
} ini_ctx;

static int ini_handler_cb(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *c = user;
    if (c->failed)
        return 0;
    if (!section || !*section) {
        fail(c->err, c->errlen, "key '%s' outside of a section ([server], [store], [limits], [metrics])", name);
        c->failed = 1;
        return 0;
    }
    if (dqd_config_set(c->cfg, section, name, value, false, c->err, c->errlen) < 0) {
        c->failed = 1;
        return 0;
    }
    return 1;
}

static int ini_result(const ini_ctx *c, int rc, const char *what, const char *why, char *err, size_t errlen)
{
    if (rc == 0 && !c->failed)
        return DQ_OK;
    if (rc == -1)
        return fail(err, errlen, "cannot open config file '%s': %s", what, strerror(errno ? errno : ENOENT));
    if (rc == -2)
        return fail(err, errlen, "%s: out of memory", what);
    return fail(err, errlen, "%s:%d: %s", what, rc, c->failed ? why : "syntax error");
}

int dqd_config_load_file(dqd_config *cfg, const char *path, char *err, size_t errlen)
{
    char why[512] = "";
    ini_ctx c = {cfg, why, sizeof why, 0};
    errno = 0;
    int rc = ini_parse(path, ini_handler_cb, &c);
    return ini_result(&c, rc, path, why, err, errlen);
}

int dqd_config_load_string(dqd_config *cfg, const char *ini, char *err, size_t errlen)
{
    char why[512] = "";
    ini_ctx c = {cfg, why, sizeof why, 0};
    int rc = ini_parse_string(ini, ini_handler_cb, &c);
    return ini_result(&c, rc, "<config>", why, err, errlen);
}

static bool listen_equal(const dqd_listen_addr *a, const dqd_listen_addr *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == DQD_LISTEN_UNIX)
        return strcmp(a->path, b->path) == 0;
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

int dqd_config_finish(dqd_config *cfg, char *err, size_t errlen)
{
    uint64_t derived = 32 + cfg->max_header + cfg->max_payload;
    if (cfg->max_frame == 0)
        cfg->max_frame = derived;
    if (cfg->max_frame < 32 + 64)
        return fail(err, errlen, "max_frame (%llu) is too small", (unsigned long long)cfg->max_frame);
    if (cfg->max_header > UINT32_MAX)
        return fail(err, errlen, "max_header must be below 4G");
    if (cfg->max_header + 32 > cfg->max_frame)
        return fail(err, errlen, "max_header (%llu) does not fit in max_frame (%llu)",
                    (unsigned long long)cfg->max_header, (unsigned long long)cfg->max_frame);
    if (cfg->max_io_memory == 0)
        cfg->max_io_memory = cfg->max_frame > 512 * MiB ? 2 * cfg->max_frame : 1 * GiB;
    if (cfg->max_io_memory < cfg->max_frame)
        return fail(err, errlen, "max_io_memory (%llu) must hold at least one max_frame (%llu)",
                    (unsigned long long)cfg->max_io_memory, (unsigned long long)cfg->max_frame);
    if (cfg->nlisten == 0)
        return fail(err, errlen, "no listener configured");
    if ((cfg->tls_key || cfg->tls_client_ca) && !cfg->tls_cert)
        return fail(err, errlen, "tls_key and tls_client_ca need tls_cert");
    for (uint32_t i = 0; i < cfg->nlisten; i++) {
        const dqd_listen_addr *a = &cfg->listen[i];
        char name[160];
        dqd_listen_format(a, name, sizeof name);
        for (uint32_t j = 0; j < i; j++)
            if (listen_equal(a, &cfg->listen[j]))
                return fail(err, errlen, "listener %s is given twice", name);
        if (a->kind == DQD_LISTEN_TCP && !dqd_host_is_loopback(a->host) && !cfg->secret && !cfg->tls_client_ca)
            return fail(err, errlen,
                        "refusing to listen on %s: a non-loopback TCP listener needs a shared secret "
                        "(secret/secret_file in [server], or --secret/--secret-file) or client certificates "
                        "(--tls-client-ca)",
                        name);
        if (a->kind == DQD_LISTEN_TCP && !dqd_host_is_loopback(a->host) && !cfg->tls_cert && !cfg->allow_plaintext)
            return fail(err, errlen,
                        "refusing plaintext TCP on %s: give a certificate (--tls-cert/--tls-key) or allow it "
                        "explicitly (--allow-plaintext)",
                        name);
    }
    return DQ_OK;
}

static const dqd_option *find_flag(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strlen(options[i].flag) == len && strncmp(options[i].flag, name, len) == 0)
            return &options[i];
    return NULL;
}

/* Splits "--name=value" / "--name value" ("--name" alone for an on|off option: on). Returns the
 * number of argv entries used. */
static int split_flag(int argc, char *const argv[], int i, const char **name, size_t *name_len, const char **value)
{
    const char *a = argv[i] + 2;
    const char *eq = strchr(a, '=');
    *name = a;
    if (eq) {
        *name_len = (size_t)(eq - a);
        *value = eq + 1;
        return 1;
    }
    *name_len = strlen(a);
    const dqd_option *o = find_flag(a, *name_len);
    if (o && o->type == OPT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
        *value = "on";
        return 1;
    }
    *value = i + 1 < argc ? argv[i + 1] : NULL;
    return 2;
}

int dqd_config_from_args(dqd_config *cfg, int argc, char *const argv[], dqd_cli_action *action, char *err,
                         size_t errlen)
{
    dqd_config_default(cfg);
    *action = DQD_CLI_RUN;
    const char *config_path = NULL;

    /* First pass: --help, --version, --config and unknown flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = DQD_CLI_HELP;
            return DQ_OK;
        }
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            *action = DQD_CLI_VERSION;
            return DQ_OK;
        }
    }
    for (int i = 1; i < argc;) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == 0)
            return fail(err, errlen, "unexpected argument '%s' (see --help)", a);
        const char *name, *value;
        size_t nlen;
        int used = split_flag(argc, argv, i, &name, &nlen, &value);
        bool is_config = nlen == 6 && strncmp(name, "config", 6) == 0;
        if (!is_config && !find_flag(name, nlen))
            return fail(err, errlen, "unknown option '--%.*s' (see --help)", (int)nlen, name);
        if (!value)
            return fail(err, errlen, "option '--%.*s' needs a value", (int)nlen, name);
        if (is_config)
            config_path = value;
        i += used;
    }

    if (config_path) {
        int rc = dqd_config_load_file(cfg, config_path, err, errlen);
        if (rc < 0)
            return rc;
    }
    for (int i = 1; i < argc;) {
        const char *name, *value;
        size_t nlen;
        int used = split_flag(argc, argv, i, &name, &nlen, &value);
        const dqd_option *o = find_flag(name, nlen);
        if (o) {
            int rc = apply(cfg, o, value, true, err, errlen);
            if (rc < 0)
                return rc;
        }
        i += used;
    }
    return dqd_config_finish(cfg, err, errlen);
}

static void print_wrapped(FILE *out, const char *text, int indent, int width)
{
    int col = indent;
    fprintf(out, "%*s", indent, "");
    const char *p = text;
    while (*p) {
        const char *sp = p;
        while (*sp && *sp != ' ')
            sp++;
        int wlen = (int)(sp - p);
        if (col > indent && col + 1 + wlen > width) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', out);
            col++;
        }
        fwrite(p, 1, (size_t)wlen, out);
        col += wlen;
        p = *sp ? sp + 1 : sp;
    }
    fputc('\n', out);
}

void dqd_config_print_help(FILE *out)
{
    fprintf(out, "NAME\n"
                 "       dquantd - KV-cache compression daemon for disaggregated LLM serving\n"
                 "\n"
                 "SYNOPSIS\n"
                 "       dquantd [--config FILE] [OPTION]...\n"
                 "\n"
                 "DESCRIPTION\n");
    print_wrapped(out,
                  "dquantd holds the keys and values (KV cache) of LLM inference in D-Quant compressed "
                  "form. Prefill engines PUT K/V per layer; decode workers GET decompressed blocks or ask "
                  "for the decode-attention result (ATTEND) computed on the compressed containers. It "
                  "speaks the framed protobuf protocol of proto/dquant.proto over Unix and TCP sockets and "
                  "serves Prometheus metrics over HTTP.",
                  7, 100);
    fprintf(out, "\nOPTIONS\n");
    fprintf(out, "       --config FILE\n");
    print_wrapped(out,
                  "Read settings from the INI file FILE first; flags given on the command line override "
                  "it. Sections [server], [store], [limits], [metrics]; see deploy/dquantd.ini.",
                  14, 100);
    for (size_t i = 0; i < NOPTIONS; i++) {
        const dqd_option *o = &options[i];
        fprintf(out, "\n       --%s %s\n", o->flag, o->arg);
        print_wrapped(out, o->help, 14, 100);
        fprintf(out, "%14sDefault: %s. INI: [%s] %s.\n", "", o->def, o->section, o->key);
    }
    fprintf(out, "\n       --help, -h\n              Show this help and exit.\n"
                 "\n       --version, -V\n              Print the version and exit.\n"
                 "\nSIZES\n"
                 "       SIZE is a byte count with an optional binary suffix: 65536, 64K, 512M, 4G, 1T\n"
                 "       (K/M/G/T are powers of 1024; KiB/MB-style spellings are accepted).\n"
                 "\nSIGNALS\n"
                 "       SIGTERM, SIGINT: stop accepting connections, finish the requests in progress, send their\n"
                 "       replies and exit with status 0.\n"
                 "\nENVIRONMENT\n"
                 "       NOTIFY_SOCKET  when set (systemd Type=notify), READY=1 is sent once the listeners are up.\n"
                 "\nEXIT STATUS\n"
                 "       0 on a clean shutdown, 1 when start-up fails (a listener cannot be opened), 2 for a bad\n"
                 "       command line or configuration.\n"
                 "\nEXAMPLES\n"
                 "       dquantd --listen unix:/run/dquantd.sock --host-memory 16G\n"
                 "       dquantd --config /etc/dquantd.ini --log-level debug\n"
                 "       dquantd --listen tcp://0.0.0.0:7733 --secret-file /etc/dquantd.secret \\\n"
                 "               --tls-cert /etc/dquantd/server.pem --tls-key /etc/dquantd/server.key\n"
                 "       dquantd --listen tcp://0.0.0.0:7733 --tls-cert server.pem --tls-key server.key \\\n"
                 "               --tls-client-ca engines-ca.pem\n");
}

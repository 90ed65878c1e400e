/* dquantd configuration: defaults, the INI file (libinih) and command-line flags.
 *
 * Every setting has one INI key and one flag, described by a single table in config.c that also
 * drives --help. Flags override the file; the file overrides the defaults. The first `listen`
 * (in the file, or on the command line) replaces the default listeners, later ones add to them. */
#ifndef DQD_CONFIG_H
#define DQD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dquant/log.h"

#define DQD_MAX_LISTENERS 16
#define DQD_HOST_MAX 64
#define DQD_UNIX_PATH_MAX 108

typedef enum dqd_listen_kind { DQD_LISTEN_UNIX = 0, DQD_LISTEN_TCP = 1 } dqd_listen_kind;

typedef struct dqd_listen_addr {
    dqd_listen_kind kind;
    char path[DQD_UNIX_PATH_MAX]; /* unix: socket path */
    char host[DQD_HOST_MAX];      /* tcp: numeric IPv4 / IPv6 address ("localhost" is 127.0.0.1) */
    uint16_t port;
} dqd_listen_addr;

typedef enum dqd_backend { DQD_BACKEND_CPU = 0, DQD_BACKEND_CUDA = 1 } dqd_backend;

/* encode_schedule values (dquant/cuda.h DQCU_SCHEDULE_PLANNED / _PLAIN) */
#define DQD_ENCODE_PLANNED 0u
#define DQD_ENCODE_PLAIN 1u

/* gpu_attention_layout values: what the cuda backend's GPU tier attends over (gpulayer.h) */
#define DQD_GPU_LAYOUT_CONTAINERS 0u /* the window records (dqcu_attend) */
#define DQD_GPU_LAYOUT_HOT 1u        /* hot copies beside them (dqcu_attend_hot, dquant/hot.h) */
#define DQD_GPU_LAYOUT_HOT_ONLY 2u   /* hot windows instead of them (records rebuilt: dq_hot_rebuild) */

typedef struct dqd_config {
    dqd_listen_addr listen[DQD_MAX_LISTENERS];
    uint32_t nlisten;
    bool metrics_enabled;
    char metrics_host[DQD_HOST_MAX];
    uint16_t metrics_port;
    uint32_t metrics_max_connections; /* metrics endpoint (http.c): connections at once */
    uint32_t metrics_timeout_ms;      /* and how long one may stay open */
    char *metrics_token;              /* NULL: /metrics needs no Authorization; /healthz never does */
    size_t metrics_token_len;
    uint64_t host_memory;   /* store budget, bytes */
    uint64_t gpu_memory;    /* GPU tier budget (cuda backend), bytes; 0: 80% of the free memory */
    uint32_t gpu_device;    /* CUDA device ordinal (cuda backend) */
    uint32_t gpu_threads;   /* threads for short GPU tasks (lane.h); 0: the workers run them */
    uint32_t io_threads;    /* threads that read large frames' payloads (conn.c); 0: the loop */
    uint32_t gpu_spin_us;   /* how long a GPU thread polls for the next task before sleeping */
    uint32_t attend_kernel; /* cuda backend's kernel versions (dqcu_settings): 0 = auto */
    uint32_t encode_kernel;
    uint32_t encode_schedule;      /* DQD_ENCODE_PLANNED or DQD_ENCODE_PLAIN */
    uint32_t gpu_attention_layout; /* DQD_GPU_LAYOUT_CONTAINERS, _HOT or _HOT_ONLY */
    double attention_value_mass;   /* host-path ATTEND's value mass target (dquant/vskip.h); 0: off */
    dqd_backend backend;
    dq_log_level log_level;
    char *secret; /* NULL: none; when set, every TCP listener requires it */
    size_t secret_len;
    uint32_t auth_fail_burst;   /* failed HELLOs a peer address may make at once (authlimit.h) */
    uint32_t auth_fail_per_min; /* and then per minute */
    uint64_t max_frame;         /* 0 until dqd_config_finish: 32 + max_header + max_payload */
    uint64_t max_header;
    uint64_t max_payload;
    uint64_t max_output_queue; /* reply bytes queued per connection before reading pauses */
    uint64_t max_io_memory;    /* bytes all connections may hold (iomem.h); 0 until dqd_config_finish */
    uint64_t frame_cache;      /* bytes of freed large frame buffers kept for the next frames */
    uint32_t max_connections;
    uint32_t max_inflight; /* requests per connection before reading pauses */
    /* connection deadlines (conn.c), seconds: HELLO after accept; no request, reply or byte in
     * flight (0: never); a frame once started (plus its bytes / frame_min_rate); replies queued
     * without a byte going out */
    uint32_t handshake_timeout, idle_timeout, frame_timeout, write_timeout;
    uint64_t frame_min_rate;  /* bytes per second a large frame is given on top of frame_timeout */
    uint32_t max_batch_items; /* ATTEND items */
    uint32_t max_lookup_keys; /* chunk keys of one LOOKUP / PUT_CHUNKS */
    uint32_t max_lease_ms;    /* longest LOOKUP lease */
    uint64_t max_calibration; /* REGISTER_MODEL's KVQ calibration bytes */
    uint32_t max_leases;      /* live LOOKUP leases per connection */
    uint32_t max_models;
    uint32_t max_models_per_client; /* 0: no per-client limit */
    uint32_t workers;
    uint32_t shutdown_timeout; /* seconds to finish in-flight work on SIGTERM */
    uint32_t nccl_timeout_ms;  /* NCCL communicator setup / transfer deadline (plus 1 s per GB) */
    char *disk_dir;            /* the disk tier's directory (malloc'd); NULL: no disk tier */
    uint64_t disk_capacity;    /* bytes of records at most; 0: 80% of the free space at start */
    bool disk_sync;            /* fsync records and the directory (power-loss safe) */
    char *tls_cert;            /* TLS on every TCP listener: certificate chain file (malloc'd); NULL: plaintext */
    char *tls_key;             /* its key file; NULL: in tls_cert */
    char *tls_client_ca;       /* mutual TLS: CA file client certificates must chain to; NULL: none */
    bool allow_plaintext;      /* plaintext TCP on a non-loopback address is allowed */

    /* bookkeeping for "first listen replaces the defaults" */
    bool listen_from_file, listen_from_flags;
} dqd_config;

typedef enum dqd_cli_action { DQD_CLI_RUN = 0, DQD_CLI_HELP = 1, DQD_CLI_VERSION = 2 } dqd_cli_action;

void dqd_config_default(dqd_config *cfg);
/* Frees the secret, the disk directory and the metrics token; the struct may be reused after
 * dqd_config_default. */
void dqd_config_free(dqd_config *cfg);

/* Sets one key as if read from section [section] of the INI file (section may be NULL or "":
 * then the key is looked up in every section). from_flag selects the listen replacement rule. */
int dqd_config_set(dqd_config *cfg, const char *section, const char *key, const char *value, bool from_flag, char *err,
                   size_t errlen);
/* Reads an INI file / string. Unknown sections or keys and bad values are errors. */
int dqd_config_load_file(dqd_config *cfg, const char *path, char *err, size_t errlen);
int dqd_config_load_string(dqd_config *cfg, const char *ini, char *err, size_t errlen);

/* Derives max_frame when unset and checks the whole configuration: coherent limits, a secret for
 * every non-loopback TCP listener, no duplicate listeners. */
int dqd_config_finish(dqd_config *cfg, char *err, size_t errlen);

/* The whole command line: defaults, then --config FILE, then every other flag, then finish.
 * --help / --version set *action and return 0 without reading anything else.
 * Returns 0 or DQ_INVALID_ARGUMENT with a message in err (one line, no program name). */
int dqd_config_from_args(dqd_config *cfg, int argc, char *const argv[], dqd_cli_action *action, char *err,
                         size_t errlen);

void dqd_config_print_help(FILE *out);

/* "4G", "512M", "64KiB", "1024" (bytes; K/M/G/T are powers of 1024, "B"/"iB" optional). */
int dqd_parse_size(const char *s, uint64_t *out);
/* "unix:/path" or "tcp://host:port" ("tcp://[::1]:7733"). */
int dqd_listen_parse(const char *s, dqd_listen_addr *out, char *err, size_t errlen);
/* "host:port" ("[::1]:9733"); "localhost" becomes 127.0.0.1. */
int dqd_hostport_parse(const char *s, char host[DQD_HOST_MAX], uint16_t *port, char *err, size_t errlen);
bool dqd_host_is_loopback(const char *host);
/* Writes "unix:/path" or "tcp://host:port". */
void dqd_listen_format(const dqd_listen_addr *a, char *buf, size_t len);

#endif

/* dquantd metrics: counters and latency histograms, rendered as Prometheus text (GET /metrics)
 * and as the STATS reply. Updated and read on the loop thread only. */
#ifndef DQD_METRICS_H
#define DQD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "dquant.pb-c.h"
#include "opcode.h"
#include "lease.h"
#include "store.h"

#define DQD_LAT_BUCKETS 16
#define DQD_ERR_SLOTS 64 /* -code; the last slot counts codes outside the table */

typedef struct dqd_histogram {
    uint64_t buckets[DQD_LAT_BUCKETS]; /* cumulative at render time, per-bucket here */
    uint64_t count;
    double sum;
} dqd_histogram;

typedef struct dqd_metrics {
    uint64_t requests[DQD_OP_COUNT];
    uint64_t errors[DQD_OP_COUNT];
    uint64_t errors_by_code[DQD_ERR_SLOTS];
    dqd_histogram latency[DQD_OP_COUNT];
    uint64_t bytes_in, bytes_out, frames_in, frames_out;
    uint64_t conns_accepted, conns_rejected, conns_open;
    uint64_t protocol_closes, auth_failures, backpressure_pauses;
    uint64_t auth_throttled; /* HELLOs refused unchecked: their address failed too often (authlimit.h) */
    /* metrics endpoint (http.c): connections closed to make room or for their time, /metrics
     * requests without the bearer token */
    uint64_t http_evicted, http_timeouts, http_unauthorized;
    /* connections closed by a deadline (conn.c): no HELLO in time, a frame too slow, queued replies
     * not read, idle */
    uint64_t handshake_timeouts, frame_timeouts, write_timeouts, idle_timeouts;
    uint64_t frame_reads_offloaded; /* large frames' payload reads handed to an I/O thread (conn.c) */
    uint64_t tokens_put, streams_encoded, encode_retries, rollbacks;
    uint64_t nccl_setups, nccl_failures, nccl_bytes_in, nccl_bytes_out;
    uint64_t tokens_get, attend_items, attend_appends, compress_tokens, decompress_tokens;
    /* sealed value streams of host-path ATTEND items decoded and left out by value skipping
     * (attention_value_mass; dquant/vskip.h) */
    uint64_t attend_values_decoded, attend_values_skipped;
    /* shared KV tier: LOOKUP keys asked (hit or missed, in tokens), PUT_CHUNKS chunks encoded or
     * found held already */
    uint64_t lookups, lookup_hit_tokens, lookup_missed_tokens, chunks_put, chunk_dedupe_hits;
    /* compressed transfer: PUT_RAW and PUT_CHUNKS_RAW requests, the record and tail bytes they
     * stored, and those refused because a record broke the container's invariants (DQ_CORRUPT) */
    uint64_t put_raw_requests, put_raw_bytes, put_raw_corrupt;
    const dqd_leases *leases; /* leases_active, lease_expiries_total */
} dqd_metrics;

/* Everything else a report shows, gathered by the server at render time. */
typedef struct dqd_gauges {
    dqd_store_stats store;
    uint64_t gpu_allocated;                  /* device bytes of GPU layers allocated right now (cuda backend) */
    uint64_t gpu_hot_windows, gpu_hot_bytes; /* hot window copies held, their device bytes (gpulayer.h) */
    uint64_t gpu_hot_attend_items;           /* ATTEND items run over hot windows, total */
    uint64_t gpu_hot_only_windows;           /* of those, windows held without their record (hot-only) */
    uint64_t gpu_records_rebuilt;            /* window records rebuilt from hot windows, total */
    uint64_t gpu_records_rebuilt_gpu;        /* of those, on the device (dqcu_rebuild_hot) */
    uint64_t gpu_records_rebuilt_cpu; /* of those, on the CPU (dq_hot_rebuild: refused or failed on the device) */
    uint64_t gpu_windows_encoded;     /* windows sealed on the device (dqcu_encode_windows), total */
    uint64_t gpu_host_attend_items;   /* ATTEND items of GPU layers computed on the host, total */
    uint64_t models;
    uint64_t inflight_requests;
    uint64_t frame_cache_bytes; /* freed frame buffers kept (framebuf.h) */
    uint64_t frame_buffers_reused, frame_buffers_fresh;
    /* client I/O memory (iomem.h): bytes held now, the budget, the most held, connections that
     * waited for room, reply buffers refused */
    uint64_t io_used, io_limit, io_peak, io_waits, io_refused;
    uint64_t workers;
    double uptime_seconds;
    const char *backend;
    const char *version;
} dqd_gauges;

void dqd_metrics_init(dqd_metrics *m);
/* One finished request: its kind, its result (0 or a dq_error) and its latency. */
void dqd_metrics_observe(dqd_metrics *m, dqd_op op, int err, double seconds);
/* A failure outside a request (framing, auth): counted by error name only. */
void dqd_metrics_count_error(dqd_metrics *m, int err);

/* Prometheus text exposition format 0.0.4. *out is malloc'd. Returns 0 or DQ_NOMEM. */
int dqd_metrics_render(const dqd_metrics *m, const dqd_gauges *g, char **out, size_t *len);
/* Fills a StatsReply (counters and gauges maps); free with dqd_metrics_stats_free. */
int dqd_metrics_stats(const dqd_metrics *m, const dqd_gauges *g, Dquant__StatsReply *out);
void dqd_metrics_stats_free(Dquant__StatsReply *out);

#endif

/* dquantd metrics (see metrics.h). */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "logging.h"

static const double bucket_le[DQD_LAT_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
};

void dqd_metrics_init(dqd_metrics *m)
{
    memset(m, 0, sizeof *m);
}

static size_t err_slot(int err)
{
    int idx = -err;
    return idx > 0 && idx < DQD_ERR_SLOTS - 1 ? (size_t)idx : DQD_ERR_SLOTS - 1;
}

void dqd_metrics_count_error(dqd_metrics *m, int err)
{
    if (err < 0)
        m->errors_by_code[err_slot(err)]++;
}

void dqd_metrics_observe(dqd_metrics *m, dqd_op op, int err, double seconds)
{
    if ((unsigned)op >= DQD_OP_COUNT)
        op = DQD_OP_UNKNOWN;
    m->requests[op]++;
    if (op == DQD_OP_PUT_RAW || op == DQD_OP_PUT_CHUNKS_RAW) {
        m->put_raw_requests++;
        m->put_raw_corrupt += err == DQ_CORRUPT;
    }
    if (err < 0) {
        m->errors[op]++;
        dqd_metrics_count_error(m, err);
    }
    dqd_histogram *h = &m->latency[op];
    h->count++;
    h->sum += seconds;
    for (size_t i = 0; i < DQD_LAT_BUCKETS; i++) {
        if (seconds <= bucket_le[i]) {
            h->buckets[i]++;
            break;
        }
    }
}

/* A growable text buffer; a failed allocation sticks and is reported at the end. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static const char *code_name(size_t slot)
{
    return slot == DQD_ERR_SLOTS - 1 ? "UNKNOWN" : dq_err_name(-(int)slot);
}

static double hit_rate(const dqd_metrics *m)
{
    const uint64_t all = m->lookup_hit_tokens + m->lookup_missed_tokens;
    return all ? (double)m->lookup_hit_tokens / (double)all : 0.0;
}

static void counter(sbuf *b, const char *name, const char *help, uint64_t v)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void gauge(sbuf *b, const char *name, const char *help, double v)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

int dqd_metrics_render(const dqd_metrics *m, const dqd_gauges *g, char **out, size_t *len)
{
    sbuf b = {malloc(16384), 0, 16384, 0};
    if (!b.p)
        return DQ_NOMEM;
    b.p[0] = 0;

    sb_printf(&b,
              "# HELP dquant_build_info Version and backend of this dquantd.\n# TYPE dquant_build_info gauge\n"
              "dquant_build_info{version=\"%s\",backend=\"%s\"} 1\n",
              g->version, g->backend);
    sb_printf(&b,
              "# HELP dquant_requests_total Requests finished, by operation.\n# TYPE dquant_requests_total counter\n");
    for (int op = 0; op < DQD_OP_COUNT; op++)
        sb_printf(&b, "dquant_requests_total{op=\"%s\"} %llu\n", dqd_op_name((dqd_op)op),
                  (unsigned long long)m->requests[op]);
    sb_printf(&b, "# HELP dquant_request_errors_total Requests answered with an error, by operation.\n"
                  "# TYPE dquant_request_errors_total counter\n");
    for (int op = 0; op < DQD_OP_COUNT; op++)
        sb_printf(&b, "dquant_request_errors_total{op=\"%s\"} %llu\n", dqd_op_name((dqd_op)op),
                  (unsigned long long)m->errors[op]);
    sb_printf(&b, "# HELP dquant_errors_total Errors by code name (requests, framing and authentication).\n"
                  "# TYPE dquant_errors_total counter\n");
    for (size_t i = 1; i < DQD_ERR_SLOTS; i++)
        if (m->errors_by_code[i] || (i <= (size_t)-DQ_INTERNAL))
            sb_printf(&b, "dquant_errors_total{code=\"%s\"} %llu\n", code_name(i),
                      (unsigned long long)m->errors_by_code[i]);
    sb_printf(&b, "# HELP dquant_request_duration_seconds Request latency from the whole frame's arrival to "
                  "its reply, by operation.\n# TYPE dquant_request_duration_seconds histogram\n");
    for (int op = 0; op < DQD_OP_COUNT; op++) {
        const dqd_histogram *h = &m->latency[op];
        uint64_t cum = 0;
        const char *name = dqd_op_name((dqd_op)op);
        for (size_t i = 0; i < DQD_LAT_BUCKETS; i++) {
            cum += h->buckets[i];
            sb_printf(&b, "dquant_request_duration_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n", name, bucket_le[i],
                      (unsigned long long)cum);
        }
        sb_printf(&b, "dquant_request_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n", name,
                  (unsigned long long)h->count);
        sb_printf(&b, "dquant_request_duration_seconds_sum{op=\"%s\"} %.9f\n", name, h->sum);
        sb_printf(&b, "dquant_request_duration_seconds_count{op=\"%s\"} %llu\n", name, (unsigned long long)h->count);
    }
    counter(&b, "dquant_received_bytes_total", "Bytes of request frames received.", m->bytes_in);
    counter(&b, "dquant_sent_bytes_total", "Bytes of reply frames sent.", m->bytes_out);
    counter(&b, "dquant_connections_total", "Client connections accepted.", m->conns_accepted);
    counter(&b, "dquant_connections_rejected_total", "Client connections refused (max_connections, shutdown).",
            m->conns_rejected);
    gauge(&b, "dquant_connections", "Client connections open.", (double)m->conns_open);
    counter(&b, "dquant_protocol_closes_total", "Connections closed for unparseable framing.", m->protocol_closes);
    counter(&b, "dquant_auth_failures_total", "HELLOs refused for a wrong or missing secret.", m->auth_failures);
    counter(&b, "dquant_auth_throttled_total", "HELLOs refused unchecked: their address failed too often.",
            m->auth_throttled);
    counter(&b, "dquant_backpressure_pauses_total", "Times reading from a client paused for its queue.",
            m->backpressure_pauses);
    counter(&b, "dquant_handshake_timeouts_total", "Connections closed without a successful HELLO in time.",
            m->handshake_timeouts);
    counter(&b, "dquant_frame_timeouts_total", "Connections closed for a frame that did not arrive in time.",
            m->frame_timeouts);
    counter(&b, "dquant_write_timeouts_total", "Connections closed for not reading their queued replies.",
            m->write_timeouts);
    counter(&b, "dquant_idle_timeouts_total", "Idle connections closed.", m->idle_timeouts);
    counter(&b, "dquant_log_lines_suppressed_total", "Log lines a client caused that were left out (rate limit).",
            dqd_log_suppressed_total());
    counter(&b, "dquant_metrics_connections_evicted_total",
            "Metrics connections closed before their request to make room for a new one.", m->http_evicted);
    counter(&b, "dquant_metrics_connections_timed_out_total", "Metrics connections closed at metrics_timeout_ms.",
            m->http_timeouts);
    counter(&b, "dquant_metrics_unauthorized_total", "GET /metrics refused for a missing or wrong bearer token.",
            m->http_unauthorized);
    counter(&b, "dquant_frame_reads_offloaded_total",
            "Times an I/O thread took over reading the rest of a large frame from its socket.",
            m->frame_reads_offloaded);
    counter(&b, "dquant_tokens_put_total", "Token-layers appended by PUT and ATTEND.", m->tokens_put);
    counter(&b, "dquant_streams_encoded_total", "K/V streams encoded into containers.", m->streams_encoded);
    counter(&b, "dquant_encode_retries_total", "Streams whose first rANS pass overflowed.", m->encode_retries);
    counter(&b, "dquant_rollbacks_total", "Layers rolled back after a failed multi-layer write.", m->rollbacks);
    counter(&b, "dquant_nccl_setups_total", "NCCL communicators set up with clients.", m->nccl_setups);
    counter(&b, "dquant_nccl_failures_total", "NCCL transfers that failed (communicator aborted).", m->nccl_failures);
    counter(&b, "dquant_nccl_received_bytes_total", "Bytes received from clients over NCCL.", m->nccl_bytes_in);
    counter(&b, "dquant_nccl_sent_bytes_total", "Bytes sent to clients over NCCL.", m->nccl_bytes_out);
    counter(&b, "dquant_tokens_get_total", "Token-layers returned by GET.", m->tokens_get);
    counter(&b, "dquant_attend_items_total", "ATTEND items computed.", m->attend_items);
    counter(&b, "dquant_attend_value_streams_decoded_total",
            "Sealed value streams of host-path ATTEND items decoded with attention_value_mass on.",
            m->attend_values_decoded);
    counter(&b, "dquant_attend_value_streams_skipped_total",
            "Sealed value streams of host-path ATTEND items left out by attention_value_mass.",
            m->attend_values_skipped);
    counter(&b, "dquant_compress_tokens_total", "Tokens compressed by COMPRESS.", m->compress_tokens);
    counter(&b, "dquant_decompress_tokens_total", "Tokens decompressed by DECOMPRESS.", m->decompress_tokens);
    counter(&b, "dquant_lookups_total", "LOOKUP requests answered.", m->lookups);
    counter(&b, "dquant_lookup_hit_tokens_total", "Tokens of LOOKUP keys held (leading hits).", m->lookup_hit_tokens);
    counter(&b, "dquant_lookup_missed_tokens_total", "Tokens of LOOKUP keys after the first miss.",
            m->lookup_missed_tokens);
    gauge(&b, "dquant_lookup_hit_rate", "lookup_hit_tokens / (hit + missed tokens) since start.", hit_rate(m));
    counter(&b, "dquant_chunks_put_total", "Chunks encoded by PUT_CHUNKS.", m->chunks_put);
    counter(&b, "dquant_chunk_dedupe_hits_total", "Chunks of PUT_CHUNKS already held (not encoded again).",
            m->chunk_dedupe_hits);
    counter(&b, "dquant_put_raw_requests_total", "PUT_RAW and PUT_CHUNKS_RAW requests.", m->put_raw_requests);
    counter(&b, "dquant_put_raw_bytes_total", "Record and tail bytes stored by PUT_RAW and PUT_CHUNKS_RAW.",
            m->put_raw_bytes);
    counter(&b, "dquant_put_raw_corrupt_total", "PUT_RAW / PUT_CHUNKS_RAW requests refused as DQ_CORRUPT.",
            m->put_raw_corrupt);
    counter(&b, "dquant_lease_expiries_total", "LOOKUP leases that ran out.", m->leases ? m->leases->expiries : 0);
    gauge(&b, "dquant_leases_active", "LOOKUP leases live.", m->leases ? (double)m->leases->active : 0.0);
    gauge(&b, "dquant_chunks_stored", "Chunks of the shared KV tier stored.", (double)g->store.chunks);
    counter(&b, "dquant_evictions_total", "Sequences evicted to stay within the host-memory budget.",
            g->store.evictions);
    counter(&b, "dquant_evicted_bytes_total", "Bytes freed by eviction.", g->store.evicted_bytes);
    gauge(&b, "dquant_sequences", "Sequences stored.", (double)g->store.sequences);
    gauge(&b, "dquant_sequences_pinned", "Sequences pinned (never evicted).", (double)g->store.pinned);
    gauge(&b, "dquant_tokens_stored", "Tokens stored, summed over layers.", (double)g->store.token_layers);
    gauge(&b, "dquant_stored_bytes", "Bytes of K/V stored (window records + BF16 tails).",
          (double)g->store.stored_bytes);
    gauge(&b, "dquant_bf16_equivalent_bytes", "The same tokens' K and V as BF16.", (double)g->store.bf16_bytes);
    gauge(&b, "dquant_compression_ratio", "BF16-equivalent bytes / stored bytes.",
          g->store.stored_bytes ? (double)g->store.bf16_bytes / (double)g->store.stored_bytes : 0.0);
    gauge(&b, "dquant_host_memory_used_bytes", "Host memory allocated by the store and codecs.", (double)g->store.used);
    gauge(&b, "dquant_host_memory_budget_bytes", "Host-memory budget.", (double)g->store.budget);
    gauge(&b, "dquant_host_memory_reserved_bytes", "Budget reserved by writes in progress.", (double)g->store.reserved);
    counter(&b, "dquant_gpu_demotions_total", "Sequences moved from GPU memory to host memory to make room.",
            g->store.gpu_demotions);
    counter(&b, "dquant_gpu_promotions_total", "Layers moved from host memory back to GPU memory.",
            g->store.gpu_promotions);
    counter(&b, "dquant_gpu_spills_total", "Layers moved to host memory by a write the GPU had no room for.",
            g->store.gpu_spills);
    counter(&b, "dquant_gpu_drops_total", "GPU sequences evicted outright (no host room); also in evictions.",
            g->store.gpu_drops);
    gauge(&b, "dquant_gpu_memory_used_bytes", "GPU memory held by GPU-resident layers (cuda backend).",
          (double)g->store.gpu_used);
    gauge(&b, "dquant_gpu_memory_allocated_bytes",
          "GPU memory allocated for layers right now, in-flight work included.", (double)g->gpu_allocated);
    gauge(&b, "dquant_gpu_hot_windows",
          "Sealed windows with a hot copy on the GPU (--gpu-attention-layout hot; cuda backend).",
          (double)g->gpu_hot_windows);
    gauge(&b, "dquant_gpu_hot_bytes",
          "GPU memory of hot window copies and their pointer arrays (part of the allocated bytes).",
          (double)g->gpu_hot_bytes);
    counter(&b, "dquant_gpu_hot_attend_items_total",
            "ATTEND items computed over hot windows (dqcu_attend_hot); the rest of the GPU ones read the records.",
            g->gpu_hot_attend_items);
    gauge(&b, "dquant_gpu_hot_only_windows",
          "Sealed windows the GPU holds only as hot windows, without their record (--gpu-attention-layout "
          "hot-only); part of dquant_gpu_hot_windows.",
          (double)g->gpu_hot_only_windows);
    counter(&b, "dquant_gpu_records_rebuilt_total",
            "Window records rebuilt from hot-only windows (GET, GET_RAW, moves off the GPU).", g->gpu_records_rebuilt);
    counter(&b, "dquant_gpu_records_rebuilt_gpu_total",
            "Window records rebuilt from hot-only windows on the GPU (dqcu_rebuild_hot).", g->gpu_records_rebuilt_gpu);
    counter(&b, "dquant_gpu_records_rebuilt_cpu_total",
            "Window records rebuilt from hot-only windows on the CPU, where the GPU rebuild was refused (the "
            "fixed-width family) or failed.",
            g->gpu_records_rebuilt_cpu);
    counter(&b, "dquant_gpu_windows_encoded_total",
            "Windows sealed on the GPU by its encoder (dqcu_encode_windows), D-Quant and fixed-width profiles.",
            g->gpu_windows_encoded);
    counter(&b, "dquant_gpu_host_attend_items_total",
            "ATTEND items of GPU-tier sequences computed on the host over a copy of the records: the "
            "fixed-width family, and version-2 profiles beyond the container attention (more than 8 levels), "
            "where no hot windows serve them.",
            g->gpu_host_attend_items);
    gauge(&b, "dquant_gpu_memory_budget_bytes", "GPU-memory budget (0 on the cpu backend).",
          (double)g->store.gpu_budget);
    gauge(&b, "dquant_gpu_memory_reserved_bytes", "GPU budget reserved by writes in progress.",
          (double)g->store.gpu_reserved);
    gauge(&b, "dquant_gpu_sequences", "Sequences holding layers in GPU memory.", (double)g->store.gpu_sequences);
    gauge(&b, "dquant_disk_records", "Records in the disk tier (sequences and chunks).", (double)g->store.disk_records);
    gauge(&b, "dquant_disk_used_bytes", "Bytes of the disk tier's records.", (double)g->store.disk_bytes);
    gauge(&b, "dquant_disk_capacity_bytes", "Capacity of the disk tier (0: none).", (double)g->store.disk_capacity);
    gauge(&b, "dquant_disk_stubs", "Sequences and chunks held on disk only.", (double)g->store.disk_stubs);
    counter(&b, "dquant_disk_spills_total", "Records written to disk (host eviction, shutdown).", g->store.disk_spills);
    counter(&b, "dquant_disk_spill_bytes_total", "Bytes of records written to disk.", g->store.disk_spill_bytes);
    counter(&b, "dquant_disk_clean_evictions_total", "Host evictions of sequences whose record was current (no write).",
            g->store.disk_clean_evictions);
    counter(&b, "dquant_disk_spill_failures_total",
            "Records that could not be written (ENOSPC, EFBIG, I/O errors); the sequence was dropped.",
            g->store.disk_spill_failures);
    counter(&b, "dquant_disk_full_drops_total", "Evictions dropped because the disk tier could not make room.",
            g->store.disk_full_drops);
    counter(&b, "dquant_disk_loads_total", "Records read back into host memory.", g->store.disk_loads);
    counter(&b, "dquant_disk_load_bytes_total", "Bytes of records read back.", g->store.disk_load_bytes);
    counter(&b, "dquant_disk_corrupt_total", "Records that failed a checksum (read back or at start): dropped.",
            g->store.disk_corrupt);
    counter(&b, "dquant_disk_load_failures_total",
            "Records that could not be read back otherwise (I/O error, no host room): dropped.",
            g->store.disk_load_failures);
    counter(&b, "dquant_disk_evictions_total", "Records removed to stay within the disk capacity.",
            g->store.disk_evictions);
    counter(&b, "dquant_disk_recovered_total", "Records found on disk at start.", g->store.disk_recovered);
    gauge(&b, "dquant_models", "Registered models.", (double)g->models);
    gauge(&b, "dquant_inflight_requests", "Requests in progress.", (double)g->inflight_requests);
    gauge(&b, "dquant_frame_cache_bytes", "Freed large frame buffers kept for the next frames.",
          (double)g->frame_cache_bytes);
    counter(&b, "dquant_frame_buffers_reused_total", "Large frames read into a kept buffer.", g->frame_buffers_reused);
    counter(&b, "dquant_frame_buffers_fresh_total", "Large frames that needed a new buffer.", g->frame_buffers_fresh);
    gauge(&b, "dquant_io_memory_used_bytes",
          "Bytes client connections hold: frames received or waiting, reply buffers, queued replies.",
          (double)g->io_used);
    gauge(&b, "dquant_io_memory_budget_bytes", "Client I/O memory budget (max_io_memory).", (double)g->io_limit);
    gauge(&b, "dquant_io_memory_peak_bytes", "Most bytes client connections held at once.", (double)g->io_peak);
    counter(&b, "dquant_io_memory_waits_total", "Times a connection stopped reading until I/O memory was free.",
            g->io_waits);
    counter(&b, "dquant_io_memory_refused_total",
            "Reply buffers refused (RESOURCE_EXHAUSTED) because client I/O memory was full.", g->io_refused);
    gauge(&b, "dquant_workers", "Worker threads.", (double)g->workers);
    gauge(&b, "dquant_uptime_seconds", "Seconds since start.", g->uptime_seconds);

    if (b.failed) {
        free(b.p);
        return DQ_NOMEM;
    }
    *out = b.p;
    *len = b.len;
    return DQ_OK;
}

/* ---- STATS reply ---- */

typedef struct kv_builder {
    Dquant__StatsReply *r;
    size_t cap_c, cap_g;
    int failed;
} kv_builder;

/* A new entry of size bytes and a copy of name for it, when there is room for one more (n of cap)
 * and memory for both; else NULL, and the builder has failed. */
static void *new_entry(kv_builder *kb, size_t n, size_t cap, size_t size, const char *name, char **key)
{
    if (kb->failed || n == cap) {
        kb->failed = 1;
        return NULL;
    }
    void *e = malloc(size);
    *key = strdup(name);
    if (!e || !*key) {
        free(e);
        free(*key);
        kb->failed = 1;
        return NULL;
    }
    return e;
}

static void add_counter(kv_builder *kb, const char *name, uint64_t v)
{
    Dquant__StatsReply *r = kb->r;
    char *key;
    Dquant__StatsReply__CountersEntry *e = new_entry(kb, r->n_counters, kb->cap_c, sizeof *e, name, &key);
    if (!e)
        return;
    dquant__stats_reply__counters_entry__init(e);
    e->key = key;
    e->value = v;
    r->counters[r->n_counters++] = e;
}

static void add_gauge(kv_builder *kb, const char *name, double v)
{
    Dquant__StatsReply *r = kb->r;
    char *key;
    Dquant__StatsReply__GaugesEntry *e = new_entry(kb, r->n_gauges, kb->cap_g, sizeof *e, name, &key);
    if (!e)
        return;
    dquant__stats_reply__gauges_entry__init(e);
    e->key = key;
    e->value = v;
    r->gauges[r->n_gauges++] = e;
}

int dqd_metrics_stats(const dqd_metrics *m, const dqd_gauges *g, Dquant__StatsReply *out)
{
    dquant__stats_reply__init(out);
    kv_builder kb = {out, 3 * DQD_OP_COUNT + DQD_ERR_SLOTS + 80, DQD_OP_COUNT + 56, 0};
    out->counters = calloc(kb.cap_c, sizeof *out->counters);
    out->gauges = calloc(kb.cap_g, sizeof *out->gauges);
    if (!out->counters || !out->gauges) {
        dqd_metrics_stats_free(out);
        return DQ_NOMEM;
    }
    char name[96];
    for (int op = 1; op < DQD_OP_COUNT; op++) {
        snprintf(name, sizeof name, "requests.%s", dqd_op_name((dqd_op)op));
        add_counter(&kb, name, m->requests[op]);
        snprintf(name, sizeof name, "errors.%s", dqd_op_name((dqd_op)op));
        add_counter(&kb, name, m->errors[op]);
    }
    add_counter(&kb, "requests.unknown", m->requests[DQD_OP_UNKNOWN]);
    for (size_t i = 1; i < DQD_ERR_SLOTS; i++) {
        if (!m->errors_by_code[i])
            continue;
        snprintf(name, sizeof name, "errors.%s", code_name(i));
        add_counter(&kb, name, m->errors_by_code[i]);
    }
    add_counter(&kb, "bytes_in", m->bytes_in);
    add_counter(&kb, "bytes_out", m->bytes_out);
    add_counter(&kb, "frames_in", m->frames_in);
    add_counter(&kb, "frames_out", m->frames_out);
    add_counter(&kb, "connections_total", m->conns_accepted);
    add_counter(&kb, "connections_rejected", m->conns_rejected);
    add_counter(&kb, "protocol_closes", m->protocol_closes);
    add_counter(&kb, "auth_failures", m->auth_failures);
    add_counter(&kb, "auth_throttled", m->auth_throttled);
    add_counter(&kb, "metrics_connections_evicted", m->http_evicted);
    add_counter(&kb, "metrics_connections_timed_out", m->http_timeouts);
    add_counter(&kb, "metrics_unauthorized", m->http_unauthorized);
    add_counter(&kb, "backpressure_pauses", m->backpressure_pauses);
    add_counter(&kb, "handshake_timeouts", m->handshake_timeouts);
    add_counter(&kb, "frame_timeouts", m->frame_timeouts);
    add_counter(&kb, "write_timeouts", m->write_timeouts);
    add_counter(&kb, "idle_timeouts", m->idle_timeouts);
    add_counter(&kb, "log_lines_suppressed", dqd_log_suppressed_total());
    add_counter(&kb, "frame_reads_offloaded", m->frame_reads_offloaded);
    add_counter(&kb, "tokens_put", m->tokens_put);
    add_counter(&kb, "streams_encoded", m->streams_encoded);
    add_counter(&kb, "encode_retries", m->encode_retries);
    add_counter(&kb, "rollbacks", m->rollbacks);
    add_counter(&kb, "nccl_setups", m->nccl_setups);
    add_counter(&kb, "nccl_failures", m->nccl_failures);
    add_counter(&kb, "nccl_bytes_in", m->nccl_bytes_in);
    add_counter(&kb, "nccl_bytes_out", m->nccl_bytes_out);
    add_counter(&kb, "tokens_get", m->tokens_get);
    add_counter(&kb, "attend_items", m->attend_items);
    add_counter(&kb, "attend_value_streams_decoded", m->attend_values_decoded);
    add_counter(&kb, "attend_value_streams_skipped", m->attend_values_skipped);
    add_counter(&kb, "attend_appends", m->attend_appends);
    add_counter(&kb, "compress_tokens", m->compress_tokens);
    add_counter(&kb, "decompress_tokens", m->decompress_tokens);
    add_counter(&kb, "lookups", m->lookups);
    add_counter(&kb, "lookup_hit_tokens", m->lookup_hit_tokens);
    add_counter(&kb, "lookup_missed_tokens", m->lookup_missed_tokens);
    add_counter(&kb, "chunks_put", m->chunks_put);
    add_counter(&kb, "chunk_dedupe_hits", m->chunk_dedupe_hits);
    add_counter(&kb, "put_raw_requests", m->put_raw_requests);
    add_counter(&kb, "put_raw_bytes", m->put_raw_bytes);
    add_counter(&kb, "put_raw_corrupt", m->put_raw_corrupt);
    add_gauge(&kb, "lookup_hit_rate", hit_rate(m));
    add_gauge(&kb, "chunks_stored", (double)g->store.chunks);
    add_counter(&kb, "lease_expiries", m->leases ? m->leases->expiries : 0);
    add_gauge(&kb, "leases_active", m->leases ? (double)m->leases->active : 0.0);
    add_counter(&kb, "evictions", g->store.evictions);
    add_counter(&kb, "evicted_bytes", g->store.evicted_bytes);
    add_counter(&kb, "gpu_demotions", g->store.gpu_demotions);
    add_counter(&kb, "gpu_promotions", g->store.gpu_promotions);
    add_counter(&kb, "gpu_drops", g->store.gpu_drops);
    add_counter(&kb, "gpu_spills", g->store.gpu_spills);
    add_counter(&kb, "disk_spills", g->store.disk_spills);
    add_counter(&kb, "disk_spill_bytes", g->store.disk_spill_bytes);
    add_counter(&kb, "disk_clean_evictions", g->store.disk_clean_evictions);
    add_counter(&kb, "disk_spill_failures", g->store.disk_spill_failures);
    add_counter(&kb, "disk_full_drops", g->store.disk_full_drops);
    add_counter(&kb, "disk_loads", g->store.disk_loads);
    add_counter(&kb, "disk_load_bytes", g->store.disk_load_bytes);
    add_counter(&kb, "disk_corrupt", g->store.disk_corrupt);
    add_counter(&kb, "disk_load_failures", g->store.disk_load_failures);
    add_counter(&kb, "disk_evictions", g->store.disk_evictions);
    add_counter(&kb, "disk_recovered", g->store.disk_recovered);
    add_counter(&kb, "frame_buffers_reused", g->frame_buffers_reused);
    add_counter(&kb, "frame_buffers_fresh", g->frame_buffers_fresh);
    add_counter(&kb, "io_memory_waits", g->io_waits);
    add_counter(&kb, "io_memory_refused", g->io_refused);

    add_gauge(&kb, "sequences", (double)g->store.sequences);
    add_gauge(&kb, "sequences_pinned", (double)g->store.pinned);
    add_gauge(&kb, "tokens_stored", (double)g->store.token_layers);
    add_gauge(&kb, "stored_bytes", (double)g->store.stored_bytes);
    add_gauge(&kb, "bf16_equivalent_bytes", (double)g->store.bf16_bytes);
    add_gauge(&kb, "compression_ratio",
              g->store.stored_bytes ? (double)g->store.bf16_bytes / (double)g->store.stored_bytes : 0.0);
    add_gauge(&kb, "host_memory_used", (double)g->store.used);
    add_gauge(&kb, "host_memory_budget", (double)g->store.budget);
    add_gauge(&kb, "host_memory_reserved", (double)g->store.reserved);
    add_gauge(&kb, "gpu_memory_used", (double)g->store.gpu_used);
    add_gauge(&kb, "gpu_memory_allocated", (double)g->gpu_allocated);
    add_gauge(&kb, "gpu_hot_windows", (double)g->gpu_hot_windows);
    add_gauge(&kb, "gpu_hot_bytes", (double)g->gpu_hot_bytes);
    add_counter(&kb, "gpu_hot_attend_items", g->gpu_hot_attend_items);
    add_gauge(&kb, "gpu_hot_only_windows", (double)g->gpu_hot_only_windows);
    add_counter(&kb, "gpu_records_rebuilt", g->gpu_records_rebuilt);
    add_counter(&kb, "gpu_records_rebuilt_gpu", g->gpu_records_rebuilt_gpu);
    add_counter(&kb, "gpu_records_rebuilt_cpu", g->gpu_records_rebuilt_cpu);
    add_counter(&kb, "gpu_windows_encoded", g->gpu_windows_encoded);
    add_counter(&kb, "gpu_host_attend_items", g->gpu_host_attend_items);
    add_gauge(&kb, "gpu_budget", (double)g->store.gpu_budget);
    add_gauge(&kb, "gpu_memory_reserved", (double)g->store.gpu_reserved);
    add_gauge(&kb, "gpu_sequences", (double)g->store.gpu_sequences);
    add_gauge(&kb, "disk_records", (double)g->store.disk_records);
    add_gauge(&kb, "disk_bytes", (double)g->store.disk_bytes);
    add_gauge(&kb, "disk_capacity", (double)g->store.disk_capacity);
    add_gauge(&kb, "disk_stubs", (double)g->store.disk_stubs);
    add_gauge(&kb, "connections_open", (double)m->conns_open);
    add_gauge(&kb, "models", (double)g->models);
    add_gauge(&kb, "inflight_requests", (double)g->inflight_requests);
    add_gauge(&kb, "frame_cache_bytes", (double)g->frame_cache_bytes);
    add_gauge(&kb, "io_memory_used", (double)g->io_used);
    add_gauge(&kb, "io_memory_budget", (double)g->io_limit);
    add_gauge(&kb, "io_memory_peak", (double)g->io_peak);
    add_gauge(&kb, "workers", (double)g->workers);
    add_gauge(&kb, "uptime_seconds", g->uptime_seconds);
    for (int op = 1; op < DQD_OP_COUNT; op++) {
        const dqd_histogram *h = &m->latency[op];
        snprintf(name, sizeof name, "latency_mean_seconds.%s", dqd_op_name((dqd_op)op));
        add_gauge(&kb, name, h->count ? h->sum / (double)h->count : 0.0);
    }
    if (kb.failed) {
        dqd_metrics_stats_free(out);
        return DQ_NOMEM;
    }
    return DQ_OK;
}

void dqd_metrics_stats_free(Dquant__StatsReply *out)
{
    for (size_t i = 0; i < out->n_counters; i++) {
        free(out->counters[i]->key);
        free(out->counters[i]);
    }
    for (size_t i = 0; i < out->n_gauges; i++) {
        free(out->gauges[i]->key);
        free(out->gauges[i]);
    }
    free(out->counters);
    free(out->gauges);
    out->counters = NULL;
    out->gauges = NULL;
    out->n_counters = out->n_gauges = 0;
}

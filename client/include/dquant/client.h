/* libdquant-client — blocking C client for dquantd.
 *
 * One handle (dqc_client) is one connection to one daemon. Every call sends one request and waits
 * for its reply. Many daemons as one: dqc_cluster ("multi-node" below). Calls return 0 (DQ_OK) or a negative dq_error code (dquant/error.h): either the
 * code the server sent in its Error reply, or a local one (DQ_CONNECTION, DQ_TIMEOUT, DQ_IO,
 * DQ_PROTOCOL, DQ_INVALID_ARGUMENT, DQ_NOMEM, DQ_TOO_LARGE, ...). After a failure,
 * dqc_last_error() describes it in words.
 *
 * Addresses: "unix:/path/to/socket" (or just "/path/to/socket"; "unix:@name" for the Linux
 * abstract namespace) and "tcp://host:port" ("tcp://[::1]:7733" for IPv6). The daemon's defaults
 * are DQC_DEFAULT_UNIX ("unix:/tmp/dquantd.sock", the CLI's default) and DQC_DEFAULT_TCP.
 *
 * Reconnection: when the connection breaks (peer closed, reset) and opts.auto_reconnect is on, the
 * handle reconnects and repeats the HELLO. A call that had already been sent is repeated on the
 * new connection only if it is idempotent: register_model, get, get_raw, attend without appends,
 * compress, decompress, delete, pin, unpin, stats, ping. A PUT or an ATTEND with appends that
 * breaks in flight returns DQ_CONNECTION (it may or may not have been applied); the next call
 * reconnects first. A connection known to be closed is always re-established before sending
 * anything, so even PUT never fails just because an idle connection went stale. A reconnect makes
 * opts.reconnect_attempts attempts, the delay between them starting at opts.reconnect_backoff_ms
 * and doubling; when all of them fail, the call fails. The next call tries a whole reconnect again;
 * when that fails too, the doubling goes on across calls: until the next delay has passed (at most
 * 30 s), calls fail at once with DQ_CONNECTION (or the DQ_UNAUTHENTICATED / DQ_VERSION that ended
 * the last reconnect) instead of trying again, so that a handle used in a loop against a daemon that
 * has gone away neither spins nor blocks for long. A successful reconnect ends this;
 * dqc_reconnect() always tries at once. Timeouts
 * (DQ_TIMEOUT) are not retried; they close the connection, since a late reply could otherwise be
 * taken for the answer to the next request.
 *
 * Memory and ownership: pointers passed in are borrowed for the duration of the call unless stated
 * otherwise. Replies with tensors whose size the caller cannot know in advance (GET, GET_RAW,
 * COMPRESS, DECOMPRESS, STATS) are returned in *result structs* whose memory the library
 * allocates and the caller releases with the matching *_free function. A result struct must be
 * zero-initialized before its first use (= {0}); passing it again to a call of the same kind
 * replaces its contents (GET, GET_RAW, COMPRESS and DECOMPRESS results also reuse their memory:
 * no allocation when the new reply fits).
 * On failure a result struct is left empty (still safe to free). Tensor pointers inside a result
 * point into one block read straight from the socket: they are byte pointers, not necessarily
 * aligned to the element size (dquantd aligns them; copy with memcpy if unsure). ATTEND writes
 * into caller buffers, whose size is fully determined by the request.
 *
 * Thread-safety: a handle is used by one thread at a time (calls on one handle must be serialized
 * by the caller); distinct handles are fully independent and may be used concurrently from
 * different threads. The library keeps no global state, never prints, never reads the environment
 * and never raises SIGPIPE (sends use MSG_NOSIGNAL).
 *
 * Linking: pkg-config libdquant-client. It needs no CUDA and no NCCL; the GPU-to-GPU data path is
 * the separate libdquant-client-nccl (dquant/client_nccl.h). */
#ifndef DQUANT_CLIENT_H
#define DQUANT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/error.h"
#include "dquant/types.h"

#if defined(DQC_BUILDING_CLIENT) && defined(__GNUC__)
#define DQC_API __attribute__((visibility("default")))
#else
#define DQC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DQC_DEFAULT_UNIX "unix:/tmp/dquantd.sock"
#define DQC_DEFAULT_TCP "tcp://127.0.0.1:7733"
#define DQC_DEFAULT_ADDR DQC_DEFAULT_UNIX

/* Largest serialized profile the client accepts from a server (dq_profile_serialize writes at most
 * DQ_PROFILE_SERIALIZED_MAX = 512 bytes). */
#define DQC_PROFILE_MAX 1024

typedef struct dqc_client dqc_client;

/* ---- options and connection ---- */

typedef struct dqc_options {
    uint32_t size;           /* sizeof(dqc_options); set by dqc_options_default */
    int connect_timeout_ms;  /* per connection attempt; default 5000; <= 0: no limit */
    int io_timeout_ms;       /* longest wait without progress while sending or receiving
                                one request; default 60000; <= 0: no limit */
    const char *client_name; /* sent in HELLO; copied by dqc_connect; NULL: "libdquant-client" */
    const void *secret;      /* shared secret sent in HELLO; copied by dqc_connect; may be NULL */
    size_t secret_len;
    int auto_reconnect;            /* default 1; 0: a broken handle fails with DQ_CONNECTION until
                                      dqc_reconnect() */
    uint32_t reconnect_attempts;   /* connection attempts per reconnect; default 5 */
    uint32_t reconnect_backoff_ms; /* delay before the 2nd attempt, doubling after, and on across
                                      failed reconnects (at most 30 s); default 20 */
    uint32_t max_reply_header;     /* largest protobuf reply header accepted; default 64 MiB */
    uint64_t max_reply_payload;    /* largest reply payload accepted; default 64 GiB */
    /* TLS, for "tls://host:port" addresses only (OpenSSL; TLS 1.2 or later). The server's
     * certificate is always verified, against tls_ca and the address's host (or tls_server_name);
     * a failed verification, or a server that refuses the client's certificate, fails the connect
     * with DQ_UNAUTHENTICATED. The paths are copied by dqc_connect and read at connect time. */
    const char *tls_ca;          /* PEM file of the CA(s) trusted for the server; NULL: the system's store */
    const char *tls_cert;        /* client certificate chain (PEM) for mutual TLS; NULL: none */
    const char *tls_key;         /* its private key (PEM); NULL: in tls_cert */
    const char *tls_server_name; /* name (or IP address) the server's certificate must carry, also
                                    sent as SNI; NULL: the address's host */
} dqc_options;

/* Fills *opts with the defaults above. */
DQC_API void dqc_options_default(dqc_options *opts);

/* Connects to addr ("unix:/path", "tcp://host:port", or "tls://host:port" for TLS, see the tls_
 * options above), sends HELLO (version 1) and waits for the reply. opts may be NULL (defaults);
 * it and everything it points to are copied. On success *out is a new handle owned by the caller
 * (release with dqc_free). On failure *out is NULL and the code is returned; the message of a
 * failed connect is available only through errbuf (may be NULL; errbuf_len bytes, NUL-terminated).
 * Returns 0, DQ_INVALID_ARGUMENT (bad address), DQ_CONNECTION (refused, no such socket),
 * DQ_TIMEOUT, DQ_UNAUTHENTICATED (bad or missing secret), DQ_VERSION, DQ_PROTOCOL, DQ_NOMEM. */
DQC_API int dqc_connect(const char *addr, const dqc_options *opts, dqc_client **out);
DQC_API int dqc_connect_ex(const char *addr, const dqc_options *opts, dqc_client **out, char *errbuf,
                           size_t errbuf_len);

/* Closes the connection and frees the handle and everything it owns. NULL is allowed. Result
 * structs filled by the handle stay valid (they own their memory). */
DQC_API void dqc_free(dqc_client *client);

/* Closes the current connection (if any) and connects again, with HELLO. */
DQC_API int dqc_reconnect(dqc_client *client);

/* A message describing the last failure on this handle ("" if none). Owned by the handle; valid
 * until the next call on it. */
DQC_API const char *dqc_last_error(const dqc_client *client);

/* Number of times the handle has reconnected since dqc_connect (explicitly or automatically). */
DQC_API uint64_t dqc_reconnect_count(const dqc_client *client);

/* Static text and name of an error code (the same tables as libdquant's dq_strerror /
 * dq_err_name, without linking libdquant). */
DQC_API const char *dqc_strerror(int err);
DQC_API const char *dqc_err_name(int err);

/* The client library's version, "MAJOR.MINOR.PATCH". */
DQC_API const char *dqc_version(void);

/* What the server said in its HELLO reply (refreshed on every reconnect). */
#define DQC_INFO_STR 64
#define DQC_INFO_LIST 16
typedef struct dqc_server_info {
    uint32_t version; /* wire protocol version chosen (1) */
    char server_version[DQC_INFO_STR];
    char backend[DQC_INFO_STR]; /* "cpu", "cuda" */
    uint64_t max_frame_bytes;   /* 0: not stated */
    uint64_t max_payload_bytes; /* 0: not stated */
    uint32_t max_batch_items;   /* 0: not stated */
    size_t nprofiles;           /* built-in profiles (at most DQC_INFO_LIST kept) */
    char profiles[DQC_INFO_LIST][DQC_INFO_STR];
    size_t nfeatures;
    char features[DQC_INFO_LIST][DQC_INFO_STR];
} dqc_server_info;

/* Copies the server's HELLO reply into *out. Returns 0 or DQ_INVALID_ARGUMENT. */
DQC_API int dqc_server(const dqc_client *client, dqc_server_info *out);

/* ---- addressing ---- */

/* A sequence: an opaque key within a namespace. ns may be NULL or "" (the default namespace);
 * key points to key_len bytes (key_len may be 0). Both borrowed for the call. */
typedef struct dqc_seq {
    const char *ns;
    const void *key;
    size_t key_len;
} dqc_seq;

/* ---- REGISTER_MODEL ---- */

typedef struct dqc_model_spec {
    const char *name; /* required, non-empty */
    uint32_t layers, q_heads, kv_heads, head_dim;
    const char *profile_name; /* a built-in profile ("dq226", "dq196"), or NULL when profile is set */
    const void *profile;      /* a serialized dq_profile; wins over profile_name; may be NULL */
    size_t profile_len;
} dqc_model_spec;

typedef struct dqc_model_info {
    int existed; /* an identical model was already registered */
    double bits_per_value;
    size_t profile_len;
    uint8_t profile[DQC_PROFILE_MAX]; /* serialized profile the server uses */
} dqc_model_info;

/* Registers a model (idempotent for an identical spec; a different spec under the same name is
 * DQ_EXISTS). info may be NULL. */
DQC_API int dqc_register_model(dqc_client *client, const dqc_model_spec *spec, dqc_model_info *info);
/* The same with the model's chunk size for the shared KV tier (see "chunks" below): chunk_tokens 0
 * means 256; else it must be a multiple of the profile's window W (DQ_INVALID_ARGUMENT). The
 * size the server uses goes to *chunk_tokens_out (may be NULL). A separate function rather than a
 * new field of dqc_model_spec, so that the structs' layout (and bindings that mirror it) stays. */
DQC_API int dqc_register_model_ex(dqc_client *client, const dqc_model_spec *spec, uint32_t chunk_tokens,
                                  dqc_model_info *info, uint32_t *chunk_tokens_out);
/* The same with the model's KVQuant++ calibration (dquant/kvq.h): the bytes dq_kvq_calibrate wrote
 * (calibration_len of them, borrowed for the call; NULL / 0: none), sent in the frame's payload. A
 * profile with a calibration hash needs them (DQ_PROFILE without), every other profile takes none
 * (DQ_PROFILE); the daemon checks them against the profile (DQ_CORRUPT, DQ_TRUNCATED, DQ_PROFILE),
 * their layer count against layers (DQ_SHAPE) and their size against its max_calibration_bytes
 * (DQ_TOO_LARGE). The model then encodes, decodes and attends each layer L with calibration layer
 * L; registering again is "existed" only with the same bytes (else DQ_EXISTS). */
DQC_API int dqc_register_model_calibrated(dqc_client *client, const dqc_model_spec *spec, uint32_t chunk_tokens,
                                          const void *calibration, size_t calibration_len, dqc_model_info *info,
                                          uint32_t *chunk_tokens_out);

/* Removes a registered model (name: borrowed), freeing its name and its place in the registry.
 * DQ_BUSY while a sequence or chunk of the model exists (delete them first: nothing is deleted by
 * this call) or a request of any client is using it; DQ_NOT_FOUND for an unknown name. Any client
 * may unregister any model. The daemon counts each model against the client_name that registered
 * it (its max_models_per_client, DQ_RESOURCE_EXHAUSTED beyond). Not retried after a break in
 * flight (a repeat would answer DQ_NOT_FOUND). */
DQC_API int dqc_unregister_model(dqc_client *client, const char *name);

/* ---- PUT ---- */

/* Appends tokens [start_token, start_token + tokens) to layers [first_layer, first_layer +
 * num_layers) of a sequence (created by its first PUT). k and v are [num_layers, tokens, kv_heads,
 * head_dim] of dtype (f32, f16, bf16), contiguous, borrowed; kv_heads and head_dim must match the
 * model. start_token must equal each layer's current length (DQ_ORDER otherwise). All-or-nothing. */
typedef struct dqc_put_args {
    dqc_seq seq;
    const char *model;
    uint64_t start_token;
    uint32_t first_layer, num_layers;
    uint64_t tokens;
    uint32_t kv_heads, head_dim;
    dq_dtype dtype;
    const void *k, *v;
} dqc_put_args;

typedef struct dqc_put_result {
    uint64_t tokens;       /* length of the first written layer after the PUT */
    uint64_t stored_bytes; /* bytes the sequence now holds */
    uint64_t streams_encoded;
    uint64_t retries;
} dqc_put_result;

/* res may be NULL. Not retried after a break in flight (see the top of this file). */
DQC_API int dqc_put(dqc_client *client, const dqc_put_args *args, dqc_put_result *res);

/* ---- GET (decompressed) ---- */

typedef struct dqc_get_args {
    dqc_seq seq;
    uint32_t first_layer;
    uint32_t num_layers; /* 0: every layer from first_layer */
    uint64_t start_token;
    uint64_t tokens; /* 0: up to the end */
    dq_dtype dtype;  /* of the returned tensors */
} dqc_get_args;

typedef struct dqc_get_result {
    uint64_t start_token, tokens;
    uint32_t num_layers, kv_heads, head_dim;
    dq_dtype dtype;
    const void *k, *v; /* [num_layers, tokens, kv_heads, head_dim] of dtype; owned by the result */
    size_t bytes;      /* of k, and of v */
    void *mem_;        /* private */
    size_t mem_cap_;   /* private */
} dqc_get_result;

/* res: zero-initialized or previously filled (its memory is reused). */
DQC_API int dqc_get(dqc_client *client, const dqc_get_args *args, dqc_get_result *res);
/* Frees what res owns and zeroes it. NULL is allowed. */
DQC_API void dqc_get_result_free(dqc_get_result *res);

/* ---- GET_RAW: containers as stored ---- */

typedef struct dqc_raw_layer {
    uint32_t layer;
    uint64_t tokens; /* tokens held: windows · W + tail_tokens */
    uint64_t windows;
    const uint8_t *records; /* windows window records back to back (see dquant/codec.h) */
    size_t records_bytes;
    uint64_t tail_tokens;
    const void *tail_k, *tail_v; /* BF16 [tail_tokens, kv_heads, head_dim] (little endian) */
    size_t tail_bytes;           /* of tail_k, and of tail_v */
} dqc_raw_layer;

typedef struct dqc_raw_result {
    size_t profile_len;
    uint8_t profile[DQC_PROFILE_MAX]; /* serialized dq_profile (dq_profile_deserialize) */
    size_t nlayers;
    dqc_raw_layer *layers; /* owned by the result */
    void *mem_;            /* private */
    size_t mem_cap_;       /* private */
    size_t layers_cap_;    /* private */
} dqc_raw_result;

/* Whole layers [first_layer, first_layer + num_layers) (num_layers 0: to the last layer). */
DQC_API int dqc_get_raw(dqc_client *client, const dqc_seq *seq, uint32_t first_layer, uint32_t num_layers,
                        dqc_raw_result *res);
DQC_API void dqc_raw_result_free(dqc_raw_result *res);

/* ---- PUT_RAW: containers the client encoded itself ---- */

/* PUT_RAW: layers appended from containers the client encoded itself (libdquant in-process, or
 * libdquant-cuda), in GET_RAW's layout; the daemon stores them as they are (no re-encoding) and
 * this library only forwards the bytes (it does not need libdquant). Everything is borrowed for
 * the call. layers[i] is layer first_layer + i (its .layer and .tokens are ignored): `windows`
 * whole window records in records (records_bytes must be windows · dq_codec_window_bytes), then
 * tail_tokens < W BF16 tail tokens in tail_k / tail_v (tail_bytes = tail_tokens · kv_heads ·
 * head_dim · 2; NULL when 0). Every layer must hold the same windows · W + tail_tokens tokens.
 * start_token must equal each layer's current length, be a multiple of W, and the layer must hold
 * no tail. profile / profile_len: the serialized profile the records were made with (GET_RAW's
 * dqc_raw_result.profile, or dq_profile_serialize); it must equal the model's. All-or-nothing.
 * Errors: DQ_INVALID_ARGUMENT ("records of another profile", a bad field), DQ_SHAPE (records_bytes
 * not windows whole records, tail_tokens >= W, token counts differ), DQ_CORRUPT (a record fails
 * the container's decode invariants; the message names layer and window), DQ_NONFINITE (a tail
 * value is NaN/Inf), DQ_ORDER, DQ_NOT_FOUND (model), DQ_OUT_OF_BOUNDS (layers),
 * DQ_RESOURCE_EXHAUSTED, and the call errors. A failed call stores nothing. res may be NULL
 * (res->streams_encoded is 0). Not retried after a break in flight. */
typedef struct dqc_put_raw_args {
    dqc_seq seq;
    const char *model;
    uint64_t start_token; /* each layer's current length; a multiple of the profile's W */
    uint32_t first_layer;
    const dqc_raw_layer *layers; /* nlayers consecutive layers from first_layer: windows whole window
                                    records (records_bytes = windows · window record size), then
                                    tail_tokens < W BF16 tail tokens (tail_k/tail_v) */
    size_t nlayers;
    const uint8_t *profile; /* the serialized profile the records were made with (GET_RAW's); must equal the model's */
    size_t profile_len;
} dqc_put_raw_args;
DQC_API int dqc_put_raw(dqc_client *client, const dqc_put_raw_args *args, dqc_put_result *res);

/* ---- ATTEND ---- */

typedef struct dqc_attend_item {
    dqc_seq seq;
    uint32_t layer;
    const void *q;        /* [q_heads, head_dim] of args.dtype; borrowed */
    const void *append_k; /* NULL, or [1, kv_heads, head_dim] of args.dtype appended first */
    const void *append_v; /* NULL exactly when append_k is NULL */
} dqc_attend_item;

typedef struct dqc_attend_args {
    const dqc_attend_item *items;
    size_t nitems;                        /* 1 .. the server's max_batch_items */
    uint32_t q_heads, kv_heads, head_dim; /* kv_heads is needed only with appends */
    dq_dtype dtype;                       /* of q and the appended K/V */
    float scale;                          /* 0: 1/sqrt(head_dim) */
} dqc_attend_args;

/* Writes out [nitems, q_heads, head_dim] and, when lse is not NULL, lse [nitems, q_heads] (both
 * f32, caller-owned, sized by the caller). Retried after a break only when no item appends. */
DQC_API int dqc_attend(dqc_client *client, const dqc_attend_args *args, float *out, float *lse);

/* ---- COMPRESS / DECOMPRESS: stateless codec calls ---- */

typedef struct dqc_compress_args {
    const char *model;           /* a registered model's profile, or NULL and: */
    const char *profile_name;    /* a built-in profile instantiated for kv_heads × head_dim */
    uint32_t kv_heads, head_dim; /* the shape of x; always required */
    int kind;                    /* 0 keys, 1 values */
    dq_dtype dtype;
    const void *x; /* [tokens, kv_heads, head_dim] of dtype; borrowed */
    uint64_t tokens;
} dqc_compress_args;

typedef struct dqc_compress_result {
    size_t profile_len;
    uint8_t profile[DQC_PROFILE_MAX];
    uint64_t tokens;
    const uint8_t *means; /* keys: one mean block per W tokens; NULL for values and codecs without */
    size_t means_bytes;
    const uint8_t *records; /* tokens · record_bytes */
    size_t records_bytes;
    double bits_per_value;
    uint64_t retries;
    void *mem_;      /* private */
    size_t mem_cap_; /* private */
} dqc_compress_result;

DQC_API int dqc_compress(dqc_client *client, const dqc_compress_args *args, dqc_compress_result *res);
/* The same with the codec view of model layer `layer` (a per-layer calibrated KVQ model encodes with
 * that layer's codebooks; layer < the model's layers, else DQ_OUT_OF_BOUNDS). dqc_compress is
 * layer 0. A separate function, like dqc_register_model_ex, so that the args' layout stays. */
DQC_API int dqc_compress_layer(dqc_client *client, const dqc_compress_args *args, uint32_t layer,
                               dqc_compress_result *res);
DQC_API void dqc_compress_result_free(dqc_compress_result *res);

typedef struct dqc_decompress_args {
    const void *profile; /* serialized dq_profile */
    size_t profile_len;
    int kind; /* 0 keys, 1 values */
    uint64_t tokens;
    const void *means; /* keys: mean blocks as returned by COMPRESS (NULL when it returned none) */
    size_t means_bytes;
    const void *records;
    size_t records_bytes;
    dq_dtype out_dtype;
} dqc_decompress_args;

typedef struct dqc_decompress_result {
    dq_dtype dtype;
    uint32_t ndim;
    uint64_t shape[4]; /* [tokens, kv_heads, head_dim] */
    const void *x;     /* owned by the result */
    size_t bytes;
    void *mem_;      /* private */
    size_t mem_cap_; /* private */
} dqc_decompress_result;

DQC_API int dqc_decompress(dqc_client *client, const dqc_decompress_args *args, dqc_decompress_result *res);
/* The same with the codec view of calibration layer `layer` (the layer the records were made with).
 * A calibrated profile is decoded with the calibration of a model registered with it (DQ_PROFILE
 * when none is). dqc_decompress is layer 0. */
DQC_API int dqc_decompress_layer(dqc_client *client, const dqc_decompress_args *args, uint32_t layer,
                                 dqc_decompress_result *res);
DQC_API void dqc_decompress_result_free(dqc_decompress_result *res);

/* ---- DELETE / PIN / UNPIN ---- */

/* DQ_NOT_FOUND when the sequence does not exist. A pinned sequence is never evicted. */
DQC_API int dqc_delete(dqc_client *client, const dqc_seq *seq);
DQC_API int dqc_pin(dqc_client *client, const dqc_seq *seq);
DQC_API int dqc_unpin(dqc_client *client, const dqc_seq *seq);

/* ---- STATS ---- */

typedef struct dqc_counter {
    const char *name;
    uint64_t value;
} dqc_counter;

typedef struct dqc_gauge {
    const char *name;
    double value;
} dqc_gauge;

typedef struct dqc_stats_result {
    size_t ncounters;
    dqc_counter *counters; /* sorted by name; owned by the result */
    size_t ngauges;
    dqc_gauge *gauges; /* sorted by name; owned by the result */
    void *mem_;        /* private */
} dqc_stats_result;

DQC_API int dqc_stats(dqc_client *client, dqc_stats_result *res);
DQC_API void dqc_stats_result_free(dqc_stats_result *res);
/* Look-ups by exact name. Return 0 or DQ_NOT_FOUND (then *value is left untouched). */
DQC_API int dqc_stats_counter(const dqc_stats_result *res, const char *name, uint64_t *value);
DQC_API int dqc_stats_gauge(const dqc_stats_result *res, const char *name, double *value);

/* ---- shared KV tier: chunks keyed by prefix ----
 *
 * A chunk is chunk_tokens consecutive tokens (the model's, see dqc_register_model_ex) of every
 * layer. Its key is a hash chain over (namespace, the previous chunk's key, the chunk's token ids)
 * (proto/chunkkey.h), so every client of one namespace computes the same keys for the same prompt
 * prefix and reuses any other client's chunks. The daemon sees no token ids and does not verify
 * keys. Chunks are stored apart from sequences: a chunk key never aliases a sequence key. */

#define DQC_CHUNK_KEY_BYTES 16

/* The keys of the full chunks of a prompt of ntokens token ids, chained from parent (NULL: the
 * prompt's start; else the 16-byte key of the chunk before tokens[0]): min(ntokens /
 * chunk_tokens, max_keys) keys written back to back into out (16 bytes each). A final partial
 * chunk has no key. Returns the number of keys (0 when chunk_tokens is 0, out is NULL, or tokens
 * is NULL with ntokens > 0). Pure: no handle, no I/O; every pointer borrowed; any thread. */
DQC_API size_t dqc_chunk_keys(const char *ns, const uint32_t *tokens, size_t ntokens, uint32_t chunk_tokens,
                              const uint8_t *parent, uint8_t *out, size_t max_keys);

/* PUT_CHUNKS: stores nkeys chunks given in prompt order. k and v are [layers, nkeys ·
 * chunk_tokens, kv_heads, head_dim] of dtype (every layer of the model), contiguous, borrowed.
 * parent: NULL at the prompt's start, else the 16-byte key before keys[0], which the daemon must
 * hold (DQ_NOT_FOUND "parent chunk not held" otherwise, nothing stored). A chunk already held is
 * acknowledged without being encoded again (deduped); concurrent PUT_CHUNKS of one chunk store it
 * once. Each chunk is stored all or nothing; when one fails, the chunks before it stay. Errors:
 * DQ_INVALID_ARGUMENT (tokens not nkeys · the model's chunk_tokens, more keys than the server's
 * max_lookup_keys), DQ_SHAPE, DQ_NOT_FOUND (model, parent), DQ_NONFINITE, DQ_RANGE,
 * DQ_RESOURCE_EXHAUSTED, and the call errors. Repeated after a break in flight (idempotent). */
typedef struct dqc_put_chunks_args {
    const char *ns;      /* NULL or "": the default namespace */
    const char *model;   /* required */
    const uint8_t *keys; /* nkeys · DQC_CHUNK_KEY_BYTES bytes */
    size_t nkeys;
    const uint8_t *parent; /* NULL or DQC_CHUNK_KEY_BYTES bytes */
    uint32_t layers, chunk_tokens, kv_heads, head_dim;
    dq_dtype dtype;
    const void *k, *v;
} dqc_put_chunks_args;

typedef struct dqc_put_chunks_result {
    uint64_t stored;  /* chunks encoded by this call */
    uint64_t deduped; /* chunks that were held already */
    uint64_t streams_encoded;
} dqc_put_chunks_result;

/* res may be NULL. */
DQC_API int dqc_put_chunks(dqc_client *client, const dqc_put_chunks_args *args, dqc_put_chunks_result *res);
/* The same for chunks: nkeys chunks of every layer of the model (layers[i] is layer i, nlayers =
 * the model's layers), each chunk_tokens / W whole windows per layer (no tail: tail_tokens 0),
 * records layer-major then chunk-major (layers[i].records holds chunk 0's windows of layer i, then
 * chunk 1's, ...; windows = nkeys · chunk_tokens / W). profile as for dqc_put_raw. Idempotent and
 * deduped like dqc_put_chunks (streams_encoded 0); errors as dqc_put_chunks and dqc_put_raw.
 * Everything borrowed; res may be NULL. */
DQC_API int dqc_put_chunks_raw(dqc_client *client, const char *ns, const char *model, const uint8_t *keys, size_t nkeys,
                               const uint8_t *parent, const dqc_raw_layer *layers, size_t nlayers,
                               const uint8_t *profile, size_t profile_len, dqc_put_chunks_result *res);

typedef struct dqc_lookup_result {
    uint64_t hits;         /* leading keys held (the count stops at the first miss) */
    uint64_t hit_tokens;   /* hits · chunk_tokens */
    uint32_t chunk_tokens; /* the model's */
    uint64_t lease_id;     /* 0: no lease (lease_ms 0, or no hits) */
    uint32_t lease_ms;     /* the lease's duration */
} dqc_lookup_result;

/* LOOKUP: how many leading keys (nkeys · 16 bytes in prompt order; borrowed) of model's chunks in
 * ns the daemon holds. With lease_ms > 0 the chunks found are leased to this connection for that
 * long: they are not evicted until the lease expires, is released (dqc_release_lease) or the
 * connection closes (a reconnect loses the handle's leases). res may be NULL. Errors:
 * DQ_INVALID_ARGUMENT (more than max_lookup_keys keys, lease_ms over max_lease_ms),
 * DQ_RESOURCE_EXHAUSTED (the connection holds max_leases leases), DQ_NOT_FOUND (model), the call
 * errors. Not repeated after a break in flight when it leases. */
DQC_API int dqc_lookup(dqc_client *client, const char *ns, const char *model, const uint8_t *keys, size_t nkeys,
                       uint32_t lease_ms, dqc_lookup_result *res);
/* Ends a lease of this connection before it expires. DQ_NOT_FOUND when there is no such lease
 * (expired, released, or taken on another connection). */
DQC_API int dqc_release_lease(dqc_client *client, uint64_t lease_id);

/* PUT that creates a sequence built on nprefix held chunks (prefix_keys: nprefix · 16 bytes, in
 * prompt order, of the sequence's namespace and model; borrowed): the chunks stay (no eviction,
 * dqc_delete_chunk is DQ_BUSY) until the sequence goes, and ATTEND on the sequence covers the
 * chunks' tokens and then its own, with one softmax. The sequence's own tokens are numbered from 0
 * (start_token, GET). Errors as dqc_put, and DQ_NOT_FOUND "prefix chunk N not held",
 * DQ_INVALID_ARGUMENT when the sequence exists already. Not retried after a break in flight. */
DQC_API int dqc_put_on_prefix(dqc_client *client, const dqc_put_args *args, const uint8_t *prefix_keys, size_t nprefix,
                              dqc_put_result *res);

/* One whole chunk (every layer, chunk_tokens tokens) decoded to dtype, or as stored (GET_RAW);
 * key: 16 bytes, borrowed. res as for dqc_get / dqc_get_raw. DQ_NOT_FOUND when not held. */
DQC_API int dqc_get_chunk(dqc_client *client, const char *ns, const uint8_t *key, dq_dtype dtype, dqc_get_result *res);
DQC_API int dqc_get_chunk_raw(dqc_client *client, const char *ns, const uint8_t *key, dqc_raw_result *res);
/* nkeys whole chunks (keys: nkeys · 16 bytes, borrowed) decoded to dtype, their tokens one after
 * the other: k and v [layers, nkeys · chunk_tokens, kv_heads, head_dim] in res (as dqc_get).
 * DQ_NOT_FOUND "chunk N not held" when one is missing (nothing is returned then). */
DQC_API int dqc_get_chunks(dqc_client *client, const char *ns, const uint8_t *keys, size_t nkeys, dq_dtype dtype,
                           dqc_get_result *res);
/* nkeys whole chunks as stored (keys: nkeys · 16 bytes, borrowed): per layer of the model, the
 * chunks' window records one after the other (windows = nkeys · chunk_tokens / W, no tail), as
 * dqc_get_raw returns them. DQ_NOT_FOUND "chunk N not held" when one is missing. */
DQC_API int dqc_get_chunks_raw(dqc_client *client, const char *ns, const uint8_t *keys, size_t nkeys,
                               dqc_raw_result *res);

/* DELETE, PIN, UNPIN of one chunk (key: 16 bytes, borrowed), as for sequences: a pinned chunk is
 * never evicted. DQ_NOT_FOUND when not held; DQ_BUSY from dqc_delete_chunk while a sequence is
 * built on the chunk (dqc_put_on_prefix). */
DQC_API int dqc_delete_chunk(dqc_client *client, const char *ns, const uint8_t *key);
DQC_API int dqc_pin_chunk(dqc_client *client, const char *ns, const uint8_t *key);
DQC_API int dqc_unpin_chunk(dqc_client *client, const char *ns, const uint8_t *key);

/* ---- PING ---- */

/* Sends data (len bytes, may be 0) and checks that the server echoes it (DQ_PROTOCOL otherwise). */
DQC_API int dqc_ping(dqc_client *client, const void *data, size_t len);

/* ---- multi-node: dqc_cluster ----
 *
 * One dquantd holds what one machine holds; a cluster's shared KV tier is many. A dqc_cluster is
 * one handle over a set of dquantd members with the operations of dqc_client: it holds one
 * dqc_client per member (connected on first use) and places every key on members by rendezvous
 * (highest random weight) hashing: the weight of member m for a key is XXH3 of the key's digest
 * seeded with XXH3 of m's identity, and the key's preference list is every member by falling
 * weight. A member added or removed moves only the keys it gains or loses (about 1/N of them).
 *
 * Placement keys. A sequence is placed by (namespace, key). A chunk of the shared tier is placed by
 * (namespace, ROOT): the key of the first chunk of its prompt (keys[0] of dqc_chunk_keys with
 * parent NULL). Every chunk of one prompt tree therefore lives on the same members, which is what
 * PUT_CHUNKS (its parent must be held where it goes) and LOOKUP (leading keys held) need. The calls
 * on chunks below take that root (LOOKUP: keys[0]; PUT_CHUNKS: the keys of the chunks before its
 * own, from the prompt's first). A sequence built on prefix chunks (dqc_cluster_put_on_prefix)
 * stays placed by its own key: the chunks it needs are copied, as stored (GET_CHUNKS_RAW then
 * PUT_CHUNKS_RAW, deduplicated by the daemon), onto each of its replicas that lacks them, so that
 * the sequence and its prefix sit on the same daemon. A tree whose first chunk is very popular puts
 * all its load on R members: placement is per tree, not per chunk.
 *
 * Replication. A key's replicas are the first R members of its preference list that are not marked
 * down (R = opts.replicas). A write (PUT, PUT_RAW, PUT_CHUNKS, PUT_CHUNKS_RAW, ATTEND with appends,
 * put_on_prefix) goes to the replicas one after the other and succeeds when W of them acknowledged
 * it (W = opts.write_quorum); a replica that fails takes the next member of the list in its place
 * (at most opts.read_spares of them), so with a member down new data lands on the next one. A read
 * (GET, GET_RAW, ATTEND, LOOKUP, GET_CHUNKS) asks the replicas in order and moves on when one fails
 * or lacks the key (DQ_NOT_FOUND; LOOKUP: fewer hits than asked), up to R + read_spares members:
 * absence is a miss, never an answer, so a member that came back empty does not serve a stale
 * one. LOOKUP returns the most hits any member had and copies the chunks a replica lacked onto it
 * from the member that had them (read repair, opts.repair); PUT_CHUNKS copies the prefix chunks onto
 * a replica that lacks its parent. Sequences are not copied between members (GET_RAW carries
 * neither the model nor the prefix a sequence was built on): an append that a replica refuses
 * (DQ_NOT_FOUND, DQ_ORDER: it restarted, or missed appends while unreachable) leaves the sequence
 * on its other replicas, and a replica with DQ_ORDER loses its stale copy (DELETE) so that it can
 * never answer with it. A member that kept its data but missed appends while unreachable (a
 * partition, not a restart) still holds its shorter copy until the next append to it; reads of an
 * explicit token range never see it (DQ_OUT_OF_BOUNDS there moves the read on).
 *
 * Failures. A member whose call fails with DQ_CONNECTION, DQ_TIMEOUT, DQ_IO, DQ_PROTOCOL or
 * DQ_SHUTTING_DOWN is marked down: skipped for down_backoff_ms, doubling after each failure up to
 * down_backoff_max_ms, then tried again by the next call that needs it; one success marks it up.
 * A dead member is found by opts.node.connect_timeout_ms (a refused connection: at once) and a hung
 * one by opts.node.io_timeout_ms, so a read fails over within about that time. Registered models
 * (dqc_cluster_register_model) are remembered and registered again on every member each time its
 * connection is (re)established, so a member that restarts empty serves them at once. With R = 1 a
 * dead member's keys become misses (DQ_NOT_FOUND, fewer LOOKUP hits), not other errors; with R >= 2
 * and W = 1 reads and writes keep succeeding. When no member answers at all a call returns
 * DQ_CONNECTION.
 *
 * Members. A members string is a comma-separated list of addresses ("tcp://10.0.0.1:7733,
 * tcp://10.0.0.2:7733", unix: addresses too; a member's identity is its address as written), or
 * one DNS name: "srv:_dquant._tcp.dquantd.ns.svc.cluster.local" (SRV records: one member per
 * record, identity TARGET:PORT, connected at the target's A/AAAA address) or
 * "dns:dquantd.ns.svc.cluster.local:7733" (A/AAAA records of a Kubernetes headless Service:
 * identity IP:PORT, so a pod that changes its IP changes identity; prefer SRV records of a
 * StatefulSet, whose names are stable). DNS membership is resolved at creation, again every
 * dns_refresh_ms and, at most once a second, after a member was marked down; the resolution is
 * done inside the next call (the library has no threads). A resolution that fails or finds no
 * record keeps the current members. Members that stay keep their connection and state.
 *
 * Thread-safety and ownership: as dqc_client (one thread at a time per handle; distinct handles
 * are independent). Errors of the last call: dqc_cluster_last_error. Every pointer argument is
 * borrowed for the call; results as for the dqc_client calls of the same name. */

typedef struct dqc_cluster dqc_cluster;

typedef struct dqc_cluster_options {
    uint32_t size;                /* sizeof(dqc_cluster_options); set by dqc_cluster_options_default */
    dqc_options node;             /* each member's connection (copied, with what it points to); the
                                     defaults of dqc_options_default except connect_timeout_ms 1000,
                                     io_timeout_ms 10000 and reconnect_attempts 1 (the cluster
                                     retries through other members, not by waiting) */
    uint32_t replicas;            /* R: members each key is written to, >= 1; default 1 */
    uint32_t write_quorum;        /* W: acknowledgements a write needs, 1..R; 0 (default): R */
    uint32_t read_spares;         /* members past the R replicas that a read asks and a failed
                                     write falls back to; default 1 */
    uint32_t down_backoff_ms;     /* a failed member is skipped this long at first; default 250 */
    uint32_t down_backoff_max_ms; /* ... doubling per failure up to this; default 8000 */
    uint32_t dns_refresh_ms;      /* DNS members re-resolved this often; default 10000 */
    const char *dns_server;       /* "IP" or "IP:PORT" (IPv4) of the DNS server to ask; NULL: the
                                     system's resolver (/etc/resolv.conf); copied */
    int connect_now;              /* 1 (default): dqc_cluster_create connects to every member and
                                     fails when none answers; 0: members connect on first use */
    int repair;                   /* 1 (default): LOOKUP copies chunks a replica lacked onto it */
} dqc_cluster_options;

/* Fills *opts with the defaults above. */
DQC_API void dqc_cluster_options_default(dqc_cluster_options *opts);

/* Creates a cluster handle over the members string (see above; copied). opts may be NULL. On
 * success *out is owned by the caller (dqc_cluster_free). Returns 0, DQ_INVALID_ARGUMENT (bad
 * string or option; errbuf says which), DQ_NOT_FOUND (DNS found no member), DQ_CONNECTION (with
 * connect_now: no member answered), DQ_UNAUTHENTICATED, DQ_NOMEM. errbuf as for dqc_connect_ex. */
DQC_API int dqc_cluster_create(const char *members, const dqc_cluster_options *opts, dqc_cluster **out, char *errbuf,
                               size_t errbuf_len);
/* Closes every member's connection and frees the handle. NULL is allowed. */
DQC_API void dqc_cluster_free(dqc_cluster *cl);
/* A message describing the last failure on this handle ("" if none); valid until the next call. */
DQC_API const char *dqc_cluster_last_error(const dqc_cluster *cl);

/* Replaces the members (a list or a DNS name, as for create); members whose identity stays keep
 * their connection. Returns 0, DQ_INVALID_ARGUMENT, DQ_NOT_FOUND (DNS found none: nothing changed). */
DQC_API int dqc_cluster_set_members(dqc_cluster *cl, const char *members);
/* Resolves DNS members now (0 for a static list). DQ_NOT_FOUND / DQ_CONNECTION when the resolution
 * failed (the members stay as they were). */
DQC_API int dqc_cluster_refresh(dqc_cluster *cl);

#define DQC_MEMBER_ID_MAX 256
typedef struct dqc_cluster_member_info {
    char id[DQC_MEMBER_ID_MAX];   /* identity: what placement hashes */
    char addr[DQC_MEMBER_ID_MAX]; /* where it is connected: unix:PATH or tcp://HOST:PORT */
    int up;                       /* 0: marked down */
    uint32_t retry_in_ms;         /* when down: how long until it is tried again */
    int connected;                /* a connection is open */
    uint64_t requests;            /* calls made on it */
    uint64_t failures;            /* times it was marked down */
} dqc_cluster_member_info;

/* Members now (their order is not placement's). */
DQC_API size_t dqc_cluster_size(const dqc_cluster *cl);
/* Member i (< dqc_cluster_size) into *out. 0 or DQ_INVALID_ARGUMENT. */
DQC_API int dqc_cluster_member(const dqc_cluster *cl, size_t i, dqc_cluster_member_info *out);
/* Member i's connection for the calls the cluster does not route (STATS, PING, COMPRESS of one
 * daemon), connected now if need be; borrowed, valid until the members change or the handle is
 * freed. NULL when i is out of range or the member cannot be reached (dqc_cluster_last_error). */
DQC_API dqc_client *dqc_cluster_client(dqc_cluster *cl, size_t i);
/* The preference list of a sequence / of the chunk tree rooted at root (16 bytes): up to n member
 * indices, highest weight first, into out. Returns how many (min(n, members)). Pure placement:
 * it ignores which members are down. */
DQC_API size_t dqc_cluster_locate(const dqc_cluster *cl, const dqc_seq *seq, size_t *out, size_t n);
DQC_API size_t dqc_cluster_locate_chunks(const dqc_cluster *cl, const char *ns, const uint8_t *root, size_t *out,
                                         size_t n);

/* What the handle did since it was created. */
typedef struct dqc_cluster_stats {
    uint64_t failovers;       /* reads answered by a member after another failed or lacked the key */
    uint64_t marked_down;     /* members marked down */
    uint64_t degraded_writes; /* writes acknowledged by fewer than R members (but W or more) */
    uint64_t repairs;         /* copies of chunks onto a member that lacked them */
    uint64_t repaired_chunks; /* chunks those copies carried */
    uint64_t dns_refreshes;   /* DNS resolutions that succeeded */
    uint64_t dns_failures;    /* ... that failed (members kept) */
    uint64_t member_changes;  /* members added or removed */
} dqc_cluster_stats;
DQC_API int dqc_cluster_get_stats(const dqc_cluster *cl, dqc_cluster_stats *out);

/* The operations. Each does what the dqc_client call of the same name does, routed as described
 * at the top of this section, with the same arguments, results and error codes, and these
 * additions: */

/* On every member (each one is also asked again whenever it reconnects); the first answer fills
 * info and *chunk_tokens_out. A member that cannot be reached now is skipped (it gets the model
 * when it connects); DQ_CONNECTION when none could. */
DQC_API int dqc_cluster_register_model(dqc_cluster *cl, const dqc_model_spec *spec, uint32_t chunk_tokens,
                                       dqc_model_info *info, uint32_t *chunk_tokens_out);
/* The same with a KVQ calibration (dqc_register_model_calibrated; copied: every member gets it,
 * also when it reconnects). */
DQC_API int dqc_cluster_register_model_calibrated(dqc_cluster *cl, const dqc_model_spec *spec, uint32_t chunk_tokens,
                                                  const void *calibration, size_t calibration_len, dqc_model_info *info,
                                                  uint32_t *chunk_tokens_out);
DQC_API int dqc_cluster_put(dqc_cluster *cl, const dqc_put_args *args, dqc_put_result *res);
DQC_API int dqc_cluster_put_raw(dqc_cluster *cl, const dqc_put_raw_args *args, dqc_put_result *res);
/* prefix_keys[0] is the prefix's root (its chunks are found where dqc_cluster_put_chunks put them);
 * missing chunks are copied onto the sequence's replicas first. */
DQC_API int dqc_cluster_put_on_prefix(dqc_cluster *cl, const dqc_put_args *args, const uint8_t *prefix_keys,
                                      size_t nprefix, dqc_put_result *res);
DQC_API int dqc_cluster_get(dqc_cluster *cl, const dqc_get_args *args, dqc_get_result *res);
DQC_API int dqc_cluster_get_raw(dqc_cluster *cl, const dqc_seq *seq, uint32_t first_layer, uint32_t num_layers,
                                dqc_raw_result *res);
/* The items are grouped by member (one ATTEND per member, items in their order); a group that fails
 * moves on to its items' next members. With appends every item is written to its R replicas. */
DQC_API int dqc_cluster_attend(dqc_cluster *cl, const dqc_attend_args *args, float *out, float *lse);
/* On every member that may hold the sequence (R + read_spares); DQ_NOT_FOUND when none did. */
DQC_API int dqc_cluster_delete(dqc_cluster *cl, const dqc_seq *seq);
DQC_API int dqc_cluster_pin(dqc_cluster *cl, const dqc_seq *seq);
DQC_API int dqc_cluster_unpin(dqc_cluster *cl, const dqc_seq *seq);

/* args->keys follow the nprefix keys prefix (prompt order, from the prompt's first chunk; borrowed),
 * which decide placement: prefix[0], or args->keys[0] when nprefix is 0. args->parent must be NULL
 * or the last prefix key (NULL is taken as that key). */
DQC_API int dqc_cluster_put_chunks(dqc_cluster *cl, const dqc_put_chunks_args *args, const uint8_t *prefix,
                                   size_t nprefix, dqc_put_chunks_result *res);
DQC_API int dqc_cluster_put_chunks_raw(dqc_cluster *cl, const char *ns, const char *model, const uint8_t *prefix,
                                       size_t nprefix, const uint8_t *keys, size_t nkeys, const dqc_raw_layer *layers,
                                       size_t nlayers, const uint8_t *profile, size_t profile_len,
                                       dqc_put_chunks_result *res);
/* keys[0] is the root. The lease (lease_ms > 0) is taken on the member that answered with the most
 * hits; its id names that member too (pass it to dqc_cluster_release_lease, not to dqc_release_lease). */
DQC_API int dqc_cluster_lookup(dqc_cluster *cl, const char *ns, const char *model, const uint8_t *keys, size_t nkeys,
                               uint32_t lease_ms, dqc_lookup_result *res);
DQC_API int dqc_cluster_release_lease(dqc_cluster *cl, uint64_t lease_id);
/* root: the 16-byte root of the keys' prompt tree; NULL: keys[0] (key for the one-chunk calls). */
DQC_API int dqc_cluster_get_chunks(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *keys,
                                   size_t nkeys, dq_dtype dtype, dqc_get_result *res);
DQC_API int dqc_cluster_get_chunks_raw(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *keys,
                                       size_t nkeys, dqc_raw_result *res);
DQC_API int dqc_cluster_get_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key,
                                  dq_dtype dtype, dqc_get_result *res);
DQC_API int dqc_cluster_delete_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key);
DQC_API int dqc_cluster_pin_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key);
DQC_API int dqc_cluster_unpin_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key);

#ifdef __cplusplus
}
#endif
#endif

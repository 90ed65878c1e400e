/* dquantd request validation: pure functions of a parsed Request, its payload and the limits.
 *
 * No connection, store or codec state is touched here, so a fuzz target can drive these functions
 * with any bytes. dqd_request_validate checks what a request says about itself (fields present,
 * sizes within limits, every tensor inside the payload with length == product(shape) · element
 * size, all arithmetic overflow-checked); the dqd_validate_* functions then check a request
 * against the model or profile it names, once the caller has looked that up.
 *
 * Error codes: DQ_UNSUPPORTED (no body), DQ_INVALID_ARGUMENT (missing / bad field),
 * DQ_DTYPE (dtype not allowed here), DQ_SHAPE (shape inconsistent with its length or with the
 * model, product overflow included), DQ_OUT_OF_BOUNDS (tensor outside the payload),
 * DQ_TOO_LARGE (over a configured limit). msg gets one human-readable sentence. */
#ifndef DQD_VALIDATE_H
#define DQD_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant.pb-c.h"
#include "opcode.h"

#define DQD_MAX_DIMS 8
#define DQD_CHUNK_KEY_BYTES 16 /* DQ_CHUNK_KEY_BYTES of proto/chunkkey.h */
#define DQD_PROFILE_MAX 4096   /* serialized profile bytes a request may carry */

/* Sizes a request may carry, beside the frame limits. */
typedef struct dqd_limits {
    uint64_t max_payload;
    uint32_t max_batch_items;
    uint32_t max_ns;          /* namespace bytes */
    uint32_t max_key;         /* sequence key bytes */
    uint32_t max_name;        /* model / profile / client names */
    uint32_t max_lookup_keys; /* chunk keys in one LOOKUP or PUT_CHUNKS */
    uint32_t max_lease_ms;    /* LOOKUP lease duration */
    uint64_t max_calibration; /* REGISTER_MODEL's KVQ calibration bytes */
} dqd_limits;

void dqd_limits_default(dqd_limits *lim);

/* Allowed dtypes, as a mask of 1 << Dquant__DType. */
#define DQD_DT_F32 (1u << DQUANT__DTYPE__F32)
#define DQD_DT_F16 (1u << DQUANT__DTYPE__F16)
#define DQD_DT_BF16 (1u << DQUANT__DTYPE__BF16)
#define DQD_DT_RAW (1u << DQUANT__DTYPE__RAW)
#define DQD_DT_TYPED (DQD_DT_F32 | DQD_DT_F16 | DQD_DT_BF16)
/* Also in the mask: the tensor may travel on NCCL (Tensor.nccl). */
#define DQD_DT_NCCL (1u << 8)

/* Where a request's tensors are: the frame's payload, and the NCCL payload (Request.nccl_payload
 * bytes received into GPU memory, NULL until they have arrived, or a host copy of them). */
typedef struct dqd_payload {
    const uint8_t *data;
    uint64_t len;
    const uint8_t *nccl;
    uint64_t nccl_len;
    bool nccl_on_host;
} dqd_payload;

/* A byte range of the NCCL payload. */
typedef struct dqd_seg {
    uint64_t offset, length;
} dqd_seg;

/* A tensor checked against its payload. */
typedef struct dqd_tensor {
    uint32_t dtype; /* Dquant__DType value */
    uint32_t ndim;
    uint64_t shape[DQD_MAX_DIMS];
    uint64_t count;       /* elements (bytes for RAW) */
    uint64_t offset, len; /* bytes in the payload */
    const uint8_t *data;  /* payload + offset; NULL when len == 0 */
    bool device;          /* data is in GPU memory (an NCCL tensor) */
} dqd_tensor;

/* What validation needs to know about a model / a codec profile. */
typedef struct dqd_model_info {
    uint32_t layers, q_heads, kv_heads, head_dim;
} dqd_model_info;

typedef struct dqd_profile_info {
    uint32_t kv_heads, head_dim, window;
    uint64_t mean_bytes, record_bytes[2];
} dqd_profile_info;

/* Element size of a dtype value (RAW: 1), 0 for an unknown one. */
size_t dqd_dtype_size(uint32_t dtype);

/* Checks one tensor: present (unless allow_missing, then out->len = 0 and DQ_OK), dtype in
 * allowed, rank == ndim (RAW: any rank, an empty shape meaning [length]), length == product ·
 * size, inside [0, payload_len). */
int dqd_tensor_check(const Dquant__Tensor *t, const char *what, uint32_t allowed, uint32_t ndim, bool allow_missing,
                     const dqd_payload *pl, dqd_tensor *out, char *msg, size_t msglen);
/* shape[i] == UINT64_MAX matches anything. */
int dqd_tensor_expect(const dqd_tensor *t, const char *what, const uint64_t *shape, char *msg, size_t msglen);

/* The NCCL tensors of a request as byte ranges sorted by offset (*out malloc'd, NULL when none):
 * after dqd_request_validate they tile [0, nccl_payload). Returns 0 or DQ_NOMEM. */
int dqd_nccl_segments(const Dquant__Request *req, dqd_seg **out, size_t *nseg);

/* Every string field of a header message as it was on the wire (header: the protobuf bytes of
 * header_len, desc: dquant__request__descriptor for a request), sub-messages included: valid UTF-8
 * and no NUL byte (DQ_INVALID_ARGUMENT naming the field, e.g. "attend.items.seq.ns"). protobuf-c
 * hands strings over NUL-terminated without their length, so a name with a NUL inside would be cut
 * there and alias another; only the wire bytes show it. Run it before dqd_request_validate, whose
 * length limits then hold for the names as sent. Bytes fields (sequence and chunk keys, secrets,
 * profiles) may hold any bytes. DQ_PROTOCOL for bytes that are not a protobuf message. */
int dqd_validate_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *header, size_t header_len, char *msg,
                         size_t msglen);

/* Self-consistency of a whole request. *op gets the request kind (DQD_OP_UNKNOWN for none). */
int dqd_request_validate(const Dquant__Request *req, const dqd_payload *pl, const dqd_limits *lim, dqd_op *op,
                         char *msg, size_t msglen);

/* PUT against its model: layer range, k/v shape [num_layers, tokens, kv_heads, head_dim]. */
int dqd_validate_put(const Dquant__Put *put, const dqd_payload *pl, const dqd_model_info *m, dqd_tensor *k,
                     dqd_tensor *v, char *msg, size_t msglen);
/* PUT_CHUNKS against its model: k/v [layers, keys * chunk_tokens, kv_heads, head_dim]. */
int dqd_validate_put_chunks(const Dquant__PutChunks *p, const dqd_payload *pl, const dqd_model_info *m,
                            uint32_t chunk_tokens, dqd_tensor *k, dqd_tensor *v, char *msg, size_t msglen);
/* One layer of PUT_RAW / PUT_CHUNKS_RAW checked against its payload (tails may be absent). */
typedef struct dqd_raw_tensors {
    dqd_tensor records, tail_k, tail_v;
    uint64_t windows, tail_tokens;
} dqd_raw_tensors;

/* PUT_RAW / PUT_CHUNKS_RAW layers [first_layer, first_layer + n) against the model and its
 * profile: layers[i].layer == first_layer + i, records exactly windows whole window records
 * (DQ_SHAPE: a truncated or oversized record run), tails BF16 [tail_tokens, kv_heads * head_dim]
 * with tail_tokens < W, tokens (windows * W + tail_tokens) the same in every layer (*tokens).
 * out: n entries. */
int dqd_validate_raw_layers(Dquant__RawLayer *const *layers, size_t n, uint32_t first_layer, const dqd_payload *pl,
                            const dqd_model_info *m, const dqd_profile_info *p, dqd_raw_tensors *out, uint64_t *tokens,
                            char *msg, size_t msglen);
/* GET's layer range against its sequence's model; *first / *num resolve num_layers = 0. */
int dqd_validate_get(const Dquant__Get *get, const dqd_model_info *m, uint32_t *first, uint32_t *num, char *msg,
                     size_t msglen);
/* One ATTEND item against its sequence's model: layer, q [q_heads, head_dim], optional
 * append_k/append_v [1, kv_heads, head_dim] (both or neither, same dtype). */
int dqd_validate_attend_item(const Dquant__AttendItem *it, const dqd_payload *pl, const dqd_model_info *m,
                             dqd_tensor *q, dqd_tensor *ak, dqd_tensor *av, char *msg, size_t msglen);
/* REGISTER_MODEL's calibration (RAW bytes in the payload, may be absent: len 0), already checked
 * by dqd_request_validate. */
int dqd_validate_calibration(const Dquant__ModelSpec *m, const dqd_payload *pl, dqd_tensor *cal, char *msg,
                             size_t msglen);
/* COMPRESS: x [tokens >= 1, kv_heads, head_dim] of the profile's shape. */
int dqd_validate_compress(const Dquant__Compress *c, const dqd_payload *pl, const dqd_profile_info *p, dqd_tensor *x,
                          char *msg, size_t msglen);
/* DECOMPRESS: records = tokens · record_bytes(kind); keys need ceil(tokens / W) mean blocks. */
int dqd_validate_decompress(const Dquant__Decompress *d, const dqd_payload *pl, const dqd_profile_info *p,
                            dqd_tensor *means, dqd_tensor *records, char *msg, size_t msglen);

#endif

/* dquantd operation handlers and what they share. Loop thread unless noted. */
#ifndef DQD_OPS_INTERNAL_H
#define DQD_OPS_INTERNAL_H

#include "append.h"
#include "registry.h"
#include "request.h"
#include "store.h"
#include "validate.h"

void dqd_op_put(dqd_req *req);
void dqd_op_get(dqd_req *req);
void dqd_op_attend(dqd_req *req);
void dqd_op_compress(dqd_req *req);
void dqd_op_decompress(dqd_req *req);
void dqd_op_put_chunks(dqd_req *req);
void dqd_op_lookup(dqd_req *req);
void dqd_op_put_raw(dqd_req *req);
void dqd_op_put_chunks_raw(dqd_req *req);

/* One chunk of PUT_CHUNKS, run by op_put.c's machinery: put (kind CHUNK, start 0, every layer,
 * chunk_tokens tokens) names it; its rows are token_off.. of k/v ([layers, tokens_total, ...]).
 * A chunk already committed is acknowledged (deduped) without encoding; one being written by
 * another request is waited for first (the store's FIFO access). done() runs once, on the loop
 * thread, possibly before dqd_op_put_chunk returns; msg is NULL on success. */
typedef struct dqd_chunk_put {
    const Dquant__Put *put;
    dqd_model *model;
    dqd_tensor k, v;
    uint64_t token_off, tokens_total;
    const dqd_raw_in *raw; /* PUT_CHUNKS_RAW: every layer's records of all chunks (k, v unused) */
    void (*done)(void *arg, int rc, const char *msg, bool deduped, uint64_t streams);
    void *arg;
} dqd_chunk_put;
void dqd_op_put_chunk(dqd_req *req, const dqd_chunk_put *cp);

/* PUT_RAW / PUT_CHUNKS_RAW (op_put.c): the profile sent equals the model's (else DQ_INVALID_ARGUMENT
 * "records of another profile"), the layers pass dqd_validate_raw_layers; out gets n layers'
 * records and tails, *tokens each layer's token count. msg says why on failure. */
int dqd_ops_raw_layers(const dqd_model *model, Dquant__RawLayer *const *layers, size_t n, uint32_t first_layer,
                       const ProtobufCBinaryData *profile, const dqd_payload *pl, dqd_raw_in *out, uint64_t *tokens,
                       char *msg, size_t msglen);
void dqd_model_info_of(const dqd_model *m, dqd_model_info *out);
void dqd_profile_info_of(const dqd_codec *c, dqd_profile_info *out);
/* The sequence a SeqRef names, referenced; NULL if there is none. */
dqd_seq *dqd_ops_lookup(dqd_req *req, const Dquant__SeqRef *ref);

#endif

/* dquant eval: the KV (and query) arrays an evaluation runs on.
 *
 * Three real datasets of ../shared/data (README there) have built-in layouts:
 *   bytellama-n1024   kv_f16.bin  f16 [2 (K,V), 4 layers, 512 tok, 8 kv_heads, 128] (n = 1024)
 *                     q_f16.bin   f16 [4 layers, 512 tok, 16 q_heads, 128]
 *   bytellama-19m     kv_f16.bin  f16 [2 seq, 2 (K,V), 6 layers, 1024 tok, 2 kv_heads, 128]
 *                     q_f16.bin   f16 [1 seq, 6 layers, 1024 tok, 4 q_heads, 128] (sequence 0)
 *   tinystories-656k  kv/kv_f16.bin f16 [2 (K,V), 2 layers, 495 tok, 4 kv_heads, 16]
 *                     kv/q_f16.bin  f16 [2 layers, 495 tok, 8 q_heads, 16]
 * Any other data comes as one layer of raw little-endian files [tokens, heads, head_dim].
 * Keys are post-RoPE, as an engine's cache holds them; queries likewise. */
#ifndef DQUANT_EVAL_DATA_H
#define DQUANT_EVAL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/types.h"

typedef struct eval_data {
    char name[64];
    uint32_t seqs, layers, tokens;
    uint32_t kv_heads, head_dim, q_heads; /* q_heads 0: no queries */
    float *k, *v;                         /* [seqs][layers][tokens][kv_heads · head_dim] */
    float *q;                             /* [layers][tokens][q_heads · head_dim] of sequence 0, or NULL */
} eval_data;

/* Loads "bytellama-n1024", "bytellama-19m" or "tinystories-656k" from dir (NULL: ../shared/data). Returns 0,
 * DQ_NOT_FOUND (unknown name, or its KV file absent), DQ_SHAPE (a file of the wrong size),
 * DQ_IO, DQ_NOMEM; err (errlen bytes) says which file. Queries are optional: a missing query file
 * leaves q NULL. */
int eval_data_load_named(const char *name, const char *dir, eval_data *d, char *err, size_t errlen);

/* One layer from raw files: k and v [tokens, kv_heads, head_dim], q (may be NULL)
 * [tokens, q_heads, head_dim], all of dtype. Same returns as above. */
int eval_data_load_files(const char *k, const char *v, const char *q, uint32_t kv_heads, uint32_t head_dim,
                         uint32_t q_heads, dq_dtype dtype, eval_data *d, char *err, size_t errlen);

void eval_data_free(eval_data *d);

/* Reads a whole file into a new buffer (free with free(); one spare byte past len). Returns 0,
 * DQ_NOT_FOUND, DQ_IO, DQ_NOMEM. */
int eval_read_file(const char *path, void **buf, size_t *len);

/* The eval functions' error convention: formats a message into err (errlen bytes; err may be NULL)
 * and returns rc. */
int eval_fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* n = kv_heads · head_dim */
size_t eval_data_stream_len(const eval_data *d);
/* [tokens, n] of one sequence, layer and kind. */
const float *eval_data_slab(const eval_data *d, dq_kind kind, uint32_t seq, uint32_t layer);

#endif

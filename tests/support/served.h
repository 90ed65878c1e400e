/* A model served by the dquantd under test (dqd_child.h), checked through libdquant-client against
 * the same codec in libdquant in-process: the PUT / GET / GET_RAW / ATTEND / COMPRESS / DECOMPRESS
 * checks that the codec families' end-to-end tests share (tests/daemon test_fixed.c, test_kvq.c).
 * Every check fails the Criterion test that calls it. */
#ifndef DQTEST_SERVED_H
#define DQTEST_SERVED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/layer.h"

/* The model on the daemon and its reference. */
typedef struct srv_model {
    const char *name; /* the model's name on the daemon */
    uint32_t layers, q_heads, kv_heads, head_dim;
    const dq_codec *codec; /* the reference codec (sizes; every layer's codec unless view) */
    /* the codec of one layer (a calibrated codec's per-layer view); NULL: codec */
    const dq_codec *(*view)(const struct srv_model *m, uint32_t layer);
    const void *view_arg; /* for view */
    dq_workspace *ws;
    const uint8_t *profile; /* the serialized profile the daemon must report */
    size_t profile_len;
    /* the test's inputs: value j of token t of layer l (K or V) of input id */
    float (*val)(uint32_t id, uint32_t l, uint64_t t, uint32_t j, int is_v);
    double attend_tol; /* 0: ATTEND equals dq_attend bit for bit; else within this relative error */
    bool window_check; /* GET_RAW's window records pass dq_window_check */
} srv_model;

/* The model `name` of that shape on the daemon, codec (every layer), ws, its serialized profile and
 * inputs val; no view, ATTEND bit for bit, no dq_window_check (set those after). */
srv_model srv_model_of(const char *name, uint32_t layers, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
                       const dq_codec *codec, dq_workspace *ws, const uint8_t *profile, size_t profile_len,
                       float (*val)(uint32_t id, uint32_t l, uint64_t t, uint32_t j, int is_v));

/* The daemon with the extra arguments (NULL-terminated); skips the test when $DQUANTD is unset. */
void srv_start(dqd_daemon *d, const char *const *extra);
/* Stops a started daemon and expects exit status 0. */
void srv_stop(dqd_daemon *d);
/* A client connected to d. */
dqc_client *srv_connect(const dqd_daemon *d);

/* [layers, n, kv_heads, head_dim] of m->val for tokens [start, start + n) (malloc'd). */
float *srv_kv(const srv_model *m, uint32_t id, uint32_t layers, uint64_t start, uint64_t n, int is_v);
/* The layer codec m->view gives, or m->codec. */
const dq_codec *srv_layer_codec(const srv_model *m, uint32_t layer);
/* Outputs (n values, then nl LSEs) equal the reference within m->attend_tol (0: bit for bit). */
bool srv_same_attend(const srv_model *m, const float *out, const float *want, size_t n, const float *lse,
                     const float *wlse, size_t nl);

/* One PUT of tokens [start, start + n) of input 1 to every layer of sequence key, and the same
 * appended to the reference layers ref (created on first use). */
void srv_put(dqc_client *c, const srv_model *m, const char *key, dq_layer **ref, uint64_t start, uint64_t n);
/* GET (f32), GET_RAW (records, tails, the profile) and one ATTEND over every layer of key equal the
 * reference layers ref of tokens tokens (what names the case in messages). */
void srv_check_seq(dqc_client *c, const srv_model *m, const char *key, dq_layer *const *ref, uint64_t tokens,
                   const char *what);
/* ATTEND over layer `layer` of key with one token appended in the same request (inputs 7 and 8 of
 * m->val) equals dq_attend after the same token is appended to the reference layer ref. */
void srv_attend_append(dqc_client *c, const srv_model *m, const char *key, uint32_t layer, dq_layer *ref,
                       const char *what);
/* COMPRESS of x (ntok tokens of one kind) with model layer `layer` (-1: dqc_compress, the model's
 * one codec) equals dq_tokens_encode's records and window headers with that layer's codec, and
 * DECOMPRESS of them dq_tokens_decode's values. Returns the records (malloc'd, ntok records of
 * dq_codec_record_bytes); *means (may be NULL) the window headers (malloc'd; keys only, else
 * NULL). */
uint8_t *srv_compress_check(dqc_client *c, const srv_model *m, int layer, int kind, const float *x, uint64_t ntok,
                            uint8_t **means);

#endif

/* Internals shared by the codec's source files. */
#ifndef DQ_CODEC_INTERNAL_H
#define DQ_CODEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/log.h"
#include "rans.h"

/* The rotation is orthonormal per head, so no rotated value of a head exceeds the head's 2-norm: a
 * head whose norm (computed in float, in any order) is at most this passes the range check without
 * being rotated; the 0.1% margin is far above the rounding of the rotation and of the norm. Used by
 * dq_check_tokens and by the GPU's window checks. */
#define DQ__TOKEN_NORM_LIMIT (0.999f * DQ_TOKEN_MAX_ABS)

/* Per-kind tables derived from the profile. */
typedef struct dq__kind_tables {
    uint32_t container;   /* C */
    uint32_t levels;      /* M */
    uint64_t budget_q16;  /* B = 8C - 32 bits, Q16 */
    int32_t cost_q16[32]; /* r_m = -log2(f_m / 256) in 1/65536 bits, exact integer algorithm */
    float cost[32];       /* cost_q16 / 65536, exactly */
    uint32_t cheapest;    /* argmin cost (lowest index on ties) */
    dq__rans_enc enc;
    dq__rans_dec dec;
} dq__kind_tables;

struct dq_codec {
    dq_profile profile;
    dq_allocator alloc;
    uint32_t n; /* kv_heads × head_dim */
    uint32_t head_dim;
    uint32_t log2_head_dim;
    float rot_scale; /* (float)(1 / sqrt(head_dim)) */
    float *signs;    /* n entries of ±1 (D), or NULL when the seed is 0 */
    dq__kind_tables kt[2];
    size_t record_bytes[2]; /* 4 + C (baselines: their record size) */
    size_t mean_bytes;      /* key window header: 2 + n (KIVI: 4n, other baselines: 0) */
    size_t window_bytes;
    /* baselines */
    uint32_t group;  /* channels per scale/zero group */
    float lm_c[256]; /* TurboQuant: Lloyd–Max centroids for N(0,1), 2^bits of them */
    float lm_t[256]; /* decision thresholds between consecutive centroids */
};

struct dq_workspace {
    const dq_codec *codec;
    float *f0, *f1, *f2; /* n floats each */
    uint32_t *u0;        /* n: sort keys / indices */
    uint32_t *u1;        /* n */
    uint8_t *b0, *b1;    /* n bytes each */
    float *big;          /* window scratch: W · n floats */
    uint8_t *levels;     /* window scratch: W · n levels */
    uint16_t *stage;     /* window staging: 2 · W · n BF16 (K then V) */
    size_t big_len;
};

/* Little-endian 16-bit fields of records, and element access by dtype. */
static inline void dq__put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline uint16_t dq__get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* A BF16 bit pattern as float (exact for every pattern, as dq_bf16_to_f32; inline so that loops
 * over BF16 data vectorize instead of calling through the PLT per element). */
static inline float dq__bf16_f32(uint16_t b)
{
    union {
        uint32_t u;
        float f;
    } x = {.u = (uint32_t)b << 16};
    return x.f;
}

/* A float as BF16, round to nearest even, a NaN kept a quiet NaN: dq_f32_to_bf16, inline and
 * without branches so that loops storing BF16 vectorize. */
static inline uint16_t dq__f32_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } x = {.f = f};
    const uint32_t u = x.u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float dq__load_elem(const void *src, dq_dtype t, size_t i)
{
    switch (t) {
    case DQ_DTYPE_F16:
        return dq_f16_to_f32(((const uint16_t *)src)[i]);
    case DQ_DTYPE_BF16:
        return dq__bf16_f32(((const uint16_t *)src)[i]);
    default:
        return ((const float *)src)[i];
    }
}

static inline void dq__store_elem(void *dst, dq_dtype t, size_t i, float v)
{
    switch (t) {
    case DQ_DTYPE_F16:
        ((uint16_t *)dst)[i] = dq_f32_to_f16(v);
        break;
    case DQ_DTYPE_BF16:
        ((uint16_t *)dst)[i] = dq__f32_bf16(v);
        break;
    default:
        ((float *)dst)[i] = v;
        break;
    }
}

/* Fills the tables of one kind (0: K, 1: V) of a DQ_CODEC_DQUANT profile whose levels and
 * frequencies are in range (profile.c; used by validation and by dq_codec_create). */
void dq__kind_tables_init(const dq_profile *p, int kind, dq__kind_tables *kt);

void *dq__alloc(const dq_allocator *a, size_t size);
void dq__free(const dq_allocator *a, void *p);

/* Log through the user callback (no-op when none). */
void dq__log(dq_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define DQ_LOG(level, ...) dq__log(level, __FILE__, __LINE__, __VA_ARGS__)

/* Checks (zstd RETURN_ERROR_IF / FORWARD_IF_ERROR): on failure, log the failed condition or call
 * with file:line at DEBUG level through the user's callback (nothing when none is set), then return
 * the negative code. For argument validation at public boundaries and error forwarding; lib has no
 * cleanup paths that need a goto. Invariants that no input can break are asserts instead. */
#define DQ_RETURN_IF(cond, err)                                      \
    do {                                                             \
        if (cond) {                                                  \
            DQ_LOG(DQ_LOG_DEBUG, "%s: %s", dq_err_name(err), #cond); \
            return (err);                                            \
        }                                                            \
    } while (0)
#define DQ_FORWARD_IF_ERROR(expr)                                             \
    do {                                                                      \
        int dq__e = (expr);                                                   \
        if (dq__e < 0) {                                                      \
            DQ_LOG(DQ_LOG_DEBUG, "%s failed: %s", #expr, dq_err_name(dq__e)); \
            return dq__e;                                                     \
        }                                                                     \
    } while (0)

/* Stream encoder with its diagnostics: levels (may be NULL) receives the final assignment. */
int dq__stream_encode_ex(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const float *y, uint8_t *record,
                         dq_encode_stats *stats, uint8_t *levels);

/* Baseline codecs (baseline.c). */
int dq__baseline_profile(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out);
int dq__baseline_validate(const dq_profile *p);
/* Record bytes per kind and key window header bytes of a baseline profile. */
size_t dq__baseline_record_bytes(const dq_profile *p, int kind);
size_t dq__baseline_header_bytes(const dq_profile *p);
void dq__baseline_setup(dq_codec *c);
int dq__baseline_encode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const void *x, dq_dtype dtype, size_t ntok,
                        uint8_t *header, uint8_t *records, size_t stride);
int dq__baseline_decode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const uint8_t *header,
                        const uint8_t *records, size_t stride, size_t ntok, void *out, dq_dtype dtype);

/* Key-mean block helpers (window of ntok rotated tokens, token-major [ntok][n]; sum: n floats of
 * scratch). */
int dq__mean_compute(const dq_codec *codec, const float *y, size_t ntok, uint8_t *mean_block, float *sum);
void dq__mean_dequant(const dq_codec *codec, const uint8_t *mean_block, float *mu);

/* Fast Walsh–Hadamard transform of len (power of two) floats, unnormalized, in place. */
void dq__fwht(float *x, uint32_t len);
/* Exact integer cost r = -log2(f/256) in Q16 for 1 <= f <= 256. */
int32_t dq__cost_q16(uint32_t f);

/* Canonical warp-order reduction (32 lanes, lane l sums i ≡ l mod 32 in order, then a butterfly),
 * the order the CUDA kernels use, so sums are bit-identical on CPU and GPU. */
double dq__sum_lanes_d(const double *v, uint32_t n);

#endif

/* Internals shared by the codec's source files. */
#ifndef DQ_CODEC_INTERNAL_H
#define DQ_CODEC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/log.h"
#include "rans.h"
#include "rans2.h"

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
    /* format version 2 (rans2.h): levels coded in pairs */
    uint32_t pairs;                            /* 1 for a version-2 profile */
    uint32_t cheap[2];                         /* the cheapest pair (version 1: cheapest, cheapest) */
    int32_t pair_cost_q16[DQ_RANS2_MAX_PAIRS]; /* r_ab = -log2(f_ab / 4096), Q16, exact integer algorithm */
    float pair_cost[DQ_RANS2_MAX_PAIRS];       /* pair_cost_q16 / 65536, exactly */
    dq__rans2_enc enc2;
    dq__rans2_dec dec2;
} dq__kind_tables;

/* The container of n levels of one kind (version 1 or 2): dq__rans_encode's contract with
 * cap = the kind's container. */
static inline uint32_t dq__kt_encode(const dq__kind_tables *kt, const uint8_t *levels, uint32_t n, uint8_t *scratch,
                                     uint8_t *out)
{
    return kt->pairs ? dq__rans2_encode(&kt->enc2, levels, n, scratch, out, kt->container)
                     : dq__rans_encode(&kt->enc, levels, n, scratch, out, kt->container);
}

/* Decodes one container (version 1 or 2): dq__rans_decode's contract. */
static inline int dq__kt_decode(const dq__kind_tables *kt, const uint8_t *in, uint32_t n, uint8_t *levels)
{
    return kt->pairs ? dq__rans2_decode(&kt->dec2, in, kt->container, n, levels)
                     : dq__rans_decode(&kt->dec, in, kt->container, n, levels);
}

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
    /* KVQ family (kvq_codec.c). A calibrated codec owns one view per layer: a copy of this struct
     * whose per-layer tables point into the root's memory; views are never freed on their own. */
    const dq_codec *root; /* the codec that owns the views and the shared tables (itself if none) */
    dq_codec *views;      /* kvq_layers views, or NULL */
    uint32_t nviews;
    void *kvq_mem;               /* root only: per-layer tables of every layer */
    float *kvq_haar;             /* root only: d × d Haar rotation (kvq_rotation 1), or NULL */
    float *kvq_ol_rot[2];        /* root only: Haar rotations of the outlier / regular parts */
    float *kvq_qjl;              /* root only: d × d Gaussian QJL projection S (IP keys) */
    uint32_t kvq_parts;          /* parts per head: 2 for outliers (outlier, regular), else 1 */
    uint32_t kvq_pdim[2];        /* coordinates of each part */
    uint32_t kvq_pbits[2][2];    /* [kind][part] bits per coordinate (PQ: bits per code) */
    const float *kvq_cent[2][2]; /* [kind][part] Lloyd–Max centroids */
    const float *kvq_bnd[2][2];  /* [kind][part] Lloyd–Max boundaries */
    uint32_t kvq_ip[2];          /* [kind] inner-product quantizer (QJL residual) */
    size_t kvq_off_rnorm[2];     /* [kind] byte offset of the residual norms (IP) */
    size_t kvq_off_lr[2];        /* [kind] byte offset of the U_s row (low rank, keys) */
    size_t kvq_off_bits[2];      /* [kind] byte offset of the packed indices */
    size_t kvq_head_bits[2];     /* [kind] packed bits per head */
    const uint16_t *kvq_perm[2]; /* [kind] outliers: H × d channel order, outliers first */
    const float *kvq_pq[2];      /* [kind] PQ: M × 2^B × (d / M) codebook */
    /* fixed-width family (fixed_codec.c): per kind the symbols per group, bits per group and M^k */
    uint32_t fx_k[2], fx_w[2];
    uint64_t fx_pow[2];
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
    float *kvq; /* KVQ codecs: scratch of kvq_len floats (dq__kvq_scratch_floats), else NULL */
    size_t kvq_len;
};

/* Whether ws may serve codec: made for it, or for another view of the same root. */
static inline int dq__ws_fits(const dq_workspace *ws, const dq_codec *codec)
{
    return ws->codec == codec || (ws->codec->root && ws->codec->root == codec->root);
}

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

/* The KVQuant++ family (kvq_codec.c, kvq_calib.c). */
int dq__kvq_validate(const dq_profile *p);
size_t dq__kvq_record_bytes(const dq_profile *p, int kind);
size_t dq__kvq_header_bytes(const dq_profile *p);
/* Fills the codec's shared KVQ state (rotations, codebooks, record layout); tables stay NULL until
 * dq__kvq_bind sets them from a calibration. Frees what it made on failure. */
int dq__kvq_setup(dq_codec *c);
void dq__kvq_release(dq_codec *c);
size_t dq__kvq_scratch_floats(const dq_codec *c);
/* The rotated parts (back to back, d floats) of head h of a token (xh: d original channels). */
void dq__kvq_head_forward(const dq_codec *c, int kind, uint32_t h, const float *xh, float *y, float *tmp);
/* Makes a codec without requiring calibration tables (calibration itself, and create_calibrated). */
int dq__codec_make(const dq_profile *profile, const dq_allocator *alloc, dq_codec **out);
int dq__kvq_encode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const void *x, dq_dtype dtype, size_t ntok,
                   uint8_t *header, uint8_t *records, size_t stride);
/* Decodes records [first, first + count) of a run that starts at records (a window's first record):
 * delta profiles decode from the nearest anchor at or before first. lowrank = 0 leaves out the
 * low-rank correction (attention adds it in factored form). out: f32 when dtype is F32. */
int dq__kvq_decode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const uint8_t *header, const uint8_t *records,
                   size_t stride, size_t first, size_t count, void *out, dq_dtype dtype, int lowrank);
/* Logits scale · q·k̂ of the W keys of one window for query heads [qh0, qh0 + qn) (group G), into
 * logit[h · ld + t], in each head's rotated domain: PQ through per-query lookup tables, IP keys'
 * QJL term as (S·q_rot)·z, the low-rank term as (q·V_rᵀ)·U_sᵀ; deltas accumulate. */
int dq__kvq_window_logits(const dq_codec *c, dq_workspace *ws, const uint8_t *window, const float *q, uint32_t qh0,
                          uint32_t qn, uint32_t G, float scale, float *logit, size_t ld);
/* dq_window_check for KVQ records: every fp16 field finite, norms not negative, the first record
 * of each kind an anchor for delta profiles. */
int dq__kvq_window_check(const dq_codec *c, const uint8_t *window);
/* The fixed-width family (fixed_codec.c, dq_profile_fixed). */
int dq__fixed_validate(const dq_profile *p);
void dq__fixed_setup(dq_codec *c);
/* One preprocessed stream y[n] into a record (4 + C bytes); levels (may be NULL) gets the levels. */
int dq__fixed_stream_encode(const dq_codec *c, dq_kind kind, const float *y, uint8_t *record, dq_encode_stats *stats,
                            uint8_t *levels);
/* Unpacks one container's n levels; DQ_CORRUPT when a group's value is >= M^k (its symbols) or a
 * bit past the groups is set (the levels are still written, each < M). */
int dq__fixed_unpack(const dq_codec *c, dq_kind kind, const uint8_t *container, uint8_t *levels);
/* Packs n levels (each < M) into one container of C bytes, base-M groups of k, bits past the
 * groups zero: what the encoder writes (dq__fixed_stream_encode) and dq_hot_rebuild rebuilds. */
void dq__fixed_pack(const dq_codec *c, dq_kind kind, const uint8_t *levels, uint8_t *container);

/* Codecs whose streams are levels on an affine grid with D-Quant's preprocessing and record layout
 * (D-Quant itself and the fixed-width family): attention, decoding and the hot layout share them. */
static inline int dq__codec_has_levels(const dq_codec *c)
{
    return c->profile.codec_type == DQ_CODEC_DQUANT || c->profile.codec_type == DQ_CODEC_FIXED;
}
/* The levels of count records of a kind (records[t · stride], [count][n] into levels) with the
 * codec's decoder; returns how many records were not valid streams. */
size_t dq__levels_decode(const dq_codec *c, dq_kind kind, const uint8_t *records, size_t stride, size_t count,
                         uint8_t *levels);

/* The codec of a layer (layer.c). */
struct dq_layer;
const dq_codec *dq__layer_codec(const struct dq_layer *layer);

/* Key-mean block helpers (window of ntok rotated tokens, token-major [ntok][n]; sum: n floats of
 * scratch). */
int dq__mean_compute(const dq_codec *codec, const float *y, size_t ntok, uint8_t *mean_block, float *sum);
void dq__mean_dequant(const dq_codec *codec, const uint8_t *mean_block, float *mu);

/* Fast Walsh–Hadamard transform of len (power of two) floats, unnormalized, in place. */
void dq__fwht(float *x, uint32_t len);
/* Exact integer cost r = -log2(f/256) in Q16 for 1 <= f <= 256. */
int32_t dq__cost_q16(uint32_t f);
/* The same for version 2's pair tables: -log2(f/4096) for 1 <= f <= 4096. */
int32_t dq__cost12_q16(uint32_t f);
/* log2(f) in Q16 for f >= 1 (the algorithm of both costs). */
int32_t dq__log2_q16(uint32_t f);

/* Canonical warp-order reduction (32 lanes, lane l sums i ≡ l mod 32 in order, then a butterfly),
 * the order the CUDA kernels use, so sums are bit-identical on CPU and GPU. */
double dq__sum_lanes_d(const double *v, uint32_t n);

#endif

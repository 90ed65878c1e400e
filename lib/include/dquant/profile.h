/* dquant — codec profiles (container format version 1).
 *
 * A profile is everything a decoder needs besides the bytes: the stream shape (kv_heads × head_dim
 * values per token), per kind (keys, values) the container size in bytes and the number of levels
 * with its integer frequency table, the sharpening used to make the tables, the key-mean window W,
 * the BF16 residual window R and the rotation seed. Frequency tables are computed once, when the
 * profile is made, and from then on travel as integers, so that every machine encodes and decodes
 * against the same table. A profile is plain data: copy it freely. */
#ifndef DQUANT_PROFILE_H
#define DQUANT_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DQ_FORMAT_VERSION 1
/* Format version 2: D-Quant containers with joint two-symbol rANS at 12-bit precision (specified
 * in lib/src/rans2.h); everything else is version 1's. Only for codec_type DQ_CODEC_DQUANT and
 * even n. Profiles "dq226p", "dq196p" (dq_profile_builtin). */
#define DQ_FORMAT_VERSION_PAIRS 2
#define DQ_MAX_LEVELS 32
#define DQ_MIN_LEVELS 2
#define DQ_MAX_STREAM 65536u    /* largest n = kv_heads × head_dim */
#define DQ_MAX_CONTAINER 65536u /* largest container, bytes */
#define DQ_PROFILE_NAME_MAX 32
#define DQ_PROFILE_SERIALIZED_MAX 512

typedef enum dq_kind {
    DQ_KIND_K = 0, /* keys: rotation, window mean removal, affine grid */
    DQ_KIND_V = 1, /* values: rotation, affine grid */
} dq_kind;

/* Which codec a profile describes. D-Quant is the format of this project; the others are the
 * baselines it is compared with (DESIGN §2.8), stored the same way (fixed-size records, windows
 * of W tokens, the BF16 tail) so the daemon can hold and attend over any of them. */
typedef enum dq_codec_type {
    DQ_CODEC_DQUANT = 0, /* D-Quant containers (the fields below) */
    DQ_CODEC_BF16 = 1,   /* passthrough: BF16 values */
    DQ_CODEC_INT = 2,    /* per-token asymmetric INT-b, fp16 scale/zero per group of `group` channels;
                            rotate = 1: per-head Hadamard first (QuaRot-style) */
    DQ_CODEC_KIVI = 3,   /* keys per channel over each window of W tokens, values per token (groups of
                            `group` channels), INT-b, fp16 scale/zero */
    DQ_CODEC_TURBO = 4,  /* TurboQuant-MSE: keys rotated, per-head norm (fp16), Lloyd–Max b-bit scalar
                            codebook for N(0,1); values per-token affine INT-b (groups of `group`) */
    DQ_CODEC_KVQ = 5,    /* the KVQuant++ family (dquant/kvq.h): fields kvq_* below */
    DQ_CODEC_FIXED = 6,  /* D-Quant's preprocessing with fixed-width coding (dq_profile_fixed): levels[]
                            per kind, base-M packed containers of container_bytes[] (derived) */
} dq_codec_type;

/* Quantizer of a DQ_CODEC_KVQ profile (dquant/kvq.h). */
typedef enum dq_kvq_variant {
    DQ_KVQ_LM = 0,      /* scalar Lloyd–Max on the Beta marginal, keys and values */
    DQ_KVQ_IP = 1,      /* keys: Lloyd–Max at bits−1 + 1-bit QJL of the residual; values: Lloyd–Max */
    DQ_KVQ_OUTLIER = 2, /* calibrated outlier channels at more bits, the rest at fewer */
    DQ_KVQ_PQ = 3,      /* product quantization with calibrated codebooks */
} dq_kvq_variant;

typedef struct dq_profile {
    uint32_t format_version;        /* DQ_FORMAT_VERSION (DQ_FORMAT_VERSION_PAIRS: version 2) */
    char name[DQ_PROFILE_NAME_MAX]; /* NUL-terminated, informational */
    uint32_t kv_heads;
    uint32_t head_dim;               /* power of two */
    uint32_t container_bytes[2];     /* C_K, C_V: payload bytes per stream (rANS state + bytes) */
    uint32_t levels[2];              /* M_K, M_V in [2, 32] */
    float alpha;                     /* sharpening exponent used to make the tables */
    uint32_t window;                 /* W: tokens per key-mean window (>= 1) */
    uint32_t residual;               /* R: BF16 tail, tokens (R >= W) */
    uint64_t rotation_seed;          /* 0: no sign flips (D = I) */
    uint16_t freq[2][DQ_MAX_LEVELS]; /* f_m >= 1, sum 256; entries past levels are 0 */
    /* Baselines (codec_type != DQ_CODEC_DQUANT): bits per symbol per kind, channel group size,
     * rotation on/off. For them container_bytes holds the record payload, levels = 2^bits, and the
     * frequency tables and alpha are unused (zero). */
    uint32_t codec_type; /* dq_codec_type; 0 = D-Quant */
    uint32_t bits[2];
    uint32_t group;
    uint32_t rotate;
    /* KVQ family (codec_type DQ_CODEC_KVQ; zero otherwise). bits[] are the per-coordinate bits of
     * keys and values (for DQ_KVQ_PQ: bits per code). */
    uint32_t kvq_variant;    /* dq_kvq_variant */
    uint32_t kvq_rotation;   /* 0: randomized Hadamard, 1: Haar-random SO(head_dim) */
    uint32_t kvq_outliers;   /* DQ_KVQ_OUTLIER: outlier channels per head */
    uint32_t kvq_pq_m;       /* DQ_KVQ_PQ: subspaces per head */
    uint32_t kvq_rank;       /* low-rank correction rank per window; 0: none */
    uint32_t kvq_anchor;     /* delta coding: an anchor every N tokens (window starts always); 0: no delta */
    float kvq_tau;           /* delta coding: anchor when |delta| / |x| > tau; 0: off */
    uint32_t kvq_layers;     /* layers of the calibration; 0: none */
    uint64_t kvq_calib_hash; /* xxHash64 of the serialized calibration; 0: none */
} dq_profile;

/* What dq_profile_make needs; fill with dq_profile_params_default() then change fields. */
typedef struct dq_profile_params {
    uint32_t kv_heads, head_dim;
    uint32_t container_bytes[2];
    uint32_t levels[2];
    float alpha;
    uint32_t window, residual;
    uint64_t rotation_seed;
    const char *name;        /* NULL: "custom" */
    uint32_t format_version; /* 0 or DQ_FORMAT_VERSION: version 1; DQ_FORMAT_VERSION_PAIRS: version 2 */
} dq_profile_params;

/* dq226 shape for n = 8 × 128: C 331/231, M 8/6, alpha 1.4, W = R = 128, seed 0x5eed. */
DQ_API void dq_profile_params_default(dq_profile_params *p);

/* Computes the frequency tables from Gaussian order statistics and fills *out.
 * Returns DQ_PROFILE for bad shapes or levels, DQ_CONTAINER_TOO_SMALL when even the all-cheapest
 * assignment of a stream does not fit its container. */
DQ_API int dq_profile_make(const dq_profile_params *params, dq_profile *out);

/* The built-in profiles, instantiated for a stream shape. Container sizes keep the payload bit
 * rate of the n = 1024 definition: C = round((rate · n + 32) / 8) bytes.
 *   "dq226": rate K 2.5547, V 1.7734 bits/value (C 331/231 at n = 1024), M 8/6 → 2.26 bits/value
 *   "dq196": rate K 2.2109, V 1.5234 bits/value (C 287/199 at n = 1024), M 7/5 → 1.96 bits/value
 * A name with the suffix "p" ("dq226p", "dq196p") is the same profile in format version 2 (joint
 * two-symbol rANS at 12-bit precision, same containers, levels and tables; n must be even).
 * Baseline, KVQuant++ and fixed-width names (dq_profile_fixed) are accepted too.
 * Returns DQ_PROFILE for an unknown name or bad shape. */
DQ_API int dq_profile_builtin(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out);
/* NULL-terminated list of the built-in D-Quant profile names. */
DQ_API const char *const *dq_profile_builtin_names(void);

/* Baseline profiles by name, for any shape, W = R = 128 and channel groups of 128 (or n when
 * smaller): "bf16"; "intB" (per-token INT-B, no rotation); "quarotB" (INT-B after the Hadamard
 * rotation); "kiviB"; "turboB"; B in 1..8 (e.g. "int2", "kivi2", "turbo2"). dq_profile_builtin
 * accepts these names too. */
DQ_API int dq_profile_baseline(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out);
/* NULL-terminated list of the baseline names at 2 bits (and "bf16"), as compared in the seed. */
DQ_API const char *const *dq_profile_baseline_names(void);

/* The fixed-width family (codec_type DQ_CODEC_FIXED): D-Quant's rotation, INT8 key window mean and
 * record layout (codec.h: fp16 s, fp16 o, container per stream; the key-mean block per window),
 * with each stream coded on a per-token min–max grid of M levels (nearest rounding, a least-squares
 * refit of s and o, fp16, nearest rounding again against the fp16 grid) instead of rANS. The
 * container packs the n levels in groups of k, each group the base-M number Σ_i m_{gk+i}·M^i in w
 * bits (w = ceil(k·log2 M) <= 32), groups back to back as a little-endian bit string, then zero
 * bits; k is the one that gives the fewest bytes (the smallest k on ties; k = 1, w = log2 M for
 * powers of two), so C = ceil(ceil(n/k)·w / 8) (dq_fixed_packing). Every symbol decodes with a
 * shift, a mask and divisions by M, and the hot layout (dquant/hot.h) holds the same levels at
 * b = ceil(log2 M) bits. A speed mode with a stated quality price: dq226 stays the default.
 *
 * Names: "fixedNNN" for a built-in D-Quant profile "dqNNN" (fixed226, fixed196): per kind
 * M = floor(2^(8·C/n)) (at most 256) with C that profile's container at the shape, the levels
 * fixed-width coding affords at its storage; the same window, residual and rotation seed.
 * "fixedkAvB": M_K = A, M_V = B levels (2..256), e.g. "fixedk8v4".
 * Returns DQ_PROFILE for another name, a bad shape or levels out of range. */
DQ_API int dq_profile_fixed(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out);
/* The fixed-width profile at the storage of a D-Quant profile (any, e.g. one scaled to a bit
 * budget): per kind M = floor(2^(8·C/n)), at most 256, with C its container; its window, residual
 * and rotation seed; name (NULL: "fixed"). DQ_PROFILE when dquant is not a valid D-Quant profile
 * or its containers afford fewer than 2 levels. */
DQ_API int dq_profile_fixed_matched(const dq_profile *dquant, const char *name, dq_profile *out);
/* A fixed-width profile from params: kv_heads, head_dim, levels, window, residual, rotation_seed
 * and name are used (container_bytes and alpha are ignored: the containers follow from n and M). */
DQ_API int dq_profile_fixed_make(const dq_profile_params *params, dq_profile *out);
/* The packing of n levels of M (2..256) values: symbols per group *k, bits per group *w; returns the
 * container bytes C, 0 for M out of range or n = 0. */
DQ_API uint32_t dq_fixed_packing(uint32_t n, uint32_t levels, uint32_t *k, uint32_t *w);
/* NULL-terminated list of the fixed-width names matching the built-in D-Quant profiles. */
DQ_API const char *const *dq_profile_fixed_names(void);

/* Checks every field of a profile that came from outside (wire, disk): shapes, levels, tables
 * summing to 256 with every f >= 1, containers large enough. Returns 0 or an error code. */
DQ_API int dq_profile_validate(const dq_profile *p);

/* Stored bits per value of one kind, every byte counted: container + fp16 scale/offset per token,
 * plus for keys the INT8 window mean (n bytes + fp16 scale per W tokens). */
DQ_API double dq_profile_bits_per_value(const dq_profile *p, dq_kind kind);
/* Mean of the two kinds. */
DQ_API double dq_profile_bits_per_value_mean(const dq_profile *p);

/* Fixed little-endian serialization ("DQPF", version, fields, FNV-1a 32 checksum).
 * serialize: writes at most cap bytes, sets *len; DQ_INVALID_ARGUMENT if cap is too small.
 * deserialize: validates fully (dq_profile_validate); DQ_TRUNCATED, DQ_CORRUPT, DQ_VERSION. */
DQ_API int dq_profile_serialize(const dq_profile *p, uint8_t *buf, size_t cap, size_t *len);
DQ_API int dq_profile_deserialize(const uint8_t *buf, size_t len, dq_profile *out);

/* The analytic model alone: symbol probabilities of an n-value Gaussian stream on an M-level
 * min–max grid (p[M], summing to 1), and the sharpened integer table (f[M], sum 256, f >= 1). */
DQ_API int dq_model_probabilities(uint32_t n, uint32_t levels, double *p);
DQ_API int dq_model_freq_table(uint32_t n, uint32_t levels, float alpha, uint16_t *freq);

#ifdef __cplusplus
}
#endif
#endif

/* dquant — the KVQuant++ / TurboQuant++ codec family (second seed, ../shared/seeds/001_…).
 *
 * Rotated vector quantizers beside D-Quant, in the same storage model (fixed-size records per
 * token and kind, a window header per W tokens, the BF16 tail of the layer) so that dquantd holds,
 * serves and attends over them like any profile (codec_type DQ_CODEC_KVQ). This header has two
 * parts:
 *
 *   1. the numerical toolbox (pure functions, used by the codecs, the evaluation and the tests):
 *      Lloyd–Max codebooks on the true coordinate marginal of a rotated unit vector, bucketize,
 *      Haar SO(d) and Hadamard rotations, k-means++ / k-means, QJL sketches, product quantization,
 *      randomized SVD, canonical Huffman codes, attention-weighted bit assignment;
 *   2. the codec family: profile names, per-layer calibration (a serialized blob that travels with
 *      the model's profile), per-layer codec views, and the calls that take more than records
 *      (low-rank attention, PQ lookup-table attention, attention-weighted encoding).
 *
 * Profile names (dq_profile_kvq; dq_profile_builtin accepts them too), B in 1..8 bits per
 * coordinate unless said otherwise, per head of head_dim coordinates:
 *   "lmB"        scalar Lloyd–Max (Beta marginal) for keys and values, per-head fp16 norm; Hadamard
 *   "lmhB"       the same with a Haar-random SO(d) rotation instead of the Hadamard one
 *   "ipB"        keys: inner-product quantizer (lm at B−1 bits + 1-bit QJL of the residual + fp16
 *                residual norm); values: lm at B bits (K/V asymmetric, seed §2.2.9). B >= 2;
 *                "iphB" with the Haar rotation
 *   "olB"        outlier channels (calibrated per layer, head_dim/4 per head by default) at B+1
 *                bits, the rest at B−1, keys and values (seed §5.1); needs calibration; B 2..7.
 *                Outliers are raw (unrotated) channels picked by calibration variance, as the
 *                seed's OutlierKVQuant does; the two channel sets are then quantized independently
 *                (each with its own fp16 norm and a Haar rotation of its own size, since d/4 and
 *                3d/4 are not powers of two). Suffix "+oO" sets O outliers per head (1..d−1),
 *                e.g. "ol2+o32" at d = 64 has the coordinate bits of "lm2"
 *   "pqMxB"      product quantization: M subspaces per head after the rotation, 2^B-entry
 *                k-means++ codebooks per layer and kind (e.g. "pq16x8"); needs calibration.
 *                Vectors are normalized per head (fp16 norm) and rotated (Hadamard); one codebook
 *                per subspace, shared by the heads of a layer and kind
 *   suffix "+lrR" low-rank error correction of rank R (1..64, <= W) per window, keys only (the
 *                values have no window header in this storage model): window header V_r (R × n
 *                fp16), record U_s row (R fp16), e.g. "ip3+lr4"
 *   suffix "+dN"  delta coding within windows: anchors at window starts and every N tokens, and
 *                adaptively when ‖δ‖/‖x‖ > τ (profile field kvq_tau, 0.5 by default; over the whole
 *                token); deltas to the previous reconstruction, quantized by the same quantizer
 *                (scaled by the delta's norm); records stay addressable per window
 * Suffixes come in this order, each at most once: "+oO", "+lrR", "+dN" (e.g. "ol3+o8+lr2+d16").
 *
 * Record of one token and kind (fixed size, little endian), H = kv_heads, d = head_dim, P = 2
 * parts per head for "ol" (outlier, regular), else 1:
 *   offset 0           H·P fp16 norms ([head][part]); bit 15 of the first is the anchor flag of
 *                      "+dN" profiles (1: anchor; a norm is never negative), 0 otherwise
 *   then               IP keys: H fp16 QJL residual norms
 *   then               "+lrR" keys: R fp16, the token's row of U_s = U_r·Σ_r
 *   then               the indices, bit-packed LSB first, head after head; per head each part's
 *                      coordinates (in the part's rotated domain) at the part's bits, then for IP
 *                      keys d QJL sign bits (1: (S·r)_i >= 0, S a d × d Gaussian from the rotation
 *                      seed); PQ: M codes of B bits instead
 * Key window header ("+lrR" only, else none): V_r, R × n fp16, row-major.
 * dq_tokens_decode of a "+dN" run must start at an anchor (DQ_CORRUPT otherwise);
 * dq_layer_decode finds the anchor itself. dq_window_check checks every fp16 field and the anchor
 * flags. dq_attend scores keys in each head's rotated domain (the query rotated per head and window): PQ
 * through per-query lookup tables (q_rot · codebook entries), IP keys' QJL term as (S·q_rot)·z,
 * the low-rank term as (q·V_rᵀ)·U_sᵀ without materializing corrected keys, deltas accumulated;
 * values are decoded per window. Each item is decoded with its layer's codec (view).
 * Every byte is counted in dq_profile_bits_per_value. */
#ifndef DQUANT_KVQ_H
#define DQUANT_KVQ_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/export.h"
#include "dquant/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- 1. Toolbox ------------------------------------------------------------------------------ */

/* Lloyd–Max codebook of 2^bits centroids (ascending, symmetric) and 2^bits − 1 boundaries for one
 * coordinate of a uniformly random unit vector in R^dim: density ∝ (1 − t²)^((dim−3)/2) on [−1, 1]
 * (computed by Gauss–Legendre quadrature on that density with t = sin θ, which also covers dim = 2
 * where the density is singular at ±1; not a Gaussian approximation), converged to the fixed point
 * centroid = conditional mean of its cell. boundaries[i] is the largest float not strictly closer to
 * centroids[i+1] than to centroids[i], so bucketize and argmin agree on every float. bits 1..8,
 * dim >= 2 (else DQ_INVALID_ARGUMENT); DQ_NOMEM. Computed once per (bits, dim) and cached
 * (thread-safe); the pointers stay valid until exit. Either output pointer may be NULL. */
DQ_API int dq_kvq_codebook(uint32_t bits, uint32_t dim, const float **centroids, const float **boundaries);
/* Index of the interval of x among count ascending boundaries (0..count): the number of boundaries
 * < x, by binary search (a value equal to a boundary goes to the lower cell). ±inf give count / 0;
 * NaN gives 0 (callers reject NaN before: the codecs return DQ_NONFINITE). */
DQ_API uint32_t dq_kvq_bucketize(float x, const float *boundaries, uint32_t count);
/* The nearest of count ascending centroids by an argmin of |x − c| over all of them (the seed's
 * "before"; kept for the benchmark): distances compared exactly, ties to the lower index; ±inf give
 * the last / first, NaN gives 0. Equal to dq_kvq_bucketize with dq_kvq_codebook's boundaries. */
DQ_API uint32_t dq_kvq_nearest_argmin(float x, const float *centroids, uint32_t count);

/* Haar-random rotation of R^dim from the seed: QR of a Gaussian matrix with R's diagonal made
 * positive and, when det(Q) < 0, the first column negated, so Q ∈ SO(d). out: dim × dim row-major.
 * Deterministic for (dim, seed). */
DQ_API int dq_kvq_haar(uint32_t dim, uint64_t seed, float *out);
/* Determinant sign of a dim × dim row-major matrix (+1 / −1 / 0), for tests. */
DQ_API int dq_kvq_det_sign(const float *m, uint32_t dim);

/* k-means++ seeding then Lloyd iterations of k centroids of dim-dimensional points (count × dim,
 * row-major). seeding only (iters = 0) is what the seed's initialisation claim measures. Returns
 * the final mean squared error per point in *mse (may be NULL). */
DQ_API int dq_kvq_kmeans(const float *points, size_t count, uint32_t dim, uint32_t k, uint32_t iters, uint64_t seed,
                         float *centroids, double *mse);
/* The same with centroids seeded uniformly on [min, max] per coordinate (the seed's "before"). */
DQ_API int dq_kvq_kmeans_linspace(const float *points, size_t count, uint32_t dim, uint32_t k, uint32_t iters,
                                  float *centroids, double *mse);

/* Randomized SVD (Halko–Martinsson–Tropp, oversampling 10, power iterations `power`) of A
 * (rows × cols, row-major): the top `rank` singular triplets. u: rows × rank, s: rank, vt:
 * rank × cols. Deterministic for the seed. For rows < 64 an exact SVD (one-sided Jacobi). */
DQ_API int dq_kvq_rsvd(const float *a, uint32_t rows, uint32_t cols, uint32_t rank, uint32_t power, uint64_t seed,
                       float *u, float *s, float *vt);

/* Canonical Huffman code of `count` symbols with frequencies freq (0 allowed), code lengths
 * bounded by max_len (<= 24): lengths out. Returns total bits for the frequencies in *bits. */
DQ_API int dq_kvq_huffman_lengths(const uint64_t *freq, uint32_t count, uint32_t max_len, uint8_t *lengths,
                                  uint64_t *bits);
/* Encodes / decodes symbols with canonical codes of these lengths (MSB-first bit order).
 * encode: DQ_INVALID_ARGUMENT when cap is too small; decode: DQ_CORRUPT on an invalid code. */
DQ_API int dq_kvq_huffman_encode(const uint8_t *lengths, uint32_t count, const uint8_t *symbols, size_t nsym,
                                 uint8_t *out, size_t cap, size_t *bits);
DQ_API int dq_kvq_huffman_decode(const uint8_t *lengths, uint32_t count, const uint8_t *in, size_t bits,
                                 uint8_t *symbols, size_t nsym);

/* ---- 2. The codec family ----------------------------------------------------------------------- */

/* A KVQ profile by name (grammar above) for a shape. Returns DQ_PROFILE for an unknown name or a
 * parameter out of range. A profile that needs calibration (outliers, PQ) is made with its
 * calibration hash 0; dq_kvq_calibrate fills it. */
DQ_API int dq_profile_kvq(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out);
/* Whether a profile needs calibration to make a codec. */
DQ_API int dq_profile_needs_calibration(const dq_profile *p);

/* Per-layer calibration (seed §7 "per-layer calibration"): from sample K/V of each layer
 * (k, v: [layers][tokens][kv_heads][head_dim], f32, a few sequences concatenated; tokens >= 64
 * and >= the codebook size for PQ), outlier channels by variance (on the deltas for "+dN"
 * profiles), PQ codebooks by k-means++ / k-means. Writes the serialized calibration ("DQKC",
 * little endian, xxHash64 checksum) to a buffer it allocates (free with dq_kvq_free), and sets the
 * profile's calibration hash and layer count. DQ_INVALID_ARGUMENT for too few tokens (< 64; PQ:
 * fewer non-zero head vectors than codebook entries), DQ_NONFINITE for NaN/Inf, DQ_PROFILE for a
 * profile that is not DQ_CODEC_KVQ. Profiles without tables ("lm", "ip") get a blob of no tables,
 * which gives them per-layer views all the same. PQ trains on at most 4096 sub-vectors per
 * subspace (evenly strided), 12 Lloyd iterations after k-means++.
 *
 * Calibration blob ("DQKC", little endian):
 *   0 "DQKC"; 4 u32 version 1; 8 u32 layers (1..65536); 12 u32 kv_heads; 16 u32 head_dim;
 *   20 u32 variant; 24 u32 bits K; 28 u32 bits V; 32 u32 outliers per head; 36 u32 PQ subspaces;
 *   40 u32 delta anchor interval (statistics taken on consecutive differences when not 0);
 *   44 u32 table format (1: fp16 codebooks); 48 per layer, per kind (K, V): "ol": H × O u16
 *   channel indices, strictly ascending per head; "pq": M × 2^B × (d/M) fp16 codebook (subspace,
 *   entry, coordinate) of unit-sphere sub-vectors; other variants nothing;
 *   end − 8: u64 xxHash64 (seed 0) of every byte before it = the profile's kvq_calib_hash.
 * Calibration tables are per model, not per token: not counted in bits/value. */
DQ_API int dq_kvq_calibrate(dq_profile *p, uint32_t layers, const float *k, const float *v, size_t tokens,
                            uint64_t seed, uint8_t **calib, size_t *calib_len);
DQ_API void dq_kvq_free(void *p);
/* Validates a serialized calibration against a profile (shape, layer count, hash, checksum):
 * DQ_TRUNCATED (shorter than its header says), DQ_CORRUPT (bad magic, longer than its header says,
 * checksum, out-of-range channel index, non-finite codebook entry), DQ_VERSION, DQ_PROFILE (a
 * field, the layer count or the hash differs from the profile's). *layers may be NULL. */
DQ_API int dq_kvq_calibration_check(const dq_profile *p, const uint8_t *calib, size_t len, uint32_t *layers);

/* A codec with its calibration (copied); for profiles without calibration calib may be NULL and
 * this is dq_codec_create (which refuses profiles that need calibration: DQ_PROFILE). The codec
 * serves every layer of the calibration through views; the codec itself encodes as layer 0.
 * A workspace of the codec serves every view (and vice versa). */
DQ_API int dq_codec_create_calibrated(const dq_profile *profile, const uint8_t *calib, size_t calib_len,
                                      const dq_allocator *alloc, dq_codec **out);
/* The codec of one layer: a view owned by codec (same profile, record sizes and workspaces; the
 * layer's own codebooks), or codec itself when it has no per-layer calibration; NULL when layer
 * is out of range of the calibration. Layers made with dq_layer_create(view, …) encode and decode
 * with that layer's tables; dq_attend(codec, …) takes items of any view of the codec. A view lives
 * as long as its codec; dq_codec_free(view) does nothing. */
DQ_API const dq_codec *dq_codec_layer(const dq_codec *codec, uint32_t layer);

/* Attention-weighted bit assignment (seed §3.1): tokens ranked by the attention the queries q
 * ([nq][head_dim] per KV head group, f32) give them, the top `frac_hi` at bits_hi, the rest at
 * bits_lo; tier[t] = 1 for high. Returns the average bits in *avg_bits. */
DQ_API int dq_kvq_assign_bits(const float *k, size_t tokens, uint32_t kv_heads, uint32_t head_dim, const float *q,
                              uint32_t q_heads, size_t nq, float frac_hi, uint8_t *tier);

#ifdef __cplusplus
}
#endif
#endif

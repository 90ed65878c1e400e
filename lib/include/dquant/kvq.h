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

/* Haar-random rotation of R^dim from the seed: QR (Householder, double) of a dim × dim standard
 * Gaussian matrix (xoshiro256** seeded by splitmix64, Box–Muller; the same on every platform), Q's
 * columns multiplied by sign(R_jj) (Haar on O(d)) and, when det(Q) < 0, the first column negated,
 * so Q ∈ SO(d) — never a reflection. out: dim × dim row-major (y = out·x rotates x). Deterministic
 * for (dim, seed). dim 1..65535 (else DQ_INVALID_ARGUMENT); DQ_NOMEM. */
DQ_API int dq_kvq_haar(uint32_t dim, uint64_t seed, float *out);
/* Sign of the determinant of a dim × dim row-major matrix into *sign (+1 / −1, or 0 when a pivot of
 * LU with partial pivoting falls below dim·2^−52·max|m|), for tests. DQ_INVALID_ARGUMENT,
 * DQ_NONFINITE for NaN/Inf entries, DQ_NOMEM. */
DQ_API int dq_kvq_det_sign(const float *m, uint32_t dim, int *sign);

/* k-means++ seeding (first centroid uniform, then D²-weighted draws from the seeded generator) and
 * `iters` Lloyd iterations (assignment to the nearest centroid, centroid = mean; an empty cluster
 * takes the point farthest from its centroid; stops early when no assignment changes) of k
 * centroids (k × dim, row-major, written) of count points (count × dim, row-major). iters = 0 is
 * seeding only (what the seed's initialisation claim measures). *mse (may be NULL): the mean over
 * points of the squared distance to the nearest final centroid. Deterministic for the seed.
 * DQ_INVALID_ARGUMENT for count 0, dim 0, k 0 or k > count; DQ_NONFINITE; DQ_NOMEM. */
DQ_API int dq_kvq_kmeans(const float *points, size_t count, uint32_t dim, uint32_t k, uint32_t iters, uint64_t seed,
                         float *centroids, double *mse);
/* The same with centroids seeded uniformly on [min, max] per coordinate (the seed's "before":
 * centroid m at min + (max − min)·m/(k − 1)). */
DQ_API int dq_kvq_kmeans_linspace(const float *points, size_t count, uint32_t dim, uint32_t k, uint32_t iters,
                                  float *centroids, double *mse);

/* QJL (1-bit quantized Johnson–Lindenstrauss) sketch of a residual r ∈ R^dim for the inner-product
 * quantizer: S is dim × dim with i.i.d. N(0, 1) entries (row-major, from the seed by
 * dq_kvq_qjl_matrix: callers keep it), the sketch is sign(S·r) — bit i of bits (LSB-first, (dim + 7)/8
 * bytes) set when (S·r)_i >= 0 — plus ‖r‖, and
 *     <y, r> ≈ sqrt(π/2)/dim · ‖r‖ · <S·y, sign(S·r)>
 * is unbiased (E over S) with variance (π/2·‖y‖²‖r‖² − <y, r>²)/dim.
 * DQ_INVALID_ARGUMENT for dim 0 (> 65535 for the matrix) or NULL; DQ_NONFINITE for NaN/Inf in r, y
 * or norm. */
DQ_API int dq_kvq_qjl_matrix(uint32_t dim, uint64_t seed, float *s);
/* The sketch of r: bits, and ‖r‖ in *norm (may be NULL). */
DQ_API int dq_kvq_qjl_sign(const float *s, uint32_t dim, const float *r, uint8_t *bits, float *norm);
/* The estimate of <y, r> from the sketch (bits, norm >= 0) into *out. */
DQ_API int dq_kvq_qjl_dot(const float *s, uint32_t dim, const float *y, const uint8_t *bits, float norm, float *out);
/* The same split for attention: sy = S·y once per query, then dq_kvq_qjl_estimate per key (no
 * checks: sy from dq_kvq_qjl_project, bits and norm from dq_kvq_qjl_sign). */
DQ_API int dq_kvq_qjl_project(const float *s, uint32_t dim, const float *y, float *sy);
DQ_API float dq_kvq_qjl_estimate(const float *sy, uint32_t dim, const uint8_t *bits, float norm);

/* Randomized SVD (Halko–Martinsson–Tropp 2011: Gaussian sketch of rank + 10 columns, `power`
 * power iterations each re-orthonormalized by Householder QR, then the exact SVD of the small
 * B = QᵀA by one-sided Jacobi; all in double) of A (rows × cols, row-major): the top `rank`
 * singular triplets, descending, each signed so that the largest |entry| of its u column is
 * positive. u: rows × rank, s: rank, vt: rank × cols (row-major). Deterministic for the seed. For
 * rows < 64 an exact SVD (one-sided Jacobi on A). DQ_INVALID_ARGUMENT for rows or cols 0, rank 0 or
 * > min(rows, cols), power > 64, rows·cols > 2^31 or NULL; DQ_NONFINITE; DQ_NOMEM. */
DQ_API int dq_kvq_rsvd(const float *a, uint32_t rows, uint32_t cols, uint32_t rank, uint32_t power, uint64_t seed,
                       float *u, float *s, float *vt);

/* Length-limited Huffman code lengths of `count` (1..256) symbols with frequencies freq (0 allowed:
 * length 0, no code), bounded by max_len (1..24), by package-merge (optimal under the bound; a
 * single used symbol gets length 1): lengths out. The total bits for the frequencies in *bits (may
 * be NULL). DQ_INVALID_ARGUMENT for sizes out of range, more used symbols than 2^max_len, or a total
 * frequency >= 2^58; DQ_NOMEM. */
DQ_API int dq_kvq_huffman_lengths(const uint64_t *freq, uint32_t count, uint32_t max_len, uint8_t *lengths,
                                  uint64_t *bits);
/* Encodes / decodes symbols with the canonical code of these lengths (deflate's order: shorter codes
 * first, then by symbol; bits MSB-first in each byte, the last byte zero-padded). Lengths > 24 or a
 * Kraft sum > 1: DQ_INVALID_ARGUMENT. encode: *bits receives the bit count; DQ_INVALID_ARGUMENT when
 * cap (bytes) is too small or a symbol has no code. decode: exactly nsym symbols from exactly `bits`
 * bits: DQ_CORRUPT on a bit string that is no code (incomplete codes) or on bits left over,
 * DQ_TRUNCATED when the bits end inside the nsym symbols. */
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

/* Attention-weighted bit assignment (seed §3.1): k is [tokens][kv_heads][head_dim] and q is
 * [nq][q_heads][head_dim] (f32, rotated or not, as long as both alike). For each query and query head
 * h, softmax(q·kᵀ/sqrt(head_dim)) over all the tokens (no causal mask) with KV head
 * h / (q_heads / kv_heads) (GQA); a token's importance is the MAX of its weights over queries and
 * heads (a token one head relies on is kept sharp even if the others ignore it). The
 * round(frac_hi · tokens) (half up) most important tokens get tier[t] = 1 (bits_hi), the others 0;
 * ties go to the earlier token. The caller's average bits: lo + (hi − lo)·n_hi/tokens.
 * DQ_INVALID_ARGUMENT for tokens, nq, heads or head_dim 0, q_heads not a multiple of kv_heads,
 * frac_hi outside [0, 1] or NaN, NULL; DQ_NONFINITE for NaN/Inf in k or q; DQ_NOMEM. */
DQ_API int dq_kvq_assign_bits(const float *k, size_t tokens, uint32_t kv_heads, uint32_t head_dim, const float *q,
                              uint32_t q_heads, size_t nq, float frac_hi, uint8_t *tier);

#ifdef __cplusplus
}
#endif
#endif

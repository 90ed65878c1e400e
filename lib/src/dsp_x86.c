/* Fast kernels: a multi-stream rANS decoder (8 interleaved states: the per-symbol dependency chain
 * of one stream is the bottleneck, independent streams fill the pipeline), portable C installed on
 * every CPU; on x86-64 with AVX2, the same decoder on 16 streams in vectors (gathers), and AVX2+FMA
 * dot/axpy. */
#include <string.h>

#include "codec_internal.h"
#include "dsp.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DQ_X86 1
#endif

#define LANES 8

static inline uint32_t load_state(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* dq__rans_decode's verdict on a stream decoded to state x with the next byte at ptr: corrupt (1)
 * when it ran past the container, did not end in the initial state, or left nonzero bytes. */
static int stream_bad(const uint8_t *in, uint32_t C, uint32_t x, uint32_t ptr, uint32_t overrun)
{
    int bad = overrun || x != DQ_RANS_L;
    for (uint32_t i = ptr; !bad && i < C; i++)
        bad = in[i] != 0;
    return bad;
}

/* Same semantics as dq__rans_decode for every input, valid or not. */
static size_t decode_group(const dq__rans_dec *dec, const uint8_t *const *in, uint32_t C, uint32_t n,
                           uint8_t *const *out)
{
    uint32_t x[LANES], ptr[LANES], overrun[LANES];
    for (int l = 0; l < LANES; l++) {
        x[l] = load_state(in[l]);
        ptr[l] = DQ_RANS_STATE_BYTES;
        overrun[l] = 0;
    }
    const uint32_t *T = dec->entry;
    for (uint32_t i = 0; i < n; i++) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 8
#endif
        for (int l = 0; l < LANES; l++) {
            /* branchless: the renormalization happens for ~1/3 of the symbols, unpredictably */
            uint32_t e = T[x[l] & 0xffu];
            out[l][i] = (uint8_t)e;
            uint32_t xn = (e >> 16) * (x[l] >> 8) + ((e >> 8) & 0xffu);
            uint32_t need = xn < DQ_RANS_L;
            uint32_t have = ptr[l] < C;
            uint32_t take = need & have;
            uint32_t b = in[l][have ? ptr[l] : 0] & (0u - take);
            overrun[l] |= need & (have ^ 1u);
            ptr[l] += take;
            x[l] = (xn << (need << 3)) | b;
        }
    }
    size_t corrupt = 0;
    for (int l = 0; l < LANES; l++)
        corrupt += (size_t)stream_bad(in[l], C, x[l], ptr[l], overrun[l]);
    return corrupt;
}

static size_t decode_levels_multi(const dq__rans_dec *dec, const uint8_t *records, size_t stride, size_t count,
                                  uint32_t C, uint32_t n, uint8_t *levels)
{
    size_t corrupt = 0, i = 0;
    if (C >= DQ_RANS_STATE_BYTES) {
        for (; i + LANES <= count; i += LANES) {
            const uint8_t *in[LANES];
            uint8_t *out[LANES];
            int ok = 1;
            for (int l = 0; l < LANES; l++) {
                in[l] = records + (i + (size_t)l) * stride + 4;
                out[l] = levels + (i + (size_t)l) * n;
                uint32_t x0 = load_state(in[l]);
                ok &= x0 >= DQ_RANS_L && x0 < (DQ_RANS_L << 8);
            }
            if (ok) {
                corrupt += decode_group(dec, in, C, n, out);
            } else {
                for (int l = 0; l < LANES; l++)
                    corrupt += dq__rans_decode(dec, in[l], C, n, out[l]) != DQ_OK;
            }
        }
    }
    for (; i < count; i++)
        corrupt += dq__rans_decode(dec, records + i * stride + 4, C, n, levels + i * n) != DQ_OK;
    return corrupt;
}

#ifdef DQ_X86
/* decode_group's steps for VG vectors of 8 streams at once (AVX2): the table lookups and the
 * renormalization bytes are gathers, the symbols of a chunk of steps go to a buffer and are then
 * written out per stream. Vectors of independent streams interleave their dependency chains. The
 * same operations as decode_group on every lane, so the same levels and verdicts for every input.
 * Streams must start at in0 + l·stride (l < 8·VG, offsets below 2^31) with C >= 4. */
#define VG 2
#define CHUNK 64

__attribute__((target("avx2"))) static size_t decode_vec_avx2(const dq__rans_dec *dec, const uint8_t *in0,
                                                              size_t stride, uint32_t C, uint32_t n, uint8_t *out0)
{
    const __m256i ff = _mm256_set1_epi32(0xff), eight = _mm256_set1_epi32(8), zero = _mm256_setzero_si256();
    const __m256i vc = _mm256_set1_epi32((int)C), vcm4 = _mm256_set1_epi32((int)(C - 4));
    /* byte 0 of each 32-bit lane to the low 4 bytes of each 128-bit half, then the halves together */
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    const int *T = (const int *)dec->entry;
    __m256i x[VG], p[VG], ov[VG], off[VG];
    for (int g = 0; g < VG; g++) {
        int o[8];
        for (int l = 0; l < 8; l++)
            o[l] = (int)((size_t)(8 * g + l) * stride);
        off[g] = _mm256_loadu_si256((const __m256i *)(const void *)o);
        uint32_t s0[8];
        for (int l = 0; l < 8; l++)
            s0[l] = load_state(in0 + (size_t)(8 * g + l) * stride);
        x[g] = _mm256_loadu_si256((const __m256i *)(const void *)s0);
        p[g] = _mm256_set1_epi32(DQ_RANS_STATE_BYTES);
        ov[g] = zero;
    }
    uint8_t buf[VG][CHUNK][8];
    for (uint32_t i0 = 0; i0 < n; i0 += CHUNK) {
        const uint32_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (uint32_t s = 0; s < m; s++) {
            for (int g = 0; g < VG; g++) {
                const __m256i e = _mm256_i32gather_epi32(T, _mm256_and_si256(x[g], ff), 4);
                const __m256i lv = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e, pick), join);
                _mm_storel_epi64((__m128i *)(void *)buf[g][s], _mm256_castsi256_si128(lv));
                const __m256i xn = _mm256_add_epi32(
                    _mm256_mullo_epi32(_mm256_srli_epi32(e, 16), _mm256_srli_epi32(x[g], 8)),
                    _mm256_and_si256(_mm256_srli_epi32(e, 8), ff));
                const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(xn, 23), zero); /* xn < DQ_RANS_L */
                const __m256i have = _mm256_cmpgt_epi32(vc, p[g]);
                const __m256i take = _mm256_and_si256(need, have);
                ov[g] = _mm256_or_si256(ov[g], _mm256_andnot_si256(have, need));
                /* the byte at p as the low byte of the word at min(p, C - 4): never past the container */
                const __m256i at = _mm256_min_epu32(p[g], vcm4);
                const __m256i w = _mm256_mask_i32gather_epi32(zero, (const int *)(const void *)in0,
                                                              _mm256_add_epi32(off[g], at), take, 1);
                const __m256i b = _mm256_and_si256(
                    _mm256_srlv_epi32(w, _mm256_slli_epi32(_mm256_sub_epi32(p[g], at), 3)), ff);
                p[g] = _mm256_sub_epi32(p[g], take);
                x[g] = _mm256_or_si256(_mm256_sllv_epi32(xn, _mm256_and_si256(need, eight)), b);
            }
        }
        for (int g = 0; g < VG; g++)
            for (int l = 0; l < 8; l++) {
                uint8_t *o = out0 + (size_t)(8 * g + l) * n + i0;
                for (uint32_t s = 0; s < m; s++)
                    o[s] = buf[g][s][l];
            }
    }
    size_t corrupt = 0;
    for (int g = 0; g < VG; g++) {
        uint32_t xs[8], ps[8], os[8];
        _mm256_storeu_si256((__m256i *)(void *)xs, x[g]);
        _mm256_storeu_si256((__m256i *)(void *)ps, p[g]);
        _mm256_storeu_si256((__m256i *)(void *)os, ov[g]);
        for (int l = 0; l < 8; l++)
            corrupt += (size_t)stream_bad(in0 + (size_t)(8 * g + l) * stride, C, xs[l], ps[l], os[l]);
    }
    return corrupt;
}

/* decode_levels_multi with decode_vec_avx2 for every 8·VG streams whose states all start in range. */
__attribute__((target("avx2"))) static size_t decode_levels_avx2(const dq__rans_dec *dec, const uint8_t *records,
                                                                 size_t stride, size_t count, uint32_t C, uint32_t n,
                                                                 uint8_t *levels)
{
    size_t corrupt = 0, i = 0;
    if (C >= DQ_RANS_STATE_BYTES && stride * (8 * VG) < ((size_t)1 << 31)) {
        for (; i + 8 * VG <= count; i += 8 * VG) {
            int ok = 1;
            for (int l = 0; l < 8 * VG; l++) {
                const uint32_t x0 = load_state(records + (i + (size_t)l) * stride + 4);
                ok &= x0 >= DQ_RANS_L && x0 < (DQ_RANS_L << 8);
            }
            if (ok)
                corrupt += decode_vec_avx2(dec, records + i * stride + 4, stride, C, n, levels + i * n);
            else
                corrupt += decode_levels_multi(dec, records + i * stride, stride, 8 * VG, C, n, levels + i * n);
        }
    }
    return corrupt + decode_levels_multi(dec, records + i * stride, stride, count - i, C, n, levels + i * n);
}

/* The sum of the 16 lanes of two accumulators. */
__attribute__((target("avx2,fma"))) static inline float hsum2_avx(__m256 a, __m256 b)
{
    a = _mm256_add_ps(a, b);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static float dot_u8_avx2(const float *q, const uint8_t *lev, size_t len,
                                                             float center)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), vc = _mm256_set1_ps(center);
    size_t j = 0;
    for (; j + 16 <= len; j += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(lev + j));
        __m256 l0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), vc);
        __m256 l1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))), vc);
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), l0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), l1, acc1);
    }
    float r = hsum2_avx(acc0, acc1);
    for (; j < len; j++)
        r += q[j] * ((float)lev[j] - center);
    return r;
}

__attribute__((target("avx2,fma"))) static void axpy_u8_avx2(float *acc, float w, const uint8_t *lev, size_t len,
                                                             float center)
{
    __m256 vw = _mm256_set1_ps(w), vc = _mm256_set1_ps(center);
    size_t j = 0;
    for (; j + 8 <= len; j += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(lev + j));
        __m256 l = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), vc);
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(vw, l, _mm256_loadu_ps(acc + j)));
    }
    for (; j < len; j++)
        acc[j] += w * ((float)lev[j] - center);
}

/* Eight BF16 patterns widened to floats: the 16 bits become the high half of each 32-bit lane. */
__attribute__((target("avx2,fma"))) static inline __m256 bf16x8(const uint16_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const float *q, const uint16_t *k, size_t len)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= len; j += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), bf16x8(k + j), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), bf16x8(k + j + 8), acc1);
    }
    float r = hsum2_avx(acc0, acc1);
    for (; j < len; j++)
        r += q[j] * dq__bf16_f32(k[j]);
    return r;
}

__attribute__((target("avx2,fma"))) static void axpy_bf16_avx2(float *acc, float w, const uint16_t *v, size_t len)
{
    __m256 vw = _mm256_set1_ps(w);
    size_t j = 0;
    for (; j + 8 <= len; j += 8)
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(vw, bf16x8(v + j), _mm256_loadu_ps(acc + j)));
    for (; j < len; j++)
        acc[j] += w * dq__bf16_f32(v[j]);
}

/* Four accumulators: the FMAs' latency, not their throughput, bounds a single chain. */
__attribute__((target("avx2,fma"))) static float sumsq_bf16_avx2(const uint16_t *x, size_t len)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 32 <= len; j += 32) {
        const __m256 v0 = bf16x8(x + j), v1 = bf16x8(x + j + 8), v2 = bf16x8(x + j + 16), v3 = bf16x8(x + j + 24);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
        a2 = _mm256_fmadd_ps(v2, v2, a2);
        a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    for (; j + 8 <= len; j += 8) {
        const __m256 v = bf16x8(x + j);
        a0 = _mm256_fmadd_ps(v, v, a0);
    }
    float r = hsum2_avx(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    for (; j < len; j++) {
        const float v = dq__bf16_f32(x[j]);
        r += v * v;
    }
    return r;
}

/* fwht_c's stages in registers: h = 1, 2, 4 inside each vector of 8 (lanes whose partner is above
 * them add it, the others subtract themselves from it), then h >= 8 between vectors. Same
 * additions and subtractions of the same operands: the same bits. */
__attribute__((target("avx"))) static void fwht_avx(float *x, uint32_t len)
{
    if (len < 8) {
        dq__fwht_c(x, len);
        return;
    }
    for (uint32_t i = 0; i < len; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 p = _mm256_permute_ps(v, 0xb1); /* partners at distance 1 */
        v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xaa);
        p = _mm256_permute_ps(v, 0x4e); /* distance 2 */
        v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xcc);
        p = _mm256_permute2f128_ps(v, v, 0x01); /* distance 4 */
        v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xf0);
        _mm256_storeu_ps(x + i, v);
    }
    for (uint32_t h = 8; h < len; h <<= 1)
        for (uint32_t i = 0; i < len; i += h << 1)
            for (uint32_t j = i; j < i + h; j += 8) {
                const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
            }
}
#endif

static const char *g_name = "c";

void dq__dsp_init_x86(dq__dsp *dsp)
{
    dsp->decode_levels = decode_levels_multi;
    g_name = "interleaved";
#ifdef DQ_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx"))
        dsp->fwht = fwht_avx;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        dsp->dot_u8 = dot_u8_avx2;
        dsp->axpy_u8 = axpy_u8_avx2;
        dsp->dot_bf16 = dot_bf16_avx2;
        dsp->axpy_bf16 = axpy_bf16_avx2;
        dsp->sumsq_bf16 = sumsq_bf16_avx2;
        dsp->decode_levels = decode_levels_avx2;
        g_name = "interleaved+avx2";
    }
#endif
}

const char *dq__dsp_name(void)
{
    (void)dq__dsp_get();
    return g_name;
}

/* Portable C reference kernels and the dispatch table. */
#include <pthread.h>

#include "codec_internal.h"
#include "dsp.h"

static size_t decode_levels_c(const dq__rans_dec *dec, const uint8_t *records, size_t stride, size_t count, uint32_t C,
                              uint32_t n, uint8_t *levels)
{
    size_t corrupt = 0;
    for (size_t i = 0; i < count; i++)
        corrupt += dq__rans_decode(dec, records + i * stride + 4, C, n, levels + i * n) != DQ_OK;
    return corrupt;
}

static void axpy_u8_c(float *acc, float w, const uint8_t *lev, size_t len, float center)
{
    for (size_t j = 0; j < len; j++)
        acc[j] += w * ((float)lev[j] - center);
}

static float dot_u8_c(const float *q, const uint8_t *lev, size_t len, float center)
{
    float s = 0;
    for (size_t j = 0; j < len; j++)
        s += q[j] * ((float)lev[j] - center);
    return s;
}

static float dot_bf16_c(const float *q, const uint16_t *k, size_t len)
{
    float s = 0;
    for (size_t j = 0; j < len; j++)
        s += q[j] * dq__bf16_f32(k[j]);
    return s;
}

/* Eight partial sums, so that the loop vectorizes without reassociation. */
static float sumsq_bf16_c(const uint16_t *x, size_t len)
{
    float part[8] = {0};
    size_t j = 0;
    for (; j + 8 <= len; j += 8)
        for (int u = 0; u < 8; u++) {
            const float v = dq__bf16_f32(x[j + u]);
            part[u] += v * v;
        }
    for (; j < len; j++) {
        const float v = dq__bf16_f32(x[j]);
        part[0] += v * v;
    }
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

static void axpy_bf16_c(float *acc, float w, const uint16_t *v, size_t len)
{
    for (size_t j = 0; j < len; j++)
        acc[j] += w * dq__bf16_f32(v[j]);
}

void dq__fwht_c(float *x, uint32_t len)
{
    for (uint32_t h = 1; h < len; h <<= 1) {
        for (uint32_t i = 0; i < len; i += h << 1) {
            for (uint32_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
}

void dq__dsp_init_c(dq__dsp *dsp)
{
    dsp->decode_levels = decode_levels_c;
    dsp->axpy_u8 = axpy_u8_c;
    dsp->dot_u8 = dot_u8_c;
    dsp->dot_bf16 = dot_bf16_c;
    dsp->axpy_bf16 = axpy_bf16_c;
    dsp->sumsq_bf16 = sumsq_bf16_c;
    dsp->fwht = dq__fwht_c;
}

static dq__dsp g_dsp;
static pthread_once_t g_dsp_once = PTHREAD_ONCE_INIT;

static void dsp_init_once(void)
{
    dq__dsp_init_c(&g_dsp);
    dq__dsp_init_x86(&g_dsp);
}

const dq__dsp *dq__dsp_get(void)
{
    pthread_once(&g_dsp_once, dsp_init_once);
    return &g_dsp;
}

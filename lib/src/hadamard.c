/* Per-head randomized Hadamard rotation (DESIGN §2.1): y = H·D·x / sqrt(d), orthonormal, so
 * q·k = (Rq)·(Rk). The butterfly order below is the canonical one (CUDA uses the same pairs per
 * stage), which makes rotations bit-identical on CPU and GPU. */
#include "codec_internal.h"
#include "dsp.h"

void dq__fwht(float *x, uint32_t len)
{
    dq__dsp_get()->fwht(x, len);
}

void dq_rotate(const dq_codec *codec, float *x)
{
    const uint32_t n = codec->n, d = codec->head_dim;
    const float scale = codec->rot_scale;
    if (codec->signs)
        for (uint32_t i = 0; i < n; i++)
            x[i] *= codec->signs[i];
    for (uint32_t h0 = 0; h0 < n; h0 += d) {
        dq__fwht(x + h0, d);
        for (uint32_t j = 0; j < d; j++)
            x[h0 + j] *= scale;
    }
}

/* The scale and the signs in one product per value: a sign is ±1, so scale·sign is exact and
 * (y·scale)·sign = y·(scale·sign) bit for bit. */
void dq_unrotate(const dq_codec *codec, float *y)
{
    const uint32_t n = codec->n, d = codec->head_dim;
    const float scale = codec->rot_scale;
    for (uint32_t h0 = 0; h0 < n; h0 += d) {
        float *restrict yh = y + h0;
        dq__fwht(yh, d);
        if (codec->signs) {
            const float *restrict sh = codec->signs + h0;
            for (uint32_t j = 0; j < d; j++)
                yh[j] *= scale * sh[j];
        } else {
            for (uint32_t j = 0; j < d; j++)
                yh[j] *= scale;
        }
    }
}

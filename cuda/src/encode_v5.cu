/* GPU encoder, version 5 (the default): the sorted stream, and for alphabets M <= 8 lib's bisection
 * taken two steps at a time with per-lane searches (drift5_warp; encode_kernel.cuh has the design). */
#include "encode_kernel.cuh"

int dqcu__encode5_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream)
{
    return enc_launch<5>(dc, p, gy, stream);
}

int dqcu__encode5_upload_exp2(const float *tab)
{
    return enc_upload_exp2(tab);
}

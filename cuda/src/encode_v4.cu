/* GPU encoder, version 4: the sorted stream and lib's bisection one step at a time for every
 * alphabet (drift_warp, which version 5 runs for M > 8); kept as the reference version 5 is compared
 * with in checkcuda and bench_cuda (encode_kernel.cuh has the design). */
#include "encode_kernel.cuh"

int dqcu__encode4_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream)
{
    return enc_launch<4>(dc, p, gy, stream);
}

int dqcu__encode4_upload_exp2(const float *tab)
{
    return enc_upload_exp2(tab);
}

/* libdquant-client-nccl — the NCCL data path of libdquant-client: tensors in GPU memory.
 *
 * With a daemon on the cuda backend that offers feature "nccl" (dqc_server_info.features), tensors
 * can move GPU to GPU instead of through the socket: the request and reply headers still travel
 * on the connection, the tensor bytes on a two-rank NCCL communicator between the caller's GPU
 * (rank 1) and the daemon's (rank 0), made by dqc_nccl_setup. The *_dev calls mirror dqc_put,
 * dqc_get and dqc_attend with device pointers on the setup device; they are synchronous like every
 * call: when one returns, its transfers have finished (the caller's own streams are not involved;
 * the library uses a stream of its own and restores the caller's current CUDA device).
 *
 * Failures: a transfer that fails or does not finish within the daemon's deadline (stated at setup;
 * after an error reply, within a second) aborts the communicator, since neither side can then know
 * what the other consumed. The call returns the error (DQ_TIMEOUT, DQ_IO, or the server's code) and
 * every later *_dev call fails with DQ_IO ("NCCL not set up: <why>") until dqc_nccl_setup succeeds
 * again; the socket calls are unaffected. The communicator also belongs to the connection: after a
 * reconnect (automatic or dqc_reconnect) the *_dev calls fail the same way; they never fall back to
 * the socket silently and are never repeated on a new connection (not even GET).
 *
 * A library of its own, built only where meson finds NCCL and the CUDA runtime (options cuda and
 * nccl), so that libdquant-client itself never needs them: link with pkg-config
 * libdquant-client-nccl (which requires libdquant-client of the same version; the handles are the
 * same dqc_client). Everything in dquant/client.h about handles, ownership and thread-safety holds
 * here too. */
#ifndef DQUANT_CLIENT_NCCL_H
#define DQUANT_CLIENT_NCCL_H

#include <stddef.h>

#include "dquant/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the handle's communicator on CUDA device cuda_device: asks the daemon (NCCL_SETUP), then
 * joins as rank 1, waiting at most the I/O timeout (non-blocking NCCL init). Replaces (finalizes)
 * an earlier communicator of the handle. Returns 0; DQ_UNSUPPORTED when the server does not offer
 * NCCL; DQ_INVALID_ARGUMENT for a bad device; DQ_TIMEOUT when the join does not finish; DQ_IO for a
 * CUDA or NCCL failure; or the server's code. dqc_free tears the communicator down. */
DQC_API int dqc_nccl_setup(dqc_client *client, int cuda_device);

/* dqc_put with args->k and args->v in device memory of the setup device (each [num_layers, tokens,
 * kv_heads, head_dim] of dtype, contiguous, borrowed until the call returns). Not retried. */
DQC_API int dqc_put_dev(dqc_client *client, const dqc_put_args *args, dqc_put_result *res);

/* A typed GET (args->dtype F16, BF16 or F32) into device memory: k_dev and v_dev hold capacity
 * bytes each, on the setup device. res gets the metadata (start_token, tokens, num_layers,
 * kv_heads, head_dim, dtype, bytes) with k and v NULL; its memory from earlier dqc_get calls, if
 * any, is left alone (free it with dqc_get_result_free as usual). When the reply's tensors are
 * larger than capacity, the bytes are still received (into scratch device memory, to keep the
 * communicator in step) and DQ_TOO_LARGE is returned with the size in the message. */
DQC_API int dqc_get_dev(dqc_client *client, const dqc_get_args *args, void *k_dev, void *v_dev, size_t capacity,
                        dqc_get_result *res);

/* dqc_attend with every item's q (and append_k / append_v) in device memory of the setup device;
 * writes out_dev [nitems, q_heads, head_dim] and lse_dev [nitems, q_heads] (f32, device memory of
 * the setup device, both required). Not retried, even without appends. */
DQC_API int dqc_attend_dev(dqc_client *client, const dqc_attend_args *args, float *out_dev, float *lse_dev);

#ifdef __cplusplus
}
#endif
#endif

/* What fake_cuda.c offers fake_nccl.c: the stream model, for NCCL transfers that complete on their
 * own (a thread of the communicator) but must be observed, in order, through the stream they were
 * issued on. Not part of the emulated API. */
#ifndef DQ_FAKE_INTERNAL_H
#define DQ_FAKE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_runtime_api.h"

/* Runs everything issued on stream so far (blocking on pending waits), as the GPU would before the
 * next item: an NCCL operation reads or writes its buffers only after the work before it. */
void dq_fake_stream_flush(cudaStream_t stream);
/* Puts an item on stream that is done when ready(arg) says so: queries answer cudaErrorNotReady
 * until then; synchronizing runs run(arg), which must block until it is ready, and then release
 * arg. ready is called with the fake's lock held and may take only leaf locks of its own. */
void dq_fake_stream_wait(cudaStream_t stream, bool (*ready)(void *arg), void (*run)(void *arg), void *arg);
/* Aborts the process unless [p, p + n) lies in a live device allocation. */
void dq_fake_check_dev(const void *p, size_t n, const char *what);

#endif

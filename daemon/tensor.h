/* dquantd tensor data access: payload tensors may sit at any offset, while libdquant reads
 * elements through typed pointers; these helpers hand it aligned data. */
#ifndef DQD_TENSOR_H
#define DQD_TENSOR_H

#include "dquant/types.h"
#include "validate.h"

/* The dq_dtype of a typed tensor (the wire and library numberings agree). */
static inline dq_dtype dqd_tensor_dtype(const dqd_tensor *t)
{
    return (dq_dtype)t->dtype;
}

/* *data = t's bytes aligned for its element type: the payload itself when it already is, else a
 * malloc'd copy returned in *tmp (free it). Returns 0 or DQ_NOMEM. */
int dqd_tensor_aligned(const dqd_tensor *t, const void **data, void **tmp);
/* Converts t's count elements to f32 into dst. */
int dqd_tensor_to_f32(const dqd_tensor *t, float *dst);

#endif

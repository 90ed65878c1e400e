/* dquantd tensor data access (see tensor.h). */
#include "tensor.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"

int dqd_tensor_aligned(const dqd_tensor *t, const void **data, void **tmp)
{
    size_t esize = dqd_dtype_size(t->dtype);
    *tmp = NULL;
    if (!t->len || ((uintptr_t)t->data % (esize ? esize : 1)) == 0) {
        *data = t->data;
        return DQ_OK;
    }
    void *copy = malloc(t->len);
    if (!copy)
        return DQ_NOMEM;
    memcpy(copy, t->data, t->len);
    *tmp = copy;
    *data = copy;
    return DQ_OK;
}

int dqd_tensor_to_f32(const dqd_tensor *t, float *dst)
{
    if (!t->count)
        return DQ_OK;
    if (t->dtype == DQUANT__DTYPE__F32) {
        memcpy(dst, t->data, t->len);
        return DQ_OK;
    }
    const void *src;
    void *tmp;
    int rc = dqd_tensor_aligned(t, &src, &tmp);
    if (rc < 0)
        return rc;
    rc = dq_convert(src, dqd_tensor_dtype(t), dst, DQ_DTYPE_F32, (size_t)t->count);
    free(tmp);
    return rc;
}

/* dquant — element types, half-precision conversions and allocator hooks. */
#ifndef DQUANT_TYPES_H
#define DQUANT_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of K/V and query tensors crossing the API. Values are fixed (they travel on the wire). */
typedef enum dq_dtype {
    DQ_DTYPE_F32 = 0,
    DQ_DTYPE_F16 = 1,
    DQ_DTYPE_BF16 = 2,
} dq_dtype;

/* Bytes per element of a dtype, 0 for an invalid one. */
DQ_API size_t dq_dtype_size(dq_dtype dtype);
/* "f32", "f16", "bf16"; NULL for an invalid one. */
DQ_API const char *dq_dtype_name(dq_dtype dtype);
/* Parses "f32"/"float32", "f16"/"float16"/"fp16", "bf16"/"bfloat16". Returns 0 or DQ_DTYPE error. */
DQ_API int dq_dtype_parse(const char *name, dq_dtype *out);

/* IEEE binary16 and bfloat16 conversions, round to nearest even; NaN stays NaN, overflow goes to
 * infinity. Exact and identical on every machine (bit manipulation only). */
DQ_API uint16_t dq_f32_to_f16(float x);
DQ_API float dq_f16_to_f32(uint16_t h);
DQ_API uint16_t dq_f64_to_f16(double x);
DQ_API uint16_t dq_f32_to_bf16(float x);
DQ_API float dq_bf16_to_f32(uint16_t b);

/* Converts count elements between dtypes (f32 <-> f16/bf16, or same-type copy). */
DQ_API int dq_convert(const void *src, dq_dtype src_type, void *dst, dq_dtype dst_type, size_t count);

/* Allocator hooks. The library allocates only through these (malloc/free when NULL is passed).
 * alloc must return memory aligned to at least 64 bytes or NULL. */
typedef struct dq_allocator {
    void *(*alloc)(void *opaque, size_t size);
    void (*free)(void *opaque, void *ptr);
    void *opaque;
} dq_allocator;

#ifdef __cplusplus
}
#endif
#endif

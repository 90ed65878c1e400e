/* Host shim of cuda/src/cuda_internal.cuh for tests/cuda/emu/run.sh: the CUDA keywords, the
 * intrinsics the version-2 headers use (PRMT and __byte_perm as byte selections, __ldg as a load)
 * and the fields of dqcu_kind_tab they read. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
extern "C" {
#include "codec_internal.h"
}
#define __device__
#define __host__
#define __forceinline__ inline
#define __global__
#define __noinline__
#define DQCU_RANS_L (1u << 23)
#define DQCU_FULL 0xffffffffu
struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    return uint4{a, b, c, d};
}
struct dim3v {
    uint32_t x;
};
static dim3v threadIdx = {0}, blockDim = {1};
static inline void __syncthreads(void)
{
}
template <typename T>
static inline T __ldg(const T *p)
{
    return *p;
}
static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}
static inline uint32_t min(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}
static inline uint32_t emu_prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint8_t by[8];
    for (int i = 0; i < 4; i++) {
        by[i] = (uint8_t)(a >> (8 * i));
        by[4 + i] = (uint8_t)(b >> (8 * i));
    }
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) {
        uint32_t nib = (sel >> (4 * k)) & 0xfu;
        uint8_t v = by[nib & 7u];
        if (nib & 8u)
            v = (v & 0x80u) ? 0xffu : 0;
        r |= (uint32_t)v << (8 * k);
    }
    return r;
}
struct dqcu_kind_tab {
    uint32_t dec[256];
};
static inline uint32_t __byte_perm(uint32_t a, uint32_t b, uint32_t s)
{
    return emu_prmt(a, b, s & 0x7777u);
}

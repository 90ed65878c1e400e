/* Helpers shared by checkcuda and bench_cuda: checks that abort with file:line, a seeded
 * generator, device buffers, event timing. Host code only. */
#ifndef DQ_CUDA_TEST_UTIL_H
#define DQ_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "dquant/cuda.h"
#include "dquant/dquant.h"

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t ck_e_ = (call);                                                                   \
        if (ck_e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(ck_e_)); \
            exit(2);                                                                                  \
        }                                                                                             \
    } while (0)

#define DQ(call)                                                                                                    \
    do {                                                                                                            \
        int dq_r_ = (call);                                                                                         \
        if (dq_r_ < 0) {                                                                                            \
            fprintf(stderr, "%s:%d: %s -> %s (cuda error %d: %s)\n", __FILE__, __LINE__, #call, dq_err_name(dq_r_), \
                    dqcu_last_cuda_error(), cudaGetErrorString((cudaError_t)dqcu_last_cuda_error()));               \
            exit(2);                                                                                                \
        }                                                                                                           \
    } while (0)

/* splitmix64-seeded xorshift64*. */
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed)
    {
        uint64_t z = seed + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        s = (z ^ (z >> 31)) | 1;
    }
    uint64_t next()
    {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545F4914F6CDD1Dull;
    }
    uint32_t below(uint32_t n)
    {
        return (uint32_t)((next() >> 32) % n);
    }
    double uniform()
    {
        return (double)(next() >> 11) * 0x1p-53;
    }
    double normal()
    {
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300)
            u1 = 1e-300;
        return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }
};

/* A device buffer freed on scope exit. */
template <class T>
struct DevBuf {
    T *p = nullptr;
    size_t n = 0;
    DevBuf() = default;
    explicit DevBuf(size_t count)
    {
        alloc(count);
    }
    void alloc(size_t count)
    {
        release();
        n = count;
        if (count)
            CK(cudaMalloc((void **)&p, sizeof(T) * count));
    }
    void release()
    {
        if (p)
            CK(cudaFree(p));
        p = nullptr;
        n = 0;
    }
    void upload(const T *src, size_t count)
    {
        CK(cudaMemcpy(p, src, sizeof(T) * count, cudaMemcpyHostToDevice));
    }
    void download(T *dst, size_t count) const
    {
        CK(cudaMemcpy(dst, p, sizeof(T) * count, cudaMemcpyDeviceToHost));
    }
    void fill_bytes(int byte)
    {
        CK(cudaMemset(p, byte, sizeof(T) * n));
    }
    ~DevBuf()
    {
        release();
    }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
};

/* Median of the times (ms) of reps runs of fn after warm runs, with events on stream 0. */
template <class F>
static inline double time_median_ms(F fn, int warm, int reps)
{
    for (int i = 0; i < warm; i++)
        fn();
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ts;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, 0));
        fn();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

/* GPU time per call (ms) of fn: warm calls, then events around calls back-to-back calls on stream
 * 0, the median of reps such runs divided by calls. Unlike one call between two events, this does
 * not charge the launch latency of a short call to it. */
template <class F>
static inline double time_per_call_ms(F fn, int warm, int calls, int reps)
{
    for (int i = 0; i < warm; i++)
        fn();
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ts;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, 0));
        for (int j = 0; j < calls; j++)
            fn();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms / (float)calls);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

/* Device-to-device copy bandwidth (bytes read + written per second) over bytes bytes. */
static inline double measure_copy_bw(size_t bytes)
{
    DevBuf<uint8_t> a(bytes), b(bytes);
    a.fill_bytes(1);
    double ms = time_median_ms([&] { CK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, 0)); }, 3, 11);
    return 2.0 * (double)bytes / (ms * 1e-3);
}

#endif

// Host emulation of the CUDA built-ins used by kernels/*.cu, so the SAME
// source compiles as C++ and runs on a CPU (ibtmpi/kernelcheck.py wraps each
// kernel in a loop over gridDim x blockDim). Kernels here use 1-D launches,
// grid-stride loops, atomicAdd and no __syncthreads (a loop over threads
// cannot honour a barrier), so sequential execution gives the GPU's result
// up to float summation order.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 { unsigned x, y, z; };

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __syncthreads() static_assert(false, "__syncthreads cannot be emulated by the thread loop")

static inline float atomicAdd(float* addr, float v) { float old = *addr; *addr += v; return old; }
// round-to-nearest single operations (no contraction into a fused multiply-add)
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline int atomicAdd(int* addr, int v) { int old = *addr; *addr += v; return old; }
using std::min;
using std::max;

// The emulator's <cuda_runtime.h>: the runtime API, dim3, and the CUDA keywords kernel
// sources use (as host C++: __global__ and __device__ functions are plain functions, which
// src/kernels/cuda/device_seam.cuh launches on the emulator).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>

#include "cuda_runtime_api.h"
#include "emu/cuda_builtins.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The typed overloads of the runtime's C++ API.
template <typename T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaMallocAsync(T** ptr, std::size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(ptr), bytes, stream);
}
template <typename T>
cudaError_t cudaMallocFromPoolAsync(T** ptr, std::size_t bytes, cudaMemPool_t pool,
                                    cudaStream_t stream) {
  return cudaMallocFromPoolAsync(reinterpret_cast<void**>(ptr), bytes, pool, stream);
}

// The fp32 CUDA-core kernels' row arithmetic (simple_fp32.cu, sparse_simple_fp32.cu): one
// warp holds one row, each lane up to kPerLane of its columns (lane, lane + 32, ...; head
// dim <= 256), and a dot product is a warp reduction.
#pragma once

#include "kernels/cuda/device_seam.cuh"

namespace ringattn::kernels::cuda::simple {

constexpr int kWarps = 8;    // rows in flight per block
constexpr int kPerLane = 8;  // 8 × 32 lanes = 256 columns

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ void load_row(float (&r)[kPerLane], const float* src, int head_dim,
                                         int lane) {
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    r[u] = d < head_dim ? src[d] : 0.0f;
  }
}

__device__ __forceinline__ float dot_row(const float (&a)[kPerLane], const float* b, int head_dim,
                                         int lane) {
  float s = 0.0f;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    if (d < head_dim) s += a[u] * b[d];
  }
  return warp_sum(s);
}

}  // namespace ringattn::kernels::cuda::simple

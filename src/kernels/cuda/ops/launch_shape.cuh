// The launch shapes the small device operations share (ops/*.cu): block size, grid size for a
// grid-stride loop, and one warp per lse row.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_seam.cuh"

namespace ringattn::kernels::cuda {
namespace ops_detail {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int64_t per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 65535 * 16 ? (b < 1 ? 1 : b) : 65535 * 16);
}

// Calls f(r, b, h, n, lane) for every lse row r = (b·H + h)·N + n of a [B, H, N] grid, one
// warp per row (grid-stride); every lane of the warp takes part.
template <typename F>
__device__ void for_each_row_by_warp(int64_t batch, int64_t heads, int64_t seq_len, F&& f) {
  const int64_t rows = batch * heads * seq_len;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < rows;
       r += warps) {
    const int64_t n = r % seq_len, bh = r / seq_len;
    f(r, bh / heads, bh % heads, n, lane);
  }
}

}  // namespace ops_detail
}  // namespace ringattn::kernels::cuda

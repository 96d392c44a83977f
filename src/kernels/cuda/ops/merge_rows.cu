// Partial results merged by log-sum-exp, row by row (see device_ops.hpp): the ring's step
// partials into the running out/lse.
#include <cmath>

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/ops/launch_shape.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using namespace ops_detail;

// One warp per row: the same arithmetic as merge_lse_row.
__global__ void merge_lse_kernel(const MergeRows m) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < m.rows;
       r += warps) {
    // Shard rows (MergeRows::lse_heads): lse [B, heads, n] under out rows [B, n, heads], as
    // shard_lse_index() says.
    const int64_t h = m.lse_heads ? r % m.lse_heads : 0;
    const int64_t i = m.lse_heads ? (r / m.lse_heads) % m.lse_rows : 0;
    const int64_t b = m.lse_heads ? r / (m.lse_heads * m.lse_rows) : 0;
    const int64_t shard_lse = (b * m.lse_heads + h) * m.lse_rows + i;
    float* oa = m.acc_out + r * m.acc_out_stride;
    float* la_ptr = m.acc_lse + (m.lse_heads ? shard_lse : r * m.acc_lse_stride);
    const float* ob = m.part_out + r * m.part_out_stride;
    const float lb = m.part_lse[m.lse_heads ? shard_lse : r * m.part_lse_stride];
    const float la = *la_ptr;
    __syncwarp();
    if (lb == -INFINITY) continue;
    if (la == -INFINITY) {
      for (int64_t d = lane; d < m.d; d += 32) oa[d] = ob[d];
      if (lane == 0) *la_ptr = lb;
      continue;
    }
    const float mx = fmaxf(la, lb);
    const float wa = expf(la - mx), wb = expf(lb - mx);
    const float inv = 1.0f / (wa + wb);
    const float ca = wa * inv, cb = wb * inv;
    for (int64_t d = lane; d < m.d; d += 32) oa[d] = ca * oa[d] + cb * ob[d];
    if (lane == 0) *la_ptr = mx + logf(wa + wb);
  }
}

}  // namespace

void launch_merge_lse(const MergeRows& m, cudaStream_t stream) {
  if (m.rows == 0) return;
  launch_kernel("merge_lse_kernel", &merge_lse_kernel, dim3(blocks_for(m.rows, kThreads / 32)),
                dim3(kThreads), 0, stream, m);
  RINGATTN_CUDA_CHECK_LAUNCH("merge_lse_kernel");
}

}  // namespace ringattn::kernels::cuda

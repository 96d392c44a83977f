// The Hopper (sm_90a) forward's epilogue: a lane's rows of out = o / l and lse written, or
// merged by log-sum-exp into what is there (hopper/forward_mainloop.cuh's bodies end with it).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/hopper/dense_forward.hpp"  // HopperForwardForm
#include "kernels/cuda/hopper/tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

// The epilogue of a lane's two rows, local0 and local0 + 8 of the block's (`qr`): out = o / l
// and lse = (m + log2 l)·ln 2, written, or (accumulate) merged into the (out, lse) already
// there as merge_lse_row does. Rows at or past qr.rows are left alone.
template <int kD>
__device__ __forceinline__ void write_rows(bool accumulate, const QueryRows& qr, int local0,
                                           const float (&o)[kD / 2], float (&m)[2], float (&l)[2],
                                           int lane) {
  // Every lane of a row reads the old lse before the row's first lane writes the new one.
  float row_lse[2], inv[2], old_lse[2];
  bool valid[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    valid[r] = local0 + 8 * r < qr.rows;
    row_lse[r] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2f : -INFINITY;
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    old_lse[r] = accumulate && valid[r]
                     ? qr.lse[static_cast<int64_t>(local0 + 8 * r) * qr.lse_stride]
                     : -INFINITY;
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    const int64_t row = local0 + 8 * r;
    float ca = 0.0f, cb = accumulate ? inv[r] : inv[r] * qr.out_scale, new_lse = row_lse[r];
    if (accumulate) {
      if (row_lse[r] == -INFINITY) continue;  // nothing to add
      if (old_lse[r] != -INFINITY) {
        const float mx = fmaxf(old_lse[r], row_lse[r]);
        const float wa = expf(old_lse[r] - mx), wb = expf(row_lse[r] - mx);
        const float norm = 1.0f / (wa + wb);
        ca = wa * norm;
        cb = wb * norm * inv[r];
        new_lse = mx + logf(wa + wb);
      }
    }
    float* out = qr.out + row * qr.out_stride;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) {
      if (acc_row(i) != r) continue;
      float& x = out[acc_col(i, lane)];
      const float mine = o[i] * cb;
      x = ca == 0.0f ? mine : ca * x + mine;
    }
    if (lane % 4 == 0) qr.lse[row * qr.lse_stride] = new_lse;
  }
}

}  // namespace ringattn::kernels::cuda::hopper

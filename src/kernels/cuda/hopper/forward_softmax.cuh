// The Hopper (sm_90a) forward's online softmax over a lane's two rows, one or several key
// tiles a step, in wgmma's accumulator layout (hopper/forward_mainloop.cuh's bodies take it).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/hopper/dense_forward.hpp"  // HopperForwardForm
#include "kernels/cuda/hopper/tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

// One online-softmax step over kTiles key tiles (the first n_tiles of them walked; the rest
// masked whole) for a lane's two rows (index r = 0, 1, reaching `reach`): sc[u] holds
// S = Q·Kᵀ of tile u on entry and P on return (scaled to the log2 domain, columns outside
// the row's reach masked, exponentiated against the new running max); m and l, the running
// max and sum, are updated and o is rescaled by exp2(m_old - m_new), once per step. `lg`
// turns S into the log2-domain logit (scaled, and soft-capped where the job caps).
template <int kD, int kTiles, bool kCap>
__device__ __forceinline__ void softmax_tiles(float (&sc)[kTiles][32], const Reach (&reach)[2],
                                              const KeyTile (&t)[kTiles], int n_tiles, int lane,
                                              const Logits& lg, float (&m)[2], float (&l)[2],
                                              float (&o)[kD / 2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int u = 0; u < kTiles; ++u) {
    // Scores in the log2 domain; columns outside the row's reach are masked.
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = u < n_tiles ? columns_of(reach[r], t[u]) : Reach{0, 0};
    // Most tiles lie wholly inside both rows' reach: no per-column compare there.
    if (cols[0].lo <= 0 && cols[0].hi >= kRows && cols[1].lo <= 0 && cols[1].hi >= kRows) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        sc[u][i] = lg.logit<kCap>(sc[u][i]);
        tile_max[acc_row(i)] = fmaxf(tile_max[acc_row(i)], sc[u][i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int r = acc_row(i), col = acc_col(i, lane);
        const float x =
            col < cols[r].lo || col >= cols[r].hi ? -INFINITY : lg.logit<kCap>(sc[u][i]);
        sc[u][i] = x;
        tile_max[r] = fmaxf(tile_max[r], x);
      }
    }
  }
  float corr[2], base_m[2], tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r]);
    base_m[r] = m_new == -INFINITY ? 0.0f : m_new;
    corr[r] = exp2f(m[r] - base_m[r]);  // 0 while m was -inf
    m[r] = m_new;
  }
#pragma unroll
  for (int u = 0; u < kTiles; ++u)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int r = acc_row(i);
      sc[u][i] = exp2f(sc[u][i] - base_m[r]);
      tile_sum[r] += sc[u][i];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + tile_sum[r];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] *= corr[acc_row(i)];
}

// The one-tile step: softmax_tiles over `t` alone.
template <int kD, bool kCap>
__device__ __forceinline__ void softmax_step(float (&sc)[32], const Reach (&reach)[2],
                                             const KeyTile& t, int lane, const Logits& lg,
                                             float (&m)[2], float (&l)[2], float (&o)[kD / 2]) {
  const KeyTile one[1] = {t};
  softmax_tiles<kD, 1, kCap>(reinterpret_cast<float(&)[1][32]>(sc), reach, one, 1, lane, lg, m,
                             l, o);
}

}  // namespace ringattn::kernels::cuda::hopper

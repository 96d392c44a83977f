// The Hopper (sm_90a) backward's arguments and its recomputed softmax: a pass's launch
// arguments (BackwardArgs), and Pᵀ and dSᵀ from the forward's lse and the row sums delta, in
// wgmma's accumulator layout, as every backward body takes them (hopper/backward_mainloop.cuh).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/hopper/tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

// One pass's launch: the tensors as maps, the scalars, the gradients (fp32, added into) and
// the pass's work. The stored out and dout may be scaled (a dilated pass's): true O =
// out / out_scale and true dO = dout · dout_scale, so dP and dV take dout_scale and delta
// (rowsum(out ∘ dout)) takes delta_factor = dout_scale / out_scale.
template <class Work>
struct BackwardArgs {
  TmaDesc q, k, v, dout;
  Logits logits;  // S → the log2-domain (soft-capped) logit
  float scale;
  float dout_scale, delta_factor;
  const float* lse;
  const float* delta;
  float *dq, *dk, *dv;
  Work work;
};

// A pass's arguments: the q, k, v, dout tensor maps, the params' scale and tensors (any
// backward params with scale, lse, delta, dq, dk, dv), the pass's dout scale and delta
// factor, and its work.
template <class Work, class Params>
BackwardArgs<Work> backward_args(const TmaDesc (&maps)[4], const Params& p, float dout_scale,
                                 float delta_factor, const Work& work) {
  return {maps[0],    maps[1], maps[2],    maps[3],      logits_of(p.scale, p.softcap),
          p.scale,    dout_scale, delta_factor, p.lse,  p.delta,
          p.dq,       p.dk,       p.dv,         work};
}

// Whether column `col` of a tile lies in a row's visible columns.
__device__ __forceinline__ bool seen(const Reach& cols, int col) {
  return col >= cols.lo && col < cols.hi;
}

// lse in the log2 domain, +inf for a query that saw nothing (so that P = 0).
__device__ __forceinline__ float lse_log2(const float* lse, int64_t at) {
  const float x = lse[at];
  return x == -INFINITY ? INFINITY : x * kLog2ef;
}

// Where a walked query tile's per-column lse (log2 domain) and delta (times delta_factor) come
// from. GlobalColumnStats: global memory at the work's stats rows, each lane loading its own
// columns where one of its rows sees them (hopper_bwd_dkdv_kernel). StagedColumnStats: the
// stage's copy that the fused kernel's stats warp wrote (stage_stats), read unguarded.
template <class Work>
struct GlobalColumnStats {
  const BackwardArgs<Work>& p;
  Strided rows;
  __device__ __forceinline__ float lse2(int col, bool seen) const {
    return seen ? lse_log2(p.lse, rows.at + col * rows.stride) : INFINITY;
  }
  __device__ __forceinline__ float delta(int col, bool seen) const {
    return seen ? p.delta[rows.at + col * rows.stride] * p.delta_factor : 0.0f;
  }
};
struct StagedColumnStats {
  SmemPtr<float> lse2s;   // 64 columns
  SmemPtr<float> deltas;  // 64 columns
  __device__ __forceinline__ float lse2(int col, bool) const { return lse2s[col]; }
  __device__ __forceinline__ float delta(int col, bool) const { return deltas[col]; }
};

// Pᵀ from Sᵀ, in place, in the dK/dV walk's accumulator (rows keys, columns queries): Pᵀ =
// exp2(lg(Sᵀ) − lse·log2e) per query column (lg: the scaled, soft-capped logit), 0 where the
// query does not see the key.
// Register 4c + 2r + u is row r's column 8c + 2(lane % 4) + u. From global memory, lse is
// loaded at its use: loaded ahead of Sᵀ's product (so that the loads would run under the
// wgmma), the 16 guarded loads become branches and the whole backward slows down
// (docs/PERFORMANCE.md).
template <bool kCap, class Stats>
__device__ __forceinline__ void probs_t(float (&pt)[32], const Logits& lg, const Reach (&cols)[2],
                                        const Stats& stats, int lane) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int col = 8 * c + 2 * (lane % 4) + u;
      const bool seen0 = seen(cols[0], col), seen1 = seen(cols[1], col);
      const float lse2 = stats.lse2(col, seen0 || seen1);
      float& p0 = pt[4 * c + u];
      float& p1 = pt[4 * c + 2 + u];
      p0 = seen0 ? exp2f(lg.logit<kCap>(p0) - lse2) : 0.0f;
      p1 = seen1 ? exp2f(lg.logit<kCap>(p1) - lse2) : 0.0f;
    }
}

// With a soft-cap, Pᵀ ∘ the cap's slope in place, once dV's product has read Pᵀ: the slope
// at each logit log2(Pᵀ) + lse·log2e (no register holds Sᵀ any more; where Pᵀ is 0 it stays
// 0). Called before dPᵀ's accumulator is live, so that the lse it reloads adds no pressure
// where the backward's registers are fullest (grads_t). Nothing without a cap.
template <bool kCap, class Stats>
__device__ __forceinline__ void cap_slopes_t(float (&pt)[32], const Logits& lg,
                                             const Reach (&cols)[2], const Stats& stats,
                                             int lane) {
  if constexpr (kCap) {
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = 8 * c + 2 * (lane % 4) + u;
        const float lse2 = stats.lse2(col, seen(cols[0], col) || seen(cols[1], col));
        float& p0 = pt[4 * c + u];
        float& p1 = pt[4 * c + 2 + u];
        p0 *= p0 > 0.0f ? lg.slope_at_logit(log2f(p0) + lse2) : 0.0f;
        p1 *= p1 > 0.0f ? lg.slope_at_logit(log2f(p1) + lse2) : 0.0f;
      }
  } else {
    (void)pt, (void)lg, (void)cols, (void)stats, (void)lane;
  }
}

// dSᵀ = Pᵀ ∘ (dPᵀ·dout_scale − delta·delta_factor), in place of Pᵀ (0 where Pᵀ is; Pᵀ
// already times the cap's slope where the job caps: cap_slopes_t).
template <class Stats>
__device__ __forceinline__ void grads_t(float (&pt)[32], const float (&dpt)[32], float dout_scale,
                                        const Reach (&cols)[2], const Stats& stats, int lane) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int col = 8 * c + 2 * (lane % 4) + u;
      const float dlt = stats.delta(col, seen(cols[0], col) || seen(cols[1], col));
      pt[4 * c + u] *= dpt[4 * c + u] * dout_scale - dlt;
      pt[4 * c + 2 + u] *= dpt[4 * c + 2 + u] * dout_scale - dlt;
    }
}

}  // namespace ringattn::kernels::cuda::hopper

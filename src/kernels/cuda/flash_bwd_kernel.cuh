// The tensor-core flash backward (FlashAttention-2 identities, see docs/SEMANTICS.md), as
// two kernels so that every output element has exactly one writer and the result is
// deterministic (no atomics):
//   dq pass, one block per kQueryTile query rows: recompute P = exp(s·QKᵀ − lse) and
//     dP = dO Vᵀ tile by tile, dS = P ∘ (dP − D), dQ += s·dS K;
//   dk/dv pass, one block per kKeyTile key rows: the same products transposed,
//     dV += Pᵀ dO and dK += s·dSᵀ Q, accumulated in fp32 registers.
// Both add (+=) into fp32 dq/dk/dv, as the CPU kernels do.
#pragma once

#include <cmath>

#include "kernels/cuda/flash_fwd_kernel.cuh"
#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/mma_primitives.cuh"

namespace ringattn::kernels::cuda {

template <int kHeadDim>
struct BackwardTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 64;  // rows a block owns (16 per warp): queries or keys
  static constexpr int kStep = backward_step(kHeadDim);  // rows of the other side per step
  static constexpr int kPitch = kHeadDim + kRowPad;
  static_assert(kRows == kQueryTile && kRows == kKeyTile, "items are made for these tiles");
  template <typename T>
  static constexpr int smem_bytes() {
    return backward_smem_bytes(kHeadDim, static_cast<int>(sizeof(T)));
  }
};

// ---- dQ -----------------------------------------------------------------------------------
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    flash_backward_dq_kernel(const FlashBackwardParams p) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kStep = Tiles::kStep, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sQ = dynamic_smem<T>();
  const SmemPtr<T> sdO = sQ + Tiles::kRows * kPitch;
  const SmemPtr<T> sK = sdO + Tiles::kRows * kPitch;
  const SmemPtr<T> sV = sK + kStep * kPitch;

  const ForwardItem item = p.q_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  const int64_t i0 = item.q_begin;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tig = lane & 3;
  const T* k = static_cast<const T*>(p.k) + t.k_row0;
  const T* v = static_cast<const T*>(p.v) + t.k_row0;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sQ, static_cast<const T*>(p.q) + t.q_row0, t.q_stride, i0, t.n_q, p.head_dim, p.vector_loads);
  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sdO, static_cast<const T*>(p.dout) + t.q_row0, t.q_stride, i0, t.n_q, p.head_dim,
      p.vector_loads);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const float d_factor = p.dout_scale / p.out_scale;
  const int64_t row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float lse2[2], dlt[2];  // lse in the log2 domain (+inf: P = 0) and D, per row
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = row[r] < t.n_q;
    const int64_t at = t.lse0 + row[r] * t.lse_stride;
    const float L = valid ? p.lse[at] : kNegInf;
    lse2[r] = L == kNegInf ? INFINITY : L * kLog2e;
    dlt[r] = valid ? p.delta[at] * d_factor : 0.0f;
  }

  const int64_t bq = t.n_q - i0 < Tiles::kRows ? t.n_q - i0 : Tiles::kRows;
  const KeyRange visible = visible_key_range(t, p.causal, i0, bq);
  const int64_t j_first = visible.begin / kStep * kStep;
  const int64_t n_keys = visible.end > visible.begin ? visible.end : j_first;

  float dq[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

  for (int64_t j0 = j_first; j0 < n_keys; j0 += kStep) {
    load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sK, k, t.k_stride, j0, t.n_k, p.head_dim,
                                                    p.vector_loads);
    load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sV, v, t.k_stride, j0, t.n_k, p.head_dim,
                                                    p.vector_loads);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float s[kStep / 8][4], dp[kStep / 8][4];
#pragma unroll
    for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(s, sQ + warp * 16 * kPitch, sK, lane);
    warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(dp, sdO + warp * 16 * kPitch, sV, lane);

#pragma unroll
    for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = j0 + n * 8 + tig * 2 + (e & 1);
        const bool masked = outside_reach(t, p.causal, row[e >> 1], key);
        const float pr = masked ? 0.0f : exp2f(s[n][e] * scale_log2 - lse2[e >> 1]);
        s[n][e] = pr * (dp[n][e] * p.dout_scale - dlt[e >> 1]);  // dS
      }
    warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dq, s, sK, lane);
    __syncthreads();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= t.n_q) continue;
    float* dst = p.dq + t.q_row0 + row[r] * t.q_stride;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      const int col = d * 8 + tig * 2;
      if (col < p.head_dim) dst[col] += dq[d][2 * r] * p.scale;
      if (col + 1 < p.head_dim) dst[col + 1] += dq[d][2 * r + 1] * p.scale;
    }
  }
}

// ---- dK, dV -------------------------------------------------------------------------------
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    flash_backward_dkdv_kernel(const FlashBackwardParams p) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kStep = Tiles::kStep, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sK = dynamic_smem<T>();
  const SmemPtr<T> sV = sK + Tiles::kRows * kPitch;
  const SmemPtr<T> sQ = sV + Tiles::kRows * kPitch;
  const SmemPtr<T> sdO = sQ + kStep * kPitch;

  const ForwardItem item = p.k_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  const int64_t j0 = item.q_begin;  // first key row of this block
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tig = lane & 3;
  const T* q = static_cast<const T*>(p.q) + t.q_row0;
  const T* dout = static_cast<const T*>(p.dout) + t.q_row0;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sK, static_cast<const T*>(p.k) + t.k_row0, t.k_stride, j0, t.n_k, p.head_dim, p.vector_loads);
  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sV, static_cast<const T*>(p.v) + t.k_row0, t.k_stride, j0, t.n_k, p.head_dim, p.vector_loads);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const float d_factor = p.dout_scale / p.out_scale;
  const int64_t key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
  // The queries that see some key of this block (causality and the window).
  const int64_t bk = t.n_k - j0 < Tiles::kRows ? t.n_k - j0 : Tiles::kRows;
  const KeyRange seeing = seeing_query_range(t, p.causal, j0, bk);

  float dk[kHeadDim / 8][4], dv[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.0f;

  for (int64_t i0 = seeing.begin; i0 < seeing.end; i0 += kStep) {
    load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sQ, q, t.q_stride, i0, t.n_q, p.head_dim,
                                                    p.vector_loads);
    load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sdO, dout, t.q_stride, i0, t.n_q, p.head_dim,
                                                    p.vector_loads);
    cp_async_commit();
    // This thread's query columns' lse·log2e (+inf: P = 0) and D · dout_scale/out_scale, in
    // registers (read while the tiles are in flight; shared memory holds only the tiles, so
    // D = 256 fits the 99 KiB of compute capability 8.6/8.9).
    float colL[kStep / 8][2], colD[kStep / 8][2];
#pragma unroll
    for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int64_t qi = i0 + n * 8 + tig * 2 + u;
        const bool valid = qi < t.n_q;
        const int64_t at = t.lse0 + qi * t.lse_stride;
        const float L = valid ? p.lse[at] : kNegInf;
        colL[n][u] = L == kNegInf ? INFINITY : L * kLog2e;
        colD[n][u] = valid ? p.delta[at] * d_factor : 0.0f;
      }
    cp_async_wait<0>();
    __syncthreads();

    // Transposed tiles: rows are this warp's 16 keys, columns kStep queries.
    float pt[kStep / 8][4], dst[kStep / 8][4];
#pragma unroll
    for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) pt[n][e] = dst[n][e] = 0.0f;
    warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(pt, sK + warp * 16 * kPitch, sQ, lane);
    warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(dst, sV + warp * 16 * kPitch, sdO, lane);

#pragma unroll
    for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + tig * 2 + (e & 1);
        const int64_t kj = key[e >> 1];
        const bool masked = outside_reach(t, p.causal, i0 + c, kj);
        const float pr = masked ? 0.0f : exp2f(pt[n][e] * scale_log2 - colL[n][e & 1]);
        pt[n][e] = pr;                                                 // Pᵀ
        dst[n][e] = pr * (dst[n][e] * p.dout_scale - colD[n][e & 1]);  // dSᵀ
      }
    warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dv, pt, sdO, lane);
    warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dk, dst, sQ, lane);
    __syncthreads();  // before the next step overwrites sQ and sdO
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= t.n_k) continue;
    float* dk_row = p.dk + t.k_row0 + key[r] * t.k_stride;
    float* dv_row = p.dv + t.k_row0 + key[r] * t.k_stride;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = d * 8 + tig * 2 + u;
        if (col >= p.head_dim) continue;
        dk_row[col] += dk[d][2 * r + u] * p.scale;
        dv_row[col] += dv[d][2 * r + u] * p.dout_scale;
      }
    }
  }
}

}  // namespace ringattn::kernels::cuda

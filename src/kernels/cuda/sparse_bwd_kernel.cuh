// The tensor-core block-sparse backward: the flash backward's two passes
// (flash_bwd_kernel.cuh) over the block-sparse lists, so every output element has exactly one
// writer and the result is deterministic (no atomics):
//   dQ pass, one block per kQueryTile rows of a query tile, walking the tile's key spans:
//     P = exp(s·QKᵀ − lse), dP = dO Vᵀ, dS = P ∘ (dP − D), dQ += s·dS K;
//   dK/dV pass, one block per kKeyTile rows of a key tile, walking the query spans that
//     attend it: dV += Pᵀ dO, dK += s·dSᵀ Q.
// Both add (+=) into fp32 dq/dk/dv, as the CPU kernels do.
#pragma once

#include <cmath>

#include "kernels/cuda/flash_bwd_kernel.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/sparse_params.hpp"

namespace ringattn::kernels::cuda {

// ---- dQ -----------------------------------------------------------------------------------
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    sparse_backward_dq_kernel(const SparseBackwardParams p) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kStep = Tiles::kStep, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sQ = dynamic_smem<T>();
  const SmemPtr<T> sdO = sQ + Tiles::kRows * kPitch;
  const SmemPtr<T> sK = sdO + Tiles::kRows * kPitch;
  const SmemPtr<T> sV = sK + kStep * kPitch;

  const ForwardItem item = p.q_items[blockIdx.x];
  const SparseQueryTile tile = p.q_tiles[item.task];
  const int64_t i0 = item.q_begin;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tig = lane & 3;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sQ, static_cast<const T*>(p.q) + tile.q_row0, p.q_stride, i0, tile.n_q, p.head_dim,
      p.vector_loads);
  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sdO, static_cast<const T*>(p.dout) + tile.q_row0, p.q_stride, i0, tile.n_q, p.head_dim,
      p.vector_loads);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int64_t row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float lse2[2], dlt[2];  // lse in the log2 domain (+inf: P = 0) and D, per row
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = row[r] < tile.n_q;
    const int64_t at = tile.lse0 + row[r] * p.lse_stride;
    const float L = valid ? p.lse[at] : kNegInf;
    lse2[r] = L == kNegInf ? INFINITY : L * kLog2e;
    dlt[r] = valid ? p.delta[at] : 0.0f;
  }
  const int64_t bq = tile.n_q - i0 < Tiles::kRows ? tile.n_q - i0 : Tiles::kRows;

  float dq[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

  for (int64_t si = tile.first_span; si < tile.first_span + tile.n_spans; ++si) {
    const KeySpan sp = p.key_spans[si];
    const SubseqTask view =
        span_view(tile.n_q, sp.n_k, sp.causal_offset, p.window_left, p.window_right);
    const KeyRange keys = visible_key_range(view, p.causal, i0, bq);
    const T* k = static_cast<const T*>(p.k) + sp.k_row0;
    const T* v = static_cast<const T*>(p.v) + sp.k_row0;
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kStep) {
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sK, k, sp.k_stride, j0, sp.n_k, p.head_dim,
                                                      p.vector_loads);
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sV, v, sp.k_stride, j0, sp.n_k, p.head_dim,
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
          const bool masked = outside_reach(view, p.causal, row[e >> 1], key);
          const float pr = masked ? 0.0f : exp2f(s[n][e] * scale_log2 - lse2[e >> 1]);
          s[n][e] = pr * (dp[n][e] - dlt[e >> 1]);  // dS
        }
      warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dq, s, sK, lane);
      __syncthreads();  // before the next step overwrites sK and sV
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= tile.n_q) continue;
    float* dst = p.dq + tile.q_row0 + row[r] * p.q_stride;
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
    sparse_backward_dkdv_kernel(const SparseBackwardParams p) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kStep = Tiles::kStep, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sK = dynamic_smem<T>();
  const SmemPtr<T> sV = sK + Tiles::kRows * kPitch;
  const SmemPtr<T> sQ = sV + Tiles::kRows * kPitch;
  const SmemPtr<T> sdO = sQ + kStep * kPitch;

  const ForwardItem item = p.k_items[blockIdx.x];
  const SparseKeyTile tile = p.k_tiles[item.task];
  const int64_t j0 = item.q_begin;  // first key row of this block, in the tile
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tig = lane & 3;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sK, static_cast<const T*>(p.k) + tile.k_row0, tile.k_stride, j0, tile.n_k, p.head_dim,
      p.vector_loads);
  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sV, static_cast<const T*>(p.v) + tile.k_row0, tile.k_stride, j0, tile.n_k, p.head_dim,
      p.vector_loads);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int64_t key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
  const int64_t bk = tile.n_k - j0 < Tiles::kRows ? tile.n_k - j0 : Tiles::kRows;

  float dk[kHeadDim / 8][4], dv[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.0f;

  for (int64_t si = tile.first_span; si < tile.first_span + tile.n_spans; ++si) {
    const QuerySpan sp = p.query_spans[si];
    const SubseqTask view =
        span_view(sp.n_q, tile.n_k, sp.causal_offset, p.window_left, p.window_right);
    // Queries that see some key of this block (causality and the window).
    const KeyRange rows = seeing_query_range(view, p.causal, j0, bk);
    const T* q = static_cast<const T*>(p.q) + sp.q_row0;
    const T* dout = static_cast<const T*>(p.dout) + sp.q_row0;
    for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kStep) {
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sQ, q, p.q_stride, i0, sp.n_q, p.head_dim,
                                                      p.vector_loads);
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sdO, dout, p.q_stride, i0, sp.n_q, p.head_dim,
                                                      p.vector_loads);
      cp_async_commit();
      // This thread's query columns' lse·log2e (+inf: P = 0) and D, in registers (read while
      // the tiles are in flight).
      float colL[kStep / 8][2], colD[kStep / 8][2];
#pragma unroll
      for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int64_t qi = i0 + n * 8 + tig * 2 + u;
          const bool valid = qi < sp.n_q;
          const int64_t at = sp.lse0 + qi * p.lse_stride;
          const float L = valid ? p.lse[at] : kNegInf;
          colL[n][u] = L == kNegInf ? INFINITY : L * kLog2e;
          colD[n][u] = valid ? p.delta[at] : 0.0f;
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
          const bool masked =
              i0 + c >= sp.n_q || outside_reach(view, p.causal, i0 + c, key[e >> 1]);
          const float pr = masked ? 0.0f : exp2f(pt[n][e] * scale_log2 - colL[n][e & 1]);
          pt[n][e] = pr;                                  // Pᵀ
          dst[n][e] = pr * (dst[n][e] - colD[n][e & 1]);  // dSᵀ
        }
      warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dv, pt, sdO, lane);
      warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dk, dst, sQ, lane);
      __syncthreads();  // before the next step overwrites sQ and sdO
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= tile.n_k) continue;
    float* dk_row = p.dk + tile.k_row0 + key[r] * tile.k_stride;
    float* dv_row = p.dv + tile.k_row0 + key[r] * tile.k_stride;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = d * 8 + tig * 2 + u;
        if (col >= p.head_dim) continue;
        dk_row[col] += dk[d][2 * r + u] * p.scale;
        dv_row[col] += dv[d][2 * r + u];
      }
    }
  }
}

}  // namespace ringattn::kernels::cuda

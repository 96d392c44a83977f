// The tensor-core block-sparse forward, one block per work item (kQueryTile rows of one
// query tile): the flash forward's online softmax (flash_fwd_kernel.cuh), walking the tile's
// key spans one after another instead of one key range. Each span has its own base, stride
// and causal offset, so local rows and rows of a receive buffer mix in one tile; skipped
// blocks are never listed and cost nothing. The epilogue writes out/lse, or merges into them
// by log-sum-exp (`accumulate`), exactly as the flash forward does.
#pragma once

#include <cmath>

#include "kernels/cuda/flash_fwd_kernel.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/sparse_params.hpp"

namespace ringattn::kernels::cuda {

template <int kHeadDim>
struct SparseForwardTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kQueryTile;                  // 16 per warp
  static constexpr int kKeys = forward_key_step(kHeadDim);  // keys per step (registers)
  static constexpr int kPitch = kHeadDim + kRowPad;
  static_assert(kRows == kWarps * 16, "one 16-row mma tile per warp");
  template <typename T>
  static constexpr int smem_bytes() {
    return sparse_forward_smem_bytes(kHeadDim, static_cast<int>(sizeof(T)));
  }
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(SparseForwardTiles<kHeadDim>::kThreads)
    sparse_forward_kernel(const SparseForwardParams p) {
  using Tiles = SparseForwardTiles<kHeadDim>;
  constexpr int kKeys = Tiles::kKeys, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sQ = dynamic_smem<T>();
  const SmemPtr<T> sK = sQ + Tiles::kRows * kPitch;
  const SmemPtr<T> sV = sK + kKeys * kPitch;

  const ForwardItem item = p.items[blockIdx.x];
  const SparseQueryTile tile = p.tiles[item.task];
  const int64_t i0 = item.q_begin;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tig = lane & 3;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(
      sQ, static_cast<const T*>(p.q) + tile.q_row0, p.q_stride, i0, tile.n_q, p.head_dim,
      p.vector_loads);
  cp_async_commit();

  const int64_t bq = tile.n_q - i0 < Tiles::kRows ? tile.n_q - i0 : Tiles::kRows;
  // This thread's two rows (tile query indices).
  const int64_t row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  const float scale_log2 = p.scale * kLog2e;
  const bool windowed = p.window_left != kNoWindow || p.window_right != kNoWindow;

  float m[2] = {kNegInf, kNegInf};  // running max of scale·log2e·s
  float l[2] = {0.0f, 0.0f};        // this thread's part of the running sum
  float acc[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  for (int64_t si = tile.first_span; si < tile.first_span + tile.n_spans; ++si) {
    const KeySpan sp = p.spans[si];
    const SubseqTask view =
        span_view(tile.n_q, sp.n_k, sp.causal_offset, p.window_left, p.window_right);
    // Keys some row of the item sees (causality and the window); none outside is loaded.
    const KeyRange keys = visible_key_range(view, p.causal, i0, bq);
    const T* k = static_cast<const T*>(p.k) + sp.k_row0;
    const T* v = static_cast<const T*>(p.v) + sp.k_row0;
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kKeys) {
      load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sK, k, sp.k_stride, j0, sp.n_k, p.head_dim,
                                                      p.vector_loads);
      cp_async_commit();
      load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sV, v, sp.k_stride, j0, sp.n_k, p.head_dim,
                                                      p.vector_loads);
      cp_async_commit();
      cp_async_wait<1>();  // Q and K have landed; V may still be in flight
      __syncthreads();

      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      warp_mma_rows_rows<T, kKeys, kHeadDim, kPitch>(s, sQ + warp * 16 * kPitch, sK, lane);

      // Keys past the span's end, (causal) keys in a row's future and keys outside a row's
      // window get -inf.
      const bool tail = j0 + kKeys > sp.n_k;
      const bool diagonal = p.causal && j0 + kKeys - 1 > i0 + sp.causal_offset;
      scale_and_mask<kKeys>(s, scale_log2, tail || diagonal || windowed, j0, sp.n_k, p.causal,
                            sp.causal_offset, row, tig, p.window_left, p.window_right);
      online_softmax_step<kKeys, kHeadDim>(s, m, l, acc);

      cp_async_wait<0>();  // V has landed
      __syncthreads();
      warp_mma_regs_rows<T, kHeadDim, kKeys, kPitch>(acc, s, sV, lane);
      __syncthreads();  // every warp is done with sK and sV before they are refilled
    }
  }
  cp_async_wait<0>();  // an item with no visible keys still waits for its Q copy

  // Epilogue. Reads of the old (out, lse) happen before any write of lse, so that the four
  // threads of a row see the same old value.
  float row_lse[2], inv[2], old_lse[2];
  bool valid[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(l[r]);
    const bool empty = total == 0.0f;
    row_lse[r] = empty ? kNegInf : m[r] * kLn2 + logf(total);
    inv[r] = empty ? 0.0f : 1.0f / total;
    valid[r] = row[r] < tile.n_q;
    old_lse[r] = (p.accumulate && valid[r]) ? p.lse[tile.lse0 + row[r] * p.lse_stride] : kNegInf;
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    float* orow = p.out + tile.q_row0 + row[r] * p.q_stride;
    float* lse = p.lse + tile.lse0 + row[r] * p.lse_stride;
    float ca = 0.0f, cb = inv[r], new_lse = row_lse[r];
    if (p.accumulate) {
      // merge_lse_row: (old, la) and (mine, lb) over disjoint key sets.
      const float la = old_lse[r], lb = row_lse[r];
      if (lb == kNegInf) continue;  // nothing to add: leave out and lse as they are
      if (la != kNegInf) {
        const float mx = fmaxf(la, lb);
        const float wa = expf(la - mx), wb = expf(lb - mx);
        const float norm = 1.0f / (wa + wb);
        ca = wa * norm;
        cb = wb * norm * inv[r];
        new_lse = mx + logf(wa + wb);
      }
    }
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      const int col = d * 8 + tig * 2;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (col + u >= p.head_dim) continue;
        const float mine = acc[d][2 * r + u] * cb;
        orow[col + u] = ca == 0.0f ? mine : ca * orow[col + u] + mine;
      }
    }
    if (tig == 0) *lse = new_lse;
  }
}

}  // namespace ringattn::kernels::cuda

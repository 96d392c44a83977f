// The tensor-core flash forward, one block per work item (kQueryTile query rows of one
// task): Q stays in shared memory, K and V tiles stream through it (for D = 256 K is
// double-buffered: the next tile loads while this one's P·V runs), each warp keeps its 16
// rows' running max, running sum and fp32 output accumulator in registers (online softmax
// in the log2 domain), and the epilogue writes out/lse or merges into them by log-sum-exp.
#pragma once

#include <cmath>

#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/mma_primitives.cuh"

namespace ringattn::kernels::cuda {

template <int kHeadDim>
struct ForwardTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kQueryTile;                            // 16 per warp
  static constexpr int kKeys = forward_key_step(kHeadDim);            // keys per step (registers)
  static constexpr bool kPrefetchK = forward_prefetches_k(kHeadDim);  // two K tiles
  static constexpr int kPitch = kHeadDim + kRowPad;  // +16 bytes: conflict-free ldmatrix rows
  static_assert(kRows == kWarps * 16, "one 16-row mma tile per warp");
  template <typename T>
  static constexpr int smem_bytes() {
    return forward_smem_bytes(kHeadDim, static_cast<int>(sizeof(T)));
  }
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Sum and max over the 4 threads of a quad (the threads holding one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Scores of one key step → log2-domain logits: s·scale·log2e, and -inf for keys at or past
// n_k, (causal) keys after query row + causal_offset, and keys outside the row's sliding
// window (window_left / window_right; kNoWindow: none). Only steps that reach past the end,
// across the diagonal or a window's edge (`edge`) need the per-element test. Keys j0 + ...,
// rows `row`.
template <int kKeys>
__device__ __forceinline__ void scale_and_mask(float (&s)[kKeys / 8][4], float scale_log2,
                                               bool edge, int64_t j0, int64_t n_k, bool causal,
                                               int64_t causal_offset, const int64_t (&row)[2],
                                               int tig, int64_t window_left = kNoWindow,
                                               int64_t window_right = kNoWindow) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[n][e] * scale_log2;
      if (edge) {
        const int64_t key = j0 + n * 8 + tig * 2 + (e & 1);
        const int64_t d = key - (row[e >> 1] + causal_offset);
        if (key >= n_k || (causal && d > 0) || d > window_right || -d > window_left) x = -INFINITY;
      }
      s[n][e] = x;
    }
}

// One key step of the online softmax for this thread's two rows: the running max m and sum
// l are updated, the accumulator rescaled, and s becomes the step's probabilities (relative
// to the new max), ready for P·V.
template <int kKeys, int kHeadDim>
__device__ __forceinline__ void online_softmax_step(float (&s)[kKeys / 8][4], float (&m)[2],
                                                    float (&l)[2], float (&acc)[kHeadDim / 8][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    const float m_new = fmaxf(m[r], quad_max(mx));
    // A row with nothing visible yet keeps m = -inf; subtracting 0 then keeps p = 0.
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = exp2f(m[r] - base);  // 0 when m was -inf
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[n][2 * r] = exp2f(s[n][2 * r] - base);
      s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l[r] = l[r] * alpha + sum;
    m[r] = m_new;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      acc[d][2 * r] *= alpha;
      acc[d][2 * r + 1] *= alpha;
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ForwardTiles<kHeadDim>::kThreads)
    flash_forward_kernel(const FlashForwardParams p) {
  using Tiles = ForwardTiles<kHeadDim>;
  constexpr int kKeys = Tiles::kKeys, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sQ = dynamic_smem<T>();
  // K tiles: two with forward_prefetches_k (D = 256), else one (sK[1] is then unused).
  const SmemPtr<T> sK[2] = {sQ + Tiles::kRows * kPitch, sQ + (Tiles::kRows + kKeys) * kPitch};
  const SmemPtr<T> sV = sQ + (Tiles::kRows + (Tiles::kPrefetchK ? 2 : 1) * kKeys) * kPitch;

  const ForwardItem item = p.items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  const int64_t i0 = item.q_begin;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, tig = lane & 3;
  const T* q = static_cast<const T*>(p.q) + t.q_row0;
  const T* k = static_cast<const T*>(p.k) + t.k_row0;
  const T* v = static_cast<const T*>(p.v) + t.k_row0;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(sQ, q, t.q_stride, i0, t.n_q, p.head_dim,
                                                         p.vector_loads);
  cp_async_commit();

  const int64_t bq = t.n_q - i0 < Tiles::kRows ? t.n_q - i0 : Tiles::kRows;
  // Keys some row of the tile sees (causality and the window), walked on the kKeys grid:
  // key tiles wholly outside are never loaded.
  const KeyRange visible = visible_key_range(t, p.causal, i0, bq);
  const int64_t j_first = visible.begin / kKeys * kKeys;
  const int64_t n_keys = visible.end > visible.begin ? visible.end : j_first;
  const bool windowed = t.window_left != kNoWindow || t.window_right != kNoWindow;
  // This thread's two rows (task query indices).
  const int64_t row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  const float scale_log2 = p.scale * kLog2e;

  float m[2] = {kNegInf, kNegInf};  // running max of scale·log2e·s
  float l[2] = {0.0f, 0.0f};        // this thread's part of the running sum
  float acc[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  // With kPrefetchK, K_j was issued one step ahead (the prologue issues K_0); each step adds
  // V_j, and K_{j+1} once S_j is computed, so K's latency hides behind P·V. Without it, each
  // step issues K_j and V_j itself.
  constexpr bool kPrefetchK = Tiles::kPrefetchK;
  if constexpr (kPrefetchK) {
    if (n_keys > j_first)
      load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sK[0], k, t.k_stride, j_first, t.n_k,
                                                      p.head_dim, p.vector_loads);
    cp_async_commit();
  }
  int buf = 0;
  for (int64_t j0 = j_first; j0 < n_keys; j0 += kKeys) {
    if constexpr (!kPrefetchK) {
      load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sK[0], k, t.k_stride, j0, t.n_k, p.head_dim,
                                                      p.vector_loads);
      cp_async_commit();
    }
    load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sV, v, t.k_stride, j0, t.n_k, p.head_dim,
                                                    p.vector_loads);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K_j have landed; V_j may still be in flight
    __syncthreads();

    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    warp_mma_rows_rows<T, kKeys, kHeadDim, kPitch>(s, sQ + warp * 16 * kPitch, sK[buf], lane);
    if constexpr (kPrefetchK) {
      // K_{j+1} into the other buffer: its last reader, S_{j-1}, finished before the barrier
      // that ended step j-1. An empty group when there is no next tile keeps the count.
      if (j0 + kKeys < n_keys)
        load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sK[buf ^ 1], k, t.k_stride, j0 + kKeys,
                                                        t.n_k, p.head_dim, p.vector_loads);
      cp_async_commit();
    }

    // Keys past the view's end, (causal) keys in a row's future and keys outside a row's
    // window get -inf.
    const bool tail = j0 + kKeys > t.n_k;
    const bool diagonal = p.causal && j0 + kKeys - 1 > i0 + t.causal_offset;
    scale_and_mask<kKeys>(s, scale_log2, tail || diagonal || windowed, j0, t.n_k, p.causal,
                          t.causal_offset, row, tig, t.window_left, t.window_right);
    online_softmax_step<kKeys, kHeadDim>(s, m, l, acc);

    cp_async_wait<kPrefetchK ? 1 : 0>();  // V_j has landed (K_{j+1} may be in flight)
    __syncthreads();
    warp_mma_regs_rows<T, kHeadDim, kKeys, kPitch>(acc, s, sV, lane);
    __syncthreads();  // every warp is done with sV and sK[buf] before they are refilled
    if constexpr (kPrefetchK) buf ^= 1;
  }
  cp_async_wait<0>();  // a block with no visible keys still waits for its Q copy

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
    valid[r] = row[r] < t.n_q;
    old_lse[r] = (p.accumulate && valid[r]) ? p.lse[t.lse0 + row[r] * t.lse_stride] : kNegInf;
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    float* orow = p.out + t.q_row0 + row[r] * t.q_stride;
    float* lse = p.lse + t.lse0 + row[r] * t.lse_stride;
    float ca = 0.0f, cb = inv[r] * p.out_scale, new_lse = row_lse[r];
    if (p.accumulate) {
      // merge_lse_row: (old, la) and (mine, lb) over disjoint key sets.
      const float la = old_lse[r], lb = row_lse[r];
      if (lb == kNegInf) continue;  // nothing to add: leave out and lse as they are
      if (la == kNegInf) {
        cb = inv[r];
      } else {
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

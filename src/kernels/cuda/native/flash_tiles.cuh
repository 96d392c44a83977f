// The tensor-core block bodies, written once for the flash kernels (a task's one run of the
// other side's rows) and the block-sparse kernels (a tile's list of spans): the tile shapes,
// the forward's online softmax over key tiles and its write-or-merge epilogue, the dQ pass
// over key tiles and the dK/dV pass over query tiles. Every product is an ldmatrix + mma.sync
// warp product (mma_primitives.cuh) with fp32 accumulators in registers, 16 rows per warp.
#pragma once

#include <cmath>

#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/tiles.hpp"

namespace ringattn::kernels::cuda {

// The forward: with kPrefetchK (by default for D = 256, forward_prefetches_k) K is
// double-buffered, the next tile loading while this one's P·V runs.
template <int kHeadDim, bool kPrefetch = forward_prefetches_k(kHeadDim)>
struct ForwardTiles {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kQueryTile;                  // 16 per warp
  static constexpr int kKeys = forward_key_step(kHeadDim);  // keys per step (registers)
  static constexpr bool kPrefetchK = kPrefetch;             // two K tiles
  static constexpr int kPitch = kHeadDim + kRowPad;  // +16 bytes: conflict-free ldmatrix rows
  static_assert(kRows == kWarps * 16, "one 16-row mma tile per warp");
  // Q, one or two K tiles and one V tile.
  template <typename T>
  static constexpr int smem_bytes() {
    return (kRows + (kPrefetchK ? 3 : 2) * kKeys) * kPitch * static_cast<int>(sizeof(T));
  }
};

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

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Where this thread sits in its warp's 16-row mma tile: accumulator rows g and g + 8,
// columns 2·tig and 2·tig + 1 of each 8-column n-tile.
struct WarpLane {
  int warp, lane, g, tig;
};
__device__ __forceinline__ WarpLane warp_lane() {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  return {warp, lane, lane >> 2, lane & 3};
}

template <int kN>
__device__ __forceinline__ void zero_tiles(float (&c)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// Sum and max over the 4 threads of a quad (the threads holding one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A score s = q·k as a log2-domain logit: s·scale·log2e, or with soft-capping
// softcap·tanh(s·scale / softcap)·log2e.
__device__ __forceinline__ float logit_log2(float s, float scale, float softcap) {
  if (softcap > 0.0f) return softcap * tanhf(s * scale / softcap) * kLog2e;
  return s * (scale * kLog2e);
}
// The cap's slope at a score: d(capped)/d(scaled) = 1 − tanh², 1 without a cap.
__device__ __forceinline__ float cap_slope(float s, float scale, float softcap) {
  if (softcap <= 0.0f) return 1.0f;
  const float t = tanhf(s * scale / softcap);
  return 1.0f - t * t;
}

// Scores of one key step → log2-domain logits (logit_log2), and -inf for keys at or past
// n_k, (causal) keys after query row + causal_offset, and keys outside the row's sliding
// window (window_left / window_right; kNoWindow: none). Only steps that reach past the end,
// across the diagonal or a window's edge (`edge`) need the per-element test. Keys j0 + ...,
// rows `row`.
template <int kKeys>
__device__ __forceinline__ void scale_and_mask(float (&s)[kKeys / 8][4], float scale,
                                               float softcap, bool edge, int64_t j0, int64_t n_k,
                                               bool causal, int64_t causal_offset,
                                               const int64_t (&row)[2], int tig,
                                               int64_t window_left = kNoWindow,
                                               int64_t window_right = kNoWindow) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = logit_log2(s[n][e], scale, softcap);
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

// The forward's end: out = acc / l · out_scale and lse = m·ln2 + log(l) per row, or with
// `accumulate` a log-sum-exp merge into the (out, lse) already there. Reads of the old lse
// happen before any write of it, so that the four threads of a row see the same old value.
template <typename T, int kHeadDim>
__device__ __forceinline__ void forward_epilogue(const ForwardRows<T>& b, const AttentionScalars& a,
                                                 const float (&acc)[kHeadDim / 8][4],
                                                 const float (&m)[2], const float (&l)[2],
                                                 const int64_t (&row)[2], int tig) {
  constexpr float kNegInf = -INFINITY;
  float row_lse[2], inv[2], old_lse[2];
  bool valid[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(l[r]);
    const bool empty = total == 0.0f;
    row_lse[r] = empty ? kNegInf : m[r] * kLn2 + logf(total);
    inv[r] = empty ? 0.0f : 1.0f / total;
    valid[r] = row[r] < b.n_q;
    old_lse[r] = (a.accumulate && valid[r]) ? b.lse[row[r] * b.lse_stride] : kNegInf;
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    float* orow = b.out + row[r] * b.out_stride;
    float* lse = b.lse + row[r] * b.lse_stride;
    float ca = 0.0f, cb = inv[r] * a.out_scale, new_lse = row_lse[r];
    if (a.accumulate) {
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
        if (col + u >= a.head_dim_v) continue;
        const float mine = acc[d][2 * r + u] * cb;
        orow[col + u] = ca == 0.0f ? mine : ca * orow[col + u] + mine;
      }
    }
    if (tig == 0) *lse = new_lse;
  }
}

// A forward block (4 warps, kQueryTile query rows): Q stays in shared memory while the key
// runs' K and V tiles stream through it; each warp keeps its 16 rows' running max, running
// sum and fp32 output accumulator in registers (online softmax in the log2 domain).
template <typename T, int kHeadDim, bool kPrefetchK, typename Keys>
__device__ __forceinline__ void forward_block(const ForwardRows<T>& b, const Keys& keys,
                                              const AttentionScalars& a) {
  using Tiles = ForwardTiles<kHeadDim, kPrefetchK>;
  constexpr int kKeys = Tiles::kKeys, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;
  constexpr float kNegInf = -INFINITY;

  const SmemPtr<T> sQ = dynamic_smem<T>();
  // K tiles: two with kPrefetchK, else one (sK[1] is then unused).
  const SmemPtr<T> sK[2] = {sQ + Tiles::kRows * kPitch, sQ + (Tiles::kRows + kKeys) * kPitch};
  const SmemPtr<T> sV = sQ + (Tiles::kRows + (kPrefetchK ? 2 : 1) * kKeys) * kPitch;
  const WarpLane w = warp_lane();

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(sQ, b.q, b.stride, b.i0, b.n_q, a.head_dim,
                                                         a.vector_loads);
  cp_async_commit();

  const int64_t i0 = b.i0;
  const int64_t bq = b.n_q - i0 < Tiles::kRows ? b.n_q - i0 : Tiles::kRows;
  // This thread's two rows (view query indices).
  const int64_t row[2] = {i0 + w.warp * 16 + w.g, i0 + w.warp * 16 + w.g + 8};
  float m[2] = {kNegInf, kNegInf};  // running max of scale·log2e·s
  float l[2] = {0.0f, 0.0f};        // this thread's part of the running sum
  float acc[kHeadDim / 8][4];
  zero_tiles(acc);

  for (int64_t ri = 0; ri < keys.size(); ++ri) {
    // The keys some row of the block sees (causality and the window): none outside is loaded.
    const KeyRun<T> run = keys.template run<kKeys>(ri, a.causal, i0, bq);
    const SubseqTask& view = run.view;
    const bool windowed = view.window_left != kNoWindow || view.window_right != kNoWindow;
    // With kPrefetchK, K_j was issued one step ahead (the run's prologue issues its first);
    // each step adds V_j, and K_{j+1} once S_j is computed, so K's latency hides behind P·V.
    // Without it, each step issues K_j and V_j itself.
    if constexpr (kPrefetchK) {
      if (run.keys.end > run.keys.begin)
        load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sK[0], run.k, run.stride, run.keys.begin,
                                                        view.n_k, a.head_dim, a.vector_loads);
      cp_async_commit();
    }
    int buf = 0;
    for (int64_t j0 = run.keys.begin; j0 < run.keys.end; j0 += kKeys) {
      if constexpr (!kPrefetchK) {
        load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sK[0], run.k, run.stride, j0, view.n_k,
                                                        a.head_dim, a.vector_loads);
        cp_async_commit();
      }
      load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(sV, run.v, run.v_stride, j0, view.n_k,
                                                      a.head_dim_v, a.vector_loads);
      cp_async_commit();
      cp_async_wait<1>();  // Q and K_j have landed; V_j may still be in flight
      __syncthreads();

      float s[kKeys / 8][4];
      zero_tiles(s);
      warp_mma_rows_rows<T, kKeys, kHeadDim, kPitch>(s, sQ + w.warp * 16 * kPitch, sK[buf], w.lane);
      if constexpr (kPrefetchK) {
        // K_{j+1} into the other buffer: its last reader, S_{j-1}, finished before the
        // barrier that ended step j-1. An empty group when there is no next tile keeps the
        // count.
        if (j0 + kKeys < run.keys.end)
          load_rows<T, kKeys, kHeadDim, kPitch, kThreads>(
              sK[buf ^ 1], run.k, run.stride, j0 + kKeys, view.n_k, a.head_dim, a.vector_loads);
        cp_async_commit();
      }

      // Keys past the run's end, (causal) keys in a row's future and keys outside a row's
      // window get -inf.
      const bool tail = j0 + kKeys > view.n_k;
      const bool diagonal = a.causal && j0 + kKeys - 1 > i0 + view.causal_offset;
      scale_and_mask<kKeys>(s, a.scale, a.softcap, tail || diagonal || windowed, j0, view.n_k,
                            a.causal, view.causal_offset, row, w.tig, view.window_left,
                            view.window_right);
      online_softmax_step<kKeys, kHeadDim>(s, m, l, acc);

      cp_async_wait<kPrefetchK ? 1 : 0>();  // V_j has landed (K_{j+1} may be in flight)
      __syncthreads();
      warp_mma_regs_rows<T, kHeadDim, kKeys, kPitch>(acc, s, sV, w.lane);
      __syncthreads();  // every warp is done with sV and sK[buf] before they are refilled
      if constexpr (kPrefetchK) buf ^= 1;
    }
  }
  cp_async_wait<0>();  // a block with no visible keys still waits for its Q copy

  forward_epilogue<T, kHeadDim>(b, a, acc, m, l, row, w.tig);
}

// This thread's two rows' lse in the log2 domain (+inf for an empty row, so that P = 0) and
// D · dout_scale / out_scale.
__device__ __forceinline__ void row_softmax_stats(float& lse2, float& dlt, const float* lse,
                                                  const float* delta, int64_t at, bool valid,
                                                  float d_factor) {
  const float L = valid ? lse[at] : -INFINITY;
  lse2 = L == -INFINITY ? INFINITY : L * kLog2e;
  dlt = valid ? delta[at] * d_factor : 0.0f;
}

// A dQ block (kQueryTile query rows): recompute P = exp(s·QKᵀ − lse) and dP = dO Vᵀ tile by
// tile over the key runs, dS = P ∘ (dP − D), dQ += s·dS K; added (+=) into fp32 dq.
template <typename T, int kHeadDim, typename Keys>
__device__ __forceinline__ void dq_block(const DqRows<T>& b, const Keys& keys,
                                         const AttentionScalars& a) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kStep = Tiles::kStep, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;

  const SmemPtr<T> sQ = dynamic_smem<T>();
  const SmemPtr<T> sdO = sQ + Tiles::kRows * kPitch;
  const SmemPtr<T> sK = sdO + Tiles::kRows * kPitch;
  const SmemPtr<T> sV = sK + kStep * kPitch;
  const WarpLane w = warp_lane();
  const int64_t i0 = b.i0;

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(sQ, b.q, b.stride, i0, b.n_q, a.head_dim,
                                                         a.vector_loads);
  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(sdO, b.dout, b.dout_stride, i0, b.n_q,
                                                         a.head_dim_v, a.vector_loads);
  cp_async_commit();

  const float d_factor = a.dout_scale / a.out_scale;
  const int64_t row[2] = {i0 + w.warp * 16 + w.g, i0 + w.warp * 16 + w.g + 8};
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    row_softmax_stats(lse2[r], dlt[r], b.lse, b.delta, row[r] * b.lse_stride, row[r] < b.n_q,
                      d_factor);
  const int64_t bq = b.n_q - i0 < Tiles::kRows ? b.n_q - i0 : Tiles::kRows;

  float dq[kHeadDim / 8][4];
  zero_tiles(dq);

  for (int64_t ri = 0; ri < keys.size(); ++ri) {
    const KeyRun<T> run = keys.template run<kStep>(ri, a.causal, i0, bq);
    for (int64_t j0 = run.keys.begin; j0 < run.keys.end; j0 += kStep) {
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sK, run.k, run.stride, j0, run.view.n_k,
                                                      a.head_dim, a.vector_loads);
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sV, run.v, run.v_stride, j0, run.view.n_k,
                                                      a.head_dim_v, a.vector_loads);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();

      float s[kStep / 8][4], dp[kStep / 8][4];
      zero_tiles(s);
      zero_tiles(dp);
      warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(s, sQ + w.warp * 16 * kPitch, sK, w.lane);
      warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(dp, sdO + w.warp * 16 * kPitch, sV, w.lane);

#pragma unroll
      for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t key = j0 + n * 8 + w.tig * 2 + (e & 1);
          const bool masked = outside_reach(run.view, a.causal, row[e >> 1], key);
          const float logit = logit_log2(s[n][e], a.scale, a.softcap);
          const float pr = masked ? 0.0f : exp2f(logit - lse2[e >> 1]);
          // dS, through the cap's slope to the scaled score
          s[n][e] = pr * (dp[n][e] * a.dout_scale - dlt[e >> 1]) *
                    cap_slope(s[n][e], a.scale, a.softcap);
        }
      warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dq, s, sK, w.lane);
      __syncthreads();  // before the next step overwrites sK and sV
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= b.n_q) continue;
    float* dst = b.dq + row[r] * b.stride;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      const int col = d * 8 + w.tig * 2;
      if (col < a.head_dim) dst[col] += dq[d][2 * r] * a.scale;
      if (col + 1 < a.head_dim) dst[col + 1] += dq[d][2 * r + 1] * a.scale;
    }
  }
}

// A dK/dV block (kKeyTile key rows): the dQ block's products transposed over the query runs
// that see its keys, dV += Pᵀ dO and dK += s·dSᵀ Q; added (+=) into fp32 dk and dv.
template <typename T, int kHeadDim, typename Queries>
__device__ __forceinline__ void dkdv_block(const DkdvRows<T>& b, const Queries& queries,
                                           const AttentionScalars& a) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kStep = Tiles::kStep, kPitch = Tiles::kPitch, kThreads = Tiles::kThreads;

  const SmemPtr<T> sK = dynamic_smem<T>();
  const SmemPtr<T> sV = sK + Tiles::kRows * kPitch;
  const SmemPtr<T> sQ = sV + Tiles::kRows * kPitch;
  const SmemPtr<T> sdO = sQ + kStep * kPitch;
  const WarpLane w = warp_lane();
  const int64_t j0 = b.j0;  // first key row of this block

  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(sK, b.k, b.stride, j0, b.n_k, a.head_dim,
                                                         a.vector_loads);
  load_rows<T, Tiles::kRows, kHeadDim, kPitch, kThreads>(sV, b.v, b.v_stride, j0, b.n_k,
                                                         a.head_dim_v, a.vector_loads);
  cp_async_commit();

  const float d_factor = a.dout_scale / a.out_scale;
  const int64_t key[2] = {j0 + w.warp * 16 + w.g, j0 + w.warp * 16 + w.g + 8};
  const int64_t bk = b.n_k - j0 < Tiles::kRows ? b.n_k - j0 : Tiles::kRows;

  float dk[kHeadDim / 8][4], dv[kHeadDim / 8][4];
  zero_tiles(dk);
  zero_tiles(dv);

  for (int64_t ri = 0; ri < queries.size(); ++ri) {
    // The queries that see some key of this block (causality and the window).
    const QueryRun<T> run = queries.run(ri, a.causal, j0, bk);
    const int64_t n_q = run.view.n_q;
    for (int64_t i0 = run.rows.begin; i0 < run.rows.end; i0 += kStep) {
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sQ, run.q, run.stride, i0, n_q, a.head_dim,
                                                      a.vector_loads);
      load_rows<T, kStep, kHeadDim, kPitch, kThreads>(sdO, run.dout, run.dout_stride, i0, n_q,
                                                      a.head_dim_v, a.vector_loads);
      cp_async_commit();
      // This thread's query columns' lse·log2e and D · dout_scale/out_scale, in registers
      // (read while the tiles are in flight; shared memory holds only the tiles, so D = 256
      // fits the 99 KiB of compute capability 8.6/8.9).
      float colL[kStep / 8][2], colD[kStep / 8][2];
#pragma unroll
      for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int64_t qi = i0 + n * 8 + w.tig * 2 + u;
          row_softmax_stats(colL[n][u], colD[n][u], run.lse, run.delta,
                            run.lse0 + qi * run.lse_stride, qi < n_q, d_factor);
        }
      cp_async_wait<0>();
      __syncthreads();

      // Transposed tiles: rows are this warp's 16 keys, columns kStep queries.
      float pt[kStep / 8][4], dst[kStep / 8][4];
      zero_tiles(pt);
      zero_tiles(dst);
      warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(pt, sK + w.warp * 16 * kPitch, sQ, w.lane);
      warp_mma_rows_rows<T, kStep, kHeadDim, kPitch>(dst, sV + w.warp * 16 * kPitch, sdO, w.lane);

#pragma unroll
      for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + w.tig * 2 + (e & 1);
          const bool masked =
              i0 + c >= n_q || outside_reach(run.view, a.causal, i0 + c, key[e >> 1]);
          const float logit = logit_log2(pt[n][e], a.scale, a.softcap);
          const float pr = masked ? 0.0f : exp2f(logit - colL[n][e & 1]);
          // dSᵀ, through the cap's slope to the scaled score
          dst[n][e] = pr * (dst[n][e] * a.dout_scale - colD[n][e & 1]) *
                      cap_slope(pt[n][e], a.scale, a.softcap);
          pt[n][e] = pr;  // Pᵀ
        }
      warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dv, pt, sdO, w.lane);
      warp_mma_regs_rows<T, kHeadDim, kStep, kPitch>(dk, dst, sQ, w.lane);
      __syncthreads();  // before the next step overwrites sQ and sdO
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= b.n_k) continue;
    float* dk_row = b.dk + key[r] * b.stride;
    float* dv_row = b.dv + key[r] * b.v_stride;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = d * 8 + w.tig * 2 + u;
        if (col < a.head_dim) dk_row[col] += dk[d][2 * r + u] * a.scale;
        if (col < a.head_dim_v) dv_row[col] += dv[d][2 * r + u] * a.dout_scale;
      }
    }
  }
}

}  // namespace ringattn::kernels::cuda

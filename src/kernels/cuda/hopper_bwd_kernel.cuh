// The Hopper (sm_90a) backward kernels' bodies, written once for every kind of work: the
// dense backward (hopper_bwd.cu), the block-sparse one (hopper_sparse_bwd.cu) and the task
// one differ only in the `Work` of each pass, which says which tile a block keeps resident,
// where its rows' lse, delta and gradients are, which tiles of the other side it walks (and
// where their lse and delta are) and how far each row reaches. P and dS are recomputed from
// the forward's lse as FlashAttention-2 does (docs/SEMANTICS.md) and sit in registers, in
// wgmma's accumulator layout, until they are wgmma's register A: nothing is transposed in
// shared memory. Each gradient element has one writer, so the result is deterministic.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/hopper_tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

// One pass's launch: the tensors as maps, the scalars, the gradients (fp32, added into) and
// the pass's work. The stored out and dout may be scaled (a dilated pass's): true O =
// out / out_scale and true dO = dout · dout_scale, so dP and dV take dout_scale and delta
// (rowsum(out ∘ dout)) takes delta_factor = dout_scale / out_scale.
template <class Work>
struct BackwardArgs {
  TmaDesc q, k, v, dout;
  float scale_log2, scale;
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
  return {maps[0], maps[1], maps[2], maps[3], p.scale * kLog2ef, p.scale, dout_scale,
          delta_factor, p.lse, p.delta, p.dq, p.dk, p.dv, work};
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

// Adds this lane's rows of the block's 64 × kD accumulator, times `factor`, into `g`'s rows
// `rows` (element offsets) for the block's `count` rows.
template <int kD>
__device__ __forceinline__ void add_rows(float* g, const float (&acc)[kD / 2], float factor,
                                         const Strided& rows, int count, int local0, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = local0 + 8 * r;
    if (local >= count) continue;
    float* row = g + rows.at + local * rows.stride;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i)
      if (acc_row(i) == r) row[acc_col(i, lane)] += acc[i] * factor;
  }
}

// Which key-side gradients a dK/dV launch accumulates: both (D <= 128), or at D = 256 one per
// launch, since dK and dV of 64 × 256 in fp32 would take 256 registers a thread together. The
// dV launch then skips dPᵀ and dK's products (two of four); the dK launch, dV's (one).
enum KeyGrads : int { kGradDv = 1, kGradDk = 2, kGradBoth = 3 };

// dK and/or dV (kGrads) of a 64-key tile from every query tile the work walks for it. K and V
// are resident; the ring carries (Q, dO). Accumulator columns are queries, so lse and delta
// are per column.
template <int kD, bool kBf16, class Work, int kGrads, bool kRegA = false>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kD>)
    hopper_bwd_dkdv_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 2> st = Stages<kD, 2>::of_block();
  const QueryRows kr = p.work.query_rows(kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: one thread issues every load
    ptx::setmaxnreg<false, kProducerRegs<kD>>();
    if (threadIdx.x == 0) produce(st, p.work, kr, p.k, p.v, p.q, p.dout);
    return;
  }

  ptx::setmaxnreg<true, kConsumerRegs<kD>>();
  const int local0 = 16 * (warp - 4) + lane / 4;  // this lane's keys: local0, local0 + 8
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) reach[r] = p.work.reach(kr, local0 + 8 * r);
  constexpr bool kDv = (kGrads & kGradDv) != 0, kDk = (kGrads & kGradDk) != 0;
  // An unused accumulator is one register (the compiler drops it), not kD / 2.
  float dk[kDk ? kD / 2 : 1], dv[kDv ? kD / 2 : 1];
#pragma unroll
  for (float& x : dk) x = 0.0f;
#pragma unroll
  for (float& x : dv) x = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  // kRegA (D = 64): K and V read once into registers as wgmma's register A, so Sᵀ and dPᵀ
  // read only Q and dO from shared memory. At D = 128, K alone beside dK's and dV's
  // accumulators spilled 240-284 bytes (ptxas).
  static_assert(!kRegA || kD == 64, "K and V in registers fit at D = 64 only");
  [[maybe_unused]] uint32_t ka[kRegA ? kD / 16 : 1][4], va[kRegA ? kD / 16 : 1][4];
  if constexpr (kRegA) {
    load_a_fragments<kD>(ka, st.resident(0), local0, lane);
    load_a_fragments<kD>(va, st.resident(1), local0, lane);
  }
  typename Work::Cursor cursor = p.work.begin(kr);
  KeyTile t;  // here a query tile: t.n its first query, t.h its query head
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    if (t.limit < kRows) zero_tail_rows(st, s, t.limit, static_cast<int>(threadIdx.x) - 128);
    const Strided stats = p.work.column_stats(cursor, t);
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = columns_of(reach[r], t);
    // Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) per query column; 0 where the query does not see
    // the key. Register 4c + 2r + u is row r's column 8c + 2(lane % 4) + u. lse is loaded at
    // its use: loaded ahead of Sᵀ's product (so that the loads would run under the wgmma), the
    // 16 guarded loads become branches and the whole backward slows down (docs/PERFORMANCE.md).
    float pt[32];
    issue_a_bt<kD, kBf16, kRegA>(pt, ka, st.resident(0), st.ring(0, s));
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = 8 * c + 2 * (lane % 4) + u;
        const bool seen0 = seen(cols[0], col), seen1 = seen(cols[1], col);
        const float lse2 =
            seen0 || seen1 ? lse_log2(p.lse, stats.at + col * stats.stride) : INFINITY;
        float& p0 = pt[4 * c + u];
        float& p1 = pt[4 * c + 2 + u];
        p0 = seen0 ? exp2f(p0 * p.scale_log2 - lse2) : 0.0f;
        p1 = seen1 ? exp2f(p1 * p.scale_log2 - lse2) : 0.0f;
      }
    // dV += Pᵀ·dO, then dPᵀ = V·dOᵀ, each waited for: under one wait, the packed Pᵀ would
    // be live beside dPᵀ's accumulator, and ptxas spills 72-80 bytes at D = 128.
    if constexpr (kDv) product_rs<kD, kBf16>(dv, pt, st.ring(1, s));  // dO as stored
    if constexpr (!kDk) {
      ptx::mbarrier_arrive(at(st.empty(s)));
      continue;
    }
    float dpt[32];
    issue_a_bt<kD, kBf16, kRegA>(dpt, va, st.resident(1), st.ring(1, s));
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = 8 * c + 2 * (lane % 4) + u;
        const bool any = seen(cols[0], col) || seen(cols[1], col);
        const float dlt = any ? p.delta[stats.at + col * stats.stride] * p.delta_factor : 0.0f;
        pt[4 * c + u] *= dpt[4 * c + u] * p.dout_scale - dlt;  // dSᵀ (0 where Pᵀ is)
        pt[4 * c + 2 + u] *= dpt[4 * c + 2 + u] * p.dout_scale - dlt;
      }
    if constexpr (kDk) product_rs<kD, kBf16>(dk, pt, st.ring(0, s));  // dK += dSᵀ·Q
    ptx::mbarrier_arrive(at(st.empty(s)));
  }
  const Strided out = p.work.grad_rows(kr, kD);
  if constexpr (kDk) add_rows<kD>(p.dk, dk, p.scale, out, kr.rows, local0, lane);
  if constexpr (kDv) add_rows<kD>(p.dv, dv, p.dout_scale, out, kr.rows, local0, lane);
#else
  (void)p;
#endif
}

// dQ of a 64-query tile from the key tiles the work walks for it, as the forward walks
// them. Q and dO are resident; the ring carries (K, V). kRegA (D <= 128): Q and dO are read
// once into registers as wgmma's register A, so S and dP read only K and V from shared memory.
template <int kD, bool kBf16, class Work, bool kRegA = false>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kD>)
    hopper_bwd_dq_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
  static_assert(!kRegA || kD <= 128, "Q and dO in registers take D/2 of them");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 2> st = Stages<kD, 2>::of_block();
  const QueryRows qr = p.work.query_rows(kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {
    ptx::setmaxnreg<false, kProducerRegs<kD>>();
    if (threadIdx.x == 0) produce(st, p.work, qr, p.q, p.dout, p.k, p.v);
    return;
  }

  ptx::setmaxnreg<true, kConsumerRegs<kD>>();
  const int local0 = 16 * (warp - 4) + lane / 4;  // this lane's queries: local0, local0 + 8
  const Strided stats = p.work.row_stats(qr);
  Reach reach[2];
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    reach[r] = p.work.reach(qr, local0 + 8 * r);
    const bool valid = local0 + 8 * r < qr.rows;
    const int64_t at_row = stats.at + (local0 + 8 * r) * stats.stride;
    lse2[r] = valid ? lse_log2(p.lse, at_row) : INFINITY;
    dlt[r] = valid ? p.delta[at_row] * p.delta_factor : 0.0f;
  }
  float dq[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dq[i] = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  [[maybe_unused]] uint32_t qa[kRegA ? kD / 16 : 1][4], da[kRegA ? kD / 16 : 1][4];
  if constexpr (kRegA) {
    load_a_fragments<kD>(qa, st.resident(0), local0, lane);
    load_a_fragments<kD>(da, st.resident(1), local0, lane);
  }
  typename Work::Cursor cursor = p.work.begin(qr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    if (t.limit < kRows) zero_tail_rows(st, s, t.limit, static_cast<int>(threadIdx.x) - 128);
    float sc[32], dp[32];  // S = Q·Kᵀ and dP = dO·Vᵀ (dO as stored), under one wait
    issue_a_bt<kD, kBf16, kRegA>(sc, qa, st.resident(0), st.ring(0, s));
    issue_a_bt<kD, kBf16, kRegA>(dp, da, st.resident(1), st.ring(1, s));
    ptx::wgmma_wait_group<0>();
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = columns_of(reach[r], t);
#pragma unroll
    for (int i = 0; i < 32; ++i) {  // dS = P ∘ (dP − delta), 0 where the query does not see
      const int r = acc_row(i);
      sc[i] = seen(cols[r], acc_col(i, lane))
                  ? exp2f(sc[i] * p.scale_log2 - lse2[r]) * (dp[i] * p.dout_scale - dlt[r])
                  : 0.0f;
    }
    product_rs<kD, kBf16>(dq, sc, st.ring(0, s));  // dQ += dS·K
    ptx::mbarrier_arrive(at(st.empty(s)));
  }
  add_rows<kD>(p.dq, dq, p.scale, p.work.grad_rows(qr, kD), qr.rows, local0, lane);
#else
  (void)p;
#endif
}

// One pass: hopper_bwd_dkdv_kernel where the work's rows are keys (kKeyRows; at D = 256 as
// two launches, dV's then dK's), else hopper_bwd_dq_kernel (with Q and dO in registers under
// RINGATTN_HOPPER_QREGS=1, D <= 128).
template <bool kKeyRows, class Work>
void launch_backward_pass(int head_dim, Elem elem, const BackwardArgs<Work>& a, dim3 grid,
                          cudaStream_t stream) {
  dispatch(head_dim, elem, [&]<int kD, bool kBf16>() {
    const int smem = static_cast<int>(smem_bytes(kD, 2));
    if constexpr (kKeyRows && kD <= 128) {
      if (kD == 64 && qregs_chosen())
        launch("hopper_bwd_dkdv_kernel",
               &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradBoth, (kD == 64)>, a, grid, smem,
               stream);
      else
        launch("hopper_bwd_dkdv_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradBoth>, a,
               grid, smem, stream);
    } else if constexpr (kKeyRows) {
      launch("hopper_bwd_dv_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradDv>, a, grid,
             smem, stream);
      launch("hopper_bwd_dk_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradDk>, a, grid,
             smem, stream);
    } else if (kD <= 128 && qregs_chosen()) {
      launch("hopper_bwd_dq_kernel", &hopper_bwd_dq_kernel<kD, kBf16, Work, (kD <= 128)>, a, grid,
             smem, stream);
    } else {
      launch("hopper_bwd_dq_kernel", &hopper_bwd_dq_kernel<kD, kBf16, Work>, a, grid, smem, stream);
    }
  });
}

}  // namespace ringattn::kernels::cuda::hopper

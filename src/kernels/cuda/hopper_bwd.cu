// The Hopper dense backward (see hopper_bwd.hpp): two kernels on hopper_tiles.cuh's pipeline
// over hopper_dense_work.cuh's DenseWork. Both keep two tiles resident and stream two per
// ring stage; P and dS are recomputed from the forward's lse as FlashAttention-2 does (see
// docs/SEMANTICS.md), and sit in registers, in wgmma's accumulator layout, until they are
// wgmma's register A: nothing is transposed in shared memory.
#include <cmath>
#include <string>

#include "kernels/cuda/hopper_bwd.hpp"
#include "kernels/cuda/hopper_dense_work.cuh"
#include "kernels/cuda/hopper_tiles.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

using hopper::acc_col;
using hopper::acc_row;
using hopper::at;
using hopper::KeyTile;
using hopper::QueryRows;
using hopper::Reach;
using hopper::Stages;

struct Args {
  TmaDesc q, k, v, dout;
  float scale_log2, scale;
  const float* lse;
  const float* delta;
  float *dq, *dk, *dv;
  int seq_len, heads, kv_heads;
  hopper::DenseWork work;
};

// Whether column `col` of a tile lies in a row's visible columns.
__device__ __forceinline__ bool seen(const Reach& cols, int col) {
  return col >= cols.lo && col < cols.hi;
}

// The [B, H, N] index of query n of head h, batch b, in lse and delta.
__device__ __forceinline__ int64_t stats_at(const Args& p, int b, int h, int n) {
  return (static_cast<int64_t>(b) * p.heads + h) * p.seq_len + n;
}

// lse in the log2 domain, +inf for a query that saw nothing (so that P = 0).
__device__ __forceinline__ float lse_log2(const Args& p, int64_t at) {
  const float lse = p.lse[at];
  return lse == -INFINITY ? INFINITY : lse * hopper::kLog2ef;
}

// Adds this lane's rows of the block's 64 × kD accumulator, times `factor`, into rows
// [B, N, heads, D] of `g` from the block's first row.
template <int kD>
__device__ __forceinline__ void add_rows(float* g, const float (&acc)[kD / 2], float factor,
                                         const QueryRows& rows, int heads, int seq_len, int local0,
                                         int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = local0 + 8 * r;
    if (local >= rows.rows) continue;
    float* row =
        g + ((static_cast<int64_t>(rows.b) * seq_len + rows.n + local) * heads + rows.h) * kD;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i)
      if (acc_row(i) == r) row[acc_col(i, lane)] += acc[i] * factor;
  }
}

// dK and dV of a 64-key tile (rows: keys of K/V head blockIdx.y) from every query tile of
// the group's query heads that sees one of its keys. K and V are resident; the ring carries
// (Q, dO). Accumulator columns are queries, so lse and delta are per column.
template <int kD, bool kBf16>
__global__ void __launch_bounds__(hopper::kThreads, 1)
    hopper_bwd_dkdv_kernel(const RINGATTN_GRID_CONSTANT Args p) {
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 2> st = Stages<kD, 2>::of_block();
  const QueryRows kr = p.work.query_rows(kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: one thread issues every load
    ptx::setmaxnreg<false, 40>();
    if (threadIdx.x == 0) hopper::produce(st, p.work, kr, p.k, p.v, p.q, p.dout);
    return;
  }

  ptx::setmaxnreg<true, 232>();
  const int local0 = 16 * (warp - 4) + lane / 4;  // this lane's keys: local0, local0 + 8
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) reach[r] = p.work.reach(kr, local0 + 8 * r);
  float dk[kD / 2], dv[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  hopper::DenseWork::Cursor cursor = p.work.begin(kr);
  KeyTile t;  // here a query tile: t.n its first query, t.h its query head
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = hopper::columns_of(reach[r], t);
    // Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) per query column; 0 where the query does not see
    // the key. Register 4c + 2r + u is row r's column 8c + 2(lane % 4) + u.
    float pt[32];
    hopper::product_ss<kD, kBf16>(pt, st.resident(0), st.ring(0, s));
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = 8 * c + 2 * (lane % 4) + u;
        const bool seen0 = seen(cols[0], col), seen1 = seen(cols[1], col);
        const float lse2 =
            seen0 || seen1 ? lse_log2(p, stats_at(p, t.b, t.h, t.n + col)) : INFINITY;
        float& p0 = pt[4 * c + u];
        float& p1 = pt[4 * c + 2 + u];
        p0 = seen0 ? exp2f(p0 * p.scale_log2 - lse2) : 0.0f;
        p1 = seen1 ? exp2f(p1 * p.scale_log2 - lse2) : 0.0f;
      }
    hopper::product_rs<kD, kBf16>(dv, pt, st.ring(1, s));  // dV += Pᵀ·dO
    float dpt[32];
    hopper::product_ss<kD, kBf16>(dpt, st.resident(1), st.ring(1, s));  // dPᵀ = V·dOᵀ
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int col = 8 * c + 2 * (lane % 4) + u;
        const bool any = seen(cols[0], col) || seen(cols[1], col);
        const float dlt = any ? p.delta[stats_at(p, t.b, t.h, t.n + col)] : 0.0f;
        pt[4 * c + u] *= dpt[4 * c + u] - dlt;  // dSᵀ (0 where Pᵀ is)
        pt[4 * c + 2 + u] *= dpt[4 * c + 2 + u] - dlt;
      }
    hopper::product_rs<kD, kBf16>(dk, pt, st.ring(0, s));  // dK += dSᵀ·Q
    ptx::mbarrier_arrive(at(st.empty(s)));
  }
  add_rows<kD>(p.dk, dk, p.scale, kr, p.kv_heads, p.seq_len, local0, lane);
  add_rows<kD>(p.dv, dv, 1.0f, kr, p.kv_heads, p.seq_len, local0, lane);
#else
  (void)p;
#endif
}

// dQ of a 64-query tile (rows: queries of head blockIdx.y) from the key tiles it sees, as
// the forward walks them. Q and dO are resident; the ring carries (K, V).
template <int kD, bool kBf16>
__global__ void __launch_bounds__(hopper::kThreads, 1)
    hopper_bwd_dq_kernel(const RINGATTN_GRID_CONSTANT Args p) {
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 2> st = Stages<kD, 2>::of_block();
  const QueryRows qr = p.work.query_rows(kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {
    ptx::setmaxnreg<false, 40>();
    if (threadIdx.x == 0) hopper::produce(st, p.work, qr, p.q, p.dout, p.k, p.v);
    return;
  }

  ptx::setmaxnreg<true, 232>();
  const int local0 = 16 * (warp - 4) + lane / 4;  // this lane's queries: local0, local0 + 8
  Reach reach[2];
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    reach[r] = p.work.reach(qr, local0 + 8 * r);
    const bool valid = local0 + 8 * r < qr.rows;
    const int64_t at_row = stats_at(p, qr.b, qr.h, qr.n + local0 + 8 * r);
    lse2[r] = valid ? lse_log2(p, at_row) : INFINITY;
    dlt[r] = valid ? p.delta[at_row] : 0.0f;
  }
  float dq[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dq[i] = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  hopper::DenseWork::Cursor cursor = p.work.begin(qr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    float sc[32], dp[32];
    hopper::product_ss<kD, kBf16>(sc, st.resident(0), st.ring(0, s));  // S = Q·Kᵀ
    hopper::product_ss<kD, kBf16>(dp, st.resident(1), st.ring(1, s));  // dP = dO·Vᵀ
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = hopper::columns_of(reach[r], t);
#pragma unroll
    for (int i = 0; i < 32; ++i) {  // dS = P ∘ (dP − delta), 0 where the query does not see
      const int r = acc_row(i);
      sc[i] = seen(cols[r], acc_col(i, lane))
                  ? exp2f(sc[i] * p.scale_log2 - lse2[r]) * (dp[i] - dlt[r])
                  : 0.0f;
    }
    hopper::product_rs<kD, kBf16>(dq, sc, st.ring(0, s));  // dQ += dS·K
    ptx::mbarrier_arrive(at(st.empty(s)));
  }
  add_rows<kD>(p.dq, dq, p.scale, qr, p.heads, p.seq_len, local0, lane);
#else
  (void)p;
#endif
}

}  // namespace

std::string hopper_backward_unsupported(const HopperBackwardParams& p, int device) {
  if (p.head_dim == 256)  // dK and dV of 64 × 256 in fp32 would be 256 registers a thread
    return "head dim 256 (the backward takes 64 or 128)";
  return hopper::attention_unsupported(p, device);
}

void hopper_backward(const HopperBackwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_backward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper backward kernels cannot run: " + why);
  if (p.batch <= 0 || p.seq_len <= 0) return;
  Args a{hopper::tensor_map(p.q, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
         hopper::tensor_map(p.k, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
         hopper::tensor_map(p.v, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
         hopper::tensor_map(p.dout, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
         p.scale * hopper::kLog2ef,
         p.scale,
         p.lse,
         p.delta,
         p.dq,
         p.dk,
         p.dv,
         p.seq_len,
         p.heads,
         p.kv_heads,
         {}};
  hopper::dispatch(p.head_dim, p.elem, [&]<int kD, bool kBf16>() {
    const int smem = static_cast<int>(hopper::smem_bytes(kD, 2));
    a.work = hopper::dense_work(p, nullptr, nullptr, true);
    hopper::launch("hopper_bwd_dkdv_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16>, a,
                   hopper::dense_grid(p, p.kv_heads), smem, stream);
    a.work = hopper::dense_work(p, nullptr, nullptr, false);
    hopper::launch("hopper_bwd_dq_kernel", &hopper_bwd_dq_kernel<kD, kBf16>, a,
                   hopper::dense_grid(p, p.heads), smem, stream);
  });
}

}  // namespace ringattn::kernels::cuda

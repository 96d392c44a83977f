// The CPU flash-attention backward in the FlashAttention-2 way: scores are recomputed tile
// by tile from the saved lse (P = exp(S - lse)), D = rowsum(dO ∘ O), dS = P ∘ (dP − D),
// and dQ, dK, dV are accumulated with sgemm on strided views. One thread owns a task, so
// its dK/dV rows and its dQ rows have a single writer and the result is deterministic.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cpu_math.hpp"

namespace ringattn::kernels {

namespace {

struct BackwardScratch {
  float* p;    // q_tile × k_tile probabilities
  float* ds;   // q_tile × k_tile dP, then dS
  float* dq;   // q_tile × head_dim dQ accumulator
  float* lse;  // q_tile row lse
  float* dd;   // q_tile D = rowsum(dO ∘ O)
};

BackwardScratch carve(float* base, const TileConfig& t, int64_t d) {
  BackwardScratch s{};
  const auto tile = round_up16(static_cast<std::size_t>(t.q_tile * t.k_tile));
  s.p = base;
  s.ds = base + tile;
  base += 2 * tile;
  s.dq = base;
  base += round_up16(static_cast<std::size_t>(t.q_tile * d));
  s.lse = base;
  base += round_up16(static_cast<std::size_t>(t.q_tile));
  s.dd = base;
  return s;
}

void backward_task(const BackwardParams& p, const SubseqTask& t, const TileConfig& tiles,
                   const BackwardScratch& w) {
  const int64_t d = p.head_dim;
  const int64_t ld = tiles.k_tile;
  const int ld_q = static_cast<int>(t.q_stride), ld_k = static_cast<int>(t.k_stride);
  const float d_factor = p.dout_scale / p.out_scale;

  for (int64_t i0 = 0; i0 < t.n_q; i0 += tiles.q_tile) {
    const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
    const float* q = p.q + t.q_row0 + i0 * t.q_stride;
    const float* o = p.out + t.q_row0 + i0 * t.q_stride;
    const float* dout = p.dout + t.q_row0 + i0 * t.q_stride;
    bool any_row = false;
    for (int64_t i = 0; i < bq; ++i) {
      w.lse[i] = p.lse[t.lse0 + (i0 + i) * t.lse_stride];
      any_row |= w.lse[i] != kNegInf;
      float acc = 0.0f;
      const float* orow = o + i * t.q_stride;
      const float* grow = dout + i * t.q_stride;
#pragma omp simd reduction(+ : acc)
      for (int64_t c = 0; c < d; ++c) acc += orow[c] * grow[c];
      w.dd[i] = acc * d_factor;
    }
    if (!any_row) continue;
    const int64_t kmax = visible_keys(t, p.causal, i0, bq);
    std::fill(w.dq, w.dq + bq * d, 0.0f);

    for (int64_t j0 = 0; j0 < kmax; j0 += tiles.k_tile) {
      const int64_t bk = std::min(tiles.k_tile, kmax - j0);
      const float* k = p.k + t.k_row0 + j0 * t.k_stride;
      const float* v = p.v + t.k_row0 + j0 * t.k_stride;
      float* dk = p.dk + t.k_row0 + j0 * t.k_stride;
      float* dv = p.dv + t.k_row0 + j0 * t.k_stride;
      const int ibq = static_cast<int>(bq), ibk = static_cast<int>(bk), id = static_cast<int>(d);

      sgemm(CblasNoTrans, CblasTrans, ibq, ibk, id, p.scale, q, ld_q, k, ld_k, 0.0f, w.p,
            static_cast<int>(ld));
      const bool crosses_diagonal = p.causal && j0 + bk - 1 > i0 + t.causal_offset;
      for (int64_t i = 0; i < bq; ++i) {
        float* prow = w.p + i * ld;
        const float l = w.lse[i];
        const int64_t limit =
            crosses_diagonal ? std::clamp<int64_t>(i0 + i + t.causal_offset - j0 + 1, 0, bk) : bk;
        if (l == kNegInf) {
          std::fill(prow, prow + bk, 0.0f);
          continue;
        }
        exp_shift_sum(prow, limit, l);
        for (int64_t j = limit; j < bk; ++j) prow[j] = 0.0f;
      }
      // dV += dout_scale · Pᵀ dO
      sgemm(CblasTrans, CblasNoTrans, ibk, id, ibq, p.dout_scale, w.p, static_cast<int>(ld), dout,
            ld_q, 1.0f, dv, ld_k);
      // dP = dout_scale · dO Vᵀ
      sgemm(CblasNoTrans, CblasTrans, ibq, ibk, id, p.dout_scale, dout, ld_q, v, ld_k, 0.0f, w.ds,
            static_cast<int>(ld));
      for (int64_t i = 0; i < bq; ++i) {
        float* dsrow = w.ds + i * ld;
        const float* prow = w.p + i * ld;
        const float di = w.dd[i];
#pragma omp simd
        for (int64_t j = 0; j < bk; ++j) dsrow[j] = prow[j] * (dsrow[j] - di);
      }
      // dQ += scale · dS K ;  dK += scale · dSᵀ Q
      sgemm(CblasNoTrans, CblasNoTrans, ibq, id, ibk, p.scale, w.ds, static_cast<int>(ld), k, ld_k,
            1.0f, w.dq, id);
      sgemm(CblasTrans, CblasNoTrans, ibk, id, ibq, p.scale, w.ds, static_cast<int>(ld), q, ld_q,
            1.0f, dk, ld_k);
    }
    for (int64_t i = 0; i < bq; ++i) {
      float* dqrow = p.dq + t.q_row0 + (i0 + i) * t.q_stride;
      const float* acc = w.dq + i * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) dqrow[c] += acc[c];
    }
  }
}

}  // namespace

std::size_t backward_workspace_floats(const TileConfig& t, int64_t head_dim) {
  return 2 * round_up16(static_cast<std::size_t>(t.q_tile * t.k_tile)) +
         round_up16(static_cast<std::size_t>(t.q_tile * head_dim)) +
         2 * round_up16(static_cast<std::size_t>(t.q_tile));
}

void flash_backward(const BackwardParams& p, std::span<const SubseqTask> tasks,
                    const TileConfig& tiles, int threads, float* workspace) {
  const std::size_t per_thread = backward_workspace_floats(tiles, p.head_dim);
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  const BlasSingleThreadScope one_thread_per_sgemm;
#pragma omp parallel num_threads(threads)
  {
    const BackwardScratch w = carve(
        workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread, tiles, p.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tasks; ++i)
      backward_task(p, tasks[static_cast<std::size_t>(i)], tiles, w);
  }
}

}  // namespace ringattn::kernels

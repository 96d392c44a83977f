// The CPU flash-attention forward: for each tile of queries, stream tiles of keys with an
// online softmax (running max and sum per row), fp32 accumulation, and finish with out and
// the natural-log lse. Score and P·V products are OpenBLAS sgemm calls on strided views;
// no N×N matrix exists at any time, only one q_tile × k_tile score tile per thread.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cpu_math.hpp"
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels {

namespace {

struct ForwardScratch {
  float* s;    // q_tile × k_tile scores, then probabilities
  float* acc;  // q_tile × head_dim unnormalised output
  float* m;    // q_tile running max
  float* l;    // q_tile running sum
};

ForwardScratch carve(float* base, const TileConfig& t, int64_t d) {
  ForwardScratch s{};
  s.s = base;
  base += round_up16(static_cast<std::size_t>(t.q_tile * t.k_tile));
  s.acc = base;
  base += round_up16(static_cast<std::size_t>(t.q_tile * d));
  s.m = base;
  base += round_up16(static_cast<std::size_t>(t.q_tile));
  s.l = base;
  return s;
}

void forward_tile(const ForwardParams& p, const SubseqTask& t, int64_t i0, const TileConfig& tiles,
                  const ForwardScratch& w) {
  const int64_t d = p.head_dim;
  const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
  const int64_t ldS = tiles.k_tile;
  const float* q = p.q + t.q_row0 + i0 * t.q_stride;
  const KeyRange keys = visible_key_range(t, p.causal, i0, bq);

  std::fill(w.m, w.m + bq, kNegInf);
  std::fill(w.l, w.l + bq, 0.0f);
  std::fill(w.acc, w.acc + bq * d, 0.0f);

  // Key tiles lie on the k_tile grid; those wholly outside every row's keys are not visited.
  for (int64_t j0 = first_key_tile(keys, tiles); j0 < keys.end; j0 += tiles.k_tile) {
    const int64_t bk = std::min(tiles.k_tile, keys.end - j0);
    const float* k = p.k + t.k_row0 + j0 * t.k_stride;
    const float* v = p.v + t.k_row0 + j0 * t.k_stride;
    sgemm(CblasNoTrans, CblasTrans, static_cast<int>(bq), static_cast<int>(bk), static_cast<int>(d),
          p.scale, q, static_cast<int>(t.q_stride), k, static_cast<int>(t.k_stride), 0.0f, w.s,
          static_cast<int>(ldS));
    for (int64_t i = 0; i < bq; ++i) {
      float* srow = w.s + i * ldS;
      // Keys of this tile outside [a, b) are in the query's future or outside its window.
      const KeyRange row = row_keys_in_tile(t, p.causal, i0 + i, j0, bk);
      const int64_t a = row.begin, b = row.end;
      const float row_max = max_of(srow + a, b - a);
      const float m_new = std::max(w.m[i], row_max);
      if (m_new == kNegInf) {  // nothing visible yet for this row
        std::fill(srow, srow + bk, 0.0f);
        continue;
      }
      const float alpha = exp_approx(w.m[i] - m_new);
      const float row_sum = exp_shift_sum(srow + a, b - a, m_new);
      std::fill(srow, srow + a, 0.0f);
      std::fill(srow + b, srow + bk, 0.0f);
      w.l[i] = w.l[i] * alpha + row_sum;
      w.m[i] = m_new;
      if (alpha != 1.0f) {
        float* arow = w.acc + i * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) arow[c] *= alpha;
      }
    }
    sgemm(CblasNoTrans, CblasNoTrans, static_cast<int>(bq), static_cast<int>(d),
          static_cast<int>(bk), 1.0f, w.s, static_cast<int>(ldS), v, static_cast<int>(t.k_stride),
          1.0f, w.acc, static_cast<int>(d));
  }

  for (int64_t i = 0; i < bq; ++i) {
    float* arow = w.acc + i * d;
    float* orow = p.out + t.q_row0 + (i0 + i) * t.q_stride;
    float* lse = p.lse + t.lse0 + (i0 + i) * t.lse_stride;
    const bool empty = w.l[i] == 0.0f;
    const float row_lse = empty ? kNegInf : w.m[i] + std::log(w.l[i]);
    const float inv = empty ? 0.0f : 1.0f / w.l[i];
    if (p.accumulate) {
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) arow[c] *= inv;
      merge_lse_row(orow, lse, arow, row_lse, d);
    } else {
      const float f = inv * p.out_scale;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) orow[c] = arow[c] * f;
      *lse = row_lse;
    }
  }
}

// Work a task costs: its visible (query, key) pairs, counted per query tile as the schedule
// counts items (a sliding window or causality cuts them).
int64_t task_cost(const SubseqTask& t, bool causal, const TileConfig& tiles) {
  int64_t cost = 0;
  for (int64_t i0 = 0; i0 < t.n_q; i0 += tiles.q_tile) {
    const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
    const KeyRange keys = visible_key_range(t, causal, i0, bq);
    cost += bq * (keys.end - keys.begin);
  }
  return cost;
}

// Whether whole tasks are fine enough units of work: the largest is at most 1/32 of a
// thread's share, so even if it comes last the others wait at most ~3 % of the call.
bool tasks_are_fine_units(const ForwardParams& p, std::span<const SubseqTask> tasks,
                          const TileConfig& tiles, int threads) {
  int64_t total = 0, largest = 0;
  for (const SubseqTask& t : tasks) {
    const int64_t c = task_cost(t, p.causal, tiles);
    total += c;
    largest = std::max(largest, c);
  }
  return largest > 0 && largest * 32 * static_cast<int64_t>(threads) <= total;
}

}  // namespace

std::size_t forward_workspace_floats(const TileConfig& t, int64_t head_dim) {
  return round_up16(static_cast<std::size_t>(t.q_tile * t.k_tile)) +
         round_up16(static_cast<std::size_t>(t.q_tile * head_dim)) +
         2 * round_up16(static_cast<std::size_t>(t.q_tile));
}

void flash_forward(const ForwardParams& p, std::span<const SubseqTask> tasks,
                   std::span<const ForwardItem> items, const TileConfig& tiles, int threads,
                   float* workspace) {
  const std::size_t per_thread = forward_workspace_floats(tiles, p.head_dim);
  const auto n_items = static_cast<int64_t>(items.size());
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  const BlasSingleThreadScope one_thread_per_sgemm;
  // Items arrive longest first, which balances the threads' ends; but under causality the
  // items of equal cost come from different tasks, so a thread's next item reads another
  // task's K/V rows and, past the last-level cache (many dilated tasks at large N), every
  // item streams its keys from memory. When tasks are many and small, a thread takes a
  // whole task instead and runs its query tiles back to back over the same K/V rows. Each
  // item writes only its own rows, so the order changes no bit of the result. (The items
  // cover every query tile of every task, as ring::forward_items builds them.)
  const bool task_major = tasks_are_fine_units(p, tasks, tiles, threads);
#pragma omp parallel num_threads(threads)
  {
    const ForwardScratch w = carve(
        workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread, tiles, p.head_dim);
    if (task_major) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t ti = 0; ti < n_tasks; ++ti) {
        const SubseqTask& t = tasks[static_cast<std::size_t>(ti)];
        for (int64_t i0 = 0; i0 < t.n_q; i0 += tiles.q_tile) forward_tile(p, t, i0, tiles, w);
      }
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < n_items; ++it) {
        const ForwardItem& item = items[static_cast<std::size_t>(it)];
        forward_tile(p, tasks[static_cast<std::size_t>(item.task)], item.q_begin, tiles, w);
      }
    }
  }
}

}  // namespace ringattn::kernels

// The CPU flash-attention forward: for each tile of queries, stream tiles of keys with an
// online softmax (running max and sum per query), fp32 accumulation, and finish with out and
// the natural-log lse. Scores are held key-major (cpu_keymajor.hpp): the query tile is
// transposed (and scaled) once, S = Qᵀ·K and acc += P·V are small column-major products on
// K and V in place (cpu_small_gemm.hpp), and the softmax runs on 16 queries per vector. No
// N×N matrix exists at any time, only one q_tile × k_tile score tile per thread.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cpu_keymajor.hpp"
#include "kernels/cpu_math.hpp"
#include "kernels/cpu_small_gemm.hpp"
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels {

namespace {

struct ForwardScratch {
  int64_t ld;  // queries per key column: tile_ld(q_tile) (cpu_flash.hpp)
  float* qt;   // head_dim × ld: the query tile, transposed and scaled
  float* s;    // k_tile × ld scores, then probabilities
  float* acc;  // head_dim_v × ld unnormalised output
  float* m;    // ld running max
  float* l;    // ld running sum
  float* row;  // head_dim_v: one output row, for merging
};

ForwardScratch carve(float* base, const TileConfig& t, int64_t d, int64_t dv) {
  ForwardScratch s{};
  s.ld = static_cast<int64_t>(tile_ld(t.q_tile));
  const auto ld = static_cast<std::size_t>(s.ld);
  s.qt = base;
  base += round_up16(ld * static_cast<std::size_t>(d));
  s.s = base;
  base += round_up16(ld * static_cast<std::size_t>(t.k_tile));
  s.acc = base;
  base += round_up16(ld * static_cast<std::size_t>(dv));
  s.m = base;
  base += ld;
  s.l = base;
  base += ld;
  s.row = base;
  return s;
}

void forward_tile(const ForwardParams& p, const SubseqTask& t, int64_t i0, const TileConfig& tiles,
                  const ForwardScratch& w) {
  const int64_t d = p.head_dim, dv = p.value_dim();
  const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
  const int64_t ld = w.ld;
  const KeyRange keys = visible_key_range(t, p.causal, i0, bq);

  km::transpose_rows(p.q + t.q_row0 + i0 * t.q_stride, t.q_stride, bq, d, p.scale, w.qt, ld);
  std::fill(w.m, w.m + ld, kNegInf);
  std::fill(w.l, w.l + ld, 0.0f);
  std::fill(w.acc, w.acc + ld * dv, 0.0f);

  const int ild = static_cast<int>(ld), id = static_cast<int>(d), idv = static_cast<int>(dv);
  const int ldk = static_cast<int>(t.k_stride);
  const int64_t v_stride = value_floats(t.k_stride, d, dv);
  const int ldv = static_cast<int>(v_stride);
  const float* v_rows = p.v + value_floats(t.k_row0, d, dv);
  // Key tiles lie on the k_tile grid; those wholly outside every row's keys are not visited.
  for (int64_t j0 = first_key_tile(keys, tiles); j0 < keys.end; j0 += tiles.k_tile) {
    const int64_t bk = std::min(tiles.k_tile, keys.end - j0);
    const float* k = p.k + t.k_row0 + j0 * t.k_stride;
    const float* v = v_rows + j0 * v_stride;
    if (t.k_stride != d && j0 + tiles.k_tile < keys.end) {  // the next tile's rows, strided
      const int64_t next = std::min(tiles.k_tile, keys.end - j0 - tiles.k_tile);
      km::prefetch_rows(k + tiles.k_tile * t.k_stride, t.k_stride, next, d, false);
      km::prefetch_rows(v + tiles.k_tile * v_stride, v_stride, next, dv, false);
    }
    const auto part = [&](const km::TilePart& b) {
      const int m = static_cast<int>(b.r1 - b.r0), n = static_cast<int>(b.c1 - b.c0);
      float* s = w.s + b.c0 * ld + b.r0;
      float* acc = w.acc + b.r0;
      small_gemm(false, m, n, id, w.qt + b.r0, ild, k + b.c0 * t.k_stride, ldk, 0.0f, s,
                 ild);  // S = (scale·Q)·Kᵀ
      if (p.softcap > 0.0f) km::soft_cap(s, ld, m, n, p.softcap, nullptr);
      km::mask_outside_reach(s, ld, t, p.causal, i0 + b.r0, std::min(b.r1, bq) - b.r0, j0 + b.c0,
                             n);
      km::online_softmax(s, ld, m, n, w.m + b.r0, w.l + b.r0, acc, ld, dv);
      small_gemm(true, m, idv, n, s, ild, v + b.c0 * v_stride, ldv, 1.0f, acc,
                 ild);  // acc += P·V
    };
    km::for_each_part(t, p.causal, i0, bq, ld, j0, bk, part);
  }

  const int64_t o_stride = value_floats(t.q_stride, d, dv);
  km::finish_rows(w.acc, ld, w.m, w.l, bq, dv,
                  p.out + value_floats(t.q_row0, d, dv) + i0 * o_stride, o_stride,
                  p.lse + t.lse0 + i0 * t.lse_stride, t.lse_stride, p.accumulate, p.out_scale,
                  w.row);
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

std::size_t forward_workspace_floats(const TileConfig& t, int64_t head_dim, int64_t head_dim_v) {
  const std::size_t ld = tile_ld(t.q_tile);
  const auto d = static_cast<std::size_t>(head_dim);
  const auto dv = static_cast<std::size_t>(head_dim_v > 0 ? head_dim_v : head_dim);
  return round_up16(ld * d) + round_up16(ld * dv) +
         round_up16(ld * static_cast<std::size_t>(t.k_tile)) + 2 * ld + round_up16(dv);
}

void flash_forward(const ForwardParams& p, std::span<const SubseqTask> tasks,
                   std::span<const ForwardItem> items, const TileConfig& tiles, int threads,
                   float* workspace) {
  const std::size_t per_thread = forward_workspace_floats(tiles, p.head_dim, p.value_dim());
  const auto n_items = static_cast<int64_t>(items.size());
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  const BlasSingleThreadScope one_thread_per_sgemm;
  // Items arrive longest first, which balances the threads' ends; but under causality the
  // items of equal cost come from different tasks, so a thread's next item reads another
  // task's K/V rows and, past the last-level cache (many dilated tasks at large N), every
  // item streams its keys from memory. When tasks are many and small, a thread takes a
  // whole task instead and runs its query tiles back to back over the same K/V rows. Each
  // item writes only its own rows, so the order changes no bit of the result. (The items
  // cover every query tile of every task, as single::forward_items builds them.)
  const bool task_major = tasks_are_fine_units(p, tasks, tiles, threads);
#pragma omp parallel num_threads(threads)
  {
    const ForwardScratch w =
        carve(workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread, tiles,
              p.head_dim, p.value_dim());
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

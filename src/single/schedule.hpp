// The schedule: how a configuration's attention breaks into kernel passes of strided
// subsequence tasks on one rank. It is built once per Plan, computed once and reused by
// every call: the pattern cache is the schedule itself.
#pragma once

#include <span>
#include <vector>

#include "core/head_slice.hpp"
#include "kernels/cpu_flash.hpp"
#include "ringattn/config.hpp"

namespace ringattn::single {

// Floats between consecutive batches, positions and heads of a tensor of `n` positions,
// `heads` heads and head dim `d` laid out as `layout` ([B, n, heads, d] for bnhd,
// [B, heads, n, d] for bhnd), and the offset of (batch, position, head)'s row. Every engine
// and work list derives its row bases and strides from this.
struct RowStrides {
  int64_t batch = 0, position = 0, head = 0;
  int64_t at(int64_t b, int64_t pos, int64_t h) const {
    return b * batch + pos * position + h * head;
  }
};
inline RowStrides row_strides(TensorLayout layout, int64_t n, int64_t heads, int64_t d) {
  return layout == TensorLayout::bnhd ? RowStrides{n * heads * d, heads * d, d}
                                      : RowStrides{heads * n * d, d, n * d};
}

// One forward kernel launch. Tasks inside a pass share no query rows; they share key rows
// only under grouped-query attention, where the query heads of one K/V group read the same
// K/V rows.
struct KernelPass {
  std::vector<kernels::SubseqTask> tasks;
  std::vector<kernels::ForwardItem> items;  // forward work, most expensive first
  bool accumulate = false;                  // mixture: merge into what earlier passes wrote
  float out_scale = 1.0f;                   // grouped: 1/G
  // The backward runs tasks [0, e0), [e0, e1), ... (e_i = backward_ends[i]) as separate
  // kernel calls, in this order, so that no call has two tasks writing the same dK/dV rows:
  // tasks are ordered by their query head's place in its K/V group (h % (H / HKV)), one call
  // per place, and a K/V head's gradient sums its query heads in that fixed order whatever
  // the thread count. Multi-head attention: one call with every task.
  std::vector<std::size_t> backward_ends;
};

struct LocalSchedule {
  std::vector<KernelPass> passes;
  // Rows that no pass writes (unselected by every pattern) must read out 0, lse -inf, and
  // mixture passes merge into that initial state, so the outputs are cleared first.
  bool clear_outputs_first = false;
};

// `slice`: the job's heads this config computes (default: all of them).
LocalSchedule build_local_schedule(const AttentionConfig& cfg, const kernels::TileConfig& t,
                                   const HeadSlice& slice = {});

// Concatenates tasks grouped by the query head's place in its K/V group (the buckets of
// `by_place`, in order) into `tasks`, appending each bucket's end to `ends`; empty buckets
// add nothing.
void append_by_kv_place(std::vector<std::vector<kernels::SubseqTask>>& by_place,
                        std::vector<kernels::SubseqTask>& tasks, std::vector<std::size_t>& ends);

// Forward work items (task, query tile) of `tasks`, most expensive first.
std::vector<kernels::ForwardItem> forward_items(std::span<const kernels::SubseqTask> tasks,
                                                bool causal, const kernels::TileConfig& tiles);

// Tiles for a head dim, unless the caller asks for others (0: automatic): 256 queries × 128
// keys (a 128 KiB score tile) up to D = 128, 128 × 128 past it, so that the score tiles and
// the query tile's transposed copies (cpu_keymajor.hpp) stay in L2 beside the K/V tile. 256
// queries per tile halve how often K/V stream past each query (measured against 128 × 256
// with bench/cpu_bench --q-tile --k-tile: docs/PERFORMANCE.md).
inline kernels::TileConfig choose_tiles(int64_t head_dim, int64_t q_tile, int64_t k_tile) {
  kernels::TileConfig t;
  t.q_tile = q_tile > 0 ? q_tile : (head_dim > 128 ? 128 : 256);
  t.k_tile = k_tile > 0 ? k_tile : 128;
  return t;
}

// Bytes the schedule occupies (reported as part of the plan's workspace).
std::size_t schedule_bytes(const LocalSchedule& s);

}  // namespace ringattn::single

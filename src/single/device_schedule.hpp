// The schedule in the form the CUDA kernels read: every pass's tasks in one array, forward
// (and dQ) items of kQueryTile query rows and dK/dV items of kKeyTile key rows, each with
// an index into that array, and per pass the ranges of both item lists. Built on the host
// from the same LocalSchedule as the CPU Plan and uploaded once by CudaPlan; plain C++, so
// its layout is tested without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu_flash.hpp"
#include "single/schedule.hpp"

namespace ringattn::single {

// A slice {first, count} of an item list.
struct ItemRange {
  int64_t first = 0, count = 0;
};

struct DevicePass {
  int64_t q_item0 = 0, n_q_items = 0;  // into FlatSchedule::q_items
  int64_t k_item0 = 0, n_k_items = 0;  // into FlatSchedule::k_items
  // The key items of each of the pass's backward ranges (KernelPass::backward_ends), in
  // order: one dK/dV launch each, so that query heads sharing a K/V head (grouped-query
  // attention) add into its dK/dV one after another, never at once. One range for MHA.
  std::vector<ItemRange> k_ranges;
  bool accumulate = false;
  float out_scale = 1.0f;
};

struct FlatSchedule {
  std::vector<kernels::SubseqTask> tasks;     // all passes, in pass order
  std::vector<kernels::ForwardItem> q_items;  // (task index into tasks, first query row)
  std::vector<kernels::ForwardItem> k_items;  // (task index into tasks, first key row)
  std::vector<DevicePass> passes;
  bool clear_outputs_first = false;
};

// `s` must have been built with q_tile rows per forward item.
FlatSchedule flatten_schedule(const LocalSchedule& s, bool causal, int64_t k_tile);

// Key items (task, first key row) of `tasks`, k_tile keys each, most expensive first (cost:
// keys × queries that can see the tile). Item task indices start at `task0`.
std::vector<kernels::ForwardItem> key_items(std::span<const kernels::SubseqTask> tasks, bool causal,
                                            int64_t k_tile, int64_t task0 = 0);

// Appends the key items of each backward range [0, e0), [e0, e1), ... of `tasks` to `items`
// (task indices offset by `task0`) and returns each range's slice of `items`.
std::vector<ItemRange> append_key_items_by_range(std::span<const kernels::SubseqTask> tasks,
                                                 std::span<const std::size_t> backward_ends,
                                                 bool causal, int64_t k_tile, int64_t task0,
                                                 std::vector<kernels::ForwardItem>& items);

// True when every row start and row stride of every task is a multiple of `multiple`
// elements (8 for 16-byte copies of 2-byte elements).
bool rows_aligned(const FlatSchedule& f, int64_t multiple);

// Bytes the flat schedule occupies on the device.
std::size_t flat_schedule_bytes(const FlatSchedule& f);

}  // namespace ringattn::single

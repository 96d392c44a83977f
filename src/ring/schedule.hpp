// The schedule: how a configuration's attention breaks into kernel passes of strided
// subsequence tasks on one rank. It is built once per Plan (this is the "pattern cache" of
// the replaced project: computed once, reused by every call).
#pragma once

#include <vector>

#include "kernels/cpu_flash.hpp"
#include "ringattn/config.hpp"

namespace ringattn::ring {

// One kernel launch. Tasks inside a pass share no query rows and no key rows.
struct KernelPass {
  std::vector<kernels::SubseqTask> tasks;
  std::vector<kernels::ForwardItem> items;  // forward work, most expensive first
  bool accumulate = false;                  // mixture: merge into what earlier passes wrote
  float out_scale = 1.0f;                   // grouped: 1/G
};

struct LocalSchedule {
  std::vector<KernelPass> passes;
  // Rows that no pass writes (unselected by every pattern) must read out 0, lse -inf, and
  // mixture passes merge into that initial state, so the outputs are cleared first.
  bool clear_outputs_first = false;
};

LocalSchedule build_local_schedule(const AttentionConfig& cfg, const kernels::TileConfig& t);

// Bytes the schedule occupies (reported as part of the plan's workspace).
std::size_t schedule_bytes(const LocalSchedule& s);

}  // namespace ringattn::ring

// The Hopper (sm_90a) forward over the native forward's own work: SubseqTasks (strided query
// and key views into [B, N, H, D] q and [B, N, HKV, D] k, v, so dilated patterns are read in
// place, each with its causal offset and window) and ForwardItems, with write or log-sum-exp
// merge and out_scale, as FlashForwardParams gives them to the native forward. The body is
// hopper/forward_mainloop.cuh's. TMA reads a strided view through a tensor map of exactly its rows
// (rows phase, phase + step, ... of each batch), so one launch covers the items whose tasks
// share a query view (step, phase) and a key view: hopper_task_groups orders a pass's items
// into such groups once, on the host, and hopper_task_forward launches once per group.
// bf16/fp16, D = 64, 128 or 256. Run on the emulated GPU in CI; exact on an H100.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/dense_forward.hpp"  // HopperForwardForm
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

struct HopperTaskShape {
  int batch = 0, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int head_dim_v = 0;  // v, out, dout and dv (0: head_dim); as the launch's params' value_dim()
  // K and V as kv_rows positions of kv_heads heads end to end, when they are not [B, N,
  // HKV, D] (a ring's packed receive buffer: [kv_rows, D], kv_heads 1); 0: B·N positions.
  int kv_rows = 0;
  // The forward's loop (HopperForwardForm plain, overlap or qregs; rule: the environment's).
  HopperForwardForm form = HopperForwardForm::rule;
};

// Items [item0, item0 + n_items) of an ordered list, whose tasks read query rows q_phase,
// q_phase + q_step, ... and key rows k_phase, k_phase + k_step, ... of their (batch, head).
struct HopperTaskGroup {
  int64_t item0 = 0, n_items = 0;
  int q_step = 1, q_phase = 0, k_step = 1, k_phase = 0;
};

// Orders `items` of `tasks` into groups of one (query view, key view) each: `ordered` gets
// the items (group by group, each group in the items' own order) and `groups` the groups.
// Returns "" or why the tasks cannot be read through such tensor maps (a row start or stride
// that is not a whole row of a head, a view that leaves its batch, coordinates past int).
std::string hopper_task_groups(std::span<const SubseqTask> tasks,
                               std::span<const ForwardItem> items, const HopperTaskShape& s,
                               std::vector<ForwardItem>& ordered,
                               std::vector<HopperTaskGroup>& groups);

// "" when hopper_task_forward can run D = s.head_dim (values of s.head_dim_v) in `e` on
// `device`, else why not.
std::string hopper_task_forward_unsupported(Elem e, const HopperTaskShape& s, int device);

// One launch per group: p.items is the ordered list on the device (groups index into it),
// p.tasks the tasks; p.n_items is ignored. Throws RuntimeFailure where
// hopper_task_forward_unsupported says why, or a tensor map is refused.
void hopper_task_forward(Elem e, const FlashForwardParams& p, const HopperTaskShape& s,
                         std::span<const HopperTaskGroup> groups, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

// The Hopper (sm_90a) backward over the native backward's own work (FlashBackwardParams:
// SubseqTasks, q_items for the dQ pass, k_items for the dK/dV pass, the pass's out_scale and
// dout_scale), so dilated patterns' strided views are read in place: hopper/backward_mainloop.cuh's
// two passes over hopper/work_tasks.cuh's TaskWork (dQ) and TaskKeyWork (dK/dV), one launch
// per group of items sharing a (query view, key view), as hopper_task_forward
// (hopper_task_groups orders both item lists). Same contract as flash_backward: dq, dk and
// dv fp32 and added into, delta = rowsum(out ∘ dout) from start_backward. bf16/fp16,
// D = 64 or 128. K/V may be a ring's packed receive rows (HopperTaskShape::kv_rows; dK/dV
// then laid out as they are, the step's partial buffer). Run on the emulated GPU in CI;
// exact on an H100 (the packed-rows case not yet run there).
#pragma once

#include <cuda_runtime_api.h>

#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/task_forward.hpp"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

// "" when hopper_task_backward can run D = s.head_dim in `e` on `device`, else why not.
std::string hopper_task_backward_unsupported(Elem e, const HopperTaskShape& s, int device);

// The dQ launches (one per q_groups entry, items from p.q_items) and then the dK/dV ones
// (one per k_groups entry, items from p.k_items), on `stream`; p.n_q_items and p.n_k_items
// are ignored. Each k group's items must write disjoint dK/dV rows (as a k_range's do).
// `fused` (D <= 128 with k groups, else ignored): q_groups are not launched; each k group's
// launch is the fused kernel, which adds dQ's part from its keys (not deterministic).
// `wide` (with `fused`, D = 64 or 128): the k groups are hopper_wide_key_items' and each launch is
// the wide fused kernel, a block per 128 keys.
// Throws RuntimeFailure where hopper_task_backward_unsupported says why, or a tensor map is
// refused.
void hopper_task_backward(Elem e, const FlashBackwardParams& p, const HopperTaskShape& s,
                          std::span<const HopperTaskGroup> q_groups,
                          std::span<const HopperTaskGroup> k_groups, cudaStream_t stream,
                          bool fused = false, bool wide = false);

// The wide fused kernel's dK/dV items from a range's ordered kKeyTile-key items and groups
// (hopper_task_groups'): each item whose first key is a multiple of 128 stands for itself
// and the task's next 64 keys, so `wide` gets one item per 128 keys and `wide_groups` the
// same groups over it (item0 from 0). Returns "" or why the items do not pair up (an item
// off the 64 grid, or one at 64 mod 128 whose partner 64 keys before is not in its group).
std::string hopper_wide_key_items(std::span<const ForwardItem> ordered,
                                  std::span<const HopperTaskGroup> groups,
                                  std::vector<ForwardItem>& wide,
                                  std::vector<HopperTaskGroup>& wide_groups);

}  // namespace ringattn::kernels::cuda

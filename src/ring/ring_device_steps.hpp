// The GPU ring's schedule in the form its kernels read, built once per plan on the host:
// every step's waves and send runs in one set of lists (the native kernels' tasks, query and
// key items, as single/device_schedule.hpp flattens one GPU's passes), each step's slices of
// them, and the sm_90a task kernels' lists over the same waves (single/hopper_task_lists.hpp).
// CudaRingPlan uploads and runs them; plain host code beside the kernels' declarations.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/task_forward.hpp"
#include "kernels/cuda/ops/device_ops.hpp"  // PackedRun
#include "kernels/cuda/params.hpp"
#include "ring/ring_schedule.hpp"
#include "single/device_schedule.hpp"
#include "single/hopper_task_lists.hpp"

namespace ringattn::ring {

// One wave's slices of the plan's device lists.
struct DeviceWave {
  int64_t task0 = 0, q_item0 = 0, n_q_items = 0;
  std::vector<single::ItemRange> k_ranges;  // key items of each backward range (one for MHA)
};
struct DeviceStep {
  std::vector<DeviceWave> waves;
  int64_t run0 = 0, n_runs = 0;  // the rows this rank sends, into the run list
  bool rows_repeat = false;      // runs_repeat_a_row(): dK/dV rows are added serially
};

// Every step's waves and send runs appended to `all` and `runs`; each step's slices of them.
std::vector<DeviceStep> flatten_ring_steps(const RingSchedule& sched, bool causal,
                                           single::FlatSchedule& all,
                                           std::vector<kernels::cuda::PackedRun>& runs);

// Step t's tensors as the task kernels read them.
using RingHopperShape = std::function<kernels::cuda::HopperTaskShape(int t)>;

// Every wave's forward items added to `lists` ([step][wave] slices in `waves`): "" or why the
// sm_90a task forward cannot run them (`shard_rows`: B·N/P positions).
std::string build_ring_hopper_forward(const RingSchedule& sched, int64_t shard_rows,
                                      const RingHopperShape& shape, kernels::cuda::Elem elem,
                                      int device, single::HopperTaskLists& lists,
                                      std::vector<std::vector<single::HopperTaskWave>>& waves);

// Every wave's key items (`key_items`: the native backward's list, sliced by `steps`' ranges)
// added to `lists`, after build_ring_hopper_forward: "" or why the task backward cannot run.
std::string build_ring_hopper_backward(const RingSchedule& sched,
                                       const std::vector<DeviceStep>& steps,
                                       const std::vector<kernels::ForwardItem>& key_items,
                                       const RingHopperShape& shape, kernels::cuda::Elem elem,
                                       int device, single::HopperTaskLists& lists,
                                       std::vector<std::vector<single::HopperTaskWave>>& waves);

}  // namespace ringattn::ring

// The sm_90a task kernels' work lists, built once for every plan that runs them over
// subsequence tasks: one GPU's dilated passes (CudaPlan) and the GPU ring's waves
// (CudaRingPlan). The device schedule's items (device_schedule.hpp) are reordered into groups
// of one (query view, key view) each (hopper_task_groups): a wave's query items for the
// forward and the backward's dQ, and its backward's key items range by range (query heads
// that share a K/V head add into it in turn), with the wide fused kernel's 128-key items
// beside them where every range's pair up (D = 128). Kept on the host as well: the emulated
// runtime reads an async copy's host source when the copy runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/head_dims.hpp"
#include "kernels/cuda/hopper/task_forward.hpp"
#include "kernels/cuda/params.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "single/device_schedule.hpp"

namespace ringattn::single {

// One wave's slices of the lists: a pass on one GPU, a wave of a ring step.
struct HopperTaskWave {
  int64_t item0 = 0;  // into HopperTaskLists::items
  std::vector<kernels::cuda::HopperTaskGroup> groups;
  std::vector<int64_t> k_item0;  // per key range, into HopperTaskLists::k_items
  std::vector<std::vector<kernels::cuda::HopperTaskGroup>> k_groups;
  // The same ranges' 128-key items for the wide fused kernel (where wide_ok()).
  std::vector<int64_t> wide_k_item0;
  std::vector<std::vector<kernels::cuda::HopperTaskGroup>> wide_k_groups;
};

class HopperTaskLists {
 public:
  // Appends a wave's query items (`items`, over `tasks`) to the forward's list; "" or why the
  // task kernels cannot run them.
  std::string add_forward(std::span<const kernels::SubseqTask> tasks,
                          std::span<const kernels::ForwardItem> items,
                          const kernels::cuda::HopperTaskShape& shape, HopperTaskWave& wave);
  // Appends a wave's key items (`key_items` sliced by `ranges`) to the backward's list, range
  // by range, and their wide items while every range so far pairs up; "" or why not.
  std::string add_backward(std::span<const kernels::SubseqTask> tasks,
                           std::span<const kernels::ForwardItem> key_items,
                           std::span<const ItemRange> ranges,
                           const kernels::cuda::HopperTaskShape& shape, HopperTaskWave& wave);
  // Whether the wide fused kernel has its items: D = 64 or 128 and every range paired up.
  bool wide_ok(int64_t head_dim) const {
    return kernels::cuda::hopper_wide_head_dim(head_dim) && pairs_;
  }

  // Both lists on the device.
  void upload(int device, cudaStream_t stream);
  const kernels::ForwardItem* items() const { return items_.as<kernels::ForwardItem>(); }
  const kernels::ForwardItem* k_items() const { return k_items_.as<kernels::ForwardItem>(); }
  std::size_t bytes() const { return items_.bytes() + k_items_.bytes(); }
  void reset() {
    items_.reset();
    k_items_.reset();
  }

 private:
  std::vector<kernels::ForwardItem> items_host_, k_items_host_;
  kernels::cuda::DeviceAllocation items_, k_items_;
  bool pairs_ = true;  // every range's key items so far pair up into 128 keys (D = 128)
};

// One wave's backward on the task kernels, in the native backward's order: dQ with the first
// key range's dK/dV, then one launch per further range. `p` carries the tensors and the
// wave's task pointer; the items come from `lists`.
void hopper_task_backward_wave(kernels::cuda::Elem elem, kernels::cuda::FlashBackwardParams p,
                               const kernels::cuda::HopperTaskShape& shape,
                               const HopperTaskWave& wave, const HopperTaskLists& lists,
                               cudaStream_t stream, bool fused, bool wide);

}  // namespace ringattn::single

// The sm_90a task kernels' work lists (hopper_task_lists.hpp).
#include "single/hopper_task_lists.hpp"

#include <utility>

#include "kernels/cuda/hopper/task_backward.hpp"

namespace ringattn::single {

namespace kc = kernels::cuda;

std::string HopperTaskLists::add_forward(std::span<const kernels::SubseqTask> tasks,
                                         std::span<const kernels::ForwardItem> items,
                                         const kc::HopperTaskShape& shape, HopperTaskWave& wave) {
  std::vector<kernels::ForwardItem> ordered;
  if (std::string why = kc::hopper_task_groups(tasks, items, shape, ordered, wave.groups);
      !why.empty())
    return why;
  wave.item0 = static_cast<int64_t>(items_host_.size());
  items_host_.insert(items_host_.end(), ordered.begin(), ordered.end());
  return "";
}

std::string HopperTaskLists::add_backward(std::span<const kernels::SubseqTask> tasks,
                                          std::span<const kernels::ForwardItem> key_items,
                                          std::span<const ItemRange> ranges,
                                          const kc::HopperTaskShape& shape, HopperTaskWave& wave) {
  std::vector<kernels::ForwardItem> ordered, wide;
  for (const ItemRange& r : ranges) {
    std::vector<kc::HopperTaskGroup> groups, wide_groups;
    const std::span<const kernels::ForwardItem> items(key_items.data() + r.first,
                                                      static_cast<std::size_t>(r.count));
    if (std::string why = kc::hopper_task_groups(tasks, items, shape, ordered, groups);
        !why.empty())
      return why;
    wave.k_item0.push_back(static_cast<int64_t>(k_items_host_.size()));
    k_items_host_.insert(k_items_host_.end(), ordered.begin(), ordered.end());
    pairs_ = pairs_ && kc::hopper_wide_head_dim(shape.head_dim) &&
             kc::hopper_wide_key_items(ordered, groups, wide, wide_groups).empty();
    wave.wide_k_item0.push_back(static_cast<int64_t>(k_items_host_.size()));
    if (pairs_) k_items_host_.insert(k_items_host_.end(), wide.begin(), wide.end());
    wave.k_groups.push_back(std::move(groups));
    wave.wide_k_groups.push_back(std::move(wide_groups));
  }
  return "";
}

void HopperTaskLists::upload(int device, cudaStream_t stream) {
  items_ = kc::upload_vector(items_host_, "the Hopper forward's work items", device, stream);
  k_items_ =
      kc::upload_vector(k_items_host_, "the Hopper backward's key work items", device, stream);
}

void hopper_task_backward_wave(kc::Elem elem, kc::FlashBackwardParams p,
                               const kc::HopperTaskShape& shape, const HopperTaskWave& wave,
                               const HopperTaskLists& lists, cudaStream_t stream, bool fused,
                               bool wide) {
  wide = fused && wide;
  p.q_items = lists.items() + wave.item0;
  std::span<const kc::HopperTaskGroup> q_groups = wave.groups;
  for (std::size_t r = 0; r < wave.k_groups.size(); ++r) {
    p.k_items = lists.k_items() + (wide ? wave.wide_k_item0[r] : wave.k_item0[r]);
    kc::hopper_task_backward(elem, p, shape, q_groups,
                             wide ? wave.wide_k_groups[r] : wave.k_groups[r], stream, fused, wide);
    q_groups = {};
  }
  if (wave.k_groups.empty()) kc::hopper_task_backward(elem, p, shape, q_groups, {}, stream);
}

}  // namespace ringattn::single

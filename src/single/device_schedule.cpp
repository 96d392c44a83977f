// Flattens a LocalSchedule for the device (see device_schedule.hpp).
#include "single/device_schedule.hpp"

#include <algorithm>

namespace ringattn::single {

std::vector<kernels::ForwardItem> key_items(std::span<const kernels::SubseqTask> tasks, bool causal,
                                            int64_t k_tile, int64_t task0) {
  std::vector<std::pair<int64_t, kernels::ForwardItem>> costed;
  for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
    const auto& t = tasks[ti];
    for (int64_t j0 = 0; j0 < t.n_k; j0 += k_tile) {
      const int64_t bk = std::min(k_tile, t.n_k - j0);
      const kernels::KeyRange seen = kernels::seeing_query_range(t, causal, j0, bk);
      costed.push_back({bk * (seen.end - seen.begin), {task0 + static_cast<int64_t>(ti), j0}});
    }
  }
  std::stable_sort(costed.begin(), costed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<kernels::ForwardItem> items;
  items.reserve(costed.size());
  for (const auto& c : costed) items.push_back(c.second);
  return items;
}

std::vector<ItemRange> append_key_items_by_range(std::span<const kernels::SubseqTask> tasks,
                                                 std::span<const std::size_t> backward_ends,
                                                 bool causal, int64_t k_tile, int64_t task0,
                                                 std::vector<kernels::ForwardItem>& items) {
  std::vector<ItemRange> ranges;
  std::size_t begin = 0;
  for (const std::size_t end : backward_ends) {
    const auto range = key_items(tasks.subspan(begin, end - begin), causal, k_tile,
                                 task0 + static_cast<int64_t>(begin));
    ranges.push_back({static_cast<int64_t>(items.size()), static_cast<int64_t>(range.size())});
    items.insert(items.end(), range.begin(), range.end());
    begin = end;
  }
  return ranges;
}

FlatSchedule flatten_schedule(const LocalSchedule& s, bool causal, int64_t k_tile) {
  FlatSchedule f;
  f.clear_outputs_first = s.clear_outputs_first;
  for (const KernelPass& pass : s.passes) {
    const auto task0 = static_cast<int64_t>(f.tasks.size());
    DevicePass d;
    d.accumulate = pass.accumulate;
    d.out_scale = pass.out_scale;
    d.q_item0 = static_cast<int64_t>(f.q_items.size());
    for (kernels::ForwardItem it : pass.items) {
      it.task += task0;
      f.q_items.push_back(it);
    }
    d.n_q_items = static_cast<int64_t>(f.q_items.size()) - d.q_item0;
    d.k_item0 = static_cast<int64_t>(f.k_items.size());
    d.k_ranges =
        append_key_items_by_range(pass.tasks, pass.backward_ends, causal, k_tile, task0, f.k_items);
    d.n_k_items = static_cast<int64_t>(f.k_items.size()) - d.k_item0;
    f.tasks.insert(f.tasks.end(), pass.tasks.begin(), pass.tasks.end());
    f.passes.push_back(d);
  }
  return f;
}

bool rows_aligned(const FlatSchedule& f, int64_t multiple) {
  for (const auto& t : f.tasks)
    if (t.q_row0 % multiple || t.q_stride % multiple || t.k_row0 % multiple ||
        t.k_stride % multiple)
      return false;
  return true;
}

std::size_t flat_schedule_bytes(const FlatSchedule& f) {
  return f.tasks.size() * sizeof(kernels::SubseqTask) +
         (f.q_items.size() + f.k_items.size()) * sizeof(kernels::ForwardItem);
}

}  // namespace ringattn::single

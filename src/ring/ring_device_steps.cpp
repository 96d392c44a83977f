// The GPU ring's device lists (ring_device_steps.hpp).
#include "ring/ring_device_steps.hpp"

#include <limits>

#include "kernels/cuda/hopper/task_backward.hpp"
#include "kernels/cuda/tiles.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

std::vector<DeviceStep> flatten_ring_steps(const RingSchedule& sched, bool causal,
                                           single::FlatSchedule& all,
                                           std::vector<kc::PackedRun>& runs) {
  std::vector<DeviceStep> steps;
  for (const RingStep& st : sched.steps) {
    DeviceStep ds;
    for (const Wave& w : st.waves) {
      DeviceWave dw;
      dw.task0 = static_cast<int64_t>(all.tasks.size());
      dw.q_item0 = static_cast<int64_t>(all.q_items.size());
      dw.n_q_items = static_cast<int64_t>(w.items.size());
      // Task indices are relative to the wave's task0 (the launch's task pointer).
      dw.k_ranges = single::append_key_items_by_range(w.tasks, w.backward_ends, causal,
                                                      kc::kKeyTile, 0, all.k_items);
      all.tasks.insert(all.tasks.end(), w.tasks.begin(), w.tasks.end());
      all.q_items.insert(all.q_items.end(), w.items.begin(), w.items.end());
      ds.waves.push_back(dw);
    }
    ds.run0 = static_cast<int64_t>(runs.size());
    int64_t base = 0;
    for (const Run& r : st.send_runs) {
      runs.push_back({r.row0, r.stride, r.rows(), base, base});
      base += r.rows();
    }
    ds.n_runs = static_cast<int64_t>(st.send_runs.size());
    ds.rows_repeat = runs_repeat_a_row(st.send_runs);
    steps.push_back(std::move(ds));
  }
  return steps;
}

std::string build_ring_hopper_forward(const RingSchedule& sched, int64_t shard_rows,
                                      const RingHopperShape& shape, kc::Elem elem, int device,
                                      single::HopperTaskLists& lists,
                                      std::vector<std::vector<single::HopperTaskWave>>& waves) {
  if (shard_rows > std::numeric_limits<int>::max() / 2 ||
      sched.max_recv_rows > std::numeric_limits<int>::max() / 2)
    return "a shard past int positions (tensor map coordinates)";
  if (std::string why = kc::hopper_task_forward_unsupported(elem, shape(0), device); !why.empty())
    return why;
  for (std::size_t t = 0; t < sched.steps.size(); ++t) {
    std::vector<single::HopperTaskWave>& step = waves.emplace_back();
    for (const Wave& w : sched.steps[t].waves)
      if (std::string why =
              lists.add_forward(w.tasks, w.items, shape(static_cast<int>(t)), step.emplace_back());
          !why.empty())
        return why;
  }
  return "";
}

std::string build_ring_hopper_backward(const RingSchedule& sched,
                                       const std::vector<DeviceStep>& steps,
                                       const std::vector<kernels::ForwardItem>& key_items,
                                       const RingHopperShape& shape, kc::Elem elem, int device,
                                       single::HopperTaskLists& lists,
                                       std::vector<std::vector<single::HopperTaskWave>>& waves) {
  for (std::size_t t = 0; t < sched.steps.size(); ++t)
    if (std::string why =
            kc::hopper_task_backward_unsupported(elem, shape(static_cast<int>(t)), device);
        !why.empty())
      return why;
  for (std::size_t t = 0; t < sched.steps.size(); ++t)
    for (std::size_t i = 0; i < sched.steps[t].waves.size(); ++i)
      if (std::string why = lists.add_backward(sched.steps[t].waves[i].tasks, key_items,
                                               steps[t].waves[i].k_ranges,
                                               shape(static_cast<int>(t)), waves[t][i]);
          !why.empty())
        return why;
  return "";
}

}  // namespace ringattn::ring

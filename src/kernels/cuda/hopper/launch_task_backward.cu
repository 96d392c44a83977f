// The Hopper backward over SubseqTasks (see hopper/task_backward.hpp):
// hopper/backward_mainloop.cuh's two passes over hopper/work_tasks.cuh's TaskWork and TaskKeyWork,
// through tensor maps of each launch's query and key views.
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/backward_launch.cuh"
#include "kernels/cuda/hopper/dense_backward.hpp"  // hopper_wide_key_items over one list
#include "kernels/cuda/hopper/task_backward.hpp"
#include "kernels/cuda/hopper/work_tasks.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

std::string hopper_task_backward_unsupported(Elem e, const HopperTaskShape& s, int device) {
  return hopper_task_forward_unsupported(e, s, device);
}

std::string hopper_wide_key_items(std::span<const ForwardItem> ordered,
                                  std::span<const HopperTaskGroup> groups,
                                  std::vector<ForwardItem>& wide,
                                  std::vector<HopperTaskGroup>& wide_groups) {
  wide.clear();
  wide_groups.clear();
  std::vector<ForwardItem> group_wide;
  for (const HopperTaskGroup& g : groups) {
    if (std::string why = hopper_wide_key_items(
            ordered.subspan(static_cast<std::size_t>(g.item0), static_cast<std::size_t>(g.n_items)),
            group_wide);
        !why.empty())
      return why;
    HopperTaskGroup w = g;
    w.item0 = static_cast<int64_t>(wide.size());
    w.n_items = static_cast<int64_t>(group_wide.size());
    wide.insert(wide.end(), group_wide.begin(), group_wide.end());
    wide_groups.push_back(w);
  }
  return "";
}

void hopper_task_backward(Elem e, const FlashBackwardParams& p, const HopperTaskShape& s,
                          std::span<const HopperTaskGroup> q_groups,
                          std::span<const HopperTaskGroup> k_groups, cudaStream_t stream,
                          bool fused, bool wide) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_task_backward_unsupported(e, s, device); !why.empty())
    throw RuntimeFailure("the Hopper task backward cannot run: " + why);
  const int rows = s.batch * s.seq_len;  // one "batch" of B·N positions: views never cross
  // K/V (and dK/dV, laid out as they are): [B, N, HKV, D], or a ring's packed receive rows.
  const int kv_rows = s.kv_rows > 0 ? s.kv_rows : rows;
  // The stored out and dout are the pass's scaled ones (see BackwardArgs).
  const float dout_scale = p.dout_scale, delta_factor = p.dout_scale / p.out_scale;
  const int dv = hopper::task_value_dim(s, p);
  auto maps = [&](const HopperTaskGroup& g, auto work) {
    const TmaDesc m[4] = {
        hopper::tensor_map(p.q, e, 1, rows, s.heads, s.head_dim, g.q_phase, g.q_step),
        hopper::tensor_map(p.k, e, 1, kv_rows, s.kv_heads, s.head_dim, g.k_phase, g.k_step),
        hopper::tensor_map(p.v, e, 1, kv_rows, s.kv_heads, dv, g.k_phase, g.k_step),
        hopper::tensor_map(p.dout, e, 1, rows, s.heads, dv, g.q_phase, g.q_step)};
    return hopper::backward_args(m, p, dout_scale, delta_factor, work);
  };
  fused = fused && hopper_fused_head_dims(s.head_dim, dv) && !k_groups.empty();
  wide = wide && fused && hopper_wide_head_dim(s.head_dim);
  if (fused) require_bulk_aligned_dq(p.dq, "the Hopper task backward");
  for (const HopperTaskGroup& g : q_groups) {
    if (fused) break;  // the k groups' launches add dQ
    if (g.n_items == 0) continue;
    const hopper::TaskWork work{
        p.tasks,    p.q_items + g.item0, nullptr,  nullptr,  rows,     kv_rows, s.heads,
        s.kv_heads, s.head_dim,          g.q_step, g.k_step, p.causal, 1.0f};
    hopper::launch_backward_pass<false>(s.head_dim, dv, e, maps(g, work),
                                        dim3(static_cast<unsigned>(g.n_items)), stream);
  }
  for (const HopperTaskGroup& g : k_groups) {
    if (g.n_items == 0) continue;
    const hopper::TaskKeyWork work{p.tasks,    p.k_items + g.item0, rows,     kv_rows,  s.heads,
                                   s.kv_heads, s.head_dim,          g.q_step, g.k_step, p.causal};
    if (wide) {
      hopper::TaskKeyWork wide_work = work;
      wide_work.block_rows = 2 * hopper::kRows;
      hopper::launch_fused_wide_backward(s.head_dim, e, maps(g, wide_work),
                                         dim3(static_cast<unsigned>(g.n_items)), stream);
    } else if (fused)
      hopper::launch_fused_backward(s.head_dim, dv, e, maps(g, work),
                                    dim3(static_cast<unsigned>(g.n_items)), stream);
    else
      hopper::launch_backward_pass<true>(s.head_dim, dv, e, maps(g, work),
                                         dim3(static_cast<unsigned>(g.n_items)), stream);
  }
}

}  // namespace ringattn::kernels::cuda

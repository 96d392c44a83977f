// The Hopper dense backward (see hopper/dense_backward.hpp): hopper/backward_mainloop.cuh's two
// passes over hopper/work_dense.cuh's DenseWork, keys as rows for dK/dV and queries as rows for dQ.
#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "kernels/cuda/hopper/backward_launch.cuh"
#include "kernels/cuda/hopper/dense_backward.hpp"
#include "kernels/cuda/hopper/work_dense.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {
const std::string& hopper_bwd_env() {
  static const std::string v =
      hopper::hopper_switch(Env::hopper_bwd, {"two_pass", "fused", "fused_wide", "auto"});
  return v;
}
}  // namespace

bool hopper_fused_backward_chosen(bool deterministic, int head_dim, int head_dim_v) {
  return (hopper_bwd_env() == "fused" || hopper_bwd_env() == "fused_wide") && !deterministic &&
         hopper_fused_head_dims(head_dim, head_dim_v);
}

bool hopper_wide_backward_chosen(bool deterministic, int head_dim) {
  return hopper_bwd_env() == "fused_wide" && !deterministic && hopper_wide_head_dim(head_dim);
}

FusedBackwardRule hopper_fused_backward_rule(bool deterministic, int head_dim, bool automatic,
                                             int head_dim_v) {
  if (deterministic || !hopper_fused_head_dims(head_dim, head_dim_v))
    return FusedBackwardRule::two_pass;
  const std::string& env = hopper_bwd_env();
  if (env == "fused" || env == "fused_wide") return FusedBackwardRule::fused;
  if (env == "two_pass" || !automatic) return FusedBackwardRule::two_pass;
#if RINGATTN_CUDA_EMULATION
  if (env != "auto") return FusedBackwardRule::two_pass;
#endif
  return FusedBackwardRule::timed;
}

std::string hopper_wide_key_items(std::span<const ForwardItem> items,
                                  std::vector<ForwardItem>& wide) {
  wide.clear();
  constexpr int64_t kWide = 2 * hopper::kRows;
  std::set<std::pair<int64_t, int64_t>> firsts;  // (task, first key) of the 128-key items
  for (const ForwardItem& it : items) {
    if (it.q_begin % hopper::kRows != 0) return "a key item off the 64-key grid";
    if (it.q_begin % kWide == 0) firsts.insert({it.task, it.q_begin});
  }
  for (const ForwardItem& it : items) {
    if (it.q_begin % kWide == 0)
      wide.push_back(it);
    else if (!firsts.contains({it.task, it.q_begin - hopper::kRows}))
      return "a key item whose 128-key partner is not beside it";
  }
  return "";
}

std::string hopper_backward_unsupported(const HopperBackwardParams& p, int device) {
  return hopper::attention_unsupported(p, device);
}

void hopper_backward(const HopperBackwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_backward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper backward kernels cannot run: " + why);
  if (p.batch <= 0 || p.seq_len <= 0) return;
  const TmaDesc maps[4] = {
      hopper::tensor_map(p.q, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
      hopper::tensor_map(p.k, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      hopper::tensor_map(p.v, p.elem, p.batch, p.seq_len, p.kv_heads, p.value_dim()),
      hopper::tensor_map(p.dout, p.elem, p.batch, p.seq_len, p.heads, p.value_dim())};
  auto a =
      hopper::backward_args(maps, p, 1.0f, 1.0f, hopper::dense_work(p, nullptr, nullptr, true));
  const bool fused = p.fused && hopper_fused_head_dims(p.head_dim, p.value_dim());
  if (fused) require_bulk_aligned_dq(p.dq, "the Hopper backward");
  if (fused && p.wide && hopper_wide_head_dim(p.head_dim)) {
    a.work.block_rows = 2 * hopper::kRows;
    hopper::launch_fused_wide_backward(
        p.head_dim, p.elem, a, hopper::dense_grid(p, p.kv_heads, 2 * hopper::kRows), stream);
    return;
  }
  if (fused) {
    hopper::launch_fused_backward(p.head_dim, p.value_dim(), p.elem, a,
                                  hopper::dense_grid(p, p.kv_heads), stream);
    return;
  }
  hopper::launch_backward_pass<true>(p.head_dim, p.value_dim(), p.elem, a,
                                     hopper::dense_grid(p, p.kv_heads), stream);
  a.work = hopper::dense_work(p, nullptr, nullptr, false);
  hopper::launch_backward_pass<false>(p.head_dim, p.value_dim(), p.elem, a,
                                      hopper::dense_grid(p, p.heads), stream);
}

}  // namespace ringattn::kernels::cuda

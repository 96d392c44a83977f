// The Hopper dense forward (see hopper/dense_forward.hpp): hopper/forward_mainloop.cuh's body over
// hopper/work_dense.cuh's DenseWork, a block per (64-row query tile, head, batch), or (at
// D = 256, or as RINGATTN_HOPPER_PINGPONG says) its ping-pong kernel, a block per 128 rows.
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/dense_forward.hpp"
#include "kernels/cuda/hopper/forward_launch.cuh"
#include "kernels/cuda/hopper/work_dense.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

std::string hopper_forward_unsupported(const HopperForwardParams& p, int device) {
  return hopper::attention_unsupported(p, device);
}

void hopper_forward(const HopperForwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_forward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper forward kernel cannot run: " + why);
  hopper::Args<hopper::DenseWork> a{
      hopper::tensor_map(p.q, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
      hopper::tensor_map(p.k, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      hopper::tensor_map(p.v, p.elem, p.batch, p.seq_len, p.kv_heads, p.value_dim()),
      hopper::logits_of(p.scale, p.softcap),
      false,
      hopper::dense_work(p, p.out, p.lse, false)};
  // The ping-pong kernel: 128-row blocks, two consumer warpgroups (not built for values of
  // their own head dim).
  using F = HopperForwardForm;
  const int step = p.value_dim() != p.head_dim ? 0
                   : p.form == F::rule         ? hopper::pingpong_chosen(p.head_dim)
                   : p.form == F::pingpong64   ? 1
                   : p.form == F::pingpong128  ? (p.head_dim <= 128 ? 2 : 1)
                                               : 0;
  if (step > 0) {
    a.work.block_rows = 2 * hopper::kRows;
    hopper::launch_pingpong(p.head_dim, p.elem, step, "hopper_fwd_pingpong_kernel", a,
                            hopper::dense_grid(p, p.heads, a.work.block_rows), stream);
    return;
  }
  hopper::launch_for(p.head_dim, p.value_dim(), p.elem, "hopper_fwd_kernel", a,
                     hopper::dense_grid(p, p.heads), stream, p.form);
}

const char* to_string(HopperForwardForm f) {
  switch (f) {
    case HopperForwardForm::plain:
      return "plain";
    case HopperForwardForm::overlap:
      return "overlap";
    case HopperForwardForm::qregs:
      return "Q in registers";
    case HopperForwardForm::pingpong64:
      return "ping-pong 64";
    case HopperForwardForm::pingpong128:
      return "ping-pong 128";
    case HopperForwardForm::rule:
      break;
  }
  return "by rule";
}

std::vector<HopperForwardForm> hopper_forward_forms(int head_dim, bool dense) {
  using F = HopperForwardForm;
  if (head_dim == 192) return {};  // MLA's 192/128: the plain loop only
  if (head_dim > 128) return dense ? std::vector<F>{F::plain, F::pingpong64} : std::vector<F>{};
  std::vector<F> forms{F::plain, F::overlap, F::qregs};
  if (dense) forms.insert(forms.end(), {F::pingpong64, F::pingpong128});
  return forms;
}

bool hopper_qregs_forced() { return hopper::qregs_chosen(); }

bool hopper_forward_forms_timed(bool deterministic, bool automatic) {
  // Every switch is read (and a bad value refused) before any rule applies.
  const bool user_chose = !hopper::hopper_switch(Env::hopper_overlap, {"0", "1"}).empty() ||
                          !hopper::hopper_switch(Env::hopper_qregs, {"0", "1"}).empty() ||
                          !hopper::hopper_switch(Env::hopper_pingpong, {"0", "1", "2"}).empty();
  [[maybe_unused]] const bool asked = hopper::hopper_switch(Env::hopper_fwd, {"auto"}) == "auto";
  if (deterministic || !automatic || user_chose) return false;  // the user chose a form
#if RINGATTN_CUDA_EMULATION
  return asked;
#else
  return true;
#endif
}

}  // namespace ringattn::kernels::cuda

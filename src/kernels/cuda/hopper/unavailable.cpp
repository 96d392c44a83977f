// hopper/dense_forward.hpp, hopper/dense_backward.hpp, hopper/sparse_forward.hpp,
// hopper/sparse_backward.hpp, hopper/task_forward.hpp and hopper/task_backward.hpp in a build whose
// CUDA toolkit is older than 12.5: the kernels are not built, and the plans run the native kernels
// with this reason as their note.
#include <string>
#include <vector>

#include "kernels/cuda/hopper/dense_backward.hpp"
#include "kernels/cuda/hopper/dense_forward.hpp"
#include "kernels/cuda/hopper/sparse_backward.hpp"
#include "kernels/cuda/hopper/sparse_forward.hpp"
#include "kernels/cuda/hopper/task_backward.hpp"
#include "kernels/cuda/hopper/task_forward.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

const char* to_string(HopperForwardForm) { return "by rule"; }
std::vector<HopperForwardForm> hopper_forward_forms(int, bool) { return {}; }
bool hopper_forward_forms_timed(bool, bool) { return false; }
bool hopper_qregs_forced() { return false; }

std::string hopper_forward_unsupported(const HopperForwardParams&, int) {
  return "this build's CUDA toolkit is older than 12.5, so it has no sm_90a kernels";
}

void hopper_forward(const HopperForwardParams& p, cudaStream_t) {
  throw RuntimeFailure("the Hopper forward kernel cannot run: " + hopper_forward_unsupported(p, 0));
}

bool hopper_fused_backward_chosen(bool, int, int) { return false; }

bool hopper_wide_backward_chosen(bool, int) { return false; }

std::string hopper_wide_key_items(std::span<const ForwardItem>, std::vector<ForwardItem>& wide) {
  wide.clear();
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

std::string hopper_wide_key_items(std::span<const ForwardItem>, std::span<const HopperTaskGroup>,
                                  std::vector<ForwardItem>& wide,
                                  std::vector<HopperTaskGroup>& wide_groups) {
  wide.clear();
  wide_groups.clear();
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

FusedBackwardRule hopper_fused_backward_rule(bool, int, bool, int) {
  return FusedBackwardRule::two_pass;
}

std::string hopper_backward_unsupported(const HopperBackwardParams&, int) {
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

void hopper_backward(const HopperBackwardParams&, cudaStream_t) {
  throw RuntimeFailure("the Hopper backward kernels cannot run: " +
                       hopper_forward_unsupported(HopperForwardParams{}, 0));
}

std::string hopper_sparse_forward_unsupported(Elem, const SparseForwardParams&,
                                              const HopperSparseShape&, int) {
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

void hopper_sparse_forward(Elem, const SparseForwardParams&, const HopperSparseShape&,
                           cudaStream_t) {
  throw RuntimeFailure("the Hopper block-sparse forward cannot run: " +
                       hopper_forward_unsupported(HopperForwardParams{}, 0));
}

std::string hopper_sparse_backward_unsupported(Elem, const SparseBackwardParams&,
                                               const HopperSparseShape&, int) {
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

void hopper_sparse_backward(Elem, const SparseBackwardParams&, const HopperSparseShape&,
                            cudaStream_t, bool, bool) {
  throw RuntimeFailure("the Hopper block-sparse backward cannot run: " +
                       hopper_forward_unsupported(HopperForwardParams{}, 0));
}

std::string hopper_task_groups(std::span<const SubseqTask>, std::span<const ForwardItem>,
                               const HopperTaskShape&, std::vector<ForwardItem>& ordered,
                               std::vector<HopperTaskGroup>& groups) {
  ordered.clear();
  groups.clear();
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

std::string hopper_task_forward_unsupported(Elem, const HopperTaskShape&, int) {
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

void hopper_task_forward(Elem, const FlashForwardParams&, const HopperTaskShape&,
                         std::span<const HopperTaskGroup>, cudaStream_t) {
  throw RuntimeFailure("the Hopper task forward cannot run: " +
                       hopper_forward_unsupported(HopperForwardParams{}, 0));
}

std::string hopper_task_backward_unsupported(Elem, const HopperTaskShape&, int) {
  return hopper_forward_unsupported(HopperForwardParams{}, 0);
}

void hopper_task_backward(Elem, const FlashBackwardParams&, const HopperTaskShape&,
                          std::span<const HopperTaskGroup>, std::span<const HopperTaskGroup>,
                          cudaStream_t, bool, bool) {
  throw RuntimeFailure("the Hopper task backward cannot run: " +
                       hopper_forward_unsupported(HopperForwardParams{}, 0));
}

}  // namespace ringattn::kernels::cuda

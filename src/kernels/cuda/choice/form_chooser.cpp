// FormChooser's rules and notes (form_chooser.hpp).
#include "kernels/cuda/choice/form_chooser.hpp"

namespace ringattn::kernels::cuda {

void FormChooser::decide(const std::string& why_forward, const std::string& why_backward,
                         bool wide_ok, std::vector<std::string>& notes) {
  forward_ = why_forward.empty();
  backward_ = forward_ && why_backward.empty();
  wide_ok_ = wide_ok;
  if (!forward_) return;
  // auto times only the forms a GPU has passed on this path (verified_forms.hpp). The rules
  // depend on nothing a rank alone knows, so every rank of a collective plan times the same
  // forms.
  if (hopper_forward_forms_timed(deterministic_, automatic_)) {
    time_forward_ = auto_forward_forms(head_dim_, path_.path).size() > 1;
    note_unverified_forward_forms(head_dim_, path_.path, notes);
  }
  if (backward_) {
    const FusedBackwardRule rule =
        hopper_fused_backward_rule(deterministic_, head_dim_, automatic_, head_dim_v_);
    fused_ = rule == FusedBackwardRule::fused;
    wide_ = fused_ && wide_ok_ && hopper_wide_backward_chosen(deterministic_, head_dim_);
    if (rule == FusedBackwardRule::timed) {
      // Several ranks count the wide form as there (each rank's lists decide at the first
      // backward, where every rank must time the same forms); one GPU knows.
      time_backward_ = auto_backward_forms(path_.path, path_.collective || wide_ok_).size() > 1;
      note_unverified_backward_forms(path_.path, wide_ok_, notes);
    }
  }
  note_forced_unverified(path_.path, fused_, wide_, hopper_qregs_forced() && head_dim_ <= 128,
                         notes);
}

const char* FormChooser::backward_name() const {
  return !backward_ ? "native" : wide() ? "hopper-fused-wide" : fused_ ? "hopper-fused" : "hopper";
}

bool FormChooser::forward_reads(const void* q, const void* k, const void* v,
                                std::vector<std::string>& notes) {
  if (!forward_) return false;  // nothing of ours to read them: no note
  if (aligned16(q) && aligned16(k) && aligned16(v)) return true;
  if (!noted_forward_) notes.push_back(unaligned_note(path_.kernels + " forward", "q/k/v", false));
  noted_forward_ = true;
  return false;
}

bool FormChooser::backward_reads(const void* q, const void* k, const void* v, const void* dout,
                                 std::vector<std::string>& notes) {
  if (!backward_) return false;
  if (aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout)) return true;
  if (!noted_backward_)
    notes.push_back(unaligned_note(path_.kernels + " backward", "q/k/v/dout", true));
  noted_backward_ = true;
  return false;
}

std::string FormChooser::asked_note(const std::string& why_forward, const std::string& why_backward,
                                    const std::string& what, const std::string& how) const {
  const std::string flag = field_is("kernel", "hopper") + ": ";
  if (!forward_) return flag + why_forward + "; using the native kernels";
  if (backward_)
    return flag + "the sm_90a " + what + "forward and backward" + how + "; " + kHopperStatus;
  return flag + "the sm_90a " + what + "forward" + how +
         ", the native backward (the Hopper one cannot run: " + why_backward + "); " +
         kHopperStatus;
}

std::string unaligned_note(const std::string& who, const char* tensors, bool backward) {
  return who + " needs 16-byte aligned " + tensors + "; these are not, so the native " +
         (backward ? "backward" : "kernels") + " ran";
}

}  // namespace ringattn::kernels::cuda

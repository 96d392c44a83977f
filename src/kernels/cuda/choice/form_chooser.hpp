// FormChooser: the one machine that picks the sm_90a kernels' forms for a GPU plan. One GPU
// (CudaPlan), the GPU ring (CudaRingPlan) and block-sparse (CudaSparsePlan) each hold one;
// what differs between them is data (FormChooser::Path: the verified-forms table's path, the
// notes' words, whether several ranks agree), not code. Per pass it keeps:
// - whether the sm_90a kernels run it here (the plan asks its kernels, then decide());
// - the form: the forward's (HopperForwardForm) and the backward's (two passes, fused, fused
//   wide), by the rules of hopper/dense_forward.hpp / hopper/dense_backward.hpp, and under
//   `--kernel auto` timed on the first call among the forms a GPU has passed on the path
//   (form_choice.hpp, verified_forms.hpp);
// - the fallbacks a call's pointers force (TMA needs 16-byte aligned tensors, the fused
//   kernels' bulk adds a 16-byte aligned dq), each noted once;
// - the notes that say all of it.
// The plan keeps what is its own: its work lists, its cuDNN, and how one pass runs.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/choice/form_choice.hpp"
#include "kernels/cuda/hopper/dense_backward.hpp"
#include "kernels/cuda/hopper/dense_forward.hpp"

namespace ringattn::kernels::cuda {

class FormChooser {
 public:
  // What differs between the plans.
  struct Path {
    GpuPath path = GpuPath::dense;  // its entries in the verified-forms table
    // The timing notes' subjects: "the sm_90a forward", "the ring's sm_90a backward", ...
    std::string forward_what = "the sm_90a forward", backward_what = "the sm_90a backward";
    // The fallback notes' subject: "the Hopper" -> "the Hopper forward needs ...".
    std::string kernels = "the Hopper";
    // Several ranks run the plan together: every timing is the slowest rank's (`slowest`), a
    // form that fails while timed fails the job (a rank cannot leave the exchanges mid-pass),
    // and a per-call decision that needs every rank waits until every rank can.
    bool collective = false;
    std::function<double(double)> slowest;  // max over ranks; identity where unset
  };

  FormChooser() = default;
  // head_dim_v: the values' head dim (0: head_dim), which says whether a fused form exists.
  FormChooser(Path path, bool deterministic, bool automatic, int head_dim, int head_dim_v = 0)
      : path_(std::move(path)),
        deterministic_(deterministic),
        automatic_(automatic),
        head_dim_(head_dim),
        head_dim_v_(head_dim_v) {}

  // Once the plan has asked its kernels: `why_forward` is "" where the sm_90a forward runs
  // this configuration here, else why not; `why_backward` likewise for the backward (read
  // only where the forward runs); `wide_ok` where the plan's key items pair up into the wide
  // fused kernel's 128 keys (D = 64 or 128). Applies the rules, and notes what auto leaves out and
  // what an explicit switch runs unverified.
  void decide(const std::string& why_forward, const std::string& why_backward, bool wide_ok,
              std::vector<std::string>& notes);

  bool forward() const { return forward_; }
  bool backward() const { return backward_; }
  HopperForwardForm forward_form() const { return form_; }
  bool fused() const { return fused_; }
  bool wide() const { return fused_ && wide_; }
  bool wide_ok() const { return wide_ok_; }
  // "hopper" or "native"; "hopper", "hopper-fused", "hopper-fused-wide" or "native".
  const char* forward_name() const { return forward_ ? "hopper" : "native"; }
  const char* backward_name() const;
  // Whether the first aligned backward still has to time the forms (a plan's cuDNN decision
  // waits for it: it is timed against the form chosen).
  bool backward_timing_pending() const { return time_backward_; }

  // Whether the sm_90a forward (backward) runs here and can read these tensors (TMA: 16-byte
  // aligned base pointers); where it runs but cannot read them, one note for the plan's life,
  // and the caller runs the native kernels for this call. No note where it does not run.
  bool forward_reads(const void* q, const void* k, const void* v, std::vector<std::string>& notes);
  bool backward_reads(const void* q, const void* k, const void* v, const void* dout,
                      std::vector<std::string>& notes);

  // The first forward under auto: each form timed (`run()` enqueues one whole forward of ours
  // on `stream` with forward_form()), the fastest kept, a note. Nothing on later calls.
  template <class Run>
  void time_forward(cudaStream_t stream, Run&& run, std::vector<std::string>& notes);

  // One backward call's form. The fused forms need a 16-byte aligned dq: where it is not, this
  // call runs the two passes (noted once), and the timing waits for a call where every rank's
  // is aligned. Where the timing is due, `run()` (one whole backward of ours on `stream` with
  // fused()/wide()) runs each form, the fastest is kept, a note. `ours` false: the call runs
  // cuDNN's backward (nothing of the choice applies). The returned guard restores the form
  // after the call.
  class Call {
   public:
    ~Call() {
      if (c_) c_->fused_ = fused_;
    }
    Call(Call&& o) noexcept : c_(std::exchange(o.c_, nullptr)), fused_(o.fused_) {}
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    Call& operator=(Call&&) = delete;
    // Whether this call runs the two passes in place of a fused form (dq not aligned): a
    // plan's cuDNN decision waits for a call that runs the chosen form.
    bool fell_back() const { return c_ != nullptr; }

   private:
    friend class FormChooser;
    Call(FormChooser* c, bool fused) : c_(c), fused_(fused) {}
    FormChooser* c_ = nullptr;  // set where this call changed the form
    bool fused_ = false;
  };
  template <class Run>
  [[nodiscard]] Call backward_call(cudaStream_t stream, const void* dq, bool ours, Run&& run,
                                   std::vector<std::string>& notes);

  // The note an explicit `kernel=hopper` gets, after decide(): "kernel=hopper: the sm_90a
  // <what>forward and backward<how>; <status>", the forward alone and the native backward
  // (naming why), or why neither runs and the native kernels do.
  std::string asked_note(const std::string& why_forward, const std::string& why_backward,
                         const std::string& what, const std::string& how) const;

  // For the plan's own fallbacks (an unaligned call runs natively): the forward switched off
  // and back.
  void set_forward(bool on) { forward_ = on; }

 private:
  double slowest(double ms) const { return path_.slowest ? path_.slowest(ms) : ms; }
  bool all(bool x) const { return slowest(x ? 0.0 : 1.0) == 0.0; }  // on every rank

  Path path_;
  bool deterministic_ = false, automatic_ = false;
  int head_dim_ = 0, head_dim_v_ = 0;
  bool forward_ = false, backward_ = false;
  HopperForwardForm form_ = HopperForwardForm::rule;
  bool time_forward_ = false;
  bool fused_ = false, wide_ = false, wide_ok_ = false, time_backward_ = false;
  bool noted_forward_ = false, noted_backward_ = false, noted_dq_ = false;
};

// "<who> needs 16-byte aligned <tensors>; these are not, so the native <kernels|backward> ran":
// every plan's note for a call whose pointers a kernel cannot read.
std::string unaligned_note(const std::string& who, const char* tensors, bool backward);

template <class Run>
void FormChooser::time_forward(cudaStream_t stream, Run&& run, std::vector<std::string>& notes) {
  if (!time_forward_) return;
  time_forward_ = false;
  const std::vector<HopperForwardForm> forms = auto_forward_forms(head_dim_, path_.path);
  form_ = fastest_forward_form(
      stream, path_.forward_what, path_.collective, forms,
      [&](HopperForwardForm f) {
        form_ = f;
        run();
      },
      [&](double ms) { return slowest(ms); }, notes);
}

template <class Run>
FormChooser::Call FormChooser::backward_call(cudaStream_t stream, const void* dq, bool ours,
                                             Run&& run, std::vector<std::string>& notes) {
  if (!backward_ || !ours || (!fused_ && !time_backward_)) return Call(nullptr, false);
  const bool dq_aligned = aligned16(dq);
  // Timing needs every rank (the times are collectives); a rank that runs a fused form alone
  // falls back alone (the form is the rank's own compute).
  const bool time_now = time_backward_ && (path_.collective ? all(dq_aligned) : dq_aligned);
  if ((fused_ || !time_now) && !dq_aligned && !noted_dq_) {
    notes.push_back(kUnalignedDqNote);
    noted_dq_ = true;
  }
  Call call(dq_aligned ? nullptr : this, fused_);
  if (!dq_aligned) fused_ = false;
  if (time_now) {
    time_backward_ = false;
    // The wide kernel where every rank has it, so that all time the same forms.
    const bool wide_everywhere = path_.collective ? all(wide_ok_) : wide_ok_;
    const std::vector<BackwardForm> forms = auto_backward_forms(path_.path, wide_everywhere);
    const BackwardForm chosen = forms.size() < 2
                                    ? BackwardForm::two_pass
                                    : fastest_backward_form(
                                          stream, path_.backward_what, path_.collective, forms,
                                          [&](BackwardForm f) {
                                            fused_ = f != BackwardForm::two_pass;
                                            wide_ = f == BackwardForm::fused_wide;
                                            run();
                                          },
                                          [&](double ms) { return slowest(ms); }, notes);
    fused_ = chosen != BackwardForm::two_pass;
    wide_ = chosen == BackwardForm::fused_wide;
  }
  return call;
}

}  // namespace ringattn::kernels::cuda

// How `--kernel auto` picks the sm_90a kernels' forms by timing them on the first call:
// - the backward's, where hopper_fused_backward_rule says `timed`: one GPU (CudaPlan), the GPU
//   ring's steps (CudaRingPlan) and block-sparse (CudaSparsePlan) all time the two passes
//   against the fused kernel (and, at D = 128 where the path has it, the wide fused kernel)
//   on their first backward (fastest_backward_form);
// - the forward's, where hopper_forward_forms_timed says so: each HopperForwardForm the path
//   has (hopper_forward_forms) on the first forward (fastest_forward_form).
// Each candidate is timed as median_time.hpp times any, the fastest kept, and the times and
// the choice become a note. Several ranks decide on the slowest rank's times, so every rank
// runs the same kernel (not needed for correctness: the forms give the same results within
// rounding; for one reading of the times in every rank's notes).
#pragma once

#include <cuda_runtime_api.h>

#include <iomanip>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/hopper_fwd.hpp"  // HopperForwardForm
#include "kernels/cuda/median_time.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

// The sm_90a backward's forms: its two passes (deterministic), the fused kernel (64-key
// blocks), the wide fused kernel (128-key blocks of two consumer warpgroups, D = 128).
enum class BackwardForm { two_pass, fused, fused_wide };

// "two passes", "fused", "fused wide".
inline const char* to_string(BackwardForm f) {
  return f == BackwardForm::two_pass ? "two passes" : f == BackwardForm::fused ? "fused"
                                                                                : "fused wide";
}

// "--kernel auto: <what> in two passes 1.234 ms, fused 0.987 ms, fused wide 0.876 ms (median
// of 5<where>); using the wide fused kernel".
inline std::string backward_forms_note(const std::string& what, std::span<const BackwardForm> forms,
                                       std::span<const double> ms, const char* where,
                                       BackwardForm chosen) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << "--kernel auto: " << what << " in";
  for (std::size_t i = 0; i < forms.size(); ++i)
    os << (i ? ", " : " ") << to_string(forms[i]) << " " << ms[i] << " ms";
  os << " (median of 5" << where << "); using "
     << (chosen == BackwardForm::two_pass ? "the two passes"
         : chosen == BackwardForm::fused  ? "the fused kernel"
                                          : "the wide fused kernel");
  return os.str();
}

// The fastest of `forms` (the first being the two passes, which always run): `run(form)`
// enqueues one whole backward on `stream` in that form, `slowest(ms)` turns this rank's time
// into the job's (the identity on one GPU, a max-allreduce on the ring and distributed
// block-sparse, whose notes then say "slowest rank"). On one GPU (`ring` false) a
// RuntimeFailure from a fused kernel counts as infinitely slow, with a note; on a ring it
// propagates, since a rank that left the protocol mid-pass could not rejoin it: the job fails
// with the reason, as under RINGATTN_HOPPER_BWD=fused.
template <class Run, class Slowest>
BackwardForm fastest_backward_form(cudaStream_t stream, const std::string& what, bool ring,
                                   std::span<const BackwardForm> forms, Run&& run,
                                   Slowest&& slowest, std::vector<std::string>& notes) {
  std::vector<double> ms(forms.size(), std::numeric_limits<double>::infinity());
  std::size_t best = 0;
  for (std::size_t i = 0; i < forms.size(); ++i) {
    if (ring || forms[i] == BackwardForm::two_pass) {
      ms[i] = slowest(median_ms(stream, [&] { run(forms[i]); }));
    } else {
      try {
        ms[i] = slowest(median_ms(stream, [&] { run(forms[i]); }));
      } catch (const RuntimeFailure& e) {
        notes.push_back(std::string("--kernel auto: the sm_90a backward's ") +
                        to_string(forms[i]) + " kernel failed when run (" + e.what() +
                        "); not using it");
        (void)cudaGetLastError();
      }
    }
    if (ms[i] < ms[best]) best = i;
  }
  notes.push_back(backward_forms_note(what, forms, ms, ring ? ", slowest rank" : "", forms[best]));
  return forms[best];
}

// The two passes against the fused kernel (block-sparse's forms): whether the fused one is
// the faster, `run(fused)` enqueueing a backward in that form.
template <class Run, class Slowest>
bool fused_backward_is_faster(cudaStream_t stream, const std::string& what, bool ring, Run&& run,
                              Slowest&& slowest, std::vector<std::string>& notes) {
  constexpr BackwardForm kForms[] = {BackwardForm::two_pass, BackwardForm::fused};
  return fastest_backward_form(
             stream, what, ring, kForms,
             [&](BackwardForm f) { run(f == BackwardForm::fused); },
             std::forward<Slowest>(slowest), notes) == BackwardForm::fused;
}

// The fastest of the forward's `forms`: `run(form)` enqueues one whole forward on `stream` in
// that form, `slowest` as fastest_backward_form's. The note: "--kernel auto: <what> plain
// 1.234 ms, overlap 1.100 ms, ... (median of 5<where>); using overlap". On one GPU a form that
// fails to run counts as infinitely slow; on several ranks the failure propagates (a rank
// cannot leave the exchanges mid-pass).
template <class Run, class Slowest>
HopperForwardForm fastest_forward_form(cudaStream_t stream, const std::string& what, bool ring,
                                       std::span<const HopperForwardForm> forms, Run&& run,
                                       Slowest&& slowest, std::vector<std::string>& notes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << "--kernel auto: " << what;
  double best = std::numeric_limits<double>::infinity();
  HopperForwardForm chosen = forms.empty() ? HopperForwardForm::rule : forms.front();
  const char* sep = " ";
  for (const HopperForwardForm f : forms) {
    double ms = std::numeric_limits<double>::infinity();
    if (ring) {
      ms = slowest(median_ms(stream, [&] { run(f); }));
    } else {
      try {
        ms = slowest(median_ms(stream, [&] { run(f); }));
      } catch (const RuntimeFailure&) {
        (void)cudaGetLastError();
      }
    }
    os << sep << to_string(f) << " " << ms << " ms";
    sep = ", ";
    if (ms < best) best = ms, chosen = f;
  }
  os << " (median of 5" << (ring ? ", slowest rank" : "") << "); using " << to_string(chosen);
  notes.push_back(os.str());
  return chosen;
}

}  // namespace ringattn::kernels::cuda

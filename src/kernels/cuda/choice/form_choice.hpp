// How `--kernel auto` picks the sm_90a kernels' forms by timing them on the first call:
// - the backward's, where hopper_fused_backward_rule says `timed`: one GPU (CudaPlan), the GPU
//   ring's steps (CudaRingPlan) and block-sparse (CudaSparsePlan) all time the two passes
//   against the fused kernel (and, at D = 64 or 128 where the path has it, the wide fused kernel)
//   on their first backward (fastest_backward_form);
// - the forward's, where hopper_forward_forms_timed says so: each HopperForwardForm the path
//   has (hopper_forward_forms) on the first forward (fastest_forward_form).
// Only forms a committed GPU log shows passing on the path are candidates (verified_forms.hpp:
// auto_backward_forms, auto_forward_forms); the others are left out with a note.
// Each candidate is timed as median_time.hpp times any, the fastest kept, and the times and
// the choice become a note. Several ranks decide on the slowest rank's times, so every rank
// runs the same kernel (not needed for correctness: the forms give the same results within
// rounding; for one reading of the times in every rank's notes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <iomanip>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/alignment.hpp"
#include "kernels/cuda/choice/verified_forms.hpp"
#include "kernels/cuda/hopper/dense_forward.hpp"  // HopperForwardForm
#include "kernels/cuda/runtime/median_time.hpp"
#include "ringattn/config.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::kernels::cuda {

// The sm_90a backward's forms: its two passes (deterministic), the fused kernel (64-key
// blocks), the wide fused kernel (128-key blocks of two consumer warpgroups, D = 64 or 128).
enum class BackwardForm { two_pass, fused, fused_wide };

// "two passes", "fused", "fused wide".
inline const char* to_string(BackwardForm f) {
  return f == BackwardForm::two_pass ? "two passes"
         : f == BackwardForm::fused  ? "fused"
                                     : "fused wide";
}

// The verified-forms table's name for a forward form (`rule` runs the plain loop).
inline GpuForm gpu_form(HopperForwardForm f) {
  switch (f) {
    case HopperForwardForm::overlap:
      return GpuForm::hopper_forward_overlap;
    case HopperForwardForm::qregs:
      return GpuForm::hopper_forward_qregs;
    case HopperForwardForm::pingpong64:
      return GpuForm::hopper_forward_pingpong64;
    case HopperForwardForm::pingpong128:
      return GpuForm::hopper_forward_pingpong128;
    case HopperForwardForm::plain:
    case HopperForwardForm::rule:
      break;
  }
  return GpuForm::hopper_forward_plain;
}

// The backward forms `--kernel auto` times on `path`: the two passes, then the fused kernel
// and (where `wide`: D = 64 or 128 and the path's key items pair up) the wide one, each only where
// a GPU has passed it there. A single form means nothing to time.
inline std::vector<BackwardForm> auto_backward_forms(GpuPath path, bool wide) {
  std::vector<BackwardForm> forms{BackwardForm::two_pass};
  if (verified_on_gpu(GpuForm::hopper_backward_fused, path)) forms.push_back(BackwardForm::fused);
  if (wide && verified_on_gpu(GpuForm::hopper_backward_fused_wide, path))
    forms.push_back(BackwardForm::fused_wide);
  return forms;
}

// The forward forms `--kernel auto` times on `path` at `head_dim`: hopper_forward_forms'
// (the dense kernel's where `path` is dense) that a GPU has passed there.
inline std::vector<HopperForwardForm> auto_forward_forms(int head_dim, GpuPath path) {
  std::vector<HopperForwardForm> forms;
  for (const HopperForwardForm f : hopper_forward_forms(head_dim, path == GpuPath::dense))
    if (verified_on_gpu(gpu_form(f), path)) forms.push_back(f);
  return forms;
}

// One note per form that auto would have timed on `path` but no GPU has passed there yet:
// the backward's fused forms (the wide one where `wide`), or the forward's forms at
// `head_dim`.
inline void note_unverified_backward_forms(GpuPath path, bool wide,
                                           std::vector<std::string>& notes) {
  if (!verified_on_gpu(GpuForm::hopper_backward_fused, path))
    notes.push_back(
        unverified_by_auto_note(GpuForm::hopper_backward_fused, "RINGATTN_HOPPER_BWD=fused"));
  if (wide && !verified_on_gpu(GpuForm::hopper_backward_fused_wide, path))
    notes.push_back(unverified_by_auto_note(GpuForm::hopper_backward_fused_wide,
                                            "RINGATTN_HOPPER_BWD=fused_wide"));
}
inline void note_unverified_forward_forms(int head_dim, GpuPath path,
                                          std::vector<std::string>& notes) {
  for (const HopperForwardForm f : hopper_forward_forms(head_dim, path == GpuPath::dense)) {
    if (verified_on_gpu(gpu_form(f), path)) continue;
    notes.push_back(unverified_by_auto_note(
        gpu_form(f), f == HopperForwardForm::qregs         ? "RINGATTN_HOPPER_QREGS=1"
                     : f == HopperForwardForm::overlap     ? "RINGATTN_HOPPER_OVERLAP=1"
                     : f == HopperForwardForm::pingpong64  ? "RINGATTN_HOPPER_PINGPONG=1"
                     : f == HopperForwardForm::pingpong128 ? "RINGATTN_HOPPER_PINGPONG=2"
                                                           : field_is("kernel", "hopper")));
  }
}

// What an explicit switch runs that no GPU has passed on `path`, as a note: the backward's
// fused kernel (`fused`; its wide form with `wide`), the forward with Q in registers
// (`qregs`). Nothing where the forms are verified there.
inline void note_forced_unverified(GpuPath path, bool fused, bool wide, bool qregs,
                                   std::vector<std::string>& notes) {
  const auto note = [&](GpuForm f, const char* how) {
    if (!verified_on_gpu(f, path)) notes.push_back(forced_unverified_note(f, how));
  };
  if (fused && wide) note(GpuForm::hopper_backward_fused_wide, "RINGATTN_HOPPER_BWD=fused_wide");
  if (fused && !wide) note(GpuForm::hopper_backward_fused, "RINGATTN_HOPPER_BWD=fused");
  if (qregs) note(GpuForm::hopper_forward_qregs, "RINGATTN_HOPPER_QREGS=1");
}

// The job features the sm_90a kernels carry through forms of their own: values of their own
// head dim (hopper_value_dim) and a soft-cap (hopper_softcap).
inline std::vector<GpuForm> hopper_feature_forms(const AttentionConfig& cfg) {
  std::vector<GpuForm> forms;
  if (cfg.effective_head_dim_v() != cfg.shape.head_dim) forms.push_back(GpuForm::hopper_value_dim);
  if (cfg.softcapped()) forms.push_back(GpuForm::hopper_softcap);
  return forms;
}

// Why the sm_90a kernels do not take `cfg` on `path` ("" where they may): values of their own
// head dim at a pair they are not built for (192/128 only); or, under --kernel auto
// (`automatic`), a feature form (values of their own head dim, a soft-cap) until a committed
// GPU log shows it passing there (they compute it: --kernel hopper runs it, with
// hopper_feature_forced_notes' note).
inline std::string hopper_feature_refusal(const AttentionConfig& cfg, GpuPath path,
                                          bool automatic) {
  const int d = static_cast<int>(cfg.shape.head_dim);
  const int dv = static_cast<int>(cfg.effective_head_dim_v());
  if (dv != d && !hopper_value_dim_pair(d, dv))
    return "they compute values of their own head dim at 192/128 only (" +
           field_is("config.head_dim", std::to_string(d)) + ", " +
           field_is("config.head_dim_v", std::to_string(dv)) + ")";
  for (const GpuForm f : hopper_feature_forms(cfg))
    if (automatic && !verified_on_gpu(f, path))
      return field_is("kernel", "auto") + " leaves out " + form_description(f) +
             ": no committed GPU log shows it passing yet (" + field_is("kernel", "hopper") +
             " runs it)";
  return "";
}
// The notes where --kernel hopper runs a job's feature forms (hopper_feature_forms) that no
// GPU has passed on `path`.
inline void hopper_feature_forced_notes(const AttentionConfig& cfg, GpuPath path,
                                        std::vector<std::string>& notes) {
  for (const GpuForm f : hopper_feature_forms(cfg))
    if (!verified_on_gpu(f, path))
      notes.push_back(forced_unverified_note(f, field_is("kernel", "hopper")));
}

// The note for a backward whose dq is not 16-byte aligned, where a fused form would have run.
inline constexpr const char* kUnalignedDqNote =
    "the sm_90a backward's fused kernels add dQ with bulk reductions, which need a 16-byte "
    "aligned dq; this one is not, so the two passes ran";

// "kernel=auto: <what> in two passes 1.234 ms, fused 0.987 ms, fused wide 0.876 ms (median
// of 5<where>); using the wide fused kernel".
inline std::string backward_forms_note(const std::string& what, std::span<const BackwardForm> forms,
                                       std::span<const double> ms, const char* where,
                                       BackwardForm chosen) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << field_is("kernel", "auto") << ": " << what << " in";
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
        notes.push_back(field_is("kernel", "auto") + ": the sm_90a backward's " +
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

// The fastest of the forward's `forms`: `run(form)` enqueues one whole forward on `stream` in
// that form, `slowest` as fastest_backward_form's. The note: "kernel=auto: <what> plain
// 1.234 ms, overlap 1.100 ms, ... (median of 5<where>); using overlap". On one GPU a form that
// fails to run counts as infinitely slow; on several ranks the failure propagates (a rank
// cannot leave the exchanges mid-pass).
template <class Run, class Slowest>
HopperForwardForm fastest_forward_form(cudaStream_t stream, const std::string& what, bool ring,
                                       std::span<const HopperForwardForm> forms, Run&& run,
                                       Slowest&& slowest, std::vector<std::string>& notes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << field_is("kernel", "auto") << ": " << what;
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

// kernel=auto's choice between cuDNN and what runs where it does not (`ours`: "hopper" or
// "native") for one pass on one GPU: `run(cudnn)` enqueues one whole pass on `stream`, each is
// timed as median_time.hpp times any, and cuDNN is taken where it is faster. A cuDNN that
// fails when run counts as infinitely slow. The note: "kernel=auto: forward hopper 1.234 ms,
// cudnn 0.987 ms (median of 5); using cudnn".
template <class Run>
bool cudnn_is_faster(cudaStream_t stream, const char* pass, const std::string& ours, Run&& run,
                     std::vector<std::string>& notes) {
  const double ours_ms = median_ms(stream, [&] { run(false); });
  double cudnn_ms = std::numeric_limits<double>::infinity();
  try {
    cudnn_ms = median_ms(stream, [&] { run(true); });
  } catch (const RuntimeFailure& e) {
    notes.push_back(field_is("kernel", "auto") + ": cuDNN's " + pass + " failed when run (" +
                    e.what() + "); using " + ours);
    (void)cudaGetLastError();
  }
  const bool take = cudnn_ms < ours_ms;
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << field_is("kernel", "auto") << ": " << pass << " "
     << ours << " " << ours_ms << " ms, cudnn " << cudnn_ms << " ms (median of 5); using "
     << (take ? "cudnn" : ours);
  notes.push_back(os.str());
  return take;
}

}  // namespace ringattn::kernels::cuda

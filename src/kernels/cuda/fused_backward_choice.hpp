// How `--kernel auto` picks the sm_90a backward's form where hopper_fused_backward_rule says
// `timed`: one GPU (CudaPlan), the GPU ring's steps (CudaRingPlan) and block-sparse
// (CudaSparsePlan) all time the two passes against the fused kernel on their first backward,
// as median_time.hpp times any candidate, and keep the faster; the times and the choice
// become a note. Several ranks decide on the slowest rank's times, so every rank runs the same
// kernel (not needed for correctness: both forms give the same gradients; for one reading of
// the times in every rank's notes).
#pragma once

#include <cuda_runtime_api.h>

#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ringattn/errors.hpp"
#include "kernels/cuda/median_time.hpp"

namespace ringattn::kernels::cuda {

// "--kernel auto: <what> in two passes 1.234 ms, fused 0.987 ms (median of 5<where>); using
// the fused kernel".
inline std::string fused_backward_note(const std::string& what, double two_pass_ms,
                                       double fused_ms, const char* where, bool fused) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << "--kernel auto: " << what << " in two passes "
     << two_pass_ms << " ms, fused " << fused_ms << " ms (median of 5" << where << "); using "
     << (fused ? "the fused kernel" : "the two passes");
  return os.str();
}

// Whether the fused kernel is the faster: `run(fused)` enqueues one whole backward on `stream`
// in that form, `slowest(ms)` turns this rank's time into the job's (the identity on one GPU,
// a max-allreduce on the ring and distributed block-sparse, whose notes then say "slowest
// rank"). On one GPU (`ring` false) a RuntimeFailure from the fused kernel counts as infinitely
// slow, with a note; on a ring it propagates, since a rank that left the protocol mid-pass
// could not rejoin it: the job fails with the reason, as under RINGATTN_HOPPER_BWD=fused.
template <class Run, class Slowest>
bool fused_backward_is_faster(cudaStream_t stream, const std::string& what, bool ring, Run&& run,
                              Slowest&& slowest, std::vector<std::string>& notes) {
  const double two_ms = slowest(median_ms(stream, [&] { run(false); }));
  double fused_ms = std::numeric_limits<double>::infinity();
  if (ring) {
    fused_ms = slowest(median_ms(stream, [&] { run(true); }));
  } else {
    try {
      fused_ms = slowest(median_ms(stream, [&] { run(true); }));
    } catch (const RuntimeFailure& e) {
      notes.push_back("--kernel auto: the fused sm_90a backward failed when run (" +
                      std::string(e.what()) + "); using its two passes");
      (void)cudaGetLastError();
    }
  }
  const bool fused = fused_ms < two_ms;
  notes.push_back(fused_backward_note(what, two_ms, fused_ms, ring ? ", slowest rank" : "", fused));
  return fused;
}

}  // namespace ringattn::kernels::cuda

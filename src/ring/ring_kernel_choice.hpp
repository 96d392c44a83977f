// What `--kernel auto` runs the GPU ring's steps on: cuDNN's views (ring_cudnn_views.hpp)
// against ringattn's own kernels (sm_90a where they run, else native), decided per pass
// (forward, backward) on the first call by the same rule one GPU uses: the median of 5 timed
// runs of each (after a warm-up), cuDNN only where it is faster, and never under
// --deterministic (the choice would depend on timing; cuDNN's backward adds dQ with atomics).
// Ranks decide on the slowest rank's times, so every rank runs the same kernels.
#pragma once

#include <limits>
#include <optional>
#include <string>

namespace ringattn::ring {

struct RingPassTiming {
  double ours_ms = 0;
  double cudnn_ms = std::numeric_limits<double>::infinity();  // infinity: cuDNN failed to run
};

// Whether the pass takes cuDNN's steps.
bool ring_auto_takes_cudnn(const RingPassTiming& t, bool deterministic);

// The note auto prints: "kernel=auto: ring forward hopper 1.234 ms, cudnn 0.987 ms (median
// of 5, slowest rank); using cudnn".
std::string ring_auto_note(const char* pass, const std::string& ours, const RingPassTiming& t,
                           bool cudnn, bool stubbed);

// Timings that replace the measurement, for tests: RINGATTN_TEST_RING_AUTO_MS="F_OURS,F_CUDNN"
// or "F_OURS,F_CUDNN,B_OURS,B_CUDNN" (milliseconds; the forward's pair serves the backward
// when only two are given). nullopt when unset; throws InputError when malformed.
std::optional<RingPassTiming> ring_auto_stubbed_timing(bool backward);

}  // namespace ringattn::ring

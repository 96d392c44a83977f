// The distributed engine: each rank holds its shard ([B, N/P, H, D] local tensors, in the
// layout of ring/sharding.hpp) and runs the ring schedule: local block first, then at each
// step the packed rows of one peer, received while the previous step computes, merged into
// (out, lse) with the log-sum-exp update. The backward sends fp32 dK/dV partials back to the
// ranks that own those rows. Built once; forward/backward allocate nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "ring/communicator.hpp"
#include "ring/fault_injection.hpp"
#include "ring/progress_thread.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "single/plan.hpp"

namespace ringattn::ring {

struct RingTimings {
  double compute_ms = 0;   // kernels, packing and unpacking on this rank
  double comm_ms = 0;      // sum over exchanges of the time from posting to completion
  double exposed_ms = 0;   // time the compute threads waited for a transfer
  int64_t bytes_sent = 0;  // payload bytes this rank sent
};

// What the ring adds to PlanOptions.
struct RingOptions {
  double timeout_s = kDefaultTimeoutSeconds;  // watchdog: longest wait for one exchange
  FaultInjection fault = FaultInjection::from_env();
  // Tests only (GPU ring): post exchanges without waiting for the compute stream's event,
  // so that a test can show the ordering it gives is needed (the results then race).
  bool skip_buffer_ordering_for_tests = false;
  // GPU ring: how a step's attention reaches out/lse. merged_in_kernel: the native kernels
  // merge into them as they go. partials: the step's attention is written whole into a
  // partial (out, lse) and merged in by the device lse merge, as a library kernel that
  // cannot merge (cuDNN) must do; the native kernels compute the partial until the cuDNN
  // step runs there, so the ring's wiring for it is tested on every machine.
  enum class StepResults { merged_in_kernel, partials };
  StepResults step_results = StepResults::merged_in_kernel;
  // Progress hook (the CLI's progress line): called with (steps done, steps in the call) by
  // the thread that drives the ring, never inside an OpenMP region: (0, P) when a forward
  // or backward starts and after each step's compute. Must be cheap and must not throw.
  std::function<void(int done, int steps)> on_step;
};

class RingPlan {
 public:
  RingPlan(const AttentionConfig& cfg, Communicator& comm, PlanOptions opts = {},
           RingOptions ring_opts = {});
  ~RingPlan();

  const ShardLayout& layout() const noexcept;
  const RingSchedule& schedule() const noexcept;
  int threads() const noexcept;

  // Local shards: q, out, dout, dq [B, N/P, H, D]; k, v, dk, dv [B, N/P, HKV, D] (only
  // K/V heads travel); lse [B, H, N/P].
  void forward(const float* q, const float* k, const float* v, float* out, float* lse);
  void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv);

  const RingTimings& last_forward() const noexcept;
  const RingTimings& last_backward() const noexcept;
  std::size_t workspace_bytes() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::ring

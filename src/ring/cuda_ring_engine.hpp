// The ring on GPUs: the CPU RingPlan's schedule (ring_schedule.hpp: who sends which packed
// rows at which step, the waves of tasks over them) executed on one device per rank. K/V
// rows are packed on the device, travel through a device communicator (NCCL) on its own
// stream, and are read in place from the receive buffer by the flash kernels in merge mode.
// Nothing in the loop synchronises the host with a device: the compute stream waits for a
// receive with cudaStreamWaitEvent on the exchange's event, and each exchange starts on the
// communication stream only after an event of the compute stream that says its send
// buffer is packed and its receive buffer is no longer read. The backward returns fp32
// dK/dV partials to their owners, added in step order (bitwise reproducible for a given P).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/ring_engine.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn::ring {

class CudaRingPlan {
 public:
  // `comm` must be a device communicator (memory_space() == device) bound to opts.device.
  CudaRingPlan(const AttentionConfig& cfg, Communicator& comm, CudaPlanOptions opts,
               RingOptions ring_opts = {});
  ~CudaRingPlan();

  const ShardLayout& layout() const noexcept;
  const RingSchedule& schedule() const noexcept;
  DeviceDType dtype() const noexcept;  // fp32 where the tensor-core kernels do not fit
  // The forward's kernel: "cudnn" where cuDNN runs the ring's steps (--kernel cudnn, or auto
  // once its first forward has timed them faster; steps cuDNN refuses run on ours), "hopper"
  // where the sm_90a task kernels run every step (bf16/fp16, D 64/128/256, an sm_90
  // device), else "native"; backward_kernel_name() the same for the backward.
  std::string kernel_name() const;
  std::string backward_kernel_name() const;
  const std::vector<std::string>& notes() const noexcept;

  // Device pointers to the local shards: q, k, v, dout [B, N/P, H, D] in dtype(); out, lse,
  // dq, dk, dv fp32 (lse [B, H, N/P]). Enqueued on the plan's stream; synchronize() waits.
  void forward(const void* q, const void* k, const void* v, float* out, float* lse);
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv);
  void synchronize();
  // The plan's cudaStream_t (its work is ordered on it; null in a build without CUDA).
  void* stream() const noexcept;

  // Of the last call, once synchronised: compute_ms is the stream's time from the first to
  // the last kernel, exposed_ms the time the compute stream stood waiting for transfers
  // (measured with events around each wait), bytes_sent what this rank sent (K/V in dtype(),
  // dK/dV partials in fp32).
  const RingTimings& last_forward() const noexcept;
  const RingTimings& last_backward() const noexcept;
  std::size_t workspace_bytes() const noexcept;  // device bytes the plan holds

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::ring

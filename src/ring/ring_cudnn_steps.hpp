// The GPU ring's steps on cuDNN (`--kernel cudnn`, and `--kernel auto` where it times faster):
// each step's tasks as cuDNN views (ring_cudnn_views.hpp), every view's forward into a scratch
// O and its stats, merged into out/lse by lse; the backward from the global out (rounded to
// the io type) and lse, each view's dQ, dK, dV added into the fp32 gradients. One graph per
// distinct view shape, shared by the steps. A step cuDNN refuses runs on ringattn's kernels
// (runs(t) false, the reason in refused()); a step whose backward graphs alone are refused
// keeps its forward on cuDNN (runs_backward(t) false, refused_backward()). CudaRingPlan holds
// one and decides when it runs (ring_kernel_choice.hpp); built only with cuDNN (or its
// emulated stand-in).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cudnn/graphs.hpp"
#include "kernels/cuda/cudnn/view_results.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"
#include "single/cuda_plan.hpp"  // CudaPlanOptions

namespace ringattn::ring {

class RingCudnnSteps {
 public:
  using Refusals = std::map<std::string, std::vector<int>>;  // reason -> steps

  RingCudnnSteps(const AttentionConfig& cfg, const ShardLayout& layout, const RingSchedule& sched,
                 kernels::cuda::Elem elem, DeviceDType dtype, int device, cudaStream_t stream);
  ~RingCudnnSteps();

  // Every step's views with their graphs built (with the backward's where `with_backward`)
  // and, where any step runs, the scratch allocated. Returns the number of steps with views
  // on cuDNN (0: none runs; refused() says why).
  int prepare(bool with_backward);
  // The graphs and scratch given back (auto chose ringattn's kernels for both passes).
  void release();

  bool runs(int t) const { return step_[static_cast<std::size_t>(t)] != 0; }
  bool runs_backward(int t) const { return step_backward_[static_cast<std::size_t>(t)] != 0; }
  bool any_backward() const;
  const Refusals& refused() const { return refused_; }
  const Refusals& refused_backward() const { return refused_backward_; }

  // Step t's views into out/lse (merged by lse).
  void forward(int t, const void* q, const void* k, const void* v, float* out, float* lse);
  // Before a backward on cuDNN: the call's out in the io type, as cuDNN's backward reads it.
  void load_out(const float* out);
  // Step t's views' gradients added into dq (the rank's) and dk, dv (laid out as k, v).
  void backward(int t, const void* q, const void* k, const void* v, const void* dout,
                const float* lse, float* dq, float* dk, float* dv);

  // "cuDNN 9.19.0 (...; N views over S steps, G graphs built in T ms)" as notes say it.
  std::string description(int steps_on_cudnn) const;
  // One note per reason cuDNN refused steps: "<flag>cuDNN cannot run ring steps 1, 2 of 4
  // (<why>); those run on the <ours> kernels", and for steps whose backward alone it refused
  // (`backward_notes`), where their backward runs (`backward_on_cudnn`: the other steps' on
  // cuDNN).
  void refusal_notes(const std::string& flag, const char* ours, const char* ours_backward,
                     bool backward_notes, bool backward_on_cudnn,
                     std::vector<std::string>& notes) const;
  std::size_t bytes() const;

 private:
  kernels::cuda::ViewResultParams place_of(const kernels::cuda::SdpaView& v, float* out,
                                           float* lse) const;
  std::size_t eb() const;

  AttentionConfig cfg_;
  ShardLayout layout_;
  const RingSchedule* sched_;
  kernels::cuda::Elem elem_;
  DeviceDType dtype_;
  int device_;
  cudaStream_t stream_;
  std::vector<char> step_, step_backward_;  // [step]
  Refusals refused_, refused_backward_;
  std::vector<std::vector<kernels::cuda::SdpaView>> views_;  // [step][view]
  std::vector<std::vector<std::size_t>> graph_of_;           // [step][view] into graphs_
  std::vector<std::unique_ptr<kernels::cuda::CudnnGraphPlan>> graphs_;
  kernels::cuda::DeviceAllocation o_, stats_, dq_, dk_, dv_;
  double build_ms_ = 0;
};

// What a ring's plan runs on cuDNN: the steps (null where nothing does), and per pass whether
// cuDNN runs it (--kernel cudnn) or auto times it on the first call (decide_*).
struct RingCudnnChoice {
  std::unique_ptr<RingCudnnSteps> steps;
  bool forward = false, backward = false, decide_forward = false, decide_backward = false;
};

// --kernel cudnn (`asked`: every step cuDNN can run, the backward too unless deterministic,
// cuDNN's backward adding dQ with atomics) or auto (`auto_tries`: candidates to time) -- auto
// only once a GPU has passed the ring's cuDNN steps (verified_forms.hpp); with the notes that
// say so (`flag`: the notes' "kernel=...: ").
RingCudnnChoice choose_ring_cudnn(const AttentionConfig& cfg, const ShardLayout& layout,
                                  const RingSchedule& sched, kernels::cuda::Elem elem,
                                  const CudaPlanOptions& opts, bool asked, bool auto_tries,
                                  const std::string& flag, cudaStream_t stream,
                                  std::vector<std::string>& notes);

}  // namespace ringattn::ring

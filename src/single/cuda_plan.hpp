// CudaPlan: the single-device plan on a CUDA GPU (internal: callers reach it through
// make_engine). Built once from the same AttentionConfig and the same schedule as the CPU
// Plan; it uploads the task list once, takes its workspace once from a stream-ordered device
// pool, and then runs forward/backward on device pointers without allocating. Inputs (q, k, v,
// dout) are bf16, fp16 or fp32 on the device; outputs (out, lse, dq, dk, dv) are fp32. In a build
// without the CUDA toolkit the same interface exists and reports, as an InputError naming `device`,
// that CUDA is not built in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/head_slice.hpp"
#include "ringattn/config.hpp"
#include "ringattn/device.hpp"  // DeviceDType, KernelChoice, CudaDeviceStatus

namespace ringattn {

struct CudaPlanOptions {
  DeviceDType dtype = DeviceDType::bf16;
  // automatic: cuDNN's fused SDPA where it applies and times faster than ours (decided on
  // the first forward and the first backward, on the caller's tensors); ours are the sm_90a
  // kernels where they run (compute capability 9.0, bf16/fp16, head dims 64/128/256), else
  // the native ones, and run wherever cuDNN does not (its refused backwards, --deterministic
  // backwards, builds without it). native: ours on mma.sync; cudnn: cuDNN where it applies
  // (otherwise native, with a note).
  KernelChoice kernel = KernelChoice::automatic;
  int device = 0;
  // Bitwise the same results run to run: `automatic` then chooses by rule (cuDNN where it
  // applies) instead of by timing the first forward, and no kernel that accumulates with
  // atomics (cuDNN's backward dQ) is chosen.
  bool deterministic = false;
  HeadSlice heads = {};  // the job's heads the config computes (Ulysses); default: all
  // The device watchdog (JobSpec::timeout_s): the longest any wait on the plan's work may
  // take before the job ends naming the kernel that has not finished (DeviceHang).
  double timeout_s = 300;
};

class CudaPlan {
 public:
  CudaPlan(const AttentionConfig& cfg, CudaPlanOptions opts = {});
  ~CudaPlan();
  CudaPlan(CudaPlan&&) noexcept;
  CudaPlan& operator=(CudaPlan&&) noexcept;

  const AttentionConfig& config() const noexcept;
  DeviceDType dtype() const noexcept;

  // Device pointers. q, k, v: [B, N, H, D] of dtype(); out: fp32 [B, N, H, D]; lse: fp32
  // [B, H, N]. Asynchronous on the plan's stream (call synchronize() before reading).
  void forward(const void* q, const void* k, const void* v, float* out, float* lse);

  // Gradients of sum(out * dout); dout of dtype(); dq, dk, dv fp32, overwritten.
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv);

  void synchronize();
  // The plan's cudaStream_t (its work is ordered on it; null in a build without CUDA).
  void* stream() const noexcept;

  // "native", "cudnn" or "hopper": the forward kernel in use (after the first forward for
  // automatic).
  std::string kernel_name() const;
  // The same for the backward (after the first backward for automatic).
  std::string backward_kernel_name() const;
  // Lines worth printing once: fallbacks, the automatic choice and its timings.
  const std::vector<std::string>& notes() const noexcept;
  // Device bytes the plan holds beyond the caller's tensors (task lists, workspace).
  std::size_t workspace_bytes() const noexcept;
  // E.g. "NVIDIA H100 80GB HBM3 (sm_90)".
  std::string device_description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn

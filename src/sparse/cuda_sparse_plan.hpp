// CudaSparsePlan: block-sparse attention on one CUDA device. Built once from the
// configuration and the block lists: the work lists (sparse/single_device_lists.hpp) are
// uploaded once, the backward's row sums allocated once from the device pool, and
// forward/backward then run on device pointers without allocating, on the plan's stream.
// Inputs (q, k, v, dout) are bf16, fp16 or fp32 on the device; outputs fp32. In a build
// without CUDA the same interface exists and refuses, as an InputError naming --device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ringattn/config.hpp"
#include "ringattn/cuda_plan.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

class CudaSparsePlan {
 public:
  // `cfg.attention` must be block_sparse and `lists` match its heads, N and block size.
  // `opts.kernel` cudnn is refused (InputError naming --kernel): cuDNN has no block-sparse
  // kernel; automatic and native run the native kernels.
  CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                 CudaPlanOptions opts = {});
  ~CudaSparsePlan();
  CudaSparsePlan(CudaSparsePlan&&) noexcept;
  CudaSparsePlan& operator=(CudaSparsePlan&&) noexcept;

  const AttentionConfig& config() const noexcept;
  // The element type the kernels read: fp32 where the tensor-core kernels do not fit.
  DeviceDType dtype() const noexcept;

  // Device pointers. q, k, v: [B, N, H, D] of dtype(); out: fp32 [B, N, H, D]; lse: fp32
  // [B, H, N]. Asynchronous on the plan's stream (call synchronize() before reading).
  void forward(const void* q, const void* k, const void* v, float* out, float* lse);
  // Gradients of sum(out * dout); dout of dtype(); dq, dk, dv fp32, overwritten.
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv);
  void synchronize();

  std::string kernel_name() const { return "native"; }
  const std::vector<std::string>& notes() const noexcept;
  // Device bytes the plan holds beyond the caller's tensors (work lists, row sums).
  std::size_t workspace_bytes() const noexcept;
  std::string device_description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::sparse

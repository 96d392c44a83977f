// cuDNN's fused attention for CudaPlan, through cudnn-frontend's graphs (CudnnGraphPlan in
// cudnn/graphs.hpp). The forward runs each view's graph into a scratch O (the io type, shaped
// like q) and its stats, and an epilogue stores or merges them into the engine's fp32 out and
// lse exactly like the native kernels' epilogue. The backward, where every view writes its
// rows once (dense, causal, window, GQA, packed documents, a single dilated pattern), gives
// cuDNN the fp32 out rounded to the io type and each view's rows of lse as its stats, and
// widens cuDNN's dQ, dK, dV into the fp32 gradients. cuDNN is opened with dlopen when first
// needed, so a machine without it runs the native kernels instead.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/cuda/params.hpp"
#include "ringattn/config.hpp"

namespace ringattn::kernels::cuda {

// cuDNN cannot run this configuration here; what() says why (printed as a note).
class CudnnUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CudnnSdpa {
 public:
  // Builds the forward graphs and, with `with_backward` where the views allow it, the
  // backward's (has_backward() says which), once, for `device`; work runs on `stream`.
  // Throws CudnnUnavailable when the library, the views or a graph do not fit (the caller
  // falls back to the native kernels with the reason); DeviceOutOfMemory when its scratch
  // and workspace do not fit the device.
  static std::unique_ptr<CudnnSdpa> create(const AttentionConfig& cfg, Elem e, int device,
                                           cudaStream_t stream, bool with_backward);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // The whole forward into out/lse (which the caller has cleared when the schedule says so).
  void forward(const void* q, const void* k, const void* v, float* out, float* lse,
               cudaStream_t stream);
  bool has_backward() const;
  // dq, dk, dv (fp32) = the gradients (+= with `add`), from the forward's out and lse (fp32)
  // and dout (the io type).
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv, bool add, cudaStream_t stream);
  std::size_t workspace_bytes() const;
  double build_ms() const;
  // Why the backward was asked for and is not cuDNN's ("" otherwise).
  const std::string& backward_refusal() const;
  // "cuDNN 9.19.0: 1 view, composite forward + backward"
  std::string description() const;

 private:
  struct Impl;
  explicit CudnnSdpa(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::kernels::cuda

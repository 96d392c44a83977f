// cuDNN's fused scaled-dot-product attention (cuDNN 9, backend API, no cudnn-frontend) for
// the forward. The library is opened with dlopen when first needed, so a machine without it
// runs the native kernels instead. Every pattern (and head group) is one strided 4-D view
// [B·S, Hg, m, D]: S = N/w segments of m selected rows at row stride r·H·D, heads at stride
// (head step)·D. cuDNN reads the dilated pattern in place, writes its output into a scratch
// tensor through the same view and its softmax stats (the natural-log lse) contiguously;
// a small kernel then writes or merges those into out/lse exactly like the native epilogue.
// The unified SDPA operation has no causal mask, so causal configurations stay native.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/cuda/flash_params.hpp"
#include "ringattn/config.hpp"

namespace ringattn::kernels::cuda {

// cuDNN cannot run this configuration here; what() says why (printed as a note).
class CudnnUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CudnnSdpa {
 public:
  // Builds and finalises one execution plan per view. Throws CudnnUnavailable when the
  // library (older than 9.13 included), an engine or the configuration does not fit;
  // DeviceOutOfMemory when its scratch and workspace do not fit the device.
  static std::unique_ptr<CudnnSdpa> create(const AttentionConfig& cfg, Elem e, int device,
                                           cudaStream_t stream);
  virtual ~CudnnSdpa() = default;

  // The whole forward into out/lse (which the caller has cleared when the schedule says so).
  virtual void forward(const void* q, const void* k, const void* v, float* out, float* lse,
                       cudaStream_t stream) = 0;
  virtual std::size_t workspace_bytes() const = 0;
  virtual std::string description() const = 0;  // e.g. "cuDNN 9.19.0, 3 views"
};

}  // namespace ringattn::kernels::cuda

// The CUDA check macro: every runtime call and every launch goes through it, and a failure
// becomes a RuntimeFailure (exit 3) that names the file, the line, the call and CUDA's own
// message. Out-of-memory from an allocation is reported by device_memory.cpp instead, with
// the size asked and what to change.
#pragma once

#include <cuda_runtime_api.h>

#include <new>
#include <string>

#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
  throw RuntimeFailure(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " +
                       what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Makes `device` current on this host thread for the scope's life and puts the previous one
// back: every entry point of an object bound to a GPU (a plan, a communicator) may be called
// from another thread (the ring's progress thread, a framework's worker) whose current device
// is another, and CUDA's current device is per thread. Restoring keeps an embedding
// framework's own choice intact.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : ScopedDevice(device, std::nothrow) {
    if (previous_ == device || changed_) return;
    const cudaError_t err = cudaSetDevice(device);  // the failure again, for its message
    if (err != cudaSuccess) throw_cuda_error(err, "cudaSetDevice", __FILE__, __LINE__);
    changed_ = true;
  }
  // For destructors: errors are ignored (the calls that follow report them, or nothing can).
  ScopedDevice(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    changed_ = previous_ != device && cudaSetDevice(device) == cudaSuccess;
  }
  ~ScopedDevice() {
    if (changed_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace ringattn::kernels::cuda

#define RINGATTN_CUDA_CHECK(expr)                                                                 \
  do {                                                                                            \
    const cudaError_t ringattn_cuda_err_ = (expr);                                                \
    if (ringattn_cuda_err_ != cudaSuccess)                                                        \
      ::ringattn::kernels::cuda::throw_cuda_error(ringattn_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: a bad configuration shows up in cudaGetLastError at once; faults
// inside the kernel surface at the next synchronising call, which is checked too.
#define RINGATTN_CUDA_CHECK_LAUNCH(kernel_name)                                                 \
  do {                                                                                          \
    const cudaError_t ringattn_cuda_err_ = cudaGetLastError();                                  \
    if (ringattn_cuda_err_ != cudaSuccess)                                                      \
      ::ringattn::kernels::cuda::throw_cuda_error(ringattn_cuda_err_, "launch of " kernel_name, \
                                                  __FILE__, __LINE__);                          \
  } while (0)

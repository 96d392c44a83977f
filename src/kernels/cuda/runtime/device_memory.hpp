// Device memory: one private stream-ordered pool per device (cudaMallocFromPoolAsync from a
// cudaMemPool_t of our own, never the device's default pool, whose settings every other
// cudaMallocAsync user in the process shares). Freed memory stays in the pool while any
// ringattn allocation is alive, so repeated calls (benchmarks, a training loop) allocate
// nothing new; when the last plan on a device goes, the pool gives it all back. Counted like
// host allocations so that --json can report the peak. Out-of-memory is a DeviceOutOfMemory
// (a RuntimeFailure, exit 3) that says how much was asked and what to do, after one retry
// with the pool trimmed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/runtime/cuda_check.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

class DeviceOutOfMemory : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

// Allocates `bytes` on `device` from its pool, ordered on `stream`. `what` names the buffer
// in the out-of-memory message.
void* device_allocate(std::size_t bytes, const char* what, int device, cudaStream_t stream);
// Returns memory allocated on `device` to its pool, ordered on `stream` (never throws;
// errors are ignored because it runs in destructors).
void device_free(void* p, std::size_t bytes, int device, cudaStream_t stream) noexcept;

// Returns the pool's unused memory on `device` to the driver if ringattn holds nothing on
// it any more (called when a plan is destroyed, after its stream has finished).
void release_unused_device_memory(int device) noexcept;

// Bytes held through device_allocate now, and the most ever held (all devices).
std::size_t device_bytes_now() noexcept;
std::size_t device_bytes_peak() noexcept;

// An owned device allocation (move-only).
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  DeviceAllocation(std::size_t bytes, const char* what, int device, cudaStream_t stream)
      : ptr_(device_allocate(bytes, what, device, stream)),
        bytes_(bytes),
        device_(device),
        stream_(stream) {}
  ~DeviceAllocation() { reset(); }
  DeviceAllocation(DeviceAllocation&& o) noexcept
      : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_), stream_(o.stream_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      device_ = o.device_;
      stream_ = o.stream_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* get() const noexcept { return ptr_; }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const noexcept { return bytes_; }
  void reset() noexcept {
    if (ptr_) device_free(ptr_, bytes_, device_, stream_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

// A device copy of `v` (allocated and copied in order on `stream`). An empty `v` gets a valid,
// distinct pointer all the same (device_allocate's 16 bytes), with bytes() 0: lists that are
// empty on some rank or pass are passed to kernels, which read none of them.
template <typename T>
DeviceAllocation upload_vector(const std::vector<T>& v, const char* what, int device,
                               cudaStream_t stream) {
  DeviceAllocation a(v.size() * sizeof(T), what, device, stream);
  if (!v.empty())
    RINGATTN_CUDA_CHECK(
        cudaMemcpyAsync(a.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return a;
}

}  // namespace ringattn::kernels::cuda

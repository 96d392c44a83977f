// GPUs as a caller sees them: whether this build has CUDA kernels and a device is usable, and
// device memory from ringattn's pool for the caller's own tensors (what a TensorRef with
// Memory::device points at). In a build without CUDA every call that needs a device throws
// an InputError naming `device`.
#pragma once

#include <cstddef>
#include <string>

#include "ringattn/types.hpp"

namespace ringattn {

// Whether a CUDA device can be used, and if not why (never throws).
struct CudaDeviceStatus {
  bool usable = false;
  int device_count = 0;
  std::string reason;  // why not usable, e.g. "no CUDA device (cudaGetDeviceCount: ...)"
  std::string name;    // e.g. "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  std::size_t total_bytes = 0;
  bool emulated = false;  // the SIMT emulator's device (a test build): no GPU timings
};
bool cuda_built() noexcept;  // this build has CUDA kernels
CudaDeviceStatus probe_cuda_device(int device = 0) noexcept;

// Device memory from ringattn's pool, counted in device_bytes_peak().
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, const char* what, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&&) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) noexcept;

  void* data() const noexcept { return ptr_; }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const noexcept { return bytes_; }

  // Host fp32 → this buffer as `t` (converted on the host, round to nearest even).
  void upload(const float* host, std::size_t count, DeviceDType t);
  // This buffer (fp32) → host.
  void download(float* host, std::size_t count) const;
  // Sets every byte to zero.
  void zero();

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

// Bytes of device memory ringattn holds now / has held at most (tensors and workspace).
std::size_t device_bytes_now() noexcept;
std::size_t device_bytes_peak() noexcept;

// data[i] = float(t(data[i])): the values a device tensor of type t holds.
void round_to_device_dtype(float* data, std::size_t count, DeviceDType t);

}  // namespace ringattn

// The public device entry points (ringattn/device.hpp) on the kernel layer's allocator and
// conversions: the device probe, DeviceBuffer, the pool's counters.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/params.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "kernels/cuda/runtime/host_convert.hpp"
#include "ringattn/device.hpp"
#include "ringattn/errors.hpp"

namespace ringattn {

namespace kc = kernels::cuda;

bool cuda_built() noexcept { return true; }

CudaDeviceStatus probe_cuda_device(int device) noexcept {
  CudaDeviceStatus s;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    s.reason = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
               cudaGetErrorString(err) + ")";
    return s;
  }
  s.device_count = count;
  if (count == 0) {
    s.reason = "no CUDA device (cudaGetDeviceCount: 0 devices)";
    return s;
  }
  if (device < 0 || device >= count) {
    s.reason = "device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
               " visible)";
    return s;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    s.reason = "cannot read the properties of device " + std::to_string(device);
    return s;
  }
  s.name = prop.name;
  s.cc_major = prop.major;
  s.cc_minor = prop.minor;
  s.total_bytes = prop.totalGlobalMem;
#if RINGATTN_CUDA_EMULATION
  s.emulated = true;
#endif
  if (prop.major < 8) {
    s.reason = s.name + " has compute capability " + std::to_string(prop.major) + "." +
               std::to_string(prop.minor) + "; the kernels need 8.0 or newer (mma.sync bf16)";
    return s;
  }
  s.usable = true;
  return s;
}

// ---- DeviceBuffer -------------------------------------------------------------------------
// Every entry point makes the buffer's device current (and puts the caller's back): the
// legacy default stream these use is per device.
DeviceBuffer::DeviceBuffer(std::size_t bytes, const char* what, int device) : device_(device) {
  const kc::ScopedDevice on(device);
  ptr_ = kc::device_allocate(bytes, what, device, nullptr);
  bytes_ = bytes;
  // Allocated on the legacy default stream: usable by any stream once that is done.
  RINGATTN_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}
DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  const kc::ScopedDevice on(device_, std::nothrow);
  kc::device_free(ptr_, bytes_, device_, nullptr);
  kc::release_unused_device_memory(device_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) {
      const kc::ScopedDevice on(device_, std::nothrow);
      kc::device_free(ptr_, bytes_, device_, nullptr);
    }
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const float* host, std::size_t count, DeviceDType t) {
  const kc::ScopedDevice on(device_);
  const kc::Elem e = kc::elem_of(t);
  const std::size_t bytes = count * static_cast<std::size_t>(kc::elem_bytes(e));
  if (bytes > bytes_) throw RuntimeFailure("DeviceBuffer::upload: buffer too small");
  if (e == kc::Elem::fp32) {
    RINGATTN_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
    return;
  }
  // Converted in pieces so the host copy stays small.
  constexpr std::size_t kChunk = std::size_t{1} << 24;
  std::vector<uint16_t> staging(std::min(count, kChunk));
  for (std::size_t i = 0; i < count; i += kChunk) {
    const std::size_t n = std::min(kChunk, count - i);
    kc::convert_from_float(host + i, staging.data(), n, e);
    RINGATTN_CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(ptr_) + i, staging.data(),
                                   n * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
}

void DeviceBuffer::download(float* host, std::size_t count) const {
  if (count * sizeof(float) > bytes_) throw RuntimeFailure("DeviceBuffer::download: too many");
  const kc::ScopedDevice on(device_);
  RINGATTN_CUDA_CHECK(cudaMemcpy(host, ptr_, count * sizeof(float), cudaMemcpyDeviceToHost));
}

void DeviceBuffer::zero() {
  const kc::ScopedDevice on(device_);
  RINGATTN_CUDA_CHECK(cudaMemset(ptr_, 0, bytes_));
}

std::size_t device_bytes_now() noexcept { return kc::device_bytes_now(); }
std::size_t device_bytes_peak() noexcept { return kc::device_bytes_peak(); }

void round_to_device_dtype(float* data, std::size_t count, DeviceDType t) {
  kc::round_through(data, count, kc::elem_of(t));
}

}  // namespace ringattn

// The kernel layer in a build without the CUDA toolkit: the device probe says why there is no
// device, and everything that needs one (device buffers, stream ordering) throws, naming
// --device, that this build has no CUDA kernels.
#include "kernels/attention_sinks.hpp"
#include "kernels/cuda/runtime/stream_order.hpp"
#include "kernels/cuda/runtime/unavailable.hpp"
#include "ringattn/device.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

const char* const kNoCudaReason =
    "this build of ringattn has no CUDA kernels (the CUDA toolkit was not found at configure "
    "time, or RINGATTN_WITH_CUDA=OFF)";

void no_cuda() { throw InputError("device", kNoCudaReason); }

void order_after(void*, void*, int) { no_cuda(); }
void apply_sinks(const SinkRows&, const float*, float*, float*, void*, int) { no_cuda(); }
std::size_t sink_gradient_workspace_bytes(const SinkRows&) { return 0; }
void sink_gradient(const SinkRows&, DeviceDType, const float*, const float*, const void*,
                   const float*, float*, void*, void*, int) {
  no_cuda();
}

}  // namespace ringattn::kernels::cuda

namespace ringattn {

using kernels::cuda::no_cuda;

bool cuda_built() noexcept { return false; }
CudaDeviceStatus probe_cuda_device(int) noexcept {
  CudaDeviceStatus s;
  s.reason = kernels::cuda::kNoCudaReason;
  return s;
}

DeviceBuffer::DeviceBuffer(std::size_t, const char*, int) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;
void DeviceBuffer::upload(const float*, std::size_t, DeviceDType) { no_cuda(); }
void DeviceBuffer::download(float*, std::size_t) const { no_cuda(); }
void DeviceBuffer::zero() { no_cuda(); }
std::size_t device_bytes_now() noexcept { return 0; }
std::size_t device_bytes_peak() noexcept { return 0; }
void round_to_device_dtype(float*, std::size_t, DeviceDType) { no_cuda(); }

}  // namespace ringattn

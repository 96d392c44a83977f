// CudaPlan in a build without the CUDA toolkit: the interface exists so that the CLI and
// library users compile unchanged, and every entry point says, naming --device, that this
// build has no CUDA kernels.
#include "job/ulysses.hpp"
#include "kernels/attention_sinks.hpp"
#include "kernels/cuda/stream_order.hpp"
#include "ring/cuda_ring_engine.hpp"
#include "ringattn/cuda_plan.hpp"
#include "ringattn/errors.hpp"

namespace ringattn {

namespace {
const char* kNoCuda =
    "this build of ringattn has no CUDA kernels (the CUDA toolkit was not found at configure "
    "time, or RINGATTN_WITH_CUDA=OFF)";
[[noreturn]] void no_cuda() { throw InputError("--device", kNoCuda); }
}  // namespace

const char* to_string(DeviceDType t) {
  return t == DeviceDType::bf16 ? "bf16" : t == DeviceDType::fp16 ? "fp16" : "fp32";
}
const char* to_string(KernelChoice k) {
  return k == KernelChoice::automatic ? "auto" : k == KernelChoice::native ? "native" : "cudnn";
}

bool cuda_built() noexcept { return false; }
CudaDeviceStatus probe_cuda_device(int) noexcept {
  CudaDeviceStatus s;
  s.reason = kNoCuda;
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

struct CudaPlan::Impl {};
CudaPlan::CudaPlan(const AttentionConfig&, CudaPlanOptions) { no_cuda(); }
CudaPlan::~CudaPlan() = default;
CudaPlan::CudaPlan(CudaPlan&&) noexcept = default;
CudaPlan& CudaPlan::operator=(CudaPlan&&) noexcept = default;
const AttentionConfig& CudaPlan::config() const noexcept {
  static const AttentionConfig none;
  return none;
}
DeviceDType CudaPlan::dtype() const noexcept { return DeviceDType::fp32; }
void CudaPlan::forward(const void*, const void*, const void*, float*, float*) { no_cuda(); }
void CudaPlan::backward(const void*, const void*, const void*, const float*, const float*,
                        const void*, float*, float*, float*) {
  no_cuda();
}
void CudaPlan::synchronize() { no_cuda(); }
void* CudaPlan::stream() const noexcept { return nullptr; }
std::string CudaPlan::kernel_name() const { return "none"; }
std::string CudaPlan::backward_kernel_name() const { return "none"; }
const std::vector<std::string>& CudaPlan::notes() const noexcept {
  static const std::vector<std::string> none;
  return none;
}
std::size_t CudaPlan::workspace_bytes() const noexcept { return 0; }
std::string CudaPlan::device_description() const { return "none"; }

}  // namespace ringattn

namespace ringattn::ring {

std::unique_ptr<Communicator> make_device_inproc_communicator(Communicator&, int) { no_cuda(); }

struct CudaRingPlan::Impl {
  ShardLayout layout;
  RingSchedule sched;
  RingTimings none;
  std::vector<std::string> notes;
};
CudaRingPlan::CudaRingPlan(const AttentionConfig&, Communicator&, CudaPlanOptions, RingOptions) {
  no_cuda();
}
CudaRingPlan::~CudaRingPlan() = default;
const ShardLayout& CudaRingPlan::layout() const noexcept { return impl_->layout; }
const RingSchedule& CudaRingPlan::schedule() const noexcept { return impl_->sched; }
DeviceDType CudaRingPlan::dtype() const noexcept { return DeviceDType::fp32; }
void CudaRingPlan::forward(const void*, const void*, const void*, float*, float*) { no_cuda(); }
void CudaRingPlan::backward(const void*, const void*, const void*, const float*, const float*,
                            const void*, float*, float*, float*) {
  no_cuda();
}
void CudaRingPlan::synchronize() { no_cuda(); }
void* CudaRingPlan::stream() const noexcept { return nullptr; }
const RingTimings& CudaRingPlan::last_forward() const noexcept { return impl_->none; }
const RingTimings& CudaRingPlan::last_backward() const noexcept { return impl_->none; }
std::size_t CudaRingPlan::workspace_bytes() const noexcept { return 0; }
std::string CudaRingPlan::kernel_name() const { return "native"; }
std::string CudaRingPlan::backward_kernel_name() const { return "native"; }
const std::vector<std::string>& CudaRingPlan::notes() const noexcept { return impl_->notes; }

}  // namespace ringattn::ring

namespace ringattn::kernels::cuda {
void order_after(void*, void*, int) { no_cuda(); }
void apply_sinks(const SinkRows&, const float*, float*, float*, void*, int) { no_cuda(); }
void sink_gradient(const SinkRows&, DeviceDType, const float*, const float*, const void*,
                   const float*, float*, void*, int) {
  no_cuda();
}
}  // namespace ringattn::kernels::cuda

namespace ringattn::job {
std::unique_ptr<Moves> make_device_moves(void*, int) { no_cuda(); }
}  // namespace ringattn::job

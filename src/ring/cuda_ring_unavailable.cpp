// The ring's GPU engine in a build without the CUDA toolkit: the interface exists so that the
// layers above compile unchanged, and constructing it says, naming `device`, that this build
// has no CUDA kernels.
#include "kernels/cuda/runtime/unavailable.hpp"
#include "ring/cuda_ring_engine.hpp"
#include "ring/nccl_communicator.hpp"

namespace ringattn::ring {

std::unique_ptr<Communicator> make_device_inproc_communicator(Communicator&, int) {
  kernels::cuda::no_cuda();
}

struct CudaRingPlan::Impl {
  ShardLayout layout;
  RingSchedule sched;
  RingTimings none;
  std::vector<std::string> notes;
};
CudaRingPlan::CudaRingPlan(const AttentionConfig&, Communicator&, CudaPlanOptions, RingOptions) {
  kernels::cuda::no_cuda();
}
CudaRingPlan::~CudaRingPlan() = default;
const ShardLayout& CudaRingPlan::layout() const noexcept { return impl_->layout; }
const RingSchedule& CudaRingPlan::schedule() const noexcept { return impl_->sched; }
DeviceDType CudaRingPlan::dtype() const noexcept { return DeviceDType::fp32; }
void CudaRingPlan::forward(const void*, const void*, const void*, float*, float*) {
  kernels::cuda::no_cuda();
}
void CudaRingPlan::backward(const void*, const void*, const void*, const float*, const float*,
                            const void*, float*, float*, float*) {
  kernels::cuda::no_cuda();
}
void CudaRingPlan::synchronize() { kernels::cuda::no_cuda(); }
void* CudaRingPlan::stream() const noexcept { return nullptr; }
const RingTimings& CudaRingPlan::last_forward() const noexcept { return impl_->none; }
const RingTimings& CudaRingPlan::last_backward() const noexcept { return impl_->none; }
std::size_t CudaRingPlan::workspace_bytes() const noexcept { return 0; }
std::string CudaRingPlan::kernel_name() const { return "native"; }
std::string CudaRingPlan::backward_kernel_name() const { return "native"; }
const std::vector<std::string>& CudaRingPlan::notes() const noexcept { return impl_->notes; }

}  // namespace ringattn::ring

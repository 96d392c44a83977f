// CudaSparsePlan in a build without CUDA: the interface exists so that the CLI compiles
// unchanged, and constructing it says, naming `device`, that this build has no CUDA kernels.
#include "kernels/cuda/runtime/unavailable.hpp"
#include "sparse/cuda_sparse_plan.hpp"

namespace ringattn::sparse {

struct CudaSparsePlan::Impl {};

CudaSparsePlan::CudaSparsePlan(const AttentionConfig&, std::shared_ptr<const BlockLists>,
                               CudaPlanOptions) {
  kernels::cuda::no_cuda();
}
CudaSparsePlan::CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                               ring::Communicator&, CudaPlanOptions opts, ring::RingOptions)
    : CudaSparsePlan(cfg, std::move(lists), opts) {}
CudaSparsePlan::~CudaSparsePlan() = default;
CudaSparsePlan::CudaSparsePlan(CudaSparsePlan&&) noexcept = default;
CudaSparsePlan& CudaSparsePlan::operator=(CudaSparsePlan&&) noexcept = default;
const AttentionConfig& CudaSparsePlan::config() const noexcept {
  static const AttentionConfig none;
  return none;
}
DeviceDType CudaSparsePlan::dtype() const noexcept { return DeviceDType::fp32; }
void CudaSparsePlan::forward(const void*, const void*, const void*, float*, float*) {}
void CudaSparsePlan::backward(const void*, const void*, const void*, const float*, const float*,
                              const void*, float*, float*, float*) {}
void CudaSparsePlan::synchronize() {}
void* CudaSparsePlan::stream() const noexcept { return nullptr; }
const std::vector<std::string>& CudaSparsePlan::notes() const noexcept {
  static const std::vector<std::string> none;
  return none;
}
std::size_t CudaSparsePlan::workspace_bytes() const noexcept { return 0; }
const ring::ShardLayout& CudaSparsePlan::layout() const noexcept {
  static const ring::ShardLayout none;
  return none;
}
const ring::RingTimings& CudaSparsePlan::last_forward() const noexcept {
  static const ring::RingTimings none;
  return none;
}
const ring::RingTimings& CudaSparsePlan::last_backward() const noexcept { return last_forward(); }
int CudaSparsePlan::peers() const noexcept { return 0; }
std::string CudaSparsePlan::device_description() const { return "none"; }
std::string CudaSparsePlan::kernel_name() const { return "native"; }
std::string CudaSparsePlan::backward_kernel_name() const { return "native"; }

}  // namespace ringattn::sparse

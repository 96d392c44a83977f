// CudaPlan in a build without the CUDA toolkit: the interface exists so that the layers
// above compile unchanged, and every entry point says, naming `device`, that this build has
// no CUDA kernels (the kernel layer's stub, kernels/cuda/runtime/cuda_unavailable.cpp, says how).
#include "kernels/cuda/runtime/unavailable.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn {

struct CudaPlan::Impl {};
CudaPlan::CudaPlan(const AttentionConfig&, CudaPlanOptions) { kernels::cuda::no_cuda(); }
CudaPlan::~CudaPlan() = default;
CudaPlan::CudaPlan(CudaPlan&&) noexcept = default;
CudaPlan& CudaPlan::operator=(CudaPlan&&) noexcept = default;
const AttentionConfig& CudaPlan::config() const noexcept {
  static const AttentionConfig none;
  return none;
}
DeviceDType CudaPlan::dtype() const noexcept { return DeviceDType::fp32; }
void CudaPlan::forward(const void*, const void*, const void*, float*, float*) {
  kernels::cuda::no_cuda();
}
void CudaPlan::backward(const void*, const void*, const void*, const float*, const float*,
                        const void*, float*, float*, float*) {
  kernels::cuda::no_cuda();
}
void CudaPlan::synchronize() { kernels::cuda::no_cuda(); }
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

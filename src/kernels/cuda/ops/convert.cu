// Conversions between the fp32 results and the io element type on the device (see
// device_ops.hpp).
#include <cmath>

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/ops/launch_shape.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using namespace ops_detail;

template <typename T>
__global__ void floats_to_elem_kernel(const float* src, T* dst, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      dst[i] = __float2bfloat16_rn(src[i] * scale);
    else
      dst[i] = __float2half_rn(src[i] * scale);
  }
}

template <typename T>
__global__ void elem_to_floats_kernel(const T* src, float* dst, int64_t n, bool add, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = add ? dst[i] + to_float(src[i]) * scale : to_float(src[i]) * scale;
}

}  // namespace

void launch_floats_to_elem(Elem e, const float* src, void* dst, int64_t n, cudaStream_t stream,
                           float scale) {
  if (n <= 0) return;
  const dim3 grid(blocks_for(n, kThreads * 4)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("floats_to_elem_kernel", &floats_to_elem_kernel<__nv_bfloat16>, grid, block, 0,
                    stream, src, static_cast<__nv_bfloat16*>(dst), n, scale);
      break;
    case Elem::fp16:
      launch_kernel("floats_to_elem_kernel", &floats_to_elem_kernel<__half>, grid, block, 0, stream,
                    src, static_cast<__half*>(dst), n, scale);
      break;
    case Elem::fp32:
      if (scale != 1.0f)
        throw RuntimeFailure("launch_floats_to_elem: a scaled fp32 copy is not implemented");
      RINGATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, stream));
      return;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("floats_to_elem_kernel");
}

void launch_elem_to_floats(Elem e, const void* src, float* dst, int64_t n, bool add,
                           cudaStream_t stream, float scale) {
  if (n <= 0) return;
  const dim3 grid(blocks_for(n, kThreads * 4)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("elem_to_floats_kernel", &elem_to_floats_kernel<__nv_bfloat16>, grid, block, 0,
                    stream, static_cast<const __nv_bfloat16*>(src), dst, n, add, scale);
      break;
    case Elem::fp16:
      launch_kernel("elem_to_floats_kernel", &elem_to_floats_kernel<__half>, grid, block, 0, stream,
                    static_cast<const __half*>(src), dst, n, add, scale);
      break;
    case Elem::fp32:
      launch_kernel("elem_to_floats_kernel", &elem_to_floats_kernel<float>, grid, block, 0, stream,
                    static_cast<const float*>(src), dst, n, add, scale);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("elem_to_floats_kernel");
}

}  // namespace ringattn::kernels::cuda

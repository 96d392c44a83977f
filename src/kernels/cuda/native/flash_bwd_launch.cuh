// Launch logic of the tensor-core backward: the dQ pass over query items and the dK/dV
// pass over key items, on one stream (they write disjoint outputs; order does not matter).
#pragma once

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/native/flash_bwd_kernel.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

template <Elem E, int kHeadDim>
void launch_flash_backward(const FlashBackwardParams& p, cudaStream_t stream) {
  using T = typename ElemType<E>::type;
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kSmem = Tiles::template smem_bytes<T>();
  if (p.n_q_items > 0) {
    auto kernel = &flash_backward_dq_kernel<T, kHeadDim>;
    RINGATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    launch_kernel("flash_backward_dq_kernel", kernel, dim3(static_cast<unsigned>(p.n_q_items)),
                  dim3(Tiles::kThreads), kSmem, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("flash_backward_dq_kernel");
  }
  if (p.n_k_items > 0) {
    auto kernel = &flash_backward_dkdv_kernel<T, kHeadDim>;
    RINGATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    launch_kernel("flash_backward_dkdv_kernel", kernel, dim3(static_cast<unsigned>(p.n_k_items)),
                  dim3(Tiles::kThreads), kSmem, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("flash_backward_dkdv_kernel");
  }
}

}  // namespace ringattn::kernels::cuda

#define RINGATTN_INSTANTIATE_FLASH_BACKWARD(D)                                            \
  template void                                                                           \
  ringattn::kernels::cuda::launch_flash_backward<ringattn::kernels::cuda::Elem::bf16, D>( \
      const ringattn::kernels::cuda::FlashBackwardParams&, cudaStream_t);                 \
  template void                                                                           \
  ringattn::kernels::cuda::launch_flash_backward<ringattn::kernels::cuda::Elem::fp16, D>( \
      const ringattn::kernels::cuda::FlashBackwardParams&, cudaStream_t);

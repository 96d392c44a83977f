// Launch logic of the tensor-core forward, apart from its body: grid = one block per work
// item, dynamic shared memory raised past 48 KiB once per instantiation, launch checked.
#pragma once

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/native/flash_fwd_kernel.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

template <Elem E, int kHeadDim>
void launch_flash_forward(const FlashForwardParams& p, cudaStream_t stream) {
  using T = typename ElemType<E>::type;
  using Tiles = ForwardTiles<kHeadDim>;
  if (p.n_items == 0) return;
  constexpr int kSmem = Tiles::template smem_bytes<T>();
  auto kernel = &flash_forward_kernel<T, kHeadDim>;
  // Per device, not per process: a second device needs the attribute too. Setting it is
  // cheap, so it is set on every launch rather than cached.
  RINGATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  launch_kernel("flash_forward_kernel", kernel, dim3(static_cast<unsigned>(p.n_items)),
                dim3(Tiles::kThreads), kSmem, stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("flash_forward_kernel");
}

}  // namespace ringattn::kernels::cuda

// One explicit instantiation per element type for a head dim (used by flash_fwd_hdim*.cu).
#define RINGATTN_INSTANTIATE_FLASH_FORWARD(D)                                            \
  template void                                                                          \
  ringattn::kernels::cuda::launch_flash_forward<ringattn::kernels::cuda::Elem::bf16, D>( \
      const ringattn::kernels::cuda::FlashForwardParams&, cudaStream_t);                 \
  template void                                                                          \
  ringattn::kernels::cuda::launch_flash_forward<ringattn::kernels::cuda::Elem::fp16, D>( \
      const ringattn::kernels::cuda::FlashForwardParams&, cudaStream_t);

// Launch logic of the tensor-core block-sparse kernels, apart from their bodies: grid = one
// block per work item, dynamic shared memory raised past 48 KiB per instantiation (set on
// every launch: the attribute is per device), each launch checked.
#pragma once

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/native/sparse_bwd_kernel.cuh"
#include "kernels/cuda/native/sparse_fwd_kernel.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

template <Elem E, int kHeadDim>
void launch_sparse_forward(const SparseForwardParams& p, cudaStream_t stream) {
  using T = typename ElemType<E>::type;
  using Tiles = SparseForwardTiles<kHeadDim>;
  if (p.n_items == 0) return;
  constexpr int kSmem = Tiles::template smem_bytes<T>();
  auto kernel = &sparse_forward_kernel<T, kHeadDim>;
  RINGATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  launch_kernel("sparse_forward_kernel", kernel, dim3(static_cast<unsigned>(p.n_items)),
                dim3(Tiles::kThreads), kSmem, stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("sparse_forward_kernel");
}

template <Elem E, int kHeadDim>
void launch_sparse_backward(const SparseBackwardParams& p, cudaStream_t stream) {
  using T = typename ElemType<E>::type;
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kSmem = sparse_backward_smem_bytes(kHeadDim, static_cast<int>(sizeof(T)));
  if (p.n_q_items > 0) {
    auto kernel = &sparse_backward_dq_kernel<T, kHeadDim>;
    RINGATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    launch_kernel("sparse_backward_dq_kernel", kernel, dim3(static_cast<unsigned>(p.n_q_items)),
                  dim3(Tiles::kThreads), kSmem, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("sparse_backward_dq_kernel");
  }
  if (p.n_k_items > 0) {
    auto kernel = &sparse_backward_dkdv_kernel<T, kHeadDim>;
    RINGATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    launch_kernel("sparse_backward_dkdv_kernel", kernel, dim3(static_cast<unsigned>(p.n_k_items)),
                  dim3(Tiles::kThreads), kSmem, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("sparse_backward_dkdv_kernel");
  }
}

}  // namespace ringattn::kernels::cuda

// The forward and backward instantiations of one head dim, for bf16 and fp16.
#define RINGATTN_INSTANTIATE_SPARSE(D)                                                     \
  template void                                                                            \
  ringattn::kernels::cuda::launch_sparse_forward<ringattn::kernels::cuda::Elem::bf16, D>(  \
      const ringattn::kernels::cuda::SparseForwardParams&, cudaStream_t);                  \
  template void                                                                            \
  ringattn::kernels::cuda::launch_sparse_forward<ringattn::kernels::cuda::Elem::fp16, D>(  \
      const ringattn::kernels::cuda::SparseForwardParams&, cudaStream_t);                  \
  template void                                                                            \
  ringattn::kernels::cuda::launch_sparse_backward<ringattn::kernels::cuda::Elem::bf16, D>( \
      const ringattn::kernels::cuda::SparseBackwardParams&, cudaStream_t);                 \
  template void                                                                            \
  ringattn::kernels::cuda::launch_sparse_backward<ringattn::kernels::cuda::Elem::fp16, D>( \
      const ringattn::kernels::cuda::SparseBackwardParams&, cudaStream_t);

// The native flash kernels (tensor-core mma.sync on sm_80+, CUDA-core fp32 elsewhere) over
// SubseqTasks: their launches and the dispatch every device plan calls (params.hpp's
// FlashForwardParams / FlashBackwardParams).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

// Tensor-core kernels (mma.sync m16n8k16, sm_80+), one explicit instantiation per element
// type and padded head dim, in flash_fwd_hdim*.cu / flash_bwd_hdim*.cu.
template <Elem E, int kHeadDim>
void launch_flash_forward(const FlashForwardParams& p, cudaStream_t stream);
template <Elem E, int kHeadDim>
void launch_flash_backward(const FlashBackwardParams& p, cudaStream_t stream);

// Dispatch on (element type, head dim) to the instantiations above; fp32 goes to the simple
// CUDA-core kernels (simple_fp32.cu), which handle any head dim up to 256.
// Empty when the tensor-core kernels for `head_dim` in `e` fit `device`'s opt-in shared
// memory per block; otherwise why not (sizes and limit), for a note.
std::string native_kernels_fit(int64_t head_dim, Elem e, int device);

void flash_forward(Elem e, const FlashForwardParams& p, cudaStream_t stream);
void flash_backward(Elem e, const FlashBackwardParams& p, cudaStream_t stream);

void launch_simple_forward_fp32(const FlashForwardParams& p, cudaStream_t stream);
void launch_simple_backward_fp32(const FlashBackwardParams& p, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

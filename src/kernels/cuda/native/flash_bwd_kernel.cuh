// The tensor-core flash backward (FlashAttention-2 identities, see docs/SEMANTICS.md), as
// two kernels so that every output element has exactly one writer and the result is
// deterministic (no atomics), each a block of flash_tiles.cuh over the task's one run:
//   dq pass, one block per kQueryTile query rows: recompute P = exp(s·QKᵀ − lse) and
//     dP = dO Vᵀ tile by tile, dS = P ∘ (dP − D), dQ += s·dS K;
//   dk/dv pass, one block per kKeyTile key rows: the same products transposed,
//     dV += Pᵀ dO and dK += s·dSᵀ Q, accumulated in fp32 registers.
// Both add (+=) into fp32 dq/dk/dv, as the CPU kernels do.
#pragma once

#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/native/flash_tiles.cuh"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    flash_backward_dq_kernel(const FlashBackwardParams p) {
  const ForwardItem item = p.q_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  dq_block<T, kHeadDim>(dq_rows_of<T>(p, item, t, t.q_stride, t.lse_stride), keys_of<T>(p, t),
                        scalars_of(p));
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    flash_backward_dkdv_kernel(const FlashBackwardParams p) {
  const ForwardItem item = p.k_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  dkdv_block<T, kHeadDim>(dkdv_rows_of<T>(p, item, t), queries_of<T>(p, t), scalars_of(p));
}

}  // namespace ringattn::kernels::cuda

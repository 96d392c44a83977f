// The tensor-core block-sparse backward: the flash backward's two passes (flash_tiles.cuh)
// over the block-sparse lists, so every output element has exactly one writer and the result
// is deterministic (no atomics):
//   dQ pass, one block per kQueryTile rows of a query tile, walking the tile's key spans:
//     P = exp(s·QKᵀ − lse), dP = dO Vᵀ, dS = P ∘ (dP − D), dQ += s·dS K;
//   dK/dV pass, one block per kKeyTile rows of a key tile, walking the query spans that
//     attend it: dV += Pᵀ dO, dK += s·dSᵀ Q.
// Both add (+=) into fp32 dq/dk/dv, as the CPU kernels do.
#pragma once

#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/native/flash_tiles.cuh"
#include "kernels/cuda/native/sparse.hpp"

namespace ringattn::kernels::cuda {

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    sparse_backward_dq_kernel(const SparseBackwardParams p) {
  const ForwardItem item = p.q_items[blockIdx.x];
  const SparseQueryTile tile = p.q_tiles[item.task];
  dq_block<T, kHeadDim>(dq_rows_of<T>(p, item, tile, p.q_stride, p.lse_stride),
                        keys_of<T>(p, p.key_spans, tile), scalars_of(p));
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiles<kHeadDim>::kThreads)
    sparse_backward_dkdv_kernel(const SparseBackwardParams p) {
  const ForwardItem item = p.k_items[blockIdx.x];
  const SparseKeyTile tile = p.k_tiles[item.task];
  dkdv_block<T, kHeadDim>(dkdv_rows_of<T>(p, item, tile), queries_of<T>(p, tile), scalars_of(p));
}

}  // namespace ringattn::kernels::cuda

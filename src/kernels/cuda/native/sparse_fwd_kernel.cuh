// The tensor-core block-sparse forward, one block per work item (kQueryTile rows of one
// query tile): the flash forward's block (flash_tiles.cuh) walking the tile's key spans one
// after another instead of one key range, with one K tile (no prefetch across spans). Each
// span has its own base, stride and causal offset, so local rows and rows of a receive buffer
// mix in one tile; skipped blocks are never listed and cost nothing. The epilogue writes
// out/lse, or merges into them by log-sum-exp (`accumulate`), exactly as the flash forward.
#pragma once

#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/native/flash_tiles.cuh"
#include "kernels/cuda/native/sparse.hpp"

namespace ringattn::kernels::cuda {

template <int kHeadDim>
using SparseForwardTiles = ForwardTiles<kHeadDim, false>;
static_assert(SparseForwardTiles<64>::smem_bytes<uint16_t>() == sparse_forward_smem_bytes(64, 2) &&
                  SparseForwardTiles<128>::smem_bytes<uint16_t>() ==
                      sparse_forward_smem_bytes(128, 2) &&
                  SparseForwardTiles<256>::smem_bytes<uint16_t>() ==
                      sparse_forward_smem_bytes(256, 2),
              "the host's fit check (sparse_forward_smem_bytes) sizes what the kernel lays out");

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(SparseForwardTiles<kHeadDim>::kThreads)
    sparse_forward_kernel(const SparseForwardParams p) {
  const ForwardItem item = p.items[blockIdx.x];
  const SparseQueryTile tile = p.tiles[item.task];
  forward_block<T, kHeadDim, false>(forward_rows_of<T>(p, item, tile, p.q_stride, p.lse_stride),
                                    keys_of<T>(p, p.spans, tile), scalars_of(p));
}

}  // namespace ringattn::kernels::cuda

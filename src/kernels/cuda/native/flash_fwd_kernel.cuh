// The tensor-core flash forward, one block per work item (kQueryTile query rows of one
// task): the forward block of flash_tiles.cuh walking the task's one run of keys (for
// D = 256 with K double-buffered), writing out/lse or merging into them by log-sum-exp.
#pragma once

#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/native/flash_tiles.cuh"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

static_assert(ForwardTiles<64>::smem_bytes<uint16_t>() == forward_smem_bytes(64, 2) &&
                  ForwardTiles<128>::smem_bytes<uint16_t>() == forward_smem_bytes(128, 2) &&
                  ForwardTiles<256>::smem_bytes<uint16_t>() == forward_smem_bytes(256, 2),
              "the host's fit check (forward_smem_bytes) sizes what the kernel lays out");

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ForwardTiles<kHeadDim>::kThreads)
    flash_forward_kernel(const FlashForwardParams p) {
  const ForwardItem item = p.items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  forward_block<T, kHeadDim, ForwardTiles<kHeadDim>::kPrefetchK>(
      forward_rows_of<T>(p, item, t, t.q_stride, t.lse_stride), keys_of<T>(p, t), scalars_of(p));
}

}  // namespace ringattn::kernels::cuda

// A block-sparse plan's work lists on the device (CudaSparsePlan holds one set for the rank's
// local blocks and one for the received ones): query tiles with key spans (forward, dQ) and
// key tiles with query spans (dK/dV), with their work items, and the key items paired into
// 128 keys for the sm_90a wide fused backward.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu_block_sparse.hpp"  // the tiles and spans
#include "kernels/cuda/runtime/device_memory.hpp"

namespace ringattn::sparse {

// One set of work lists on the device: query tiles with key spans (forward, dQ) and key tiles
// with query spans (dK/dV), with their work items.
struct DeviceLists {
  kernels::cuda::DeviceAllocation q_tiles, key_spans, q_items, k_tiles, query_spans, k_items;
  int64_t n_q_items = 0, n_k_items = 0;
  // The key items paired into 128 keys for the wide fused backward (hopper_wide_key_items),
  // where they pair up (wide_pairs: always for tiles of 64-key multiples).
  kernels::cuda::DeviceAllocation wide_k_items;
  int64_t n_wide_k_items = 0;
  bool wide_pairs = false;
  // 16-byte copies need every row start and stride the kernels use to be a multiple of 8
  // elements (the tensors' own pointers are checked at each call).
  bool rows_aligned = true;

  // The lists uploaded (and paired for the wide kernel), and rows_aligned checked.
  void upload(const std::vector<kernels::SparseQueryTile>& qt,
              const std::vector<kernels::KeySpan>& ks,
              const std::vector<kernels::SparseKeyTile>& kt,
              const std::vector<kernels::QuerySpan>& qs, bool causal, int device,
              cudaStream_t stream);
  std::size_t bytes() const {
    return q_tiles.bytes() + key_spans.bytes() + q_items.bytes() + k_tiles.bytes() +
           query_spans.bytes() + k_items.bytes() + wide_k_items.bytes();
  }
  void reset() {
    for (kernels::cuda::DeviceAllocation* a :
         {&q_tiles, &key_spans, &q_items, &k_tiles, &query_spans, &k_items, &wide_k_items})
      a->reset();
  }
};

}  // namespace ringattn::sparse

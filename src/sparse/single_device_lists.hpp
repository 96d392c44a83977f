// The block-sparse work lists of a whole problem on one device: the CPU kernels' own structs
// (query tiles with key spans, key tiles with query spans) for every (batch, head, block) of
// [B, N, H, D] tensors, plus work items that cut tiles into pieces of at most
// `rows_per_item` rows. Host-only: the CUDA plan uploads these once; the CPU kernels accept
// them as they are.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_block_sparse.hpp"
#include "kernels/cpu_flash.hpp"
#include "ringattn/config.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

struct SingleDeviceWork {
  // Forward and dQ: one tile per (batch, head, query block), every one present (the forward
  // writes every row, 0 and -inf where a row attends nothing).
  std::vector<kernels::SparseQueryTile> q_tiles;
  std::vector<kernels::KeySpan> key_spans;
  // dK/dV: one tile per (batch, head, key block) that some query block attends.
  std::vector<kernels::SparseKeyTile> k_tiles;
  std::vector<kernels::QuerySpan> query_spans;
  // (tile, first row): query items over q_tiles, most keys first; key items over k_tiles,
  // most queries first (long items start first, short ones fill the tail).
  std::vector<kernels::ForwardItem> q_items, k_items;
  int64_t q_stride = 0;    // H·D: between consecutive positions of one head
  int64_t lse_stride = 1;  // lse is [B, H, N]
};

// `cfg.attention` block_sparse, `lists` for its heads, N and block size (checked).
SingleDeviceWork build_single_device_work(const AttentionConfig& cfg, const BlockLists& lists,
                                          int64_t rows_per_item);

}  // namespace ringattn::sparse

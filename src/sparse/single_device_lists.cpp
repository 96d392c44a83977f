// Builds the single-device block-sparse lists from the block lists: the SparsePlan's lists on
// one rank (rank_work.cpp), with work items so that a device block of 64 rows can run any
// block size. Key spans (query spans) of consecutive blocks that continue each other in memory
// and in causal offset are merged, so a local window is one span per tile.
#include "sparse/single_device_lists.hpp"

#include <stdexcept>
#include <string>

#include "single/schedule.hpp"
#include "sparse/rank_work.hpp"

namespace ringattn::sparse {

SingleDeviceWork build_single_device_work(const AttentionConfig& cfg, const BlockLists& l,
                                          int64_t rows_per_item) {
  const Shape4& s = cfg.shape;
  const int64_t H = s.heads, D = s.head_dim, N = s.seq_len, bs = cfg.block_size;
  if (l.heads != H || l.block_size != bs || l.blocks * bs != N || rows_per_item <= 0)
    throw std::invalid_argument(
        "build_single_device_work: block lists are for H=" + std::to_string(l.heads) +
        ", bs=" + std::to_string(l.block_size) + ", nb=" + std::to_string(l.blocks) +
        ", not for this configuration");
  // One rank's work lists with the whole sequence on it: tiles cut at document bounds,
  // K/V rows of grouped-query heads, pairs outside the dense rule dropped (rank_work.hpp).
  ring::ShardLayout layout;
  layout.world = 1;
  layout.seq_len = N;
  layout.local_len = N;
  RankSparseWork r = build_rank_sparse_work(cfg, l, layout, 0);
  SingleDeviceWork w;
  w.q_stride = single::row_strides(cfg.layout, N, H, D).position;
  w.lse_stride = 1;
  w.q_tiles = std::move(r.local_tiles);
  w.key_spans = std::move(r.local_spans);
  w.k_tiles = std::move(r.local_ktiles);
  w.query_spans = std::move(r.local_qspans);
  w.q_items = sparse_query_items(w.q_tiles, w.key_spans, cfg.causal, rows_per_item);
  w.k_items = sparse_key_items(w.k_tiles, w.query_spans, cfg.causal, rows_per_item);
  return w;
}

}  // namespace ringattn::sparse

// Builds the single-device block-sparse lists from the block lists: the SparsePlan's lists on
// one rank (sparse_plan.cpp), with work items so that a device block of 64 rows can run any
// block size. Key spans (query spans) of consecutive blocks that continue each other in memory
// and in causal offset are merged, so a local window is one span per tile.
#include "sparse/single_device_lists.hpp"

#include <stdexcept>
#include <string>

#include "sparse/rank_work.hpp"

namespace ringattn::sparse {

SingleDeviceWork build_single_device_work(const AttentionConfig& cfg, const BlockLists& l,
                                          int64_t rows_per_item) {
  const Shape4& s = cfg.shape;
  const int64_t B = s.batch, H = s.heads, D = s.head_dim, N = s.seq_len, bs = cfg.block_size;
  if (l.heads != H || l.block_size != bs || l.blocks * bs != N || rows_per_item <= 0)
    throw std::invalid_argument(
        "build_single_device_work: block lists are for H=" + std::to_string(l.heads) +
        ", bs=" + std::to_string(l.block_size) + ", nb=" + std::to_string(l.blocks) +
        ", not for this configuration");
  auto row = [&](int64_t b, int64_t n, int64_t h) { return ((b * N + n) * H + h) * D; };
  auto lse_at = [&](int64_t b, int64_t h, int64_t n) { return (b * H + h) * N + n; };

  SingleDeviceWork w;
  w.q_stride = H * D;
  w.lse_stride = 1;
  std::vector<BlockCsr> cols;
  for (const BlockCsr& c : l.lists) cols.push_back(transpose(c, l.blocks));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const BlockCsr& c = l.of_head(h);
      for (int64_t i = 0; i < l.blocks; ++i) {
        kernels::SparseQueryTile t{row(b, i * bs, h), lse_at(b, h, i * bs), bs,
                                   static_cast<int64_t>(w.key_spans.size()), 0};
        for (int32_t j : c.row(i)) {
          if (cfg.causal && j > i) break;  // rows are sorted
          add_key_span(w.key_spans, t.first_span, {row(b, j * bs, h), H * D, bs, (i - j) * bs});
        }
        t.n_spans = static_cast<int64_t>(w.key_spans.size()) - t.first_span;
        w.q_tiles.push_back(t);
      }
      const BlockCsr& ct = cols[static_cast<std::size_t>(l.head_list[static_cast<std::size_t>(h)])];
      for (int64_t j = 0; j < l.blocks; ++j) {
        kernels::SparseKeyTile t{row(b, j * bs, h), H * D, bs,
                                 static_cast<int64_t>(w.query_spans.size()), 0};
        for (int32_t i : ct.row(j)) {
          if (cfg.causal && j > i) continue;
          add_query_span(w.query_spans, t.first_span,
                         {row(b, i * bs, h), lse_at(b, h, i * bs), bs, (i - j) * bs}, H * D, 1);
        }
        t.n_spans = static_cast<int64_t>(w.query_spans.size()) - t.first_span;
        if (t.n_spans > 0) w.k_tiles.push_back(t);
      }
    }

  w.q_items = sparse_query_items(w.q_tiles, w.key_spans, cfg.causal, rows_per_item);
  w.k_items = sparse_key_items(w.k_tiles, w.query_spans, cfg.causal, rows_per_item);
  return w;
}

}  // namespace ringattn::sparse

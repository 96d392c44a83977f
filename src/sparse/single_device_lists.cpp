// Builds the single-device block-sparse lists from the block lists: the SparsePlan's lists on
// one rank (sparse_plan.cpp), with work items so that a device block of 64 rows can run any
// block size. Key spans (query spans) of consecutive blocks that continue each other in memory
// and in causal offset are merged, so a local window is one span per tile.
#include "sparse/single_device_lists.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ringattn::sparse {

namespace {

void add_key_span(std::vector<kernels::KeySpan>& spans, int64_t tile_first, kernels::KeySpan s) {
  if (static_cast<int64_t>(spans.size()) > tile_first) {
    kernels::KeySpan& last = spans.back();
    if (last.k_stride == s.k_stride && last.k_row0 + last.n_k * last.k_stride == s.k_row0 &&
        last.causal_offset - last.n_k == s.causal_offset) {
      last.n_k += s.n_k;
      return;
    }
  }
  spans.push_back(s);
}

void add_query_span(std::vector<kernels::QuerySpan>& spans, int64_t tile_first,
                    kernels::QuerySpan s, int64_t q_stride, int64_t lse_stride) {
  if (static_cast<int64_t>(spans.size()) > tile_first) {
    kernels::QuerySpan& last = spans.back();
    if (last.q_row0 + last.n_q * q_stride == s.q_row0 &&
        last.lse0 + last.n_q * lse_stride == s.lse0 &&
        last.causal_offset + last.n_q == s.causal_offset) {
      last.n_q += s.n_q;
      return;
    }
  }
  spans.push_back(s);
}

// Items of `rows` rows (the last may be shorter) for every tile, ordered by `cost` of the
// item, largest first; ties keep tile order, so the list is the same on every build.
template <typename Cost>
std::vector<kernels::ForwardItem> items_of(int64_t n_tiles, int64_t rows_per_item,
                                           const std::vector<int64_t>& tile_rows, Cost&& cost) {
  std::vector<kernels::ForwardItem> items;
  std::vector<int64_t> costs;
  for (int64_t t = 0; t < n_tiles; ++t)
    for (int64_t r = 0; r < tile_rows[static_cast<std::size_t>(t)]; r += rows_per_item) {
      items.push_back({t, r});
      costs.push_back(cost(t, r));
    }
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<kernels::ForwardItem> sorted;
  sorted.reserve(items.size());
  for (std::size_t i : order) sorted.push_back(items[i]);
  return sorted;
}

}  // namespace

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

  // Costs: the keys (queries) an item's rows can see, which is what its block iterates over.
  std::vector<int64_t> q_rows(w.q_tiles.size()), k_rows(w.k_tiles.size());
  for (std::size_t t = 0; t < w.q_tiles.size(); ++t) q_rows[t] = w.q_tiles[t].n_q;
  for (std::size_t t = 0; t < w.k_tiles.size(); ++t) k_rows[t] = w.k_tiles[t].n_k;
  w.q_items = items_of(
      static_cast<int64_t>(w.q_tiles.size()), rows_per_item, q_rows, [&](int64_t t, int64_t i0) {
        const kernels::SparseQueryTile& qt = w.q_tiles[static_cast<std::size_t>(t)];
        const int64_t bq = std::min(rows_per_item, qt.n_q - i0);
        int64_t keys = 0;
        for (int64_t x = qt.first_span; x < qt.first_span + qt.n_spans; ++x) {
          const kernels::KeySpan& sp = w.key_spans[static_cast<std::size_t>(x)];
          keys += cfg.causal ? std::clamp<int64_t>(i0 + bq + sp.causal_offset, 0, sp.n_k) : sp.n_k;
        }
        return keys;
      });
  w.k_items = items_of(
      static_cast<int64_t>(w.k_tiles.size()), rows_per_item, k_rows, [&](int64_t t, int64_t j0) {
        const kernels::SparseKeyTile& kt = w.k_tiles[static_cast<std::size_t>(t)];
        int64_t queries = 0;
        for (int64_t x = kt.first_span; x < kt.first_span + kt.n_spans; ++x) {
          const kernels::QuerySpan& sp = w.query_spans[static_cast<std::size_t>(x)];
          const int64_t first = cfg.causal ? std::max<int64_t>(0, j0 - sp.causal_offset) : 0;
          queries += std::max<int64_t>(0, sp.n_q - first);
        }
        return queries;
      });
  return w;
}

}  // namespace ringattn::sparse

// The token-level rule inside listed blocks (token_rule.hpp), from config's dense_keys_of.
#include "sparse/token_rule.hpp"

#include <algorithm>

#include "core/patterns.hpp"
#include "kernels/cpu_flash.hpp"

namespace ringattn::sparse {

int64_t allowed_token_pairs(const AttentionConfig& cfg, int64_t bs, int64_t i, int64_t j) {
  if (!has_token_rule(cfg)) {
    if (!cfg.causal || j < i) return bs * bs;
    return j == i ? bs * (bs + 1) / 2 : 0;
  }
  const int64_t k0 = j * bs, k1 = k0 + bs;
  int64_t total = 0;
  for (int64_t p = i * bs; p < (i + 1) * bs; ++p) {
    const PositionRange r = dense_keys_of(cfg, p);
    total += std::max<int64_t>(0, std::min(r.end, k1) - std::max(r.begin, k0));
  }
  return total;
}

BlockLists within_reach(const BlockLists& l, const AttentionConfig& cfg) {
  BlockLists out;
  out.heads = l.heads;
  out.blocks = l.blocks;
  out.block_size = l.block_size;
  out.head_list = l.head_list;
  out.lists.reserve(l.lists.size());
  for (const BlockCsr& c : l.lists) {
    BlockCsr r;
    r.row_ptr.reserve(c.row_ptr.size());
    r.row_ptr.push_back(0);
    for (int64_t i = 0; i < l.blocks; ++i) {
      for (int32_t j : c.row(i))
        if (allowed_token_pairs(cfg, l.block_size, i, j) > 0) r.cols.push_back(j);
      r.row_ptr.push_back(static_cast<int64_t>(r.cols.size()));
    }
    out.lists.push_back(std::move(r));
  }
  return out;
}

double attended_token_pairs(const BlockLists& l, const AttentionConfig& cfg) {
  // Heads sharing a list count it once each: count every list once, then weigh.
  std::vector<double> per_list(l.lists.size(), 0.0);
  for (std::size_t x = 0; x < l.lists.size(); ++x)
    for (int64_t i = 0; i < l.blocks; ++i)
      for (int32_t j : l.lists[x].row(i))
        per_list[x] += static_cast<double>(allowed_token_pairs(cfg, l.block_size, i, j));
  double total = 0;
  for (int32_t x : l.head_list) total += per_list[static_cast<std::size_t>(x)];
  return total;
}

std::vector<Piece> document_pieces(const AttentionConfig& cfg, int64_t first, int64_t n) {
  if (!cfg.packed()) return {{first, first + n}};
  std::vector<Piece> pieces;
  const auto& cu = cfg.cu_seqlens;
  for (int64_t p = first; p < first + n;) {
    const int64_t end = std::min(*std::upper_bound(cu.begin(), cu.end(), p), first + n);
    pieces.push_back({p, end});
    p = end;
  }
  return pieces;
}

Piece in_document_of(const AttentionConfig& cfg, int64_t p, int64_t first, int64_t n) {
  if (!cfg.packed()) return {first, first + n};
  const auto& cu = cfg.cu_seqlens;
  const auto it = std::upper_bound(cu.begin(), cu.end(), p);
  const int64_t begin = std::max(*(it - 1), first), end = std::min(*it, first + n);
  return {begin, std::max(begin, end)};
}

WindowLimits kernel_window(const AttentionConfig& cfg) {
  if (!cfg.windowed()) return {kernels::kNoWindow, kernels::kNoWindow};
  const auto reach = cfg.window_reach();
  return {reach.left, cfg.causal ? kernels::kNoWindow : reach.right};
}

}  // namespace ringattn::sparse

// CSR helpers for block patterns: transpose, counts, and conversion from and to dense masks.
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

std::size_t BlockLists::bytes() const {
  std::size_t b = head_list.size() * sizeof(int32_t);
  for (const BlockCsr& c : lists)
    b += c.row_ptr.size() * sizeof(int64_t) + c.cols.size() * sizeof(int32_t);
  return b;
}

BlockCsr transpose(const BlockCsr& rows, int64_t blocks) {
  BlockCsr t;
  t.row_ptr.assign(static_cast<std::size_t>(blocks) + 1, 0);
  for (int32_t c : rows.cols) ++t.row_ptr[static_cast<std::size_t>(c) + 1];
  for (int64_t j = 0; j < blocks; ++j)
    t.row_ptr[static_cast<std::size_t>(j) + 1] += t.row_ptr[static_cast<std::size_t>(j)];
  t.cols.resize(rows.cols.size());
  std::vector<int64_t> next(t.row_ptr.begin(), t.row_ptr.end() - 1);
  // Visiting query blocks in order leaves every column's list sorted.
  for (int64_t i = 0; i < blocks; ++i)
    for (int32_t c : rows.row(i))
      t.cols[static_cast<std::size_t>(next[static_cast<std::size_t>(c)]++)] =
          static_cast<int32_t>(i);
  return t;
}

int64_t computed_block_pairs(const BlockLists& l, bool causal) {
  int64_t total = 0;
  for (int64_t h = 0; h < l.heads; ++h) {
    const BlockCsr& c = l.of_head(h);
    if (!causal) {
      total += c.nnz();
      continue;
    }
    for (int64_t i = 0; i < l.blocks; ++i)
      for (int32_t j : c.row(i)) total += j <= i ? 1 : 0;
  }
  return total;
}

int64_t dense_block_pairs(const BlockLists& l, bool causal) {
  const int64_t nb = l.blocks;
  return l.heads * (causal ? nb * (nb + 1) / 2 : nb * nb);
}

double sparsity(const BlockLists& l, bool causal) {
  const auto dense = static_cast<double>(dense_block_pairs(l, causal));
  return dense == 0 ? 0.0 : 1.0 - static_cast<double>(computed_block_pairs(l, causal)) / dense;
}

BlockLists lists_from_mask(const uint8_t* mask, int64_t mask_heads, int64_t heads, int64_t blocks,
                           int64_t block_size) {
  BlockLists l;
  l.heads = heads;
  l.blocks = blocks;
  l.block_size = block_size;
  l.head_list.resize(static_cast<std::size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    const uint8_t* m = mask + (mask_heads == 1 ? 0 : h) * blocks * blocks;
    BlockCsr c;
    c.row_ptr.reserve(static_cast<std::size_t>(blocks) + 1);
    c.row_ptr.push_back(0);
    for (int64_t i = 0; i < blocks; ++i) {
      for (int64_t j = 0; j < blocks; ++j)
        if (m[i * blocks + j]) c.cols.push_back(static_cast<int32_t>(j));
      c.row_ptr.push_back(static_cast<int64_t>(c.cols.size()));
    }
    // Heads with identical masks share a list.
    std::size_t found = l.lists.size();
    for (std::size_t i = 0; i < l.lists.size(); ++i)
      if (l.lists[i].row_ptr == c.row_ptr && l.lists[i].cols == c.cols) found = i;
    if (found == l.lists.size()) l.lists.push_back(std::move(c));
    l.head_list[static_cast<std::size_t>(h)] = static_cast<int32_t>(found);
  }
  return l;
}

std::vector<uint8_t> mask_from_lists(const BlockLists& l) {
  const int64_t nb = l.blocks;
  std::vector<uint8_t> m(static_cast<std::size_t>(l.heads * nb * nb), 0);
  for (int64_t h = 0; h < l.heads; ++h)
    for (int64_t i = 0; i < nb; ++i)
      for (int32_t j : l.of_head(h).row(i)) m[static_cast<std::size_t>((h * nb + i) * nb + j)] = 1;
  return m;
}

}  // namespace ringattn::sparse

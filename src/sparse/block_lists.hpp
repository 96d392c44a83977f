// Compressed block patterns: for each head, the sorted key blocks of every query block
// (CSR: row_ptr and cols). Heads whose lists are equal share one copy (a local window is
// the same for every head; LongNet's dilated blocks repeat with the head index modulo the
// dilations). Never a dense N x N or nb x nb mask, except on request for small N.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ringattn::sparse {

struct BlockCsr {
  std::vector<int64_t> row_ptr;  // blocks + 1 entries
  std::vector<int32_t> cols;     // sorted, unique within a row

  std::span<const int32_t> row(int64_t qblock) const {
    const auto b = static_cast<std::size_t>(row_ptr[static_cast<std::size_t>(qblock)]);
    const auto e = static_cast<std::size_t>(row_ptr[static_cast<std::size_t>(qblock) + 1]);
    return {cols.data() + b, e - b};
  }
  int64_t nnz() const { return static_cast<int64_t>(cols.size()); }
};

struct BlockLists {
  int64_t heads = 0, blocks = 0, block_size = 0;
  std::vector<int32_t> head_list;  // head -> index into lists
  std::vector<BlockCsr> lists;

  const BlockCsr& of_head(int64_t h) const {
    return lists[static_cast<std::size_t>(head_list[static_cast<std::size_t>(h)])];
  }
  std::size_t bytes() const;
};

// The transpose of a CSR: for each key block, the sorted query blocks that list it.
BlockCsr transpose(const BlockCsr& rows, int64_t blocks);

// (head, query block, key block) triples that are computed: listed, and for causal runs not
// wholly in the future (key block <= query block).
int64_t computed_block_pairs(const BlockLists& l, bool causal);
// Triples a dense run with the same causal setting computes: H·nb² or H·nb(nb+1)/2.
int64_t dense_block_pairs(const BlockLists& l, bool causal);
// Fraction of the dense run's block pairs that are skipped (0: dense, 1: nothing computed).
double sparsity(const BlockLists& l, bool causal);
// Attended token pairs under a configuration's documents, causality and window:
// attended_token_pairs in token_rule.hpp.

// From an explicit bool mask, [mask_heads, nb, nb] with mask_heads 1 (shared) or `heads`.
BlockLists lists_from_mask(const uint8_t* mask, int64_t mask_heads, int64_t heads, int64_t blocks,
                           int64_t block_size);
// The dense [heads, nb, nb] bool mask (for --pattern-out and tests on small N).
std::vector<uint8_t> mask_from_lists(const BlockLists& l);

}  // namespace ringattn::sparse

// What the block-sparse suites share: a case's packed documents as offsets, the dense bool
// masks ([H, nb, nb], or [nb, nb] shared by every head) they run, and the float64 block
// reference reading such a mask.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ringattn/config.hpp"
#include "ringattn/reference.hpp"
#include "sparse/pattern.hpp"

namespace ringattn::sparse {

// Document lengths -> cu_seqlens (0, then the running sums).
inline std::vector<int64_t> cu_seqlens_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

// [heads, nb, nb]: the blocks of pattern text (its dilated-blocks, where it has them, over
// segments 96, 384 and dilations 1, 3; seed 5).
inline std::vector<uint8_t> pattern_mask(const char* pattern, int64_t seq_len, int64_t block_size,
                                         int64_t heads) {
  const Geometry g{seq_len, block_size, heads};
  return mask_from_lists(build_lists(parse_pattern(pattern, g, {96, 384}, {1, 3}, 5), g));
}

// [heads, nb, nb]: each block kept with probability 0.35 (from `seed`), and the diagonal block
// of every query block kept on the first `diagonal_heads` heads.
inline std::vector<uint8_t> random_mask(int64_t heads, int64_t nb, uint64_t seed,
                                        int64_t diagonal_heads) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution keep(0.35);
  std::vector<uint8_t> mask(static_cast<std::size_t>(heads * nb * nb));
  for (auto& m : mask) m = keep(gen) ? 1 : 0;
  for (int64_t x = 0; x < diagonal_heads; ++x)
    for (int64_t i = 0; i < nb; ++i) mask[static_cast<std::size_t>((x * nb + i) * nb + i)] = 1;
  return mask;
}

// The float64 reference of cfg (read as [B, N, H, D] rows whatever cfg's layout) over `mask`,
// which holds `mask_heads` heads: 1 (shared) or cfg's. The mask must outlive the problem.
inline BlockReferenceProblem mask_problem(const AttentionConfig& cfg,
                                          const std::vector<uint8_t>& mask, int64_t mask_heads) {
  const int64_t nb = cfg.shape.seq_len / cfg.block_size;
  AttentionConfig rows = cfg;
  rows.layout = TensorLayout::bnhd;
  rows.kv_layout.reset();
  BlockReferenceProblem pb = block_problem_of(rows);
  pb.key_blocks = [&mask, nb, mask_heads](int64_t h, int64_t i) {
    std::vector<int64_t> out;
    const int64_t mh = mask_heads == 1 ? 0 : h;
    for (int64_t j = 0; j < nb; ++j)
      if (mask[static_cast<std::size_t>((mh * nb + i) * nb + j)]) out.push_back(j);
    return out;
  };
  return pb;
}

}  // namespace ringattn::sparse

// Block-pattern generators and the `--pattern` language. A generator answers, for one head
// and one query block, which key blocks it attends; a pattern is a union of generators
// ("local:window=1024+global:blocks=1"). Lists are built row by row, so nothing of size
// nb x nb ever exists. Definitions are in docs/SEMANTICS.md (block-sparse).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

struct Geometry {
  int64_t seq_len = 0, block_size = 0, heads = 0;
  int64_t blocks() const { return seq_len / block_size; }
};

class BlockGenerator {
 public:
  virtual ~BlockGenerator() = default;
  // Canonical text with every parameter spelled out ("local:window=384").
  virtual std::string describe() const = 0;
  // Heads with equal classes get equal lists (0 for every head when the pattern ignores it).
  virtual int64_t head_class(int64_t head) const = 0;
  // Appends the key blocks of query block `qblock` for `head` (any order, duplicates allowed).
  virtual void row(int64_t head, int64_t qblock, std::vector<int32_t>& cols) const = 0;
};

// Each takes its parameters already checked by parse_pattern.
// local: key blocks j with |i - j| <= floor(window / (2·bs)).
std::unique_ptr<BlockGenerator> make_local(const Geometry& g, int64_t window);
// global: the first `blocks` blocks attend to every block and every block attends to them.
std::unique_ptr<BlockGenerator> make_global(const Geometry& g, int64_t blocks);
// random: `blocks` distinct key blocks per query block, uniform, from a counter-based hash of
// (seed, head, query block): the same on every rank and every run.
std::unique_ptr<BlockGenerator> make_random(const Geometry& g, int64_t blocks, uint64_t seed);
// strided: key blocks j with (i - j) mod stride == 0 (Sparse Transformer's strided part).
std::unique_ptr<BlockGenerator> make_strided(const Geometry& g, int64_t stride);
// dilated-blocks: LongNet at block granularity. Pattern k has segments of w_k/bs blocks and
// keeps every r_k-th block from offset head mod r_k; query and key blocks attend when both
// are kept by the same pattern in the same segment.
std::unique_ptr<BlockGenerator> make_dilated_blocks(const Geometry& g,
                                                    std::vector<int64_t> segments,
                                                    std::vector<int64_t> dilations);

struct Pattern {
  std::vector<std::unique_ptr<BlockGenerator>> terms;
  std::string canonical;  // terms' descriptions joined by '+'
};

// Parses `--pattern` text: terms joined by '+', each `name` or `name:key=value,...`.
// Names: local, global, random, strided, dilated-blocks, bigbird (global + local + random).
// dilated-blocks takes its segments and dilations from --segments/--dilations. Throws
// InputError("block_sparse.pattern", ...) for unknown names or keys and bad values.
Pattern parse_pattern(const std::string& text, const Geometry& g,
                      const std::vector<int64_t>& segments, const std::vector<int64_t>& dilations,
                      uint64_t default_seed);

// The union of the terms' lists, per head (heads with equal classes share a list).
BlockLists build_lists(const Pattern& p, const Geometry& g);

}  // namespace ringattn::sparse

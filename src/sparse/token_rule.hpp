// The token-level rule inside listed blocks. Block-sparse attention lets query p attend key t
// when t's block is listed for p's block *and* the dense rule allows the pair: the same
// document (packed sequences), t <= p when causal, and t within the sliding window
// (docs/SEMANTICS.md). The lists name blocks; these helpers say which listed pairs the dense
// rule leaves anything of, count what it leaves, and cut tiles at document bounds so that the
// kernels only ever see causality and the window.
#pragma once

#include <cstdint>
#include <vector>

#include "ringattn/config.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

// Whether anything beyond causality restricts pairs inside listed blocks.
inline bool has_token_rule(const AttentionConfig& cfg) { return cfg.windowed() || cfg.packed(); }

// Of the bs² token pairs of query block i and key block j, how many the dense rule allows.
int64_t allowed_token_pairs(const AttentionConfig& cfg, int64_t bs, int64_t i, int64_t j);

// `l` without the listed pairs that the dense rule leaves nothing of (with causality, the key
// blocks after the query block). Heads that shared a list still share one.
BlockLists within_reach(const BlockLists& l, const AttentionConfig& cfg);

// Query-key token pairs attended over every head, for one batch row: the exact count under
// cfg's rule. Forward FLOPs are 4 · D · B · this.
double attended_token_pairs(const BlockLists& l, const AttentionConfig& cfg);

// Positions [begin, end).
struct Piece {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Positions [first, first + n) cut at document bounds: one piece per document they touch
// (the whole range when unpacked).
std::vector<Piece> document_pieces(const AttentionConfig& cfg, int64_t first, int64_t n);

// The positions of [first, first + n) in the document that holds position p (all of them
// when unpacked; empty when none).
Piece in_document_of(const AttentionConfig& cfg, int64_t p, int64_t first, int64_t n);

// The window as the kernels take it (kernels::kNoWindow on a side without a limit).
struct WindowLimits {
  int64_t left = 0, right = 0;
};
WindowLimits kernel_window(const AttentionConfig& cfg);

}  // namespace ringattn::sparse

// The pattern arithmetic every layer shares (which positions a dilated pattern selects, the
// segments it attends within, the head groups of the grouped combine, the keys a dense query
// attends) and the refusals of paths that do not compute a feature yet. Internal: the public
// AttentionConfig is in ringattn/config.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/head_slice.hpp"
#include "ringattn/config.hpp"

namespace ringattn {

// For the paths that do not compute grouped-query attention yet: throws InputError naming
// `config.kv_heads`, saying it is not yet supported on `path` (e.g. "device=cuda"), when
// kv_heads != heads. Refusing is the contract there; computing with the wrong K/V layout is not.
void require_multi_head(const AttentionConfig& cfg, const std::string& path);

// For the paths that do not compute packed sequences yet: throws InputError naming
// `config.cu_seqlens`, saying they are not yet supported on `path`, when the config is packed.
void require_unpacked(const AttentionConfig& cfg, const std::string& path);

// For the paths that do not compute a sliding window yet: throws InputError naming
// `config.window_left`, saying it is not yet supported on `path`, when the config has a window.
void require_no_window(const AttentionConfig& cfg, const std::string& path);

// Values of another head dim (MLA) and soft-capped logits of cfg in words ("values of their
// own head dim (config.head_dim_v=128) and soft-capped logits (config.softcap=30)"), "" when
// it has neither: what the GPU's native kernels compute and its sm_90a and cuDNN forms do not
// yet.
std::string value_dim_and_cap_words(const AttentionConfig& cfg);
// The note a GPU plan adds where `kernels` ("the native kernels") may compute those features:
// "<kernels> compute <value_dim_and_cap_words>, which no GPU has run yet: ...", or "" when cfg
// has neither.
std::string native_unverified_note(const AttentionConfig& cfg, const std::string& kernels);

// For the paths that read only [B, N, H, D] tensors: throws InputError naming `config.layout`
// (or `config.kv_layout`), saying bhnd is not supported on `path`, when either is bhnd.
void require_bnhd(const AttentionConfig& cfg, const std::string& path);

// One dilated pattern: segments of `segment` tokens, every `dilation`-th position from
// `offset` (offset < dilation). Dense attention is the single pattern {N, 1, 0}.
struct DilatedPattern {
  int64_t segment = 0;
  int64_t dilation = 1;
};

// The segments of one pattern: position ranges attended independently of each other, in
// order. Dilated: N / w segments of w tokens each. Dense: the documents of a packed
// sequence, or one segment of N tokens. Cheap to copy for unpacked configs; holds the
// document starts otherwise.
class SegmentList {
 public:
  SegmentList(int64_t length, int64_t seq_len) : uniform_(length), seq_len_(seq_len) {}
  explicit SegmentList(std::vector<int64_t> starts) : starts_(std::move(starts)) {}
  int64_t count() const;
  int64_t begin(int64_t s) const;
  int64_t length(int64_t s) const { return begin(s + 1) - begin(s); }
  // The segment that holds position p (0 <= p < N).
  int64_t at(int64_t p) const;

 private:
  int64_t uniform_ = 0, seq_len_ = 0;
  std::vector<int64_t> starts_;  // packed: every document's first position, then N
};

// Dense → one pattern covering the whole sequence; dilated → one per (segment, dilation).
// Throws std::logic_error for block_sparse (its pattern lives in the sparse layer).
std::vector<DilatedPattern> patterns_of(const AttentionConfig& cfg);

// Grouped combine: the contiguous head range [first, first+count) of group i.
struct HeadRange {
  int64_t first = 0, count = 0;
};
HeadRange group_heads(int64_t heads, int64_t groups, int64_t group);
// The same for a config's own heads, `heads` of the job's: group `group` of the job's
// heads, clipped to the slice and counted from its first head (count 0 when the slice holds
// none of the group).
HeadRange group_heads_of(const AttentionConfig& cfg, const HeadSlice& heads, int64_t groups,
                         int64_t group);
// The scale of each head group's output (and of its dout in the backward) under the grouped
// combine: 1/k for k patterns (1 for dense); 1 under a dilated mixture, whose patterns merge
// by log-sum-exp instead.
float grouped_scale(const AttentionConfig& cfg);

// Offset of pattern i for head h (of the slice `heads`): grouped uses i % r_i (for heads of
// group i only), mixture uses (heads.base + h) % r_i.
int64_t pattern_offset(const AttentionConfig& cfg, const HeadSlice& heads, int64_t pattern,
                       int64_t head);

// Number of positions a pattern selects in one segment: ceil((w - o) / r), 0 if o >= w.
int64_t selected_per_segment(const DilatedPattern& p, int64_t offset);
// The same for a segment of `length` tokens (documents of a packed sequence vary).
int64_t selected_in(int64_t length, const DilatedPattern& p, int64_t offset);

// The segments pattern `p` of `cfg` attends within (see SegmentList).
SegmentList segments_of(const AttentionConfig& cfg, const DilatedPattern& p);

// Keys that the query at position p attends under a dense configuration: the half-open
// position range allowed by its document, causality and the window (empty when begin >=
// end). Block-sparse attention applies the same rule inside its listed blocks.
struct PositionRange {
  int64_t begin = 0, end = 0;
};
PositionRange dense_keys_of(const AttentionConfig& cfg, int64_t p);

}  // namespace ringattn

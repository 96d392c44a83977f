// Validation of AttentionConfig and the pattern arithmetic shared by every layer:
// which positions a dilated pattern selects and how many pairs a configuration attends.
#include "ringattn/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "core/patterns.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn {

const char* to_string(AttentionKind k) {
  switch (k) {
    case AttentionKind::dense:
      return "dense";
    case AttentionKind::dilated:
      return "dilated";
    case AttentionKind::block_sparse:
      return "block-sparse";
  }
  return "?";
}
const char* to_string(Combine c) { return c == Combine::grouped ? "grouped" : "mixture"; }

const char* to_string(TensorLayout l) { return l == TensorLayout::bnhd ? "bnhd" : "bhnd"; }

std::string to_string(const Shape4& s) {
  std::ostringstream os;
  os << '[' << s.batch << ", " << s.seq_len << ", " << s.heads << ", " << s.head_dim << ']';
  return os.str();
}

double AttentionConfig::effective_scale() const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
}

AttentionConfig::WindowReach AttentionConfig::window_reach() const {
  const int64_t n = shape.seq_len;
  if (!window_left) return {n, causal ? 0 : n};
  const int64_t right = causal ? 0 : window_right.value_or(*window_left);
  return {std::min(*window_left, n), std::min(right, n)};
}

namespace {

void validate_window(const AttentionConfig& cfg) {
  if (!cfg.window_left && !cfg.window_right) return;
  if (!cfg.window_left)
    throw InputError("config.window_left", "a right reach (config.window_right) needs a left one");
  if (*cfg.window_left < 0)
    throw InputError("config.window_left",
                     "the left reach must be >= 0, got " + std::to_string(*cfg.window_left));
  if (cfg.window_right && *cfg.window_right < 0)
    throw InputError("config.window_right",
                     "the right reach must be >= 0, got " + std::to_string(*cfg.window_right));
  if (cfg.causal && cfg.window_right && *cfg.window_right > 0)
    throw InputError("config.window_right",
                     "with " + field_is("config.causal", true) +
                         " a query sees no later key: the right reach must be 0 or omitted, "
                         "got " +
                         std::to_string(*cfg.window_right));
  if (cfg.attention == AttentionKind::dilated)
    throw InputError("config.window_left", "a sliding window does not combine with " +
                                               field_is("config.attention", "dilated") +
                                               " (use dense attention)");
}

void validate_packing(const AttentionConfig& cfg) {
  if (!cfg.packed()) return;
  const auto& cu = cfg.cu_seqlens;
  const int64_t n = cfg.shape.seq_len;
  if (cu.size() < 2 || cu.front() != 0)
    throw InputError("config.cu_seqlens",
                     "document offsets must start at 0 and hold at least one "
                     "document");
  for (std::size_t d = 0; d + 1 < cu.size(); ++d)
    if (cu[d + 1] <= cu[d])
      throw InputError("config.cu_seqlens", "document " + std::to_string(d) + " has length " +
                                                std::to_string(cu[d + 1] - cu[d]) +
                                                "; every document needs at least one token");
  if (cu.back() != n)
    throw InputError("config.cu_seqlens", "the document lengths sum to " +
                                              std::to_string(cu.back()) +
                                              ", not to the sequence length " + std::to_string(n) +
                                              " (config.shape.seq_len)");
  if (cfg.attention == AttentionKind::dilated)
    throw InputError("config.cu_seqlens", "packed sequences do not combine with " +
                                              field_is("config.attention", "dilated") +
                                              " yet (use dense attention)");
}

}  // namespace

void validate(const AttentionConfig& cfg) { validate(cfg, HeadSlice{}); }

void validate(const AttentionConfig& cfg, const HeadSlice& heads) {
  const Shape4& s = cfg.shape;
  const int64_t total_heads = heads.total_of(cfg);
  if (s.batch <= 0)
    throw InputError("config.shape.batch", "must be positive, got " + std::to_string(s.batch));
  if (s.seq_len <= 0)
    throw InputError("config.shape.seq_len", "must be positive, got " + std::to_string(s.seq_len));
  if (s.heads <= 0)
    throw InputError("config.shape.heads", "must be positive, got " + std::to_string(s.heads));
  if (heads.base < 0 || heads.base + s.heads > total_heads)
    throw InputError("config.shape.heads", "head slice [" + std::to_string(heads.base) + ", " +
                                               std::to_string(heads.base + s.heads) +
                                               ") lies outside " + std::to_string(total_heads) +
                                               " heads");
  if (s.head_dim <= 0 || s.head_dim > kMaxHeadDim)
    throw InputError("config.shape.head_dim", "must be in 1.." + std::to_string(kMaxHeadDim) +
                                                  ", got " + std::to_string(s.head_dim));
  // Index arithmetic is int64 throughout; refuse shapes whose element count overflows it.
  if (s.batch > INT64_MAX / s.seq_len || s.batch * s.seq_len > INT64_MAX / s.heads ||
      s.batch * s.seq_len * s.heads > INT64_MAX / s.head_dim)
    throw InputError("config.shape.seq_len", "shape " + to_string(s) + " has too many elements");
  if (cfg.head_dim_v && (*cfg.head_dim_v <= 0 || *cfg.head_dim_v > kMaxHeadDim))
    throw InputError("config.head_dim_v", "must be in 1.." + std::to_string(kMaxHeadDim) +
                                              ", got " + std::to_string(*cfg.head_dim_v));
  if (cfg.head_dim_v && s.batch * s.seq_len * s.heads > INT64_MAX / *cfg.head_dim_v)
    throw InputError("config.head_dim_v", "shape " + to_string(cfg.out_shape()) +
                                              " of the output has too many elements");
  if (!(std::isfinite(cfg.softcap) && cfg.softcap >= 0.0)) {
    std::ostringstream got;
    got << cfg.softcap;
    throw InputError("config.softcap",
                     "must be a finite number >= 0 (0: no soft-capping), got " + got.str());
  }
  if (cfg.scale && !(std::isfinite(*cfg.scale) && *cfg.scale > 0.0))
    throw InputError("config.scale", "must be a positive finite number");
  const int64_t kv_heads = cfg.effective_kv_heads();
  if (kv_heads <= 0)
    throw InputError("config.kv_heads", "must be positive, got " + std::to_string(kv_heads));
  if (s.heads % kv_heads != 0)
    throw InputError("config.kv_heads",
                     std::to_string(kv_heads) + " K/V heads cannot be shared by " +
                         std::to_string(s.heads) +
                         " query heads (config.shape.heads): config.kv_heads must divide "
                         "config.shape.heads");
  validate_window(cfg);
  validate_packing(cfg);

  if (cfg.attention == AttentionKind::dense) return;
  if (cfg.attention == AttentionKind::block_sparse) {
    if (cfg.block_size <= 0)
      throw InputError("config.block_size",
                       "must be positive, got " + std::to_string(cfg.block_size));
    if (s.seq_len % cfg.block_size != 0)
      throw InputError("config.block_size", "block size " + std::to_string(cfg.block_size) +
                                                " does not divide the sequence length " +
                                                std::to_string(s.seq_len));
    if (s.seq_len / cfg.block_size > INT32_MAX)
      throw InputError("config.block_size", "too many blocks (" +
                                                std::to_string(s.seq_len / cfg.block_size) +
                                                "); use a larger block size");
    return;
  }

  if (cfg.segments.empty())
    throw InputError("config.segments",
                     "empty: dilated attention needs at least one segment length");
  if (cfg.dilations.empty())
    throw InputError("config.dilations", "empty: dilated attention needs one dilation per segment");
  if (cfg.segments.size() != cfg.dilations.size())
    throw InputError("config.segments", std::to_string(cfg.segments.size()) +
                                            " segment lengths but " +
                                            std::to_string(cfg.dilations.size()) +
                                            " dilations (config.dilations); they must pair up");
  for (std::size_t i = 0; i < cfg.segments.size(); ++i) {
    if (cfg.segments[i] <= 0)
      throw InputError("config.segments", "segment " + std::to_string(i) + " is " +
                                              std::to_string(cfg.segments[i]) +
                                              "; must be positive");
    if (cfg.dilations[i] <= 0)
      throw InputError("config.dilations", "dilation " + std::to_string(i) + " is " +
                                               std::to_string(cfg.dilations[i]) +
                                               "; must be positive");
    if (s.seq_len % cfg.segments[i] != 0)
      throw InputError("config.segments", "segment length " + std::to_string(cfg.segments[i]) +
                                              " does not divide the sequence length " +
                                              std::to_string(s.seq_len));
  }
  const auto groups = static_cast<int64_t>(cfg.segments.size());
  if (cfg.combine == Combine::grouped && total_heads < groups)
    throw InputError("config.shape.heads",
                     std::to_string(total_heads) + " heads cannot be split into " +
                         std::to_string(groups) +
                         " groups (one per segment); use at least as many heads as "
                         "segments, or " +
                         field_is("config.combine", "mixture"));
}

void require_multi_head(const AttentionConfig& cfg, const std::string& path) {
  const int64_t kv_heads = cfg.effective_kv_heads();
  if (kv_heads == cfg.shape.heads) return;
  throw InputError("config.kv_heads",
                   "grouped-query attention (" +
                       field_is("config.kv_heads", std::to_string(kv_heads)) +
                       " != " + field_is("config.shape.heads", std::to_string(cfg.shape.heads)) +
                       ") is not yet supported on " + path);
}

void require_unpacked(const AttentionConfig& cfg, const std::string& path) {
  if (!cfg.packed()) return;
  throw InputError("config.cu_seqlens", "packed sequences are not yet supported on " + path);
}

void require_no_window(const AttentionConfig& cfg, const std::string& path) {
  if (!cfg.window_left && !cfg.window_right) return;
  throw InputError("config.window_left", "a sliding window is not yet supported on " + path);
}

std::string value_dim_and_cap_words(const AttentionConfig& cfg) {
  std::string f;
  if (cfg.effective_head_dim_v() != cfg.shape.head_dim)
    f = "values of their own head dim (" +
        field_is("config.head_dim_v", std::to_string(cfg.effective_head_dim_v())) + ")";
  if (cfg.softcapped()) {
    std::ostringstream c;
    c << cfg.softcap;
    f += (f.empty() ? "" : " and ") + std::string("soft-capped logits (") +
         field_is("config.softcap", c.str()) + ")";
  }
  return f;
}

std::string native_unverified_note(const AttentionConfig& cfg, const std::string& kernels) {
  const std::string f = value_dim_and_cap_words(cfg);
  if (f.empty()) return "";
  return kernels + " compute " + f +
         ", which no GPU has run yet: they are checked against float64 on the emulated GPU only";
}

void require_bnhd(const AttentionConfig& cfg, const std::string& path) {
  if (cfg.layout == TensorLayout::bnhd && cfg.effective_kv_layout() == TensorLayout::bnhd) return;
  throw InputError(cfg.layout == TensorLayout::bnhd ? "config.kv_layout" : "config.layout",
                   "bhnd ([B, H, N, D] tensors) is supported by the CPU engines, "
                   "not on " +
                       path + "; use bnhd there");
}

std::vector<DilatedPattern> patterns_of(const AttentionConfig& cfg) {
  if (cfg.attention == AttentionKind::dense) return {{cfg.shape.seq_len, 1}};
  if (cfg.attention == AttentionKind::block_sparse)
    throw std::logic_error("patterns_of: block-sparse patterns live in the sparse layer");
  std::vector<DilatedPattern> out;
  // A dilation past its segment selects at most one position per segment, so the segment
  // length is an equal dilation; clamping keeps every stride (dilation·H·D) inside the
  // tensor instead of overflowing int64 for dilations near INT64_MAX (found by
  // fuzz_segments). Offsets still come from the given dilations (pattern_offset).
  for (std::size_t i = 0; i < cfg.segments.size(); ++i)
    out.push_back({cfg.segments[i], std::min(cfg.dilations[i], cfg.segments[i])});
  return out;
}

float grouped_scale(const AttentionConfig& cfg) {
  if (cfg.attention == AttentionKind::dilated && cfg.combine == Combine::mixture) return 1.0f;
  return 1.0f / static_cast<float>(patterns_of(cfg).size());
}

HeadRange group_heads(int64_t heads, int64_t groups, int64_t group) {
  const int64_t base = heads / groups, extra = heads % groups;
  const int64_t first = group * base + std::min(group, extra);
  return {first, base + (group < extra ? 1 : 0)};
}

HeadRange group_heads_of(const AttentionConfig& cfg, const HeadSlice& heads, int64_t groups,
                         int64_t group) {
  const HeadRange g = group_heads(heads.total_of(cfg), groups, group);
  const int64_t first = std::max(g.first, heads.base);
  const int64_t end = std::min(g.first + g.count, heads.base + cfg.shape.heads);
  return {first - heads.base, std::max<int64_t>(0, end - first)};
}

int64_t pattern_offset(const AttentionConfig& cfg, const HeadSlice& heads, int64_t pattern,
                       int64_t head) {
  if (cfg.attention == AttentionKind::dense) return 0;
  const int64_t r = cfg.dilations[static_cast<std::size_t>(pattern)];
  return (cfg.combine == Combine::grouped ? pattern : heads.base + head) % r;
}

int64_t selected_per_segment(const DilatedPattern& p, int64_t offset) {
  if (offset >= p.segment) return 0;
  // ceil((w - o) / r) without forming w - o + r - 1, which overflows for a dilation near
  // INT64_MAX (validate() accepts any positive dilation; found by fuzz_segments).
  return 1 + (p.segment - offset - 1) / p.dilation;
}

int64_t selected_in(int64_t length, const DilatedPattern& p, int64_t offset) {
  if (offset >= length) return 0;
  return (length - offset + p.dilation - 1) / p.dilation;
}

int64_t SegmentList::count() const {
  return starts_.empty() ? seq_len_ / uniform_ : static_cast<int64_t>(starts_.size()) - 1;
}

int64_t SegmentList::begin(int64_t s) const {
  return starts_.empty() ? s * uniform_ : starts_[static_cast<std::size_t>(s)];
}

int64_t SegmentList::at(int64_t p) const {
  if (starts_.empty()) return p / uniform_;
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), p);
  return static_cast<int64_t>(it - starts_.begin()) - 1;
}

SegmentList segments_of(const AttentionConfig& cfg, const DilatedPattern& p) {
  if (cfg.attention == AttentionKind::dense && cfg.packed()) return SegmentList(cfg.cu_seqlens);
  return SegmentList(p.segment, cfg.shape.seq_len);
}

PositionRange dense_keys_of(const AttentionConfig& cfg, int64_t p) {
  int64_t begin = 0, end = cfg.shape.seq_len;
  if (cfg.packed()) {
    const auto it = std::upper_bound(cfg.cu_seqlens.begin(), cfg.cu_seqlens.end(), p);
    end = *it;
    begin = *(it - 1);
  }
  if (cfg.causal) end = std::min(end, p + 1);
  if (cfg.windowed()) {
    const auto reach = cfg.window_reach();
    begin = std::max(begin, p - reach.left);
    end = std::min(end, p + reach.right + 1);
  }
  return {begin, std::max(begin, end)};
}

double attended_pairs(const AttentionConfig& cfg) {
  if (cfg.attention == AttentionKind::dense && (cfg.windowed() || cfg.packed())) {
    double per_head = 0;
    for (int64_t p = 0; p < cfg.shape.seq_len; ++p) {
      const PositionRange keys = dense_keys_of(cfg, p);
      per_head += static_cast<double>(keys.end - keys.begin);
    }
    return per_head * static_cast<double>(cfg.shape.heads * cfg.shape.batch);
  }
  const auto pats = patterns_of(cfg);
  const int64_t groups = static_cast<int64_t>(pats.size());
  const Shape4& s = cfg.shape;
  auto pairs_in_pattern = [&](int64_t i, int64_t head) {
    const auto& p = pats[static_cast<std::size_t>(i)];
    const double m =
        static_cast<double>(selected_per_segment(p, pattern_offset(cfg, HeadSlice{}, i, head)));
    const double per_segment = cfg.causal ? m * (m + 1) / 2 : m * m;
    return per_segment * static_cast<double>(s.seq_len / p.segment);
  };
  double total = 0;
  for (int64_t h = 0; h < s.heads; ++h) {
    if (cfg.combine == Combine::grouped || cfg.attention == AttentionKind::dense) {
      for (int64_t i = 0; i < groups; ++i) {
        const HeadRange r = group_heads_of(cfg, HeadSlice{}, groups, i);
        if (h >= r.first && h < r.first + r.count) total += pairs_in_pattern(i, h);
      }
    } else {
      for (int64_t i = 0; i < groups; ++i) total += pairs_in_pattern(i, h);
    }
  }
  return total * static_cast<double>(s.batch);
}

}  // namespace ringattn

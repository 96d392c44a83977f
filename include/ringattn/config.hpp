// The attention problem a user asks for, its validation, and the pattern arithmetic that
// every layer shares (which positions a dilated pattern selects, how many key/query pairs a
// configuration attends). Semantics are written down in docs/SEMANTICS.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ringattn {

inline constexpr int64_t kMaxHeadDim = 256;

// block_sparse: the key blocks each query block attends come from a block mask or a
// pattern generator (src/sparse/); the config holds only the block size.
enum class AttentionKind { dense, dilated, block_sparse };
enum class Combine { grouped, mixture };

// How q, k, v, out and their gradients are laid out in memory, all row-major (C order):
// bnhd: [batch, seq_len, heads, head_dim], token-major (the default; what the ring shards);
// bhnd: [batch, heads, seq_len, head_dim], each head's rows contiguous (PyTorch SDPA's
// convention). The single-process CPU engine (Plan) reads either; the other paths refuse
// bhnd (require_bnhd). lse is [batch, heads, seq_len] in both.
enum class TensorLayout { bnhd, bhnd };

const char* to_string(AttentionKind k);
const char* to_string(Combine c);
const char* to_string(TensorLayout l);

// The logical shape, [batch, seq_len, heads, head_dim] whatever the TensorLayout.
struct Shape4 {
  int64_t batch = 0, seq_len = 0, heads = 0, head_dim = 0;
  int64_t numel() const { return batch * seq_len * heads * head_dim; }
  bool operator==(const Shape4&) const = default;
};

std::string to_string(const Shape4& s);

struct AttentionConfig {
  Shape4 shape;
  AttentionKind attention = AttentionKind::dense;
  Combine combine = Combine::grouped;
  std::vector<int64_t> segments;   // w_i, dilated only
  std::vector<int64_t> dilations;  // r_i, dilated only
  bool causal = false;
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  int64_t block_size = 128;     // block_sparse only: tokens per block, divides seq_len
  // Grouped-query attention (GQA; MQA when 1): k, v, dk and dv have kv_heads heads, and
  // query head j reads K/V head j / (heads / kv_heads). Default: heads (multi-head).
  std::optional<int64_t> kv_heads;
  // Sliding window (--window L or L,R): query p attends keys [p - window_left, p +
  // window_right]. Unset: no window. window_right defaults to window_left (0 when causal,
  // where it must be 0 or unset). Dense and block-sparse attention (dilated is refused).
  std::optional<int64_t> window_left;
  std::optional<int64_t> window_right;
  // Packed sequences (--seqlens, --cu-seqlens): document d holds positions [cu_seqlens[d],
  // cu_seqlens[d + 1]) of every batch row; a query attends only to keys of its own document,
  // and causality and the window count positions within it. Empty: one document of seq_len.
  // Otherwise it starts at 0, increases strictly and ends at seq_len. Dense and block-sparse
  // attention (dilated is refused).
  std::vector<int64_t> cu_seqlens;
  TensorLayout layout = TensorLayout::bnhd;  // q, out, dout, dq
  // k, v, dk, dv when they are laid out unlike q (a KV cache kept head-major beside
  // token-major queries); unset: as `layout`. The CPU engines read any pairing.
  std::optional<TensorLayout> kv_layout;
  // A head slice (Ulysses: each rank of a group computes some of the heads): this config
  // computes the job's query heads [head_base, head_base + shape.heads) of `global_heads`
  // (unset: shape.heads, head_base 0), so that a dilated head keeps its global head's group
  // and offset (group_heads_of, pattern_offset) on whichever rank computes it.
  int64_t head_base = 0;
  std::optional<int64_t> global_heads;

  double effective_scale() const;
  int64_t total_heads() const { return global_heads.value_or(shape.heads); }
  int64_t effective_kv_heads() const { return kv_heads ? *kv_heads : shape.heads; }
  // Query heads that share one K/V head: heads / kv_heads.
  int64_t queries_per_kv_head() const { return shape.heads / effective_kv_heads(); }
  // The K/V head query head `head` reads.
  int64_t kv_head_of(int64_t head) const { return head / queries_per_kv_head(); }
  TensorLayout effective_kv_layout() const { return kv_layout.value_or(layout); }
  bool windowed() const { return window_left.has_value(); }
  bool packed() const { return !cu_seqlens.empty(); }
  // The window's reach left and right of the query, clipped to the sequence length (so
  // position arithmetic cannot overflow); seq_len on a side that has no limit, 0 on the
  // right when causal. Only meaningful after validate().
  struct WindowReach {
    int64_t left = 0, right = 0;
  };
  WindowReach window_reach() const;
  // [B, N, kv_heads, D]: the shape of k, v, dk and dv.
  Shape4 kv_shape() const {
    return {shape.batch, shape.seq_len, effective_kv_heads(), shape.head_dim};
  }
};

// Throws InputError naming the option ("--segments", "--heads", ...) that is wrong.
void validate(const AttentionConfig& cfg);

// For the paths that do not compute grouped-query attention yet: throws InputError naming
// --kv-heads, saying it is not yet supported on `path` (e.g. "--device cuda"), when
// kv_heads != heads. Refusing is the contract there; computing with the wrong K/V layout is not.
void require_multi_head(const AttentionConfig& cfg, const std::string& path);

// For the paths that do not compute packed sequences yet: throws InputError naming --seqlens,
// saying they are not yet supported on `path`, when the config is packed.
void require_unpacked(const AttentionConfig& cfg, const std::string& path);

// For the paths that do not compute a sliding window yet: throws InputError naming --window,
// saying it is not yet supported on `path`, when the config has a window.
void require_no_window(const AttentionConfig& cfg, const std::string& path);

// For the paths that read only [B, N, H, D] tensors: throws InputError naming --layout,
// saying bhnd is not supported on `path`, when the config's layout is bhnd.
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
// The same for a config's own heads: group `group` of the job's total_heads(), clipped to
// this config's head slice and counted from its first head (count 0 when the slice holds
// none of the group).
HeadRange group_heads_of(const AttentionConfig& cfg, int64_t groups, int64_t group);

// Offset of pattern i for head h (of this config's slice): grouped uses i % r_i (for heads
// of group i only), mixture uses (head_base + h) % r_i.
int64_t pattern_offset(const AttentionConfig& cfg, int64_t pattern, int64_t head);

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

// Sum over batch, heads and query rows of the number of keys each query attends
// (causal counted as attended; a sliding window counts only the keys inside it). Forward FLOPs are
// 4 * head_dim * attended_pairs. Dense and dilated only: block-sparse plans count their own from
// the block lists.
double attended_pairs(const AttentionConfig& cfg);

}  // namespace ringattn

// The attention problem a user asks for, its validation, and how many key/query pairs a
// configuration attends. Semantics are written down in docs/SEMANTICS.md.
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
// convention). The single-process CPU engine reads either; the other paths refuse bhnd,
// naming `config.layout`. lse is [batch, heads, seq_len] in both.
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
  // The values' head dim (--head-dim-v): v, dv, out and dout have head_dim_v columns, q, k,
  // dq and dk head_dim (multi-head latent attention trains with 192 and 128). Unset: head_dim.
  std::optional<int64_t> head_dim_v;
  // Logit soft-capping (--softcap c, Gemma 2): each scaled score s becomes c·tanh(s / c)
  // before the mask and the softmax; a sink's logit is not capped. 0: none.
  double softcap = 0;
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

  double effective_scale() const;
  int64_t effective_kv_heads() const { return kv_heads ? *kv_heads : shape.heads; }
  // Query heads that share one K/V head: heads / kv_heads.
  int64_t queries_per_kv_head() const { return shape.heads / effective_kv_heads(); }
  // The K/V head query head `head` reads.
  int64_t kv_head_of(int64_t head) const { return head / queries_per_kv_head(); }
  TensorLayout effective_kv_layout() const { return kv_layout.value_or(layout); }
  int64_t effective_head_dim_v() const { return head_dim_v.value_or(shape.head_dim); }
  bool softcapped() const { return softcap > 0; }
  bool windowed() const { return window_left.has_value(); }
  bool packed() const { return !cu_seqlens.empty(); }
  // The window's reach left and right of the query, clipped to the sequence length (so
  // position arithmetic cannot overflow); seq_len on a side that has no limit, 0 on the
  // right when causal. Only meaningful after validate().
  struct WindowReach {
    int64_t left = 0, right = 0;
  };
  WindowReach window_reach() const;
  // [B, N, kv_heads, D]: the shape of k and dk (and of v and dv unless head_dim_v differs).
  Shape4 kv_shape() const {
    return {shape.batch, shape.seq_len, effective_kv_heads(), shape.head_dim};
  }
  // [B, N, kv_heads, head_dim_v]: the shape of v and dv.
  Shape4 v_shape() const {
    return {shape.batch, shape.seq_len, effective_kv_heads(), effective_head_dim_v()};
  }
  // [B, N, H, head_dim_v]: the shape of out and dout.
  Shape4 out_shape() const {
    return {shape.batch, shape.seq_len, shape.heads, effective_head_dim_v()};
  }
};

// Throws InputError naming the field that is wrong ("config.segments", "config.shape.heads",
// ... as errors.hpp spells them).
void validate(const AttentionConfig& cfg);

// Sum over batch, heads and query rows of the number of keys each query attends
// (causal counted as attended; a sliding window counts only the keys inside it). Forward FLOPs
// are 2 * (head_dim + head_dim_v) * attended_pairs. Dense and dilated only: block-sparse plans
// count their own from the block lists.
double attended_pairs(const AttentionConfig& cfg);

}  // namespace ringattn

// The Hopper block-sparse forward (see hopper_sparse_fwd.hpp): hopper_fwd_kernel.cuh's body
// with a block per work item (64 rows of a query tile) walking the tile's key spans, each
// from the first key some row of the item sees (visible_key_range, as the native kernel),
// 64 keys at a time; each row's reach is the span's causal offset and the window.
#include "kernels/cuda/hopper_sparse_fwd.hpp"

#include <limits>
#include <string>

#include "kernels/cuda/hopper_fwd_kernel.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

using hopper::KeyTile;
using hopper::kRows;
using hopper::QueryRows;
using hopper::Reach;

struct SparseWork {
  const SparseQueryTile* tiles;
  const KeySpan* spans;
  const ForwardItem* items;
  float* out;
  float* lse;
  int64_t q_stride, lse_stride;
  int seq_len, heads, kv_heads, head_dim;
  bool causal;
  int64_t window_left, window_right;  // span units, kNoWindow: none
  // Query i sees key j of a span iff i - reach_left <= j - causal_offset <= i + reach_right:
  // the window clamped to int, causality folded into the right.
  int reach_left, reach_right;

  struct Cursor {
    const KeySpan* span;  // the next span
    int64_t spans_left;
    int i0, rows;   // the item's query rows, in the tile
    int k0, k_end;  // the next key tile's first key and the span's last visible key + 1
    int n0, h, b;   // the span's key 0 in the [B, N, HKV, D] tensors
    int off, n_k;   // the span's causal offset and keys
  };

  __device__ __forceinline__ QueryRows query_rows(int head_dim) const {
    const ForwardItem item = items[blockIdx.x];
    const SparseQueryTile tile = tiles[item.task];
    const int i0 = static_cast<int>(item.q_begin);
    const int rows = tile.n_q - i0 < kRows ? static_cast<int>(tile.n_q - i0) : kRows;
    const int64_t at = tile.q_row0 + i0 * q_stride;
    int n, h, b;
    hopper::position_of(at, head_dim, heads, seq_len, n, h, b);
    return {n, h, b, out + at, lse + tile.lse0 + i0 * lse_stride, q_stride, lse_stride, rows, i0};
  }

  __device__ __forceinline__ Cursor begin(const QueryRows& q) const {
    const SparseQueryTile tile = tiles[items[blockIdx.x].task];
    Cursor c{};
    c.span = spans + tile.first_span;
    c.spans_left = tile.n_spans;
    c.i0 = q.row0, c.rows = q.rows;
    return c;
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    while (c.k0 >= c.k_end) {
      if (c.spans_left == 0) return false;
      const KeySpan sp = *c.span++;
      --c.spans_left;
      SubseqTask view;
      view.n_k = sp.n_k;
      view.causal_offset = sp.causal_offset;
      view.window_left = window_left;
      view.window_right = window_right;
      const KeyRange keys = visible_key_range(view, causal, c.i0, c.rows);
      c.k0 = static_cast<int>(keys.begin), c.k_end = static_cast<int>(keys.end);
      c.off = static_cast<int>(sp.causal_offset), c.n_k = static_cast<int>(sp.n_k);
      hopper::position_of(sp.k_row0, head_dim, kv_heads, seq_len, c.n0, c.h, c.b);
    }
    t = {c.n0 + c.k0, c.h, c.b, c.k0 - c.off, c.n_k - c.k0};
    c.k0 += kRows;
    return true;
  }

  __device__ __forceinline__ Reach reach(const QueryRows& q, int local) const {
    const int i = q.row0 + local;
    return {i - reach_left, i + reach_right + 1};
  }
};

}  // namespace

std::string hopper_sparse_forward_unsupported(Elem e, const SparseForwardParams& p,
                                              const HopperSparseShape& s, int device) {
  if (s.batch <= 0 || s.seq_len <= 0 || s.heads <= 0 || s.kv_heads <= 0)
    return "an empty tensor shape";
  if (p.q_stride != static_cast<int64_t>(s.heads) * p.head_dim)
    return "query rows not [B, N, H, D] (q_stride " + std::to_string(p.q_stride) + ")";
  if (p.n_items > std::numeric_limits<int>::max()) return "more work items than a grid holds";
  return hopper::device_unsupported(p.head_dim, e, device);
}

void hopper_sparse_forward(Elem e, const SparseForwardParams& p, const HopperSparseShape& s,
                           cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_sparse_forward_unsupported(e, p, s, device); !why.empty())
    throw RuntimeFailure("the Hopper block-sparse forward cannot run: " + why);
  if (p.n_items == 0) return;
  constexpr int64_t kFar = int64_t{1} << 30;  // past any key: no limit
  auto clamped = [&](int64_t w) { return static_cast<int>(w < kFar ? w : kFar); };
  const int right =
      p.causal ? (p.window_right < 0 ? clamped(p.window_right) : 0) : clamped(p.window_right);
  const hopper::Args<SparseWork> a{
      hopper::tensor_map(p.q, e, s.batch, s.seq_len, s.heads, p.head_dim),
      hopper::tensor_map(p.k, e, s.batch, s.seq_len, s.kv_heads, p.head_dim),
      hopper::tensor_map(p.v, e, s.batch, s.seq_len, s.kv_heads, p.head_dim),
      p.scale * 1.4426950408889634f,
      p.accumulate,
      {p.tiles, p.spans, p.items, p.out, p.lse, p.q_stride, p.lse_stride, s.seq_len, s.heads,
       s.kv_heads, p.head_dim, p.causal, p.window_left, p.window_right, clamped(p.window_left),
       right}};
  hopper::launch_for(p.head_dim, e, "hopper_sparse_fwd_kernel", a,
                     dim3(static_cast<unsigned>(p.n_items)), stream);
}

}  // namespace ringattn::kernels::cuda

// The block-sparse lists as Hopper kernels' `Work`s (hopper/tiles.cuh), over the native
// block-sparse kernels' own lists (native/sparse.hpp) for [B, N, H, D] q and [B, N, HKV, D]
// k and v: SparseWork, a block per work item of a query tile walking the tile's key spans
// (the forward's and the dQ pass's), and SparseKeyWork, a block per work item of a key tile
// walking the query spans that attend it (the dK/dV pass's). Each span is walked 64 rows at
// a time from the first row some row of the item can reach (visible_key_range,
// seeing_query_range, as the native kernels); each row's reach is the span's causal offset
// and the window.
#pragma once

#include <cstdint>

#include "kernels/cpu_block_sparse.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cuda/hopper/tiles.cuh"
#include "kernels/cuda/native/sparse.hpp"

namespace ringattn::kernels::cuda::hopper {

struct SparseWork {
  const SparseQueryTile* tiles;
  const KeySpan* spans;
  const ForwardItem* items;
  float* out;
  float* lse;
  int64_t q_stride, lse_stride;
  int seq_len, heads, kv_heads, head_dim;
  int kv_seq_len;  // K/V positions per batch: seq_len, or a slab's rows (one batch, one head)
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

  // The block's rows; out's rows are `out_dim` wide (the values' head dim), the tiles' row
  // offsets `row_dim` (the kernel's D: constants, so that equal widths fold).
  __device__ __forceinline__ QueryRows query_rows(int row_dim, int out_dim) const {
    const ForwardItem item = items[blockIdx.x];
    const SparseQueryTile tile = tiles[item.task];
    const int i0 = static_cast<int>(item.q_begin);
    const int rows = tile.n_q - i0 < kRows ? static_cast<int>(tile.n_q - i0) : kRows;
    const int64_t at = tile.q_row0 + i0 * q_stride;
    int n, h, b;
    hopper::position_of(at, head_dim, heads, seq_len, n, h, b);
    return {n,
            h,
            b,
            out ? out + value_floats(at, row_dim, out_dim) : nullptr,
            lse ? lse + tile.lse0 + i0 * lse_stride : nullptr,
            value_floats(q_stride, row_dim, out_dim),
            lse_stride,
            rows,
            i0};
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
      hopper::position_of(sp.k_row0, head_dim, kv_heads, kv_seq_len, c.n0, c.h, c.b);
    }
    t = {c.n0 + c.k0, c.h, c.b, c.k0 - c.off, c.n_k - c.k0};
    c.k0 += kRows;
    return true;
  }

  __device__ __forceinline__ Reach reach(const QueryRows& q, int local) const {
    const int i = q.row0 + local;
    return {i - reach_left, i + reach_right + 1};
  }

  // The dQ pass's rows in lse/delta and in dq (laid out as q).
  __device__ __forceinline__ Strided row_stats(const QueryRows& q) const {
    const SparseQueryTile tile = tiles[items[blockIdx.x].task];
    return {tile.lse0 + q.row0 * lse_stride, lse_stride};
  }
  __device__ __forceinline__ Strided grad_rows(const QueryRows& q, int row_dim, int d) const {
    const SparseQueryTile tile = tiles[items[blockIdx.x].task];
    return {value_floats(tile.q_row0 + q.row0 * q_stride, row_dim, d),
            value_floats(q_stride, row_dim, d)};
  }
};

struct SparseKeyWork {
  const SparseKeyTile* tiles;
  const QuerySpan* spans;
  const ForwardItem* items;  // (key tile, first key row)
  int64_t lse_stride;
  int seq_len, heads, kv_heads, head_dim;
  int kv_seq_len;  // K/V positions per batch: seq_len, or a slab's rows (one batch, one head)
  bool causal;
  int64_t window_left, window_right;  // span units, kNoWindow: none
  // Key j is seen by query i of a span iff j - reach_right <= i + causal_offset <=
  // j + reach_left: SparseWork's reach seen from the key.
  int reach_left, reach_right;
  int block_rows = kRows;  // an item's key rows: 64, or the wide fused backward's 128

  struct Cursor {
    const QuerySpan* span;  // the next span
    int64_t spans_left;
    int j0, rows;  // the item's key rows, in the tile
    int i, i_end;  // the next query tile's first query and the span's last seeing one + 1
    int n0, h, b;  // the span's query 0 in the [B, N, H, D] tensors
    int off, n_q;  // the span's causal offset and queries
    int64_t lse0;  // the span's query 0 in lse and delta
  };

  __device__ __forceinline__ QueryRows query_rows(int, int) const {
    const ForwardItem item = items[blockIdx.x];
    const SparseKeyTile tile = tiles[item.task];
    const int j0 = static_cast<int>(item.q_begin);
    const int rows = tile.n_k - j0 < block_rows ? static_cast<int>(tile.n_k - j0) : block_rows;
    int n, h, b;
    position_of(tile.k_row0 + j0 * tile.k_stride, head_dim, kv_heads, kv_seq_len, n, h, b);
    return {n, h, b, nullptr, nullptr, 0, 0, rows, j0};
  }

  __device__ __forceinline__ Cursor begin(const QueryRows& k) const {
    const SparseKeyTile tile = tiles[items[blockIdx.x].task];
    Cursor c{};
    c.span = spans + tile.first_span;
    c.spans_left = tile.n_spans;
    c.j0 = k.row0, c.rows = k.rows;
    return c;
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    while (c.i >= c.i_end) {
      if (c.spans_left == 0) return false;
      const QuerySpan sp = *c.span++;
      --c.spans_left;
      SubseqTask view;
      view.n_q = sp.n_q;
      view.causal_offset = sp.causal_offset;
      view.window_left = window_left;
      view.window_right = window_right;
      const KeyRange queries = seeing_query_range(view, causal, c.j0, c.rows);
      c.i = static_cast<int>(queries.begin), c.i_end = static_cast<int>(queries.end);
      c.off = static_cast<int>(sp.causal_offset), c.n_q = static_cast<int>(sp.n_q);
      c.lse0 = sp.lse0;
      position_of(sp.q_row0, head_dim, heads, seq_len, c.n0, c.h, c.b);
    }
    t = {c.n0 + c.i, c.h, c.b, c.i + c.off, c.n_q - c.i};
    c.i += kRows;
    return true;
  }

  __device__ __forceinline__ Reach reach(const QueryRows& k, int local) const {
    const int j = k.row0 + local;
    return {j - reach_right, j + reach_left + 1};
  }

  // The dK/dV rows in dk or dv (laid out as k, rows `d` wide) and a walked query tile's
  // columns in lse and delta.
  __device__ __forceinline__ Strided grad_rows(const QueryRows& k, int row_dim, int d) const {
    const SparseKeyTile tile = tiles[items[blockIdx.x].task];
    return {value_floats(tile.k_row0 + k.row0 * tile.k_stride, row_dim, d),
            value_floats(tile.k_stride, row_dim, d)};
  }
  __device__ __forceinline__ Strided column_stats(const Cursor& c, const KeyTile& t) const {
    return {c.lse0 + static_cast<int64_t>(t.base - c.off) * lse_stride, lse_stride};
  }
  // A walked query tile's rows in dq ([B, N, H, D]: the fused backward's) and how many.
  __device__ __forceinline__ Strided column_grads(const Cursor&, const KeyTile& t, int,
                                                  int& count) const {
    count = t.limit < kRows ? t.limit : kRows;
    return {((static_cast<int64_t>(t.b) * seq_len + t.n) * heads + t.h) * head_dim,
            static_cast<int64_t>(heads) * head_dim};
  }
};

// The K/V tensors' extents as the tensor maps and position_of take them: [B, N, HKV, D], or
// (kv_rows > 0) a slab of kv_rows rows, one batch of one head.
struct KeyGeometry {
  int batch, seq_len, heads;
};
template <class Shape>
KeyGeometry key_geometry(const Shape& s) {
  if (s.kv_rows > 0) return {1, s.kv_rows, 1};
  return {s.batch, s.seq_len, s.kv_heads};
}

// The window's reach in int, causality folded into the right: {left, right}.
struct SparseReach {
  int left, right;
};
inline SparseReach sparse_reach(bool causal, int64_t window_left, int64_t window_right) {
  constexpr int64_t kFar = int64_t{1} << 30;  // past any key: no limit
  auto clamped = [&](int64_t w) { return static_cast<int>(w < kFar ? w : kFar); };
  return {clamped(window_left),
          causal ? (window_right < 0 ? clamped(window_right) : 0) : clamped(window_right)};
}

}  // namespace ringattn::kernels::cuda::hopper

// Dense attention as a Hopper kernel's `Work` (hopper/tiles.cuh): a block per (64-row tile,
// head, batch) walking, in order, the 64-row tiles of the other side that some row of it can
// see; causality, the window and packed documents are each row's reach. The forward and the
// backward's dQ pass walk key tiles from a query tile; the dK/dV pass walks query tiles
// (of every query head of the K/V head's group) from a key tile, with the window mirrored:
// key k is seen by queries [k - right, k + left] of its document when query p sees keys
// [p - left, p + right] of its own.
#pragma once

#include <string>

#include "kernels/cuda/hopper/dense_forward.hpp"
#include "kernels/cuda/hopper/tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

struct DenseWork {
  // Every walked tile is whole (KeyTile::limit == kRows): rows past N are the tensor map's
  // zero fill, so no tile rows are zeroed in shared memory.
  static constexpr bool kWholeTiles = true;
  float* out;  // the forward's [B, N, H, D] out and [B, H, N] lse; null in the backward
  float* lse;
  int seq_len, heads, kv_heads;
  int left, right;        // row p sees columns [p - left, p + right]
  const int* cu_seqlens;  // packed documents (null: one), n_docs + 1 offsets
  int n_docs;
  // The dK/dV walk: blockIdx.y is a K/V head and the block walks the tiles of each of its
  // heads / kv_heads query heads in turn. Otherwise blockIdx.y is a query head and the block
  // walks its K/V head's tiles.
  bool rows_are_keys;
  int block_rows = kRows;  // a block's rows: 64, or 128 for the ping-pong forward's two halves

  struct Cursor {
    int j, first, last;  // the next tile, the first and the last one of a head
    int g;               // the walked head, in the group
  };

  // The document [start, end) holding row `row` (the whole sequence without packing).
  __device__ __forceinline__ void document_of(int row, int& start, int& end) const {
    start = 0, end = seq_len;
    if (!cu_seqlens || row >= seq_len) return;
    int lo = 0, hi = n_docs - 1;  // the last document whose start is <= row
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (cu_seqlens[mid] <= row)
        lo = mid;
      else
        hi = mid - 1;
    }
    start = cu_seqlens[lo], end = cu_seqlens[lo + 1];
  }

  // Block blockIdx.x's rows (block_rows of them) of head blockIdx.y, batch blockIdx.z; out's
  // rows are `head_dim` wide (the values' head dim).
  __device__ __forceinline__ QueryRows query_rows(int, int head_dim) const {
    const int row0 = block_rows * static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
              b = static_cast<int>(blockIdx.z);
    const int rows = seq_len - row0 < block_rows ? seq_len - row0 : block_rows;
    return {
        row0,
        h,
        b,
        out ? out + ((static_cast<int64_t>(b) * seq_len + row0) * heads + h) * head_dim : nullptr,
        lse ? lse + (static_cast<int64_t>(b) * heads + h) * seq_len + row0 : nullptr,
        static_cast<int64_t>(heads) * head_dim,
        1,
        rows,
        row0};
  }

  // The tiles some row of the block can see: from the first row's reach to the last's.
  __device__ __forceinline__ Cursor begin(const QueryRows& q) const {
    const int all_tiles = (seq_len + kRows - 1) / kRows;
    const int last_row = q.row0 + q.rows - 1;
    int first_start, first_end, last_start, last_end;
    document_of(q.row0, first_start, first_end);
    document_of(last_row, last_start, last_end);
    const int lo_reach = q.row0 - left, hi_reach = last_row + right;
    const int lo = lo_reach > first_start ? lo_reach : first_start;
    const int hi = hi_reach < last_end - 1 ? hi_reach : last_end - 1;
    const int first = lo > 0 ? lo / kRows : 0;
    return {first, first, hi / kRows < all_tiles - 1 ? hi / kRows : all_tiles - 1, 0};
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    const int group = heads / kv_heads;
    while (c.j > c.last) {  // the next head of the group, for the dK/dV walk
      if (!rows_are_keys || ++c.g == group) return false;
      c.j = c.first;
    }
    const int h = rows_are_keys ? static_cast<int>(blockIdx.y) * group + c.g
                                : static_cast<int>(blockIdx.y) / group;
    t = {kRows * c.j, h, static_cast<int>(blockIdx.z), kRows * c.j, kRows};
    ++c.j;
    return true;
  }

  // The backward's rows in lse/delta ([B, H, N]) and in the gradients ([B, N, heads, D]: dQ's
  // for query rows, dK's and dV's for key rows), and a walked query tile's columns in
  // lse/delta (the dK/dV walk).
  __device__ __forceinline__ Strided row_stats(const QueryRows& q) const {
    return {(static_cast<int64_t>(q.b) * heads + q.h) * seq_len + q.n, 1};
  }
  __device__ __forceinline__ Strided grad_rows(const QueryRows& q, int, int head_dim) const {
    const int64_t row_heads = rows_are_keys ? kv_heads : heads;
    return {((static_cast<int64_t>(q.b) * seq_len + q.n) * row_heads + q.h) * head_dim,
            row_heads * head_dim};
  }
  __device__ __forceinline__ Strided column_stats(const Cursor&, const KeyTile& t) const {
    return {(static_cast<int64_t>(t.b) * heads + t.h) * seq_len + t.n, 1};
  }
  // A walked query tile's rows in dq (the fused backward's) and how many there are (the last
  // tile's stop at N).
  __device__ __forceinline__ Strided column_grads(const Cursor&, const KeyTile& t, int head_dim,
                                                  int& count) const {
    count = seq_len - t.n < kRows ? seq_len - t.n : kRows;
    return {((static_cast<int64_t>(t.b) * seq_len + t.n) * heads + t.h) * head_dim,
            static_cast<int64_t>(heads) * head_dim};
  }

  // Column positions: the window's, within the row's document.
  __device__ __forceinline__ Reach reach(const QueryRows& q, int local) const {
    const int row = q.row0 + local;
    int start, end;
    document_of(row, start, end);
    return {row - left > start ? row - left : start, row + right + 1 < end ? row + right + 1 : end};
  }
};

// The 64-key fused backward's dS by stmatrix over dense work: ptxas (sm_90a, D = 128) spills
// 4 bytes there instead of 28 (capped: 0 instead of 20). Over TaskKeyWork it was 52 instead
// of 64 (capped: 52 instead of 48), over SparseKeyWork 188 instead of 144: those keep the
// scalar stores.
template <>
struct StmatrixDs<DenseWork> {
  static constexpr bool value = true;
};

// `a`'s work with queries as rows (the forward's, writing out and lse; the dQ pass's, with
// both null) or keys as rows (the dK/dV pass's).
inline DenseWork dense_work(const HopperAttention& a, float* out, float* lse, bool rows_are_keys) {
  auto reach = [&](int64_t w) { return static_cast<int>(w < 0 || w > a.seq_len ? a.seq_len : w); };
  const int left = reach(a.window_left), right = a.causal ? 0 : reach(a.window_right);
  return {out,
          lse,
          a.seq_len,
          a.heads,
          a.kv_heads,
          rows_are_keys ? right : left,
          rows_are_keys ? left : right,
          a.cu_seqlens,
          a.n_docs,
          rows_are_keys,
          kRows};
}

// "" when the dense Hopper kernels can run `a` on `device`, else why not.
inline std::string attention_unsupported(const HopperAttention& a, int device) {
  if (a.elem == Elem::fp32) return "fp32 inputs (bf16 or fp16)";
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return "query heads not a multiple of K/V heads";
  return device_unsupported(a.head_dim, a.elem, device, a.value_dim());
}

// The grid of a block per (block_rows-row tile, head, batch) over `heads` heads.
inline dim3 dense_grid(const HopperAttention& a, int heads, int block_rows = kRows) {
  return dim3(static_cast<unsigned>((a.seq_len + block_rows - 1) / block_rows),
              static_cast<unsigned>(heads), static_cast<unsigned>(a.batch));
}

}  // namespace ringattn::kernels::cuda::hopper

// The Hopper dense forward (see hopper_fwd.hpp): hopper_fwd_kernel.cuh's body with a block per
// (64-row query tile, head, batch) walking the key tiles some row of it can see, in order;
// causality, the window and packed documents are each row's reach.
#include "kernels/cuda/hopper_fwd.hpp"

#include <string>

#include "kernels/cuda/hopper_fwd_kernel.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

using hopper::KeyTile;
using hopper::kRows;
using hopper::QueryRows;
using hopper::Reach;

struct DenseWork {
  float* out;
  float* lse;
  int seq_len, heads, kv_heads;
  int left, right;        // query p sees keys [p - left, p + right]
  const int* cu_seqlens;  // packed documents (null: one), n_docs + 1 offsets
  int n_docs;

  struct Cursor {
    int j, last;  // the next key tile and the last one
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

  // Query tile blockIdx.x of head blockIdx.y, batch blockIdx.z.
  __device__ __forceinline__ QueryRows query_rows(int head_dim) const {
    const int row0 = kRows * static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
              b = static_cast<int>(blockIdx.z);
    const int rows = seq_len - row0 < kRows ? seq_len - row0 : kRows;
    return {row0,
            h,
            b,
            out + ((static_cast<int64_t>(b) * seq_len + row0) * heads + h) * head_dim,
            lse + (static_cast<int64_t>(b) * heads + h) * seq_len + row0,
            static_cast<int64_t>(heads) * head_dim,
            1,
            rows,
            row0};
  }

  // The key tiles some row of the block can see: from the first row's reach to the last's.
  __device__ __forceinline__ Cursor begin(const QueryRows& q) const {
    const int all_tiles = (seq_len + kRows - 1) / kRows;
    const int last_row = q.row0 + q.rows - 1;
    int first_start, first_end, last_start, last_end;
    document_of(q.row0, first_start, first_end);
    document_of(last_row, last_start, last_end);
    const int lo_reach = q.row0 - left, hi_reach = last_row + right;
    const int lo = lo_reach > first_start ? lo_reach : first_start;
    const int hi = hi_reach < last_end - 1 ? hi_reach : last_end - 1;
    return {lo > 0 ? lo / kRows : 0, hi / kRows < all_tiles - 1 ? hi / kRows : all_tiles - 1};
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    if (c.j > c.last) return false;
    const int hk = static_cast<int>(blockIdx.y) / (heads / kv_heads);
    t = {kRows * c.j, hk, static_cast<int>(blockIdx.z), kRows * c.j, kRows};
    ++c.j;
    return true;
  }

  // Key positions: the window's, within the row's document.
  __device__ __forceinline__ Reach reach(const QueryRows& q, int local) const {
    const int row = q.row0 + local;
    int start, end;
    document_of(row, start, end);
    return {row - left > start ? row - left : start, row + right + 1 < end ? row + right + 1 : end};
  }
};

}  // namespace

std::string hopper_forward_unsupported(const HopperForwardParams& p, int device) {
  if (p.elem == Elem::fp32) return "fp32 inputs (bf16 or fp16)";
  if (p.kv_heads <= 0 || p.heads % p.kv_heads != 0)
    return "query heads not a multiple of K/V heads";
  return hopper::device_unsupported(p.head_dim, p.elem, device);
}

void hopper_forward(const HopperForwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_forward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper forward kernel cannot run: " + why);
  auto reach = [&](int64_t w) { return static_cast<int>(w < 0 || w > p.seq_len ? p.seq_len : w); };
  const hopper::Args<DenseWork> a{
      hopper::tensor_map(p.q, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
      hopper::tensor_map(p.k, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      hopper::tensor_map(p.v, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      p.scale * 1.4426950408889634f,
      false,
      {p.out, p.lse, p.seq_len, p.heads, p.kv_heads, reach(p.window_left),
       p.causal ? 0 : reach(p.window_right), p.cu_seqlens, p.n_docs}};
  const dim3 grid(static_cast<unsigned>((p.seq_len + kRows - 1) / kRows),
                  static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  hopper::launch_for(p.head_dim, p.elem, "hopper_fwd_kernel", a, grid, stream);
}

}  // namespace ringattn::kernels::cuda

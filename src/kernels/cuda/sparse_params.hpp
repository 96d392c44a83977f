// The CUDA block-sparse kernels' interface: the CPU block-sparse contract
// (kernels/cpu_block_sparse.hpp) on device pointers. The work lists are the CPU's own structs
// (SparseQueryTile/KeySpan for the forward and the dQ pass, SparseKeyTile/QuerySpan for the
// dK/dV pass), uploaded as they are; a work item is (tile, first row) and covers
// kQueryTile query rows (or kKeyTile key rows) of its tile, so tiles of any row count run.
// q, k, v and dout are bf16 or fp16 (or fp32 on the simple path); out, lse, dq, dk and dv fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cpu_block_sparse.hpp"
#include "kernels/cuda/flash_params.hpp"

namespace ringattn::kernels::cuda {

struct SparseForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  const SparseQueryTile* tiles = nullptr;  // device
  const KeySpan* spans = nullptr;          // device
  const ForwardItem* items = nullptr;      // device: (tile, first query row of the tile)
  int64_t n_items = 0;
  int64_t q_stride = 0;  // elements between consecutive query rows (q, out)
  int64_t lse_stride = 1;
  int head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  // Sliding window in the spans' index units (KeySpan/QuerySpan causal_offset), as for the CPU
  // kernels (SparseParams); kNoWindow: none.
  int64_t window_left = kNoWindow, window_right = kNoWindow;
  bool accumulate = false;  // merge into (out, lse) by log-sum-exp instead of writing
  // Every row start and stride is a multiple of 8 elements, the pointers 16-byte aligned and
  // head_dim the instantiated head dim: rows are read with 16-byte copies.
  bool vector_loads = false;
};

struct SparseBackwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;    // the final lse of each row
  const float* delta = nullptr;  // rowsum(out ∘ dout), laid out like lse
  float* dq = nullptr;           // accumulated into (+=)
  float* dk = nullptr;           // accumulated into (+=)
  float* dv = nullptr;           // accumulated into (+=)
  // The dQ pass: query tiles walking key spans.
  const SparseQueryTile* q_tiles = nullptr;
  const KeySpan* key_spans = nullptr;
  const ForwardItem* q_items = nullptr;  // (query tile, first query row)
  int64_t n_q_items = 0;
  // The dK/dV pass: key tiles walking query spans.
  const SparseKeyTile* k_tiles = nullptr;
  const QuerySpan* query_spans = nullptr;
  const ForwardItem* k_items = nullptr;  // (key tile, first key row)
  int64_t n_k_items = 0;
  int64_t q_stride = 0;  // elements between consecutive query rows (q, dout, dq)
  int64_t lse_stride = 1;
  int head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  int64_t window_left = kNoWindow, window_right = kNoWindow;  // as in SparseForwardParams
  bool vector_loads = false;
};

// The forward walks several key spans per item, so it keeps one K tile (no prefetch across
// span boundaries): Q (kQueryTile rows), one K tile and one V tile.
constexpr int sparse_forward_smem_bytes(int head_dim, int elem_bytes) {
  return (kQueryTile + 2 * forward_key_step(head_dim)) * (head_dim + kRowPad) * elem_bytes;
}
// The backward passes hold what the flash backward holds.
constexpr int sparse_backward_smem_bytes(int head_dim, int elem_bytes) {
  return backward_smem_bytes(head_dim, elem_bytes);
}
static_assert(sparse_forward_smem_bytes(256, 2) <= kSmallestOptInSharedBytes &&
                  sparse_backward_smem_bytes(256, 2) <= kSmallestOptInSharedBytes,
              "the D = 256 block-sparse kernels must fit compute capability 8.6/8.9");

// Tensor-core kernels, one explicit instantiation per element type and padded head dim
// (sparse_hdim*.cu).
template <Elem E, int kHeadDim>
void launch_sparse_forward(const SparseForwardParams& p, cudaStream_t stream);
template <Elem E, int kHeadDim>
void launch_sparse_backward(const SparseBackwardParams& p, cudaStream_t stream);

// The CUDA-core kernels for fp32 inputs, any head dim up to 256 (sparse_simple_fp32.cu).
void launch_sparse_simple_forward_fp32(const SparseForwardParams& p, cudaStream_t stream);
void launch_sparse_simple_backward_fp32(const SparseBackwardParams& p, cudaStream_t stream);

// Dispatch on (element type, head dim); fp32 goes to the CUDA-core kernels. The backward
// runs the dQ pass and then the dK/dV pass on `stream`.
void sparse_forward(Elem e, const SparseForwardParams& p, cudaStream_t stream);
void sparse_backward(Elem e, const SparseBackwardParams& p, cudaStream_t stream);

// Empty when the block-sparse tensor-core kernels for `head_dim` in `e` fit `device`'s
// opt-in shared memory per block; otherwise why not, for a note.
std::string sparse_kernels_fit(int64_t head_dim, Elem e, int device);

}  // namespace ringattn::kernels::cuda

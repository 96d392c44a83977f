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
#include "kernels/cuda/native/flash.hpp"

namespace ringattn::kernels::cuda {

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

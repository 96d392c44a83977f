// Tile shapes shared by the CUDA kernels and the host code that builds their work items
// (no CUDA headers here, so host-only code and its tests can use them in any build).
#pragma once

#include <cstdint>

namespace ringattn::kernels::cuda {

// Tensor-core kernels: 4 warps of 16 rows each, 64 rows per block. Forward and dQ items
// cover kQueryTile query rows of a task; dK/dV items kKeyTile key rows.
constexpr int kQueryTile = 64;
constexpr int kKeyTile = 64;

// Head dims with a tensor-core instantiation; other head dims run on the next larger one,
// with the extra columns read as zeros and never written.
constexpr int padded_head_dim(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

// Dynamic shared memory of the tensor-core kernels, per instantiation (16-bit elements), so
// host code can check it against a device's opt-in limit before launching. Rows are padded
// by 8 elements (16 bytes) so ldmatrix rows fall in distinct banks.
constexpr int kRowPad = 8;
constexpr int forward_key_step(int head_dim) { return head_dim > 128 ? 32 : 64; }
constexpr int backward_step(int head_dim) { return head_dim > 128 ? 32 : 64; }
// Forward K tiles double-buffered (the next loads while this one's P·V runs) only for
// D = 256, where 2-3 blocks fit an SM and it is faster; for D <= 128 the extra shared memory
// costs resident blocks that were hiding the load already, and it is slower
// (docs/PERFORMANCE.md).
constexpr bool forward_prefetches_k(int head_dim) { return head_dim > 128; }
// Forward: Q (kQueryTile rows), one or two K tiles and one V tile.
constexpr int forward_smem_bytes(int head_dim, int elem_bytes) {
  return (kQueryTile + (forward_prefetches_k(head_dim) ? 3 : 2) * forward_key_step(head_dim)) *
         (head_dim + kRowPad) * elem_bytes;
}
// Backward, both passes: the block's own two tiles (Q, dO or K, V) and one step of the other
// side's two (K, V or Q, dO). Per-row softmax statistics live in registers.
constexpr int backward_smem_bytes(int head_dim, int elem_bytes) {
  return (2 * kQueryTile + 2 * backward_step(head_dim)) * (head_dim + kRowPad) * elem_bytes;
}
// The smallest opt-in limit among the GPUs the kernels support (compute capability 8.6 and
// 8.9: 99 KiB per block); 8.0/8.7 allow 163 KiB, 9.0 227 KiB.
constexpr int kSmallestOptInSharedBytes = 101376;

static_assert(forward_smem_bytes(256, 2) <= kSmallestOptInSharedBytes &&
                  backward_smem_bytes(256, 2) <= kSmallestOptInSharedBytes,
              "the D = 256 kernels must fit compute capability 8.6/8.9 (99 KiB per block)");

}  // namespace ringattn::kernels::cuda

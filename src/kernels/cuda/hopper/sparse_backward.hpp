// The Hopper (sm_90a) block-sparse backward: the Hopper backward's two passes
// (hopper/backward_mainloop.cuh: TMA, mbarriers, wgmma) walking the native block-sparse backward's
// lists (native/sparse.hpp): the dQ pass a block per q_item walking its query tile's key
// spans, the dK/dV pass a block per k_item walking its key tile's query spans. Same contract
// as sparse_backward: dq, dk and dv fp32 and added into (+=), delta = rowsum(out ∘ dout) laid
// out like lse (start_backward computes both), each element written by one block.
//
// The lists must be over [B, N, H, D] q and dout and [B, N, HKV, D] k and v, as the sparse
// forward's (hopper/sparse_forward.hpp): q_stride = H·D, every key tile's and key span's stride
// HKV·D, every tile's and span's rows within one (batch, head). bf16/fp16, D = 64 or 128.
// Run on the emulated GPU in CI; exact on an H100.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/hopper/sparse_forward.hpp"
#include "kernels/cuda/native/sparse.hpp"

namespace ringattn::kernels::cuda {

// "" when hopper_sparse_backward can run `p` over tensors of `shape` on `device`, else why
// not.
std::string hopper_sparse_backward_unsupported(Elem e, const SparseBackwardParams& p,
                                               const HopperSparseShape& shape, int device);

// Throws RuntimeFailure where hopper_sparse_backward_unsupported says why, or a tensor map is
// refused. `fused` (D <= 128, else ignored): no dQ launch; the key tiles' launch is the fused
// kernel, which adds dQ's part from its keys (not deterministic). `wide` (with `fused`,
// D = 64 or 128): p.k_items are hopper_wide_key_items' (128 keys each) and the launch is the wide
// fused kernel.
void hopper_sparse_backward(Elem e, const SparseBackwardParams& p, const HopperSparseShape& shape,
                            cudaStream_t stream, bool fused = false, bool wide = false);

}  // namespace ringattn::kernels::cuda

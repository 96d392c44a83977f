// The Hopper (sm_90a) block-sparse forward: the Hopper forward's body (TMA, mbarriers, wgmma;
// hopper/forward_mainloop.cuh) walking the native block-sparse forward's lists instead of a dense
// key range. It takes sparse_forward's own parameters (native/sparse.hpp: work items over
// SparseQueryTiles, whose KeySpans name the K/V rows with their causal offsets, the window in
// span units, write or log-sum-exp merge) and gives the same out and lse; its producer loads
// only the 64-key tiles of each span that some row of the item can see.
//
// The tensor maps need the tensors' extents, so the lists must be over [B, N, H, D] q and
// out and [B, N, HKV, D] k and v, as build_single_device_work makes them: q_stride = H·D,
// every span's k_stride = HKV·D, and every tile's and span's rows within one (batch, head);
// or, with HopperSparseShape::kv_rows, k and v a received slab of rows (k_stride = D).
// bf16/fp16, D = 64, 128 or 256. Run on the emulated GPU in CI; exact on an H100.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/hopper/dense_forward.hpp"  // HopperForwardForm
#include "kernels/cuda/native/sparse.hpp"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

struct HopperSparseShape {
  int batch = 0, seq_len = 0, heads = 0, kv_heads = 0;
  // K and V (and dK/dV) as kv_rows rows of one head end to end, when they are not [B, N, HKV,
  // D]: a distributed block-sparse plan's received slab, whose spans are rows of D elements.
  // 0: the [B, N, HKV, D] tensors.
  int kv_rows = 0;
  // The forward's loop (HopperForwardForm plain, overlap or qregs; rule: the environment's).
  HopperForwardForm form = HopperForwardForm::rule;
};

// "" when hopper_sparse_forward can run `p` over tensors of `shape` on `device`, else why not.
std::string hopper_sparse_forward_unsupported(Elem e, const SparseForwardParams& p,
                                              const HopperSparseShape& shape, int device);

// Throws RuntimeFailure where hopper_sparse_forward_unsupported says why, or a tensor map is
// refused.
void hopper_sparse_forward(Elem e, const SparseForwardParams& p, const HopperSparseShape& shape,
                           cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

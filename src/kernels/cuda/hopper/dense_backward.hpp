// The Hopper (sm_90a) dense backward: the gradients of hopper_forward's attention (causal,
// sliding windows, packed documents, grouped-query heads; D = 64 or 128, bf16/fp16) from the
// forward's lse, with the same pipeline (TMA loads under mbarriers, a producer and a consumer
// warpgroup, wgmma) in two passes, each element written by one block (deterministic), or
// (`fused`, D <= 128) in one launch per key tile that also adds dQ's part by bulk reductions
// (`wide`, D = 64 or 128: per 128 keys, two consumer warpgroups):
//   dK/dV, a block per (64-key tile, K/V head, batch): K and V loaded once, the (Q, dO) tiles
//     of every query tile and query head that sees the keys streamed through the ring, the
//     products taken transposed (Sᵀ = K·Qᵀ, dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dK += dSᵀ·Q);
//   dQ, a block per (64-query tile, head, batch) as the forward's: S = Q·Kᵀ, dP = dO·Vᵀ,
//     dQ += dS·K over the key tiles the queries see.
// The contract is flash_backward's (params.hpp) for a dense [B, N, H, D] shard: dq, dk
// and dv are fp32 and added into (+=), delta = rowsum(out ∘ dout) per lse row comes from
// launch_row_dot, and start_backward (device_ops.hpp) does both, so a plan can run either.
// Run on the emulated GPU in CI; exact on an H100.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/alignment.hpp"
#include "kernels/cuda/hopper/dense_forward.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

struct HopperBackwardParams : HopperAttention {
  const void* dout = nullptr;    // [B, N, H, D], the element type of q
  const float* lse = nullptr;    // [B, H, N], the forward's
  const float* delta = nullptr;  // [B, H, N]: rowsum(out ∘ dout)
  float* dq = nullptr;           // [B, N, H, D], added into
  float* dk = nullptr;           // [B, N, HKV, D], added into
  float* dv = nullptr;           // [B, N, HKV, D], added into
  // One fused launch instead of the two passes (hopper_bwd_fused_kernel: dQ added by bulk
  // reductions in whatever order blocks finish, so not deterministic); D <= 128, else ignored.
  bool fused = false;
  // With `fused` at D = 64 or 128: the wide fused kernel (hopper_bwd_fused_wide_kernel: 128-key
  // blocks of two consumer warpgroups, FlashAttention-3's shape) instead of 64-key blocks.
  bool wide = false;
};

// Whether a backward that need not be deterministic runs the fused kernel at `head_dim`: only
// with RINGATTN_HOPPER_BWD=fused (read once), until an sm_90 has timed it against the two
// passes (hopper_ab.py's "fused" column); only at hopper_fused_head_dims (never at D = 256).
bool hopper_fused_backward_chosen(bool deterministic, int head_dim, int head_dim_v = 0);

// Whether a fused backward runs the wide kernel (HopperBackwardParams::wide): only with
// RINGATTN_HOPPER_BWD=fused_wide (which also makes hopper_fused_backward_chosen true), at
// hopper_wide_head_dim, not deterministic. `--kernel auto` times it as a third form where a
// path has it.
bool hopper_wide_backward_chosen(bool deterministic, int head_dim);

// How a plan picks between the two passes and the fused kernel: `two_pass`, `fused`, or
// `timed` (both timed on the first backward, the faster kept). Deterministic runs and head
// dims without a fused form (not hopper_fused_head_dims: D = 256) take the two passes;
// RINGATTN_HOPPER_BWD=fused or two_pass forces one; otherwise
// `--kernel auto` (`automatic`) times them on a GPU, and on the emulated GPU only with
// RINGATTN_HOPPER_BWD=auto (its timings say nothing of a GPU's, and cost CI's time).
enum class FusedBackwardRule { two_pass, fused, timed };
FusedBackwardRule hopper_fused_backward_rule(bool deterministic, int head_dim, bool automatic,
                                             int head_dim_v = 0);

// The wide fused kernel's dK/dV items from kKeyTile-key ones (ForwardItem: a task or key tile
// and its first key row): each item whose first key is a multiple of 128 stands for itself
// and the next 64 keys of its task, so `wide` gets one item per 128 keys, in `items`' order.
// Returns "" or why the items do not pair up (an item off the 64-key grid, or one at 64 mod
// 128 whose partner 64 keys before is not in `items`); the caller then keeps the 64-key forms.
std::string hopper_wide_key_items(std::span<const ForwardItem> items,
                                  std::vector<ForwardItem>& wide);

// The fused kernels' drain adds dQ with cp.reduce.async.bulk, whose global address must be
// 16-byte aligned (row pitches are whole multiples of 16 bytes at D = 64 and 128, so the base
// decides). Plans check dq first and run the two passes instead, with a note
// (form_choice.hpp's kUnalignedDqNote); the launchers throw here rather than fault.
inline void require_bulk_aligned_dq(const float* dq, const char* what) {
  if (!aligned16(dq))
    throw RuntimeFailure(std::string(what) +
                         ": the fused kernel's bulk reduce-adds need a 16-byte aligned dq");
}

// "" when hopper_backward can run `p` on `device`, else why not (the head dim, the dtype,
// the device's compute capability, a build without sm_90a code).
std::string hopper_backward_unsupported(const HopperBackwardParams& p, int device);

// Throws RuntimeFailure where hopper_backward_unsupported says why, or a tensor map is refused.
void hopper_backward(const HopperBackwardParams& p, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

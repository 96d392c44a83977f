// The Hopper (sm_90a) forward kernel: TMA loads of Q, K and
// V tiles into 128-byte-swizzled shared memory under mbarriers, a producer warpgroup and a
// consumer warpgroup, wgmma for S = Q·Kᵀ (both K-major) and O = P·V (P from registers, V
// N-major), the online softmax between them. Dense attention on [B, N, H, D] bf16/fp16
// tensors, causal or not, sliding windows, packed documents, grouped-query heads, D = 64,
// 128 or 256, N any (only the key tiles a query tile can see are loaded); writes fp32 out
// [B, N, H, D] and the natural-log lse [B, H, N] as the native forward does (write mode).
//
// The kernel's body (hopper/forward_mainloop.cuh) is shared with the block-sparse variant
// (hopper/sparse_forward.hpp). Run on the emulated GPU in CI (tests/kernels/test_cuda_kernels.cpp);
// on a real GPU only where the build holds sm_90a code and the device is compute capability
// 9.0. Must match the float64 reference wherever it runs. Chosen by `--kernel hopper`, and by
// `auto` where cuDNN does not run (the ring's steps, block-sparse); cuDNN is faster where it
// runs (docs/PERFORMANCE.md).
// At D = 256 the dense forward runs as the ping-pong kernel: two consumer warpgroups over 128
// rows taking turns at the tensor cores (the faster form at D = 256, the slower one at
// D <= 128; RINGATTN_HOPPER_PINGPONG=0/1/2 overrides it, see hopper/forward_mainloop.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/hopper/head_dims.hpp"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {


// What every plan's note says of the Hopper family once it runs.
inline constexpr const char* kHopperStatus =
    "opt-in: exact on an H100, an H200 and the emulated GPU, slower than cuDNN where cuDNN runs "
    "(docs/GPU_PERFORMANCE.md)";

// What the dense Hopper kernels attend over (the forward's and the backward's alike).
// QkvParams' tensors (q [B, N, H, D], k and v [B, N, HKV, D]) and scalars, and the shape.
struct HopperAttention : QkvParams {
  int batch = 0, seq_len = 0, heads = 0, kv_heads = 0;
  // Sliding window: query p sees keys [p - window_left, p + window_right] (-1: unbounded;
  // causal makes the right reach 0), as AttentionConfig::window_reach() gives them.
  int64_t window_left = -1, window_right = -1;
  // Packed documents: n_docs + 1 increasing offsets from 0 to N (device memory), the same
  // for every batch; a query sees keys of its own document only. Null: one document.
  const int* cu_seqlens = nullptr;
  int n_docs = 0;
  Elem elem = Elem::bf16;
};

// Which form of the sm_90a forward runs (hopper/forward_mainloop.cuh). `rule`: as the environment
// says (RINGATTN_HOPPER_OVERLAP, _QREGS, _PINGPONG), else the measured defaults (the plain
// loop at D <= 128, ping-pong in 64-key steps at D = 256). The others name one, as `--kernel
// auto`'s timing picks it (CudaPlan): the plain loop, the next S = Q·Kᵀ overlapped with the
// softmax, Q in registers (those three D <= 128 but the plain loop; the task kernels take
// them too), or the dense ping-pong kernel in 64- or 128-key steps (128: D <= 128).
enum class HopperForwardForm : int { rule = -1, plain, overlap, qregs, pingpong64, pingpong128 };

// The form's name in notes: "plain", "overlap", "Q in registers", "ping-pong 64",
// "ping-pong 128", "by rule".
const char* to_string(HopperForwardForm f);

// The forms `--kernel auto` times for a forward at `head_dim`: the dense kernel's (`dense`)
// or the task kernels'; empty where there is nothing to choose.
std::vector<HopperForwardForm> hopper_forward_forms(int head_dim, bool dense);

// Whether a plan times the forms on its first forward: `--kernel auto` (`automatic`), not
// --deterministic (the forms' roundings differ), and none of the environment's overrides set;
// on the emulated GPU only with RINGATTN_HOPPER_FWD=auto (its timings say nothing of a GPU's).
bool hopper_forward_forms_timed(bool deterministic, bool automatic);

// Whether RINGATTN_HOPPER_QREGS=1 makes every sm_90a forward (and backward pass) keep its
// resident tiles in registers: a form no GPU has passed yet, which plans then note.
bool hopper_qregs_forced();

struct HopperForwardParams : HopperAttention {
  HopperForwardForm form = HopperForwardForm::rule;
  float* out = nullptr;  // [B, N, H, D]
  float* lse = nullptr;  // [B, H, N]
};

// "" when hopper_forward can run `p` on `device`, else why not (the head dim, the dtype,
// the device's compute capability, a build without sm_90a code).
std::string hopper_forward_unsupported(const HopperForwardParams& p, int device);

// Throws RuntimeFailure where hopper_forward_unsupported says why, or a tensor map is refused.
void hopper_forward(const HopperForwardParams& p, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

// Which head dims each sm_90a kernel form is built for: plain constexpr predicates, with no
// CUDA header, so that plans, launchers and tests (CPU-only builds too) ask one place.
#pragma once

#include <cstdint>

namespace ringattn::kernels::cuda {

// The one (D, Dv) pair of different query/key and value head dims the sm_90a kernels are
// built for: DeepSeek's MLA, 192/128 (the plain forward, the two-pass backward and the fused
// one as dV's launch and dK's with dQ's part: no ping-pong, overlap, Q in registers or wide
// form exists at D = 192).
constexpr bool hopper_value_dim_pair(int64_t head_dim, int64_t head_dim_v) {
  return head_dim == 192 && head_dim_v == 128;
}

// The head dims the fused backward has: D <= 128 (one launch a key tile), and values of their
// own head dim at 192/128 (the two passes' dV launch, then hopper_bwd_fused_dk_kernel: dK and
// dQ's part). head_dim_v 0: head_dim.
constexpr bool hopper_fused_head_dims(int64_t head_dim, int64_t head_dim_v = 0) {
  return head_dim_v == 0 || head_dim_v == head_dim ? head_dim <= 128
                                                   : hopper_value_dim_pair(head_dim, head_dim_v);
}

// The head dims the wide fused kernel has: 128 (its two warpgroups split dQ's part by
// head-dim columns) and 64 (by keys, the two parts summed in shared memory).
constexpr bool hopper_wide_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

}  // namespace ringattn::kernels::cuda

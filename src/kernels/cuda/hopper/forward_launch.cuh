// The Hopper (sm_90a) forward's launches over any `Work` (hopper/launch_*_forward.cu call
// them): the (head dim, dtype, form) switch onto forward_mainloop.cuh's kernels, the forms'
// rules (overlap, Q in registers, ping-pong) as the environment sets them.
#pragma once

#include <string>

#include "kernels/cuda/hopper/forward_mainloop.cuh"

namespace ringattn::kernels::cuda::hopper {

// Whether the forward overlaps the next tile's S = Q·Kᵀ with this tile's softmax (D <= 128):
// only with RINGATTN_HOPPER_OVERLAP=1 (read once). With two blocks per SM the plain loop is
// faster (docs/PERFORMANCE.md): the two blocks' own interleaving already hides the softmax,
// and the second score tile costs registers and a wait on both products.
inline bool overlap_chosen() {
  static const bool on = hopper_switch(Env::hopper_overlap, {"0", "1"}) == "1";
  return on;
}

// The forward's (head dim, dtype, overlap, Q in registers) switch: as `form` names it (plain,
// overlap or qregs), or by rule (the environment's choice).
// The same launch over capped work (Capped<Work>: the kernels' instantiation with the cap).
template <class Work>
Args<Capped<Work>> with_cap(const Args<Work>& a) {
  return {a.q, a.k, a.v, a.logits, a.accumulate, Capped<Work>{a.work}};
}

// Values of their own head dim (head_dim_v != head_dim) run the plain loop, the one form
// built for them.
template <class Work>
void launch_for(int head_dim, int head_dim_v, Elem elem, const char* name, const Args<Work>& a,
                dim3 grid, cudaStream_t stream, HopperForwardForm form = HopperForwardForm::rule) {
  if constexpr (!CapOf<Work>::value)
    if (a.logits.capped())
      return launch_for(head_dim, head_dim_v, elem, name, with_cap(a), grid, stream, form);
  if (head_dim_v != head_dim) {
    dispatch_value_dim(head_dim, head_dim_v, elem, [&]<int kD, int kDv, bool kBf16>() {
      launch(name, &hopper_fwd_kernel<kD, kBf16, Work, false, false, kDv>, a, grid,
             static_cast<int>(smem_bytes(kD, 1, 2, kDv)), stream);
    });
    return;
  }
  const bool by_rule = form == HopperForwardForm::rule;
  const bool overlap = by_rule ? overlap_chosen() : form == HopperForwardForm::overlap;
  const bool qregs = by_rule ? qregs_chosen() : form == HopperForwardForm::qregs;
  dispatch(head_dim, elem, [&]<int kD, bool kBf16>() {
    const int smem = static_cast<int>(smem_bytes(kD, 1));
    if constexpr (kD <= 128) {  // at D = 256 the second score tile would spill (ptxas)
      if (overlap) {
        launch(name, &hopper_fwd_kernel<kD, kBf16, Work, true>, a, grid, smem, stream);
        return;
      }
      if (qregs) {
        launch(name, &hopper_fwd_kernel<kD, kBf16, Work, false, true>, a, grid, smem, stream);
        return;
      }
    }
    launch(name, &hopper_fwd_kernel<kD, kBf16, Work, false>, a, grid, smem, stream);
  });
}

// Which ping-pong forward the dense forward runs at head dim `head_dim`: 0, none; 1, 64-key
// steps; 2, 128-key steps (at D = 256, whose four stages would not fit shared memory, 64-key
// steps). By default 1 at D = 256 and 0 below, where each is the faster form
// (docs/PERFORMANCE.md). RINGATTN_HOPPER_PINGPONG=0, 1 or 2 sets it at every head dim.
// The variable is read once.
inline int pingpong_chosen(int head_dim) {
  static const int forced = [] {
    const std::string s = hopper_switch(Env::hopper_pingpong, {"0", "1", "2"});
    return s.empty() ? -1 : s[0] - '0';
  }();
  if (forced >= 0) return forced;
  return head_dim == 256 ? 1 : 0;
}

// The ping-pong forward's (head dim, dtype, step) switch, over a grid of 128-row blocks.
template <class Work>
void launch_pingpong(int head_dim, Elem elem, int step, const char* name, const Args<Work>& a,
                     dim3 grid, cudaStream_t stream) {
  if constexpr (!CapOf<Work>::value)
    if (a.logits.capped())
      return launch_pingpong(head_dim, elem, step, name, with_cap(a), grid, stream);
  dispatch(head_dim, elem, [&]<int kD, bool kBf16>() {
    if constexpr (kD <= 128) {
      if (step == 2) {
        launch(name, &hopper_fwd_pingpong_kernel<kD, kBf16, Work, 2>, a, grid,
               static_cast<int>(smem_bytes(kD, 2, 4)), stream, kPingPongThreads);
        return;
      }
    }
    launch(name, &hopper_fwd_pingpong_kernel<kD, kBf16, Work, 1>, a, grid,
           static_cast<int>(smem_bytes(kD, 2, 2)), stream, kPingPongThreads);
  });
}

}  // namespace ringattn::kernels::cuda::hopper

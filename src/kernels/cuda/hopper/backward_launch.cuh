// The Hopper (sm_90a) backward's launches over any `Work` (hopper/launch_*_backward.cu call
// them): one pass (the dK/dV or the dQ body), the fused kernel, the wide fused kernel.
#pragma once

#include "kernels/cuda/hopper/backward_mainloop.cuh"

namespace ringattn::kernels::cuda::hopper {

// The same launch over capped work (Capped<Work>: the kernels' instantiation with the cap).
template <class Work>
BackwardArgs<Capped<Work>> with_cap(const BackwardArgs<Work>& a) {
  return {a.q,     a.k,          a.v,            a.dout,  a.logits, a.scale, a.dout_scale,
          a.delta_factor, a.lse, a.delta, a.dq, a.dk, a.dv, Capped<Work>{a.work}};
}

// Whether the fused backwards take FlashAttention-3's order within a tile (key_tile_grads):
// only with RINGATTN_HOPPER_BWD_SCHEDULE=overlap (read once), until a GPU has timed it.
inline bool fused_overlap_chosen() {
  static const bool on =
      hopper_switch(Env::hopper_bwd_schedule, {"serial", "overlap"}) == "overlap";
  return on;
}

// The dK/dV pass's dV launch at values of their own head dim (kDv != kD), which both the two
// passes and the fused form run before their dK launch.
template <int kD, int kDv, bool kBf16, class Work>
void launch_value_dim_dv(const BackwardArgs<Work>& a, dim3 grid, cudaStream_t stream) {
  launch("hopper_bwd_dv_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradDv, false, kDv>, a,
         grid, static_cast<int>(smem_bytes(kD, 2, 2, kDv)), stream);
}

// The fused backward over work whose rows are keys: one launch at D <= 128; at values of
// their own head dim (192/128) the two passes' dV kernel, then hopper_bwd_fused_dk_kernel.
template <class Work>
void launch_fused_backward(int head_dim, int head_dim_v, Elem elem, const BackwardArgs<Work>& a,
                           dim3 grid, cudaStream_t stream) {
  if constexpr (!CapOf<Work>::value)
    if (a.logits.capped())
      return launch_fused_backward(head_dim, head_dim_v, elem, with_cap(a), grid, stream);
  if (head_dim_v != head_dim) {
    dispatch_value_dim(head_dim, head_dim_v, elem, [&]<int kD, int kDv, bool kBf16>() {
      launch_value_dim_dv<kD, kDv, kBf16>(a, grid, stream);
      launch("hopper_bwd_fused_dk_kernel",
             fused_overlap_chosen() ? &hopper_bwd_fused_dk_kernel<kD, kBf16, Work, true, kDv>
                                    : &hopper_bwd_fused_dk_kernel<kD, kBf16, Work, false, kDv>,
             a, grid, static_cast<int>(fused_smem_bytes(kD, 1, kDv)), stream);
    });
    return;
  }
  dispatch(head_dim, elem, [&]<int kD, bool kBf16>() {
    if constexpr (kD <= 128)
      launch("hopper_bwd_fused_kernel",
             fused_overlap_chosen() ? &hopper_bwd_fused_kernel<kD, kBf16, Work, true>
                                    : &hopper_bwd_fused_kernel<kD, kBf16, Work, false>,
             a, grid, static_cast<int>(fused_smem_bytes(kD)), stream);
    else
      throw RuntimeFailure("the fused Hopper backward runs D <= 128, not " + std::to_string(kD));
  });
}

// The wide fused backward over work whose blocks are 128 keys (one launch; D = 64 or 128).
template <class Work>
void launch_fused_wide_backward(int head_dim, Elem elem, const BackwardArgs<Work>& a, dim3 grid,
                                cudaStream_t stream) {
  if constexpr (!CapOf<Work>::value)
    if (a.logits.capped())
      return launch_fused_wide_backward(head_dim, elem, with_cap(a), grid, stream);
  dispatch(head_dim, elem, [&]<int kD, bool kBf16>() {
    if constexpr (kD == 64 || kD == 128)
      launch("hopper_bwd_fused_wide_kernel",
             fused_overlap_chosen() ? &hopper_bwd_fused_wide_kernel<kD, kBf16, Work, true>
                                    : &hopper_bwd_fused_wide_kernel<kD, kBf16, Work, false>,
             a, grid, static_cast<int>(fused_smem_bytes(kD, 2)), stream, kWideThreads);
    else
      throw RuntimeFailure("the wide fused Hopper backward runs D = 64 or 128, not " +
                           std::to_string(kD));
  });
}

// One pass: hopper_bwd_dkdv_kernel where the work's rows are keys (kKeyRows; at D = 256 as
// two launches, dV's then dK's), else hopper_bwd_dq_kernel (with Q and dO in registers under
// RINGATTN_HOPPER_QREGS=1, D <= 128). Values of their own head dim (head_dim_v != head_dim:
// 192/128) take two dK/dV launches as D = 256 does (dK's 96 and dV's 64 accumulator registers
// together would spill), and no registers' form.
template <bool kKeyRows, class Work>
void launch_backward_pass(int head_dim, int head_dim_v, Elem elem, const BackwardArgs<Work>& a,
                          dim3 grid, cudaStream_t stream) {
  if constexpr (!CapOf<Work>::value)
    if (a.logits.capped())
      return launch_backward_pass<kKeyRows>(head_dim, head_dim_v, elem, with_cap(a), grid, stream);
  if (head_dim_v != head_dim) {
    dispatch_value_dim(head_dim, head_dim_v, elem, [&]<int kD, int kDv, bool kBf16>() {
      const int smem = static_cast<int>(smem_bytes(kD, 2, 2, kDv));
      if constexpr (kKeyRows) {
        launch_value_dim_dv<kD, kDv, kBf16>(a, grid, stream);
        launch("hopper_bwd_dk_kernel",
               &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradDk, false, kDv>, a, grid, smem,
               stream);
      } else {
        launch("hopper_bwd_dq_kernel", &hopper_bwd_dq_kernel<kD, kBf16, Work, false, kDv>, a, grid,
               smem, stream);
      }
    });
    return;
  }
  dispatch(head_dim, elem, [&]<int kD, bool kBf16>() {
    const int smem = static_cast<int>(smem_bytes(kD, 2));
    if constexpr (kKeyRows && kD <= 128) {
      if (kD == 64 && qregs_chosen())
        launch("hopper_bwd_dkdv_kernel",
               &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradBoth, (kD == 64)>, a, grid, smem,
               stream);
      else
        launch("hopper_bwd_dkdv_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradBoth>, a,
               grid, smem, stream);
    } else if constexpr (kKeyRows) {
      launch("hopper_bwd_dv_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradDv>, a, grid,
             smem, stream);
      launch("hopper_bwd_dk_kernel", &hopper_bwd_dkdv_kernel<kD, kBf16, Work, kGradDk>, a, grid,
             smem, stream);
    } else if (kD <= 128 && qregs_chosen()) {
      launch("hopper_bwd_dq_kernel", &hopper_bwd_dq_kernel<kD, kBf16, Work, (kD <= 128)>, a, grid,
             smem, stream);
    } else {
      launch("hopper_bwd_dq_kernel", &hopper_bwd_dq_kernel<kD, kBf16, Work>, a, grid, smem, stream);
    }
  });
}

}  // namespace ringattn::kernels::cuda::hopper

// Runtime (element type, head dim) → compile-time instantiation: the one switch where the
// run-time shape picks a kernel (the BOOL_SWITCH habit of STYLE.md, for two enums).
#include "kernels/cuda/flash_params.hpp"

namespace ringattn::kernels::cuda {

namespace {

template <Elem E, typename F>
void head_dim_switch(int head_dim, F&& f) {
  switch (padded_head_dim(head_dim)) {
    case 64:
      f.template operator()<E, 64>();
      break;
    case 128:
      f.template operator()<E, 128>();
      break;
    default:
      f.template operator()<E, 256>();
      break;
  }
}

}  // namespace

void flash_forward(Elem e, const FlashForwardParams& p, cudaStream_t stream) {
  auto run = [&]<Elem E, int D>() { launch_flash_forward<E, D>(p, stream); };
  switch (e) {
    case Elem::bf16:
      head_dim_switch<Elem::bf16>(p.head_dim, run);
      break;
    case Elem::fp16:
      head_dim_switch<Elem::fp16>(p.head_dim, run);
      break;
    case Elem::fp32:
      launch_simple_forward_fp32(p, stream);
      break;
  }
}

void flash_backward(Elem e, const FlashBackwardParams& p, cudaStream_t stream) {
  auto run = [&]<Elem E, int D>() { launch_flash_backward<E, D>(p, stream); };
  switch (e) {
    case Elem::bf16:
      head_dim_switch<Elem::bf16>(p.head_dim, run);
      break;
    case Elem::fp16:
      head_dim_switch<Elem::fp16>(p.head_dim, run);
      break;
    case Elem::fp32:
      launch_simple_backward_fp32(p, stream);
      break;
  }
}

}  // namespace ringattn::kernels::cuda

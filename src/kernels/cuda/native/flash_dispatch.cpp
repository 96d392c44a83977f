// Runtime (element type, head dim) → compile-time instantiation: the one switch where the
// run-time shape picks a kernel (the BOOL_SWITCH habit of STYLE.md, for two enums).
#include <algorithm>

#include "kernels/cuda/native/flash.hpp"
#include "kernels/cuda/native/head_dim_switch.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

std::string opt_in_shortfall(const char* kernels, Elem e, int head_dim, int need, int device) {
  int limit = 0;
  RINGATTN_CUDA_CHECK(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (need <= limit) return {};
  return "the " + std::string(to_string(e)) + " " + kernels + " kernels for head dim " +
         std::to_string(head_dim) + " need " + std::to_string(need) +
         " bytes of shared memory per block; device " + std::to_string(device) + " allows " +
         std::to_string(limit);
}

std::string native_kernels_fit(int64_t head_dim, Elem e, int device) {
  if (e == Elem::fp32) return {};
  const int d = padded_head_dim(head_dim), bytes = elem_bytes(e);
  const int need = std::max(forward_smem_bytes(d, bytes), backward_smem_bytes(d, bytes));
  return opt_in_shortfall("tensor-core", e, d, need, device);
}

// The instantiation holds the wider of q/k's and v's rows (the other is zero-padded).
void flash_forward(Elem e, const FlashForwardParams& p, cudaStream_t stream) {
  auto run = [&]<Elem E, int D>() { launch_flash_forward<E, D>(p, stream); };
  const int width = std::max(p.head_dim, p.value_dim());
  switch (e) {
    case Elem::bf16:
      head_dim_switch<Elem::bf16>(width, run);
      break;
    case Elem::fp16:
      head_dim_switch<Elem::fp16>(width, run);
      break;
    case Elem::fp32:
      launch_simple_forward_fp32(p, stream);
      break;
  }
}

void flash_backward(Elem e, const FlashBackwardParams& p, cudaStream_t stream) {
  auto run = [&]<Elem E, int D>() { launch_flash_backward<E, D>(p, stream); };
  const int width = std::max(p.head_dim, p.value_dim());
  switch (e) {
    case Elem::bf16:
      head_dim_switch<Elem::bf16>(width, run);
      break;
    case Elem::fp16:
      head_dim_switch<Elem::fp16>(width, run);
      break;
    case Elem::fp32:
      launch_simple_backward_fp32(p, stream);
      break;
  }
}

}  // namespace ringattn::kernels::cuda

// Runtime (element type, head dim) → compile-time instantiation of the block-sparse kernels:
// the one switch where the run-time shape picks a kernel, as flash_dispatch.cpp does for the
// flash kernels.
#include <algorithm>

#include "kernels/cuda/native/head_dim_switch.hpp"
#include "kernels/cuda/native/sparse.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

std::string sparse_kernels_fit(int64_t head_dim, Elem e, int device) {
  if (e == Elem::fp32) return {};
  const int d = padded_head_dim(head_dim), bytes = elem_bytes(e);
  const int need =
      std::max(sparse_forward_smem_bytes(d, bytes), sparse_backward_smem_bytes(d, bytes));
  return opt_in_shortfall("block-sparse tensor-core", e, d, need, device);
}

void sparse_forward(Elem e, const SparseForwardParams& p, cudaStream_t stream) {
  if (e == Elem::fp32) return launch_sparse_simple_forward_fp32(p, stream);
  auto run = [&]<Elem E, int D>() { launch_sparse_forward<E, D>(p, stream); };
  const int width = std::max(p.head_dim, p.value_dim());  // the wider rows; the other padded
  if (e == Elem::bf16)
    head_dim_switch<Elem::bf16>(width, run);
  else
    head_dim_switch<Elem::fp16>(width, run);
}

void sparse_backward(Elem e, const SparseBackwardParams& p, cudaStream_t stream) {
  if (e == Elem::fp32) return launch_sparse_simple_backward_fp32(p, stream);
  auto run = [&]<Elem E, int D>() { launch_sparse_backward<E, D>(p, stream); };
  const int width = std::max(p.head_dim, p.value_dim());
  if (e == Elem::bf16)
    head_dim_switch<Elem::bf16>(width, run);
  else
    head_dim_switch<Elem::fp16>(width, run);
}

}  // namespace ringattn::kernels::cuda

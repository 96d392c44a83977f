// Runtime (element type, head dim) → compile-time instantiation of the block-sparse kernels:
// the one switch where the run-time shape picks a kernel, as flash_dispatch.cpp does for the
// flash kernels.
#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/sparse_params.hpp"

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

std::string sparse_kernels_fit(int64_t head_dim, Elem e, int device) {
  if (e == Elem::fp32) return {};
  int limit = 0;
  RINGATTN_CUDA_CHECK(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int d = padded_head_dim(head_dim), bytes = elem_bytes(e);
  const int need =
      std::max(sparse_forward_smem_bytes(d, bytes), sparse_backward_smem_bytes(d, bytes));
  if (need <= limit) return {};
  return "the " + std::string(to_string(e)) + " block-sparse tensor-core kernels for head dim " +
         std::to_string(d) + " need " + std::to_string(need) +
         " bytes of shared memory per block; device " + std::to_string(device) + " allows " +
         std::to_string(limit);
}

void sparse_forward(Elem e, const SparseForwardParams& p, cudaStream_t stream) {
  if (e == Elem::fp32) return launch_sparse_simple_forward_fp32(p, stream);
  auto run = [&]<Elem E, int D>() { launch_sparse_forward<E, D>(p, stream); };
  if (e == Elem::bf16)
    head_dim_switch<Elem::bf16>(p.head_dim, run);
  else
    head_dim_switch<Elem::fp16>(p.head_dim, run);
}

void sparse_backward(Elem e, const SparseBackwardParams& p, cudaStream_t stream) {
  if (e == Elem::fp32) return launch_sparse_simple_backward_fp32(p, stream);
  auto run = [&]<Elem E, int D>() { launch_sparse_backward<E, D>(p, stream); };
  if (e == Elem::bf16)
    head_dim_switch<Elem::bf16>(p.head_dim, run);
  else
    head_dim_switch<Elem::fp16>(p.head_dim, run);
}

}  // namespace ringattn::kernels::cuda

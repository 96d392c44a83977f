// The fp32 path: simple CUDA-core kernels, one warp per row, for inputs kept in fp32
// (--dtype fp32) where bf16/fp16 rounding would exceed the tolerance: the row bodies of
// simple_rows.cuh over a task's one run. Each lane holds up to 8 of the row's columns (head
// dim <= 256, any value); dot products are warp reductions and the softmax is online, key by
// key. Same contract and results as the CPU kernels; not fast.
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/native/flash.hpp"
#include "kernels/cuda/native/simple_rows.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using simple::kWarps;

__global__ void __launch_bounds__(kWarps * 32) simple_forward_kernel(const FlashForwardParams p) {
  const ForwardItem item = p.items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  simple::forward_rows(forward_rows_of<float>(p, item, t, t.q_stride, t.lse_stride),
                       keys_of<float>(p, t), scalars_of(p));
}

__global__ void __launch_bounds__(kWarps * 32) simple_dq_kernel(const FlashBackwardParams p) {
  const ForwardItem item = p.q_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  simple::dq_rows(dq_rows_of<float>(p, item, t, t.q_stride, t.lse_stride), keys_of<float>(p, t),
                  scalars_of(p));
}

__global__ void __launch_bounds__(kWarps * 32) simple_dkdv_kernel(const FlashBackwardParams p) {
  const ForwardItem item = p.k_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  simple::dkdv_rows(dkdv_rows_of<float>(p, item, t), queries_of<float>(p, t), scalars_of(p));
}

}  // namespace

void launch_simple_forward_fp32(const FlashForwardParams& p, cudaStream_t stream) {
  if (p.n_items == 0) return;
  launch_kernel("simple_forward_kernel", &simple_forward_kernel,
                dim3(static_cast<unsigned>(p.n_items)), dim3(kWarps * 32), 0, stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("simple_forward_kernel");
}

void launch_simple_backward_fp32(const FlashBackwardParams& p, cudaStream_t stream) {
  if (p.n_q_items > 0) {
    launch_kernel("simple_dq_kernel", &simple_dq_kernel, dim3(static_cast<unsigned>(p.n_q_items)),
                  dim3(kWarps * 32), 0, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("simple_dq_kernel");
  }
  if (p.n_k_items > 0) {
    launch_kernel("simple_dkdv_kernel", &simple_dkdv_kernel,
                  dim3(static_cast<unsigned>(p.n_k_items)), dim3(kWarps * 32), 0, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("simple_dkdv_kernel");
  }
}

}  // namespace ringattn::kernels::cuda

// The block-sparse fp32 path: simple CUDA-core kernels for inputs kept in fp32, one warp per
// row (or, for dK/dV, per key row): the row bodies of simple_rows.cuh, as in simple_fp32.cu,
// walking the work item's key spans (query spans) key by key (query by query). Each lane
// holds up to 8 of the row's columns (head dim <= 256, any value); dot products are warp
// reductions and the softmax is online. Same contract and results as the CPU block-sparse
// kernels; not fast.
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/native/simple_rows.cuh"
#include "kernels/cuda/native/sparse.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using simple::kWarps;

__global__ void __launch_bounds__(kWarps * 32)
    sparse_simple_forward_kernel(const SparseForwardParams p) {
  const ForwardItem item = p.items[blockIdx.x];
  const SparseQueryTile tile = p.tiles[item.task];
  simple::forward_rows(forward_rows_of<float>(p, item, tile, p.q_stride, p.lse_stride),
                       keys_of<float>(p, p.spans, tile), scalars_of(p));
}

__global__ void __launch_bounds__(kWarps * 32)
    sparse_simple_dq_kernel(const SparseBackwardParams p) {
  const ForwardItem item = p.q_items[blockIdx.x];
  const SparseQueryTile tile = p.q_tiles[item.task];
  simple::dq_rows(dq_rows_of<float>(p, item, tile, p.q_stride, p.lse_stride),
                  keys_of<float>(p, p.key_spans, tile), scalars_of(p));
}

__global__ void __launch_bounds__(kWarps * 32)
    sparse_simple_dkdv_kernel(const SparseBackwardParams p) {
  const ForwardItem item = p.k_items[blockIdx.x];
  const SparseKeyTile tile = p.k_tiles[item.task];
  simple::dkdv_rows(dkdv_rows_of<float>(p, item, tile), queries_of<float>(p, tile), scalars_of(p));
}

}  // namespace

void launch_sparse_simple_forward_fp32(const SparseForwardParams& p, cudaStream_t stream) {
  if (p.n_items == 0) return;
  launch_kernel("sparse_simple_forward_kernel", &sparse_simple_forward_kernel,
                dim3(static_cast<unsigned>(p.n_items)), dim3(kWarps * 32), 0, stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("sparse_simple_forward_kernel");
}

void launch_sparse_simple_backward_fp32(const SparseBackwardParams& p, cudaStream_t stream) {
  if (p.n_q_items > 0) {
    launch_kernel("sparse_simple_dq_kernel", &sparse_simple_dq_kernel,
                  dim3(static_cast<unsigned>(p.n_q_items)), dim3(kWarps * 32), 0, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("sparse_simple_dq_kernel");
  }
  if (p.n_k_items > 0) {
    launch_kernel("sparse_simple_dkdv_kernel", &sparse_simple_dkdv_kernel,
                  dim3(static_cast<unsigned>(p.n_k_items)), dim3(kWarps * 32), 0, stream, p);
    RINGATTN_CUDA_CHECK_LAUNCH("sparse_simple_dkdv_kernel");
  }
}

}  // namespace ringattn::kernels::cuda

// cuDNN views' results (see view_results.hpp): a view's output rows and stats stored into (or
// merged by lse with) out/lse, the stats gathered back for its backward, and a view's
// gradients added into the fp32 gradients.
#include <cmath>

#include "kernels/cuda/cudnn/view_results.hpp"
#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/ops/launch_shape.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using namespace ops_detail;

// One thread per stats entry, in store_view_result_kernel's row order.
// Row r of a view's stats ([B·S, Hg, m] in this order) as (batch, position, head).
struct ViewRow {
  int64_t b, n, h;
};
__device__ __forceinline__ ViewRow view_row(const ViewResultParams& p, int64_t r) {
  const int64_t segs = p.seq_len / p.segment;
  const int64_t i = r % p.rows;
  const int64_t hh = (r / p.rows) % p.head_count;
  const int64_t bs = r / (p.rows * p.head_count);
  return {bs / segs, (bs % segs) * p.segment + p.offset + i * p.dilation,
          p.first_head + hh * p.head_step};
}

__global__ void gather_view_stats_kernel(const ViewResultParams p, float* stats) {
  const int64_t rows = p.batch * (p.seq_len / p.segment) * p.head_count * p.rows;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const ViewRow v = view_row(p, r);
    stats[r] = p.lse[(v.b * p.heads + v.h) * p.seq_len + v.n];
  }
}

template <typename T>
__global__ void add_view_kernel(const T* src, float* dst, const StridedView v, float scale) {
  const int64_t n = v.dims[0] * v.dims[1] * v.dims[2] * v.dims[3];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, at = v.offset;
    for (int a = 3; a >= 0; --a) {
      at += rest % v.dims[a] * v.strides[a];
      rest /= v.dims[a];
    }
    dst[at] += to_float(src[at]) * scale;
  }
}

// One warp per row of the view.
template <typename T>
__global__ void store_view_result_kernel(const ViewResultParams p) {
  const int64_t segs = p.seq_len / p.segment;
  const int64_t rows = p.batch * segs * p.head_count * p.rows;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < rows;
       r += warps) {
    const auto [b, n, h] = view_row(p, r);
    const int64_t at = ((b * p.seq_len + n) * p.heads + h) * p.head_dim;
    const T* src = static_cast<const T*>(p.o_scratch) + at;
    float* dst = p.out + at;
    float* lse = p.lse + (b * p.heads + h) * p.seq_len + n;
    // A row without keys: neither its O nor its stat is read (cuDNN's values there are its own).
    const int64_t i = r % p.rows;
    const bool keyed = i >= p.keyed_begin && i < p.keyed_end;
    const float lb = keyed ? p.stats[r] : -INFINITY;
    if (!p.accumulate) {
      for (int64_t d = lane; d < p.head_dim; d += 32)
        dst[d] = keyed ? to_float(src[d]) * p.out_scale : 0.0f;
      if (lane == 0) *lse = lb;
      continue;
    }
    const float la = *lse;
    __syncwarp();
    if (!(lb > -INFINITY && lb < INFINITY)) continue;  // -inf (no key), NaN, inf: nothing
    float ca = 0.0f, cb = 1.0f, new_lse = lb;
    if (la != -INFINITY) {
      const float mx = fmaxf(la, lb);
      const float wa = expf(la - mx), wb = expf(lb - mx);
      const float inv = 1.0f / (wa + wb);
      ca = wa * inv;
      cb = wb * inv;
      new_lse = mx + logf(wa + wb);
    }
    for (int64_t d = lane; d < p.head_dim; d += 32)
      dst[d] = (ca == 0.0f ? 0.0f : ca * dst[d]) + cb * to_float(src[d]);
    if (lane == 0) *lse = new_lse;
  }
}

}  // namespace

void launch_gather_view_stats(const ViewResultParams& p, float* stats, cudaStream_t stream) {
  const int64_t rows = p.batch * (p.seq_len / p.segment) * p.head_count * p.rows;
  if (rows == 0) return;
  launch_kernel("gather_view_stats_kernel", &gather_view_stats_kernel,
                dim3(blocks_for(rows, kThreads * 4)), dim3(kThreads), 0, stream, p, stats);
  RINGATTN_CUDA_CHECK_LAUNCH("gather_view_stats_kernel");
}

void launch_store_view_result(Elem e, const ViewResultParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * (p.seq_len / p.segment) * p.head_count * p.rows;
  if (rows == 0) return;
  const unsigned blocks = blocks_for(rows, kThreads / 32);
  switch (e) {
    case Elem::bf16:
      launch_kernel("store_view_result_kernel", &store_view_result_kernel<__nv_bfloat16>,
                    dim3(blocks), dim3(kThreads), 0, stream, p);
      break;
    case Elem::fp16:
      launch_kernel("store_view_result_kernel", &store_view_result_kernel<__half>, dim3(blocks),
                    dim3(kThreads), 0, stream, p);
      break;
    case Elem::fp32:
      launch_kernel("store_view_result_kernel", &store_view_result_kernel<float>, dim3(blocks),
                    dim3(kThreads), 0, stream, p);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("store_view_result_kernel");
}

void launch_add_view(Elem e, const void* src, float* dst, const StridedView& v, cudaStream_t stream,
                     float scale) {
  const int64_t n = v.dims[0] * v.dims[1] * v.dims[2] * v.dims[3];
  if (n <= 0) return;
  const dim3 grid(blocks_for(n, kThreads * 4)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("add_view_kernel", &add_view_kernel<__nv_bfloat16>, grid, block, 0, stream,
                    static_cast<const __nv_bfloat16*>(src), dst, v, scale);
      break;
    case Elem::fp16:
      launch_kernel("add_view_kernel", &add_view_kernel<__half>, grid, block, 0, stream,
                    static_cast<const __half*>(src), dst, v, scale);
      break;
    case Elem::fp32:
      launch_kernel("add_view_kernel", &add_view_kernel<float>, grid, block, 0, stream,
                    static_cast<const float*>(src), dst, v, scale);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("add_view_kernel");
}

}  // namespace ringattn::kernels::cuda

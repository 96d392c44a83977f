// The backward's start and the small float operations around the attention kernels (see
// device_ops.hpp): fills, scales, 2-D adds, the row sums D = rowsum(out * dout).
#include <cmath>

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/ops/launch_shape.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using namespace ops_detail;

__global__ void fill_kernel(float* data, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    data[i] = value;
}

// One warp per lse row (b, h, n).
template <typename T>
__global__ void row_dot_kernel(const RowDotParams p) {
  for_each_row_by_warp(p.batch, p.heads, p.seq_len,
                       [&](int64_t r, int64_t b, int64_t h, int64_t n, int lane) {
                         const int64_t at = ((b * p.seq_len + n) * p.heads + h) * p.head_dim;
                         const T* g = static_cast<const T*>(p.dout) + at;
                         const float* o = p.out + at;
                         float s = 0.0f;
                         for (int64_t d = lane; d < p.head_dim; d += 32) s += o[d] * to_float(g[d]);
#pragma unroll
                         for (int off = 16; off > 0; off >>= 1)
                           s += __shfl_xor_sync(0xffffffffu, s, off);
                         if (lane == 0) p.delta[r] = s;
                       });
}

// dst[r * dpitch + c] += src[r * spitch + c] for r < height, c < width (floats).
__global__ void add_2d_kernel(float* dst, int64_t dpitch, const float* src, int64_t spitch,
                              int64_t width, int64_t height) {
  const int64_t n = width * height;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    dst[r * dpitch + c] += src[r * spitch + c];
  }
}

__global__ void scale_kernel(float* data, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    data[i] *= factor;
}

}  // namespace

const char* to_string(Elem e) {
  switch (e) {
    case Elem::bf16:
      return "bf16";
    case Elem::fp16:
      return "fp16";
    case Elem::fp32:
      return "fp32";
  }
  return "?";
}

void fill_floats(float* data, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel("fill_kernel", &fill_kernel, dim3(blocks_for(n, kThreads * 4)), dim3(kThreads), 0,
                stream, data, n, value);
  RINGATTN_CUDA_CHECK_LAUNCH("fill_kernel");
}

void launch_row_dot(Elem e, const RowDotParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads * p.seq_len;
  if (rows == 0) return;
  const unsigned blocks = blocks_for(rows, kThreads / 32);
  switch (e) {
    case Elem::bf16:
      launch_kernel("row_dot_kernel", &row_dot_kernel<__nv_bfloat16>, dim3(blocks), dim3(kThreads),
                    0, stream, p);
      break;
    case Elem::fp16:
      launch_kernel("row_dot_kernel", &row_dot_kernel<__half>, dim3(blocks), dim3(kThreads), 0,
                    stream, p);
      break;
    case Elem::fp32:
      launch_kernel("row_dot_kernel", &row_dot_kernel<float>, dim3(blocks), dim3(kThreads), 0,
                    stream, p);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("row_dot_kernel");
}

void start_backward(Elem e, const RowDotParams& rd, int64_t kv_heads, float* dq, float* dk,
                    float* dv, cudaStream_t stream, int64_t head_dim_qk) {
  const auto rows = static_cast<std::size_t>(rd.batch * rd.seq_len);
  const auto d = static_cast<std::size_t>(head_dim_qk > 0 ? head_dim_qk : rd.head_dim);
  const auto dv_cols = static_cast<std::size_t>(rd.head_dim);
  const auto hkv = static_cast<std::size_t>(kv_heads);
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(
      dq, 0, rows * static_cast<std::size_t>(rd.heads) * d * sizeof(float), stream));
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dk, 0, rows * hkv * d * sizeof(float), stream));
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dv, 0, rows * hkv * dv_cols * sizeof(float), stream));
  launch_row_dot(e, rd, stream);
}

void scale_floats(float* data, int64_t n, float factor, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel("scale_kernel", &scale_kernel, dim3(blocks_for(n, kThreads * 4)), dim3(kThreads), 0,
                stream, data, n, factor);
  RINGATTN_CUDA_CHECK_LAUNCH("scale_kernel");
}

void add_floats_2d(float* dst, int64_t dpitch, const float* src, int64_t spitch, int64_t width,
                   int64_t height, cudaStream_t stream) {
  if (width <= 0 || height <= 0) return;
  launch_kernel("add_2d_kernel", &add_2d_kernel, dim3(blocks_for(width * height, kThreads * 4)),
                dim3(kThreads), 0, stream, dst, dpitch, src, spitch, width, height);
  RINGATTN_CUDA_CHECK_LAUNCH("add_2d_kernel");
}

}  // namespace ringattn::kernels::cuda

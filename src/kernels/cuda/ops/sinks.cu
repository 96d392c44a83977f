// Attention sinks on the device (see device_ops.hpp): the forward's epilogue that folds each
// head's sink logit into lse and out, and the sink logits' gradient.
#include <cmath>

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/ops/launch_shape.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using namespace ops_detail;

// One warp per lse row (b, h, n): the sink's epilogue. Every lane computes the row's factor
// from lse before lane 0 rewrites it.
__global__ void apply_sinks_kernel(const SinkParams p) {
  for_each_row_by_warp(p.batch, p.heads, p.seq_len,
                       [&](int64_t r, int64_t b, int64_t h, int64_t n, int lane) {
                         const float sink = p.sinks[h];
                         if (sink == -INFINITY) return;  // no sink for this head
                         const float l = p.lse[r];
                         __syncwarp();
                         const float m = fmaxf(l, sink);
                         const float merged = m + logf(expf(l - m) + expf(sink - m));
                         const float factor = expf(l - merged);  // 0 for a row that attends no key
                         float* o = p.out + ((b * p.seq_len + n) * p.heads + h) * p.head_dim;
                         for (int64_t d = lane; d < p.head_dim; d += 32) o[d] *= factor;
                         if (lane == 0) p.lse[r] = merged;
                       });
}

// One warp per head: its rows in order, each lane summing its columns' share weighted by the
// row's exp(sink - lse), then the lanes' sums by a fixed butterfly.
template <typename T>
__global__ void sink_gradient_kernel(const SinkParams p) {
  const int64_t h = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  const float sink = p.sinks[h];
  double acc = 0.0;
  if (sink != -INFINITY) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t n = 0; n < p.seq_len; ++n) {
        const double w = exp(static_cast<double>(sink) -
                             static_cast<double>(p.lse[(b * p.heads + h) * p.seq_len + n]));
        const int64_t at = ((b * p.seq_len + n) * p.heads + h) * p.head_dim;
        const T* g = static_cast<const T*>(p.dout) + at;
        const float* o = p.out + at;
        float s = 0.0f;
        for (int64_t d = lane; d < p.head_dim; d += 32) s += o[d] * to_float(g[d]);
        acc += w * static_cast<double>(s);
      }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) p.dsinks[h] = static_cast<float>(-acc);
}

}  // namespace

void launch_apply_sinks(const SinkParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads * p.seq_len;
  if (rows == 0) return;
  launch_kernel("apply_sinks_kernel", &apply_sinks_kernel, dim3(blocks_for(rows, kThreads / 32)),
                dim3(kThreads), 0, stream, p);
  RINGATTN_CUDA_CHECK_LAUNCH("apply_sinks_kernel");
}

void launch_sink_gradient(Elem e, const SinkParams& p, cudaStream_t stream) {
  if (p.heads == 0) return;
  const dim3 grid(static_cast<unsigned>(p.heads)), block(32);
  switch (e) {
    case Elem::bf16:
      launch_kernel("sink_gradient_kernel", &sink_gradient_kernel<__nv_bfloat16>, grid, block, 0,
                    stream, p);
      break;
    case Elem::fp16:
      launch_kernel("sink_gradient_kernel", &sink_gradient_kernel<__half>, grid, block, 0, stream,
                    p);
      break;
    case Elem::fp32:
      launch_kernel("sink_gradient_kernel", &sink_gradient_kernel<float>, grid, block, 0, stream,
                    p);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("sink_gradient_kernel");
}

}  // namespace ringattn::kernels::cuda

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

// One warp per (run of kSinkRunRows rows, head), eight warps a block: the run's rows in
// order, each lane summing its columns' share of out ∘ dout weighted by the row's
// exp(sink - lse), then the lanes' sums by a fixed butterfly, into partials[h][run].
constexpr int kSinkWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kSinkWarps * 32) sink_runs_kernel(const SinkParams p,
                                                                    int64_t runs) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t run = static_cast<int64_t>(blockIdx.x) * kSinkWarps + threadIdx.x / 32;
  const int64_t h = blockIdx.y;
  if (run >= runs) return;
  const float sink = p.sinks[h];
  const int64_t rows = p.batch * p.seq_len;
  double acc = 0.0;
  if (sink != -INFINITY) {
    for (int64_t r = run * kSinkRunRows; r < (run + 1) * kSinkRunRows && r < rows; ++r) {
      const int64_t b = r / p.seq_len, n = r % p.seq_len;
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
  if (lane == 0) p.partials[h * runs + run] = acc;
}

// One warp per head: lane l adds runs l, l + 32, ... in order, then a fixed butterfly.
__global__ void sink_sum_kernel(const SinkParams p, int64_t runs) {
  const int64_t h = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  double acc = 0.0;
  for (int64_t c = lane; c < runs; c += 32) acc += p.partials[h * runs + c];
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
  const int64_t runs = sink_gradient_partials(p.batch, p.seq_len, 1);
  if (runs == 0) {  // no rows: every head's gradient is 0
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(p.dsinks, 0,
                                        static_cast<std::size_t>(p.heads) * sizeof(float), stream));
    return;
  }
  const dim3 grid(blocks_for(runs, kSinkWarps), static_cast<unsigned>(p.heads)),
      block(kSinkWarps * 32);
  switch (e) {
    case Elem::bf16:
      launch_kernel("sink_runs_kernel", &sink_runs_kernel<__nv_bfloat16>, grid, block, 0, stream,
                    p, runs);
      break;
    case Elem::fp16:
      launch_kernel("sink_runs_kernel", &sink_runs_kernel<__half>, grid, block, 0, stream, p,
                    runs);
      break;
    case Elem::fp32:
      launch_kernel("sink_runs_kernel", &sink_runs_kernel<float>, grid, block, 0, stream, p, runs);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("sink_runs_kernel");
  launch_kernel("sink_sum_kernel", &sink_sum_kernel, dim3(static_cast<unsigned>(p.heads)),
                dim3(32), 0, stream, p, runs);
  RINGATTN_CUDA_CHECK_LAUNCH("sink_sum_kernel");
}

}  // namespace ringattn::kernels::cuda

// Small device kernels around the attention kernels (see device_ops.hpp): grid-stride
// loops or one warp per row; all launches checked.
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"

namespace ringattn::kernels::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int64_t per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 65535 * 16 ? (b < 1 ? 1 : b) : 65535 * 16);
}

__global__ void fill_kernel(float* data, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    data[i] = value;
}

// Calls f(r, b, h, n, lane) for every lse row r = (b·H + h)·N + n of a [B, H, N] grid, one
// warp per row (grid-stride); every lane of the warp takes part.
template <typename F>
__device__ void for_each_row_by_warp(int64_t batch, int64_t heads, int64_t seq_len, F&& f) {
  const int64_t rows = batch * heads * seq_len;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < rows;
       r += warps) {
    const int64_t n = r % seq_len, bh = r / seq_len;
    f(r, bh / heads, bh % heads, n, lane);
  }
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

// The run holding packed row `row` (runs sorted by base, covering [0, total_rows)).
__device__ __forceinline__ int64_t run_of(const PackParams& p, int64_t row) {
  int64_t lo = 0, hi = p.n_runs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.runs[mid].base <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// One warp per packed row: its K and V rows, element by element.
template <typename T>
__global__ void pack_rows_kernel(const PackParams p, const T* k, const T* v, T* buf) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       r < p.total_rows; r += warps) {
    const PackedRun run = p.runs[run_of(p, r)];
    const int64_t at = run.row0 + (r - run.base) * run.stride;
    const int64_t br = run.buf_row + (r - run.base);
    T* kb = buf + br * p.head_dim;
    T* vb = buf + (p.buffer_rows + br) * p.head_dim;
    for (int64_t d = lane; d < p.head_dim; d += 32) {
      kb[d] = k[at + d];
      vb[d] = v[at + d];
    }
  }
}

// Parallel over packed rows (no two name one row).
__global__ void unpack_add_kernel(const PackParams p, const float* buf, float* dk, float* dv) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       r < p.total_rows; r += warps) {
    const PackedRun run = p.runs[run_of(p, r)];
    const int64_t at = run.row0 + (r - run.base) * run.stride;
    const int64_t br = run.buf_row + (r - run.base);
    const float* kb = buf + br * p.head_dim;
    const float* vb = buf + (p.buffer_rows + br) * p.head_dim;
    for (int64_t d = lane; d < p.head_dim; d += 32) {
      dk[at + d] += kb[d];
      dv[at + d] += vb[d];
    }
  }
}

// One thread per column, every packed row in order (rows may repeat across runs).
__global__ void unpack_add_serial_kernel(const PackParams p, const float* buf, float* dk,
                                         float* dv) {
  const int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (d >= p.head_dim) return;
  for (int64_t i = 0; i < p.n_runs; ++i) {
    const PackedRun run = p.runs[i];
    for (int64_t j = 0; j < run.rows; ++j) {
      const int64_t at = run.row0 + j * run.stride + d;
      dk[at] += buf[(run.buf_row + j) * p.head_dim + d];
      dv[at] += buf[(p.buffer_rows + run.buf_row + j) * p.head_dim + d];
    }
  }
}

// One warp per row: the same arithmetic as merge_lse_row.
__global__ void merge_lse_kernel(const MergeRows m) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; r < m.rows;
       r += warps) {
    // Shard rows (MergeRows::lse_heads): lse [B, heads, n] under out rows [B, n, heads], as
    // shard_lse_index() says.
    const int64_t h = m.lse_heads ? r % m.lse_heads : 0;
    const int64_t i = m.lse_heads ? (r / m.lse_heads) % m.lse_rows : 0;
    const int64_t b = m.lse_heads ? r / (m.lse_heads * m.lse_rows) : 0;
    const int64_t shard_lse = (b * m.lse_heads + h) * m.lse_rows + i;
    float* oa = m.acc_out + r * m.acc_out_stride;
    float* la_ptr = m.acc_lse + (m.lse_heads ? shard_lse : r * m.acc_lse_stride);
    const float* ob = m.part_out + r * m.part_out_stride;
    const float lb = m.part_lse[m.lse_heads ? shard_lse : r * m.part_lse_stride];
    const float la = *la_ptr;
    __syncwarp();
    if (lb == -INFINITY) continue;
    if (la == -INFINITY) {
      for (int64_t d = lane; d < m.d; d += 32) oa[d] = ob[d];
      if (lane == 0) *la_ptr = lb;
      continue;
    }
    const float mx = fmaxf(la, lb);
    const float wa = expf(la - mx), wb = expf(lb - mx);
    const float inv = 1.0f / (wa + wb);
    const float ca = wa * inv, cb = wb * inv;
    for (int64_t d = lane; d < m.d; d += 32) oa[d] = ca * oa[d] + cb * ob[d];
    if (lane == 0) *la_ptr = mx + logf(wa + wb);
  }
}

// One warp per row of the view.
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
__global__ void floats_to_elem_kernel(const float* src, T* dst, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      dst[i] = __float2bfloat16_rn(src[i] * scale);
    else
      dst[i] = __float2half_rn(src[i] * scale);
  }
}

template <typename T>
__global__ void elem_to_floats_kernel(const T* src, float* dst, int64_t n, bool add,
                                      float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = add ? dst[i] + to_float(src[i]) * scale : to_float(src[i]) * scale;
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
                    float* dv, cudaStream_t stream) {
  const auto rows = static_cast<std::size_t>(rd.batch * rd.seq_len);
  const auto d = static_cast<std::size_t>(rd.head_dim);
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(
      dq, 0, rows * static_cast<std::size_t>(rd.heads) * d * sizeof(float), stream));
  for (float* g : {dk, dv})
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(
        g, 0, rows * static_cast<std::size_t>(kv_heads) * d * sizeof(float), stream));
  launch_row_dot(e, rd, stream);
}

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

void launch_pack_rows(Elem e, const PackParams& p, const void* k, const void* v, void* buf,
                      cudaStream_t stream) {
  if (p.total_rows == 0) return;
  const dim3 grid(blocks_for(p.total_rows, kThreads / 32)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("pack_rows_kernel", &pack_rows_kernel<__nv_bfloat16>, grid, block, 0, stream, p,
                    static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v),
                    static_cast<__nv_bfloat16*>(buf));
      break;
    case Elem::fp16:
      launch_kernel("pack_rows_kernel", &pack_rows_kernel<__half>, grid, block, 0, stream, p,
                    static_cast<const __half*>(k), static_cast<const __half*>(v),
                    static_cast<__half*>(buf));
      break;
    case Elem::fp32:
      launch_kernel("pack_rows_kernel", &pack_rows_kernel<float>, grid, block, 0, stream, p,
                    static_cast<const float*>(k), static_cast<const float*>(v),
                    static_cast<float*>(buf));
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("pack_rows_kernel");
}

void launch_unpack_add_rows(const PackParams& p, const float* buf, float* dk, float* dv,
                            bool rows_may_repeat, cudaStream_t stream) {
  if (p.total_rows == 0) return;
  if (rows_may_repeat) {
    launch_kernel("unpack_add_serial_kernel", &unpack_add_serial_kernel,
                  dim3(blocks_for(p.head_dim, 128)), dim3(128), 0, stream, p, buf, dk, dv);
    RINGATTN_CUDA_CHECK_LAUNCH("unpack_add_serial_kernel");
  } else {
    launch_kernel("unpack_add_kernel", &unpack_add_kernel,
                  dim3(blocks_for(p.total_rows, kThreads / 32)), dim3(kThreads), 0, stream, p, buf,
                  dk, dv);
    RINGATTN_CUDA_CHECK_LAUNCH("unpack_add_kernel");
  }
}

void launch_merge_lse(const MergeRows& m, cudaStream_t stream) {
  if (m.rows == 0) return;
  launch_kernel("merge_lse_kernel", &merge_lse_kernel, dim3(blocks_for(m.rows, kThreads / 32)),
                dim3(kThreads), 0, stream, m);
  RINGATTN_CUDA_CHECK_LAUNCH("merge_lse_kernel");
}

void launch_gather_view_stats(const ViewResultParams& p, float* stats, cudaStream_t stream) {
  const int64_t rows = p.batch * (p.seq_len / p.segment) * p.head_count * p.rows;
  if (rows == 0) return;
  launch_kernel("gather_view_stats_kernel", &gather_view_stats_kernel,
                dim3(blocks_for(rows, kThreads * 4)), dim3(kThreads), 0, stream, p, stats);
  RINGATTN_CUDA_CHECK_LAUNCH("gather_view_stats_kernel");
}

void launch_floats_to_elem(Elem e, const float* src, void* dst, int64_t n, cudaStream_t stream,
                           float scale) {
  if (n <= 0) return;
  const dim3 grid(blocks_for(n, kThreads * 4)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("floats_to_elem_kernel", &floats_to_elem_kernel<__nv_bfloat16>, grid, block, 0,
                    stream, src, static_cast<__nv_bfloat16*>(dst), n, scale);
      break;
    case Elem::fp16:
      launch_kernel("floats_to_elem_kernel", &floats_to_elem_kernel<__half>, grid, block, 0, stream,
                    src, static_cast<__half*>(dst), n, scale);
      break;
    case Elem::fp32:
      if (scale != 1.0f)
        throw RuntimeFailure("launch_floats_to_elem: a scaled fp32 copy is not implemented");
      RINGATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, stream));
      return;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("floats_to_elem_kernel");
}

void launch_elem_to_floats(Elem e, const void* src, float* dst, int64_t n, bool add,
                           cudaStream_t stream, float scale) {
  if (n <= 0) return;
  const dim3 grid(blocks_for(n, kThreads * 4)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("elem_to_floats_kernel", &elem_to_floats_kernel<__nv_bfloat16>, grid, block, 0,
                    stream, static_cast<const __nv_bfloat16*>(src), dst, n, add, scale);
      break;
    case Elem::fp16:
      launch_kernel("elem_to_floats_kernel", &elem_to_floats_kernel<__half>, grid, block, 0, stream,
                    static_cast<const __half*>(src), dst, n, add, scale);
      break;
    case Elem::fp32:
      launch_kernel("elem_to_floats_kernel", &elem_to_floats_kernel<float>, grid, block, 0, stream,
                    static_cast<const float*>(src), dst, n, add, scale);
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("elem_to_floats_kernel");
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

void launch_add_view(Elem e, const void* src, float* dst, const StridedView& v,
                     cudaStream_t stream, float scale) {
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

// The fp32 path: simple CUDA-core kernels, one warp per row, for inputs kept in fp32
// (--dtype fp32) where bf16/fp16 rounding would exceed the tolerance. Each lane holds up to 8
// of the row's columns (head dim <= 256, any value); dot products are warp reductions and
// the softmax is online, key by key. Same contract and results as the CPU kernels; not fast.
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/simple_rows.cuh"

namespace ringattn::kernels::cuda {

namespace {

using simple::dot_row;
using simple::kPerLane;
using simple::kWarps;
using simple::load_row;
using simple::warp_sum;

__global__ void __launch_bounds__(kWarps * 32) simple_forward_kernel(const FlashForwardParams p) {
  const ForwardItem item = p.items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* q = static_cast<const float*>(p.q) + t.q_row0;
  const float* k = static_cast<const float*>(p.k) + t.k_row0;
  const float* v = static_cast<const float*>(p.v) + t.k_row0;
  for (int r = warp; r < kQueryTile; r += kWarps) {
    const int64_t i = item.q_begin + r;
    if (i >= t.n_q) break;
    float qv[kPerLane], acc[kPerLane];
    load_row(qv, q + i * t.q_stride, p.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) acc[u] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const KeyRange keys = visible_key_range(t, p.causal, i, 1);  // causality and the window
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const float s = dot_row(qv, k + j * t.k_stride, p.head_dim, lane) * p.scale;
      const float m_new = fmaxf(m, s);
      const float alpha = expf(m - m_new);  // 0 on the first key (m = -inf)
      const float pj = expf(s - m_new);
      l = l * alpha + pj;
      const float* vrow = v + j * t.k_stride;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int d = lane + 32 * u;
        acc[u] = acc[u] * alpha + (d < p.head_dim ? pj * vrow[d] : 0.0f);
      }
      m = m_new;
    }
    const bool empty = l == 0.0f;
    const float row_lse = empty ? -INFINITY : m + logf(l);
    const float inv = empty ? 0.0f : 1.0f / l;
    float* orow = p.out + t.q_row0 + i * t.q_stride;
    float* lse = p.lse + t.lse0 + i * t.lse_stride;
    float ca = 0.0f, cb = inv * p.out_scale, new_lse = row_lse;
    bool write = true;
    if (p.accumulate) {
      const float la = *lse;
      __syncwarp();  // every lane has read the old lse before lane 0 replaces it
      if (row_lse == -INFINITY) {
        write = false;
      } else if (la == -INFINITY) {
        cb = inv;
      } else {
        const float mx = fmaxf(la, row_lse);
        const float wa = expf(la - mx), wb = expf(row_lse - mx);
        const float norm = 1.0f / (wa + wb);
        ca = wa * norm;
        cb = wb * norm * inv;
        new_lse = mx + logf(wa + wb);
      }
    }
    if (write) {
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int d = lane + 32 * u;
        if (d < p.head_dim) orow[d] = (ca == 0.0f ? 0.0f : ca * orow[d]) + cb * acc[u];
      }
      if (lane == 0) *lse = new_lse;
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) simple_dq_kernel(const FlashBackwardParams p) {
  const ForwardItem item = p.q_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* q = static_cast<const float*>(p.q) + t.q_row0;
  const float* dout = static_cast<const float*>(p.dout) + t.q_row0;
  const float* k = static_cast<const float*>(p.k) + t.k_row0;
  const float* v = static_cast<const float*>(p.v) + t.k_row0;
  const float d_factor = p.dout_scale / p.out_scale;
  for (int r = warp; r < kQueryTile; r += kWarps) {
    const int64_t i = item.q_begin + r;
    if (i >= t.n_q) break;
    const float L = p.lse[t.lse0 + i * t.lse_stride];
    if (L == -INFINITY) continue;  // the row attends nothing: no gradient
    const float dl = p.delta[t.lse0 + i * t.lse_stride] * d_factor;
    float qv[kPerLane], dov[kPerLane], acc[kPerLane];
    load_row(qv, q + i * t.q_stride, p.head_dim, lane);
    load_row(dov, dout + i * t.q_stride, p.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) acc[u] = 0.0f;
    const KeyRange keys = visible_key_range(t, p.causal, i, 1);  // causality and the window
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const float* krow = k + j * t.k_stride;
      const float pr = expf(dot_row(qv, krow, p.head_dim, lane) * p.scale - L);
      const float dp = dot_row(dov, v + j * t.k_stride, p.head_dim, lane) * p.dout_scale;
      const float ds = pr * (dp - dl);
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int d = lane + 32 * u;
        if (d < p.head_dim) acc[u] += ds * krow[d];
      }
    }
    float* dst = p.dq + t.q_row0 + i * t.q_stride;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int d = lane + 32 * u;
      if (d < p.head_dim) dst[d] += acc[u] * p.scale;
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) simple_dkdv_kernel(const FlashBackwardParams p) {
  const ForwardItem item = p.k_items[blockIdx.x];
  const SubseqTask t = p.tasks[item.task];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* q = static_cast<const float*>(p.q) + t.q_row0;
  const float* dout = static_cast<const float*>(p.dout) + t.q_row0;
  const float* k = static_cast<const float*>(p.k) + t.k_row0;
  const float* v = static_cast<const float*>(p.v) + t.k_row0;
  const float d_factor = p.dout_scale / p.out_scale;
  for (int r = warp; r < kKeyTile; r += kWarps) {
    const int64_t j = item.q_begin + r;
    if (j >= t.n_k) break;
    float kv[kPerLane], vv[kPerLane], dk[kPerLane], dv[kPerLane];
    load_row(kv, k + j * t.k_stride, p.head_dim, lane);
    load_row(vv, v + j * t.k_stride, p.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) dk[u] = dv[u] = 0.0f;
    const KeyRange seeing = seeing_query_range(t, p.causal, j, 1);
    for (int64_t i = seeing.begin; i < seeing.end; ++i) {
      const float L = p.lse[t.lse0 + i * t.lse_stride];
      if (L == -INFINITY) continue;
      const float* qrow = q + i * t.q_stride;
      const float* grow = dout + i * t.q_stride;
      const float pr = expf(dot_row(kv, qrow, p.head_dim, lane) * p.scale - L);
      const float dp = dot_row(vv, grow, p.head_dim, lane) * p.dout_scale;
      const float ds = pr * (dp - p.delta[t.lse0 + i * t.lse_stride] * d_factor);
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int d = lane + 32 * u;
        if (d < p.head_dim) {
          dv[u] += pr * p.dout_scale * grow[d];
          dk[u] += ds * qrow[d];
        }
      }
    }
    float* dk_row = p.dk + t.k_row0 + j * t.k_stride;
    float* dv_row = p.dv + t.k_row0 + j * t.k_stride;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int d = lane + 32 * u;
      if (d < p.head_dim) {
        dk_row[d] += dk[u] * p.scale;
        dv_row[d] += dv[u];
      }
    }
  }
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

// The block-sparse fp32 path: simple CUDA-core kernels for inputs kept in fp32, one warp per
// row (or, for dK/dV, per key row), as in simple_fp32.cu, walking the work item's key spans
// (query spans) key by key (query by query). Each lane holds up to 8 of the row's columns
// (head dim <= 256, any value); dot products are warp reductions and the softmax is online.
// Same contract and results as the CPU block-sparse kernels; not fast.
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/simple_rows.cuh"
#include "kernels/cuda/sparse_params.hpp"

namespace ringattn::kernels::cuda {

namespace {

using simple::dot_row;
using simple::kPerLane;
using simple::kWarps;
using simple::load_row;
using simple::warp_sum;

// Keys of span `sp` that query row i (of a tile of n_q rows) sees: causality and the window.
__device__ __forceinline__ KeyRange row_keys(const KeySpan& sp, int64_t n_q, int64_t i, bool causal,
                                             int64_t window_left, int64_t window_right) {
  return visible_key_range(span_view(n_q, sp.n_k, sp.causal_offset, window_left, window_right),
                           causal, i, 1);
}

__global__ void __launch_bounds__(kWarps * 32)
    sparse_simple_forward_kernel(const SparseForwardParams p) {
  const ForwardItem item = p.items[blockIdx.x];
  const SparseQueryTile tile = p.tiles[item.task];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* q = static_cast<const float*>(p.q) + tile.q_row0;
  for (int r = warp; r < kQueryTile; r += kWarps) {
    const int64_t i = item.q_begin + r;
    if (i >= tile.n_q) break;
    float qv[kPerLane], acc[kPerLane];
    load_row(qv, q + i * p.q_stride, p.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) acc[u] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t si = tile.first_span; si < tile.first_span + tile.n_spans; ++si) {
      const KeySpan sp = p.spans[si];
      const float* k = static_cast<const float*>(p.k) + sp.k_row0;
      const float* v = static_cast<const float*>(p.v) + sp.k_row0;
      const KeyRange keys = row_keys(sp, tile.n_q, i, p.causal, p.window_left, p.window_right);
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        const float s = dot_row(qv, k + j * sp.k_stride, p.head_dim, lane) * p.scale;
        const float m_new = fmaxf(m, s);
        const float alpha = expf(m - m_new);  // 0 on the first key (m = -inf)
        const float pj = expf(s - m_new);
        l = l * alpha + pj;
        const float* vrow = v + j * sp.k_stride;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int d = lane + 32 * u;
          acc[u] = acc[u] * alpha + (d < p.head_dim ? pj * vrow[d] : 0.0f);
        }
        m = m_new;
      }
    }
    const bool empty = l == 0.0f;
    const float row_lse = empty ? -INFINITY : m + logf(l);
    const float inv = empty ? 0.0f : 1.0f / l;
    float* orow = p.out + tile.q_row0 + i * p.q_stride;
    float* lse = p.lse + tile.lse0 + i * p.lse_stride;
    float ca = 0.0f, cb = inv, new_lse = row_lse;
    bool write = true;
    if (p.accumulate) {
      const float la = *lse;
      __syncwarp();  // every lane has read the old lse before lane 0 replaces it
      if (row_lse == -INFINITY) {
        write = false;
      } else if (la != -INFINITY) {
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

__global__ void __launch_bounds__(kWarps * 32)
    sparse_simple_dq_kernel(const SparseBackwardParams p) {
  const ForwardItem item = p.q_items[blockIdx.x];
  const SparseQueryTile tile = p.q_tiles[item.task];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* q = static_cast<const float*>(p.q) + tile.q_row0;
  const float* dout = static_cast<const float*>(p.dout) + tile.q_row0;
  for (int r = warp; r < kQueryTile; r += kWarps) {
    const int64_t i = item.q_begin + r;
    if (i >= tile.n_q) break;
    const float L = p.lse[tile.lse0 + i * p.lse_stride];
    if (L == -INFINITY) continue;  // the row attends nothing: no gradient
    const float dl = p.delta[tile.lse0 + i * p.lse_stride];
    float qv[kPerLane], dov[kPerLane], acc[kPerLane];
    load_row(qv, q + i * p.q_stride, p.head_dim, lane);
    load_row(dov, dout + i * p.q_stride, p.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) acc[u] = 0.0f;
    for (int64_t si = tile.first_span; si < tile.first_span + tile.n_spans; ++si) {
      const KeySpan sp = p.key_spans[si];
      const float* k = static_cast<const float*>(p.k) + sp.k_row0;
      const float* v = static_cast<const float*>(p.v) + sp.k_row0;
      const KeyRange keys = row_keys(sp, tile.n_q, i, p.causal, p.window_left, p.window_right);
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        const float* krow = k + j * sp.k_stride;
        const float pr = expf(dot_row(qv, krow, p.head_dim, lane) * p.scale - L);
        const float dp = dot_row(dov, v + j * sp.k_stride, p.head_dim, lane);
        const float ds = pr * (dp - dl);
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int d = lane + 32 * u;
          if (d < p.head_dim) acc[u] += ds * krow[d];
        }
      }
    }
    float* dst = p.dq + tile.q_row0 + i * p.q_stride;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int d = lane + 32 * u;
      if (d < p.head_dim) dst[d] += acc[u] * p.scale;
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    sparse_simple_dkdv_kernel(const SparseBackwardParams p) {
  const ForwardItem item = p.k_items[blockIdx.x];
  const SparseKeyTile tile = p.k_tiles[item.task];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* k = static_cast<const float*>(p.k) + tile.k_row0;
  const float* v = static_cast<const float*>(p.v) + tile.k_row0;
  for (int r = warp; r < kKeyTile; r += kWarps) {
    const int64_t j = item.q_begin + r;
    if (j >= tile.n_k) break;
    float kv[kPerLane], vv[kPerLane], dk[kPerLane], dv[kPerLane];
    load_row(kv, k + j * tile.k_stride, p.head_dim, lane);
    load_row(vv, v + j * tile.k_stride, p.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) dk[u] = dv[u] = 0.0f;
    for (int64_t si = tile.first_span; si < tile.first_span + tile.n_spans; ++si) {
      const QuerySpan sp = p.query_spans[si];
      const float* q = static_cast<const float*>(p.q) + sp.q_row0;
      const float* dout = static_cast<const float*>(p.dout) + sp.q_row0;
      const KeyRange rows = seeing_query_range(
          span_view(sp.n_q, tile.n_k, sp.causal_offset, p.window_left, p.window_right), p.causal, j,
          1);
      for (int64_t i = rows.begin; i < rows.end; ++i) {
        const int64_t at = sp.lse0 + i * p.lse_stride;
        const float L = p.lse[at];
        if (L == -INFINITY) continue;
        const float* qrow = q + i * p.q_stride;
        const float* grow = dout + i * p.q_stride;
        const float pr = expf(dot_row(kv, qrow, p.head_dim, lane) * p.scale - L);
        const float dp = dot_row(vv, grow, p.head_dim, lane);
        const float ds = pr * (dp - p.delta[at]);
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int d = lane + 32 * u;
          if (d < p.head_dim) {
            dv[u] += pr * grow[d];
            dk[u] += ds * qrow[d];
          }
        }
      }
    }
    float* dk_row = p.dk + tile.k_row0 + j * tile.k_stride;
    float* dv_row = p.dv + tile.k_row0 + j * tile.k_stride;
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

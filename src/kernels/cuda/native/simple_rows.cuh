// The fp32 CUDA-core kernels' block bodies (simple_fp32.cu, sparse_simple_fp32.cu), written
// once over block_work.cuh's runs: one warp holds one row, each lane up to kPerLane of its
// columns (lane, lane + 32, ...; head dim <= 256), a dot product is a warp reduction, and
// the other side's rows are walked one at a time (the softmax online, key by key).
#pragma once

#include <cmath>

#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/native/block_work.cuh"
#include "kernels/cuda/tiles.hpp"

namespace ringattn::kernels::cuda::simple {

constexpr int kWarps = 8;    // rows in flight per block
constexpr int kPerLane = 8;  // 8 × 32 lanes = 256 columns

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ void load_row(float (&r)[kPerLane], const float* src, int head_dim,
                                         int lane) {
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    r[u] = d < head_dim ? src[d] : 0.0f;
  }
}

__device__ __forceinline__ float dot_row(const float (&a)[kPerLane], const float* b, int head_dim,
                                         int lane) {
  float s = 0.0f;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    if (d < head_dim) s += a[u] * b[d];
  }
  return warp_sum(s);
}

// dst[d] += x[u] · scale for this lane's columns.
__device__ __forceinline__ void add_row(float* dst, const float (&x)[kPerLane], float scale,
                                        int head_dim, int lane) {
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    if (d < head_dim) dst[d] += x[u] * scale;
  }
}

// The scaled score of a q·k dot product, soft-capped when softcap > 0, and the cap's slope
// there (1 − tanh², 1 without a cap).
__device__ __forceinline__ float capped_score(float dot, const AttentionScalars& a, float* slope) {
  const float x = dot * a.scale;
  if (a.softcap <= 0.0f) {
    if (slope) *slope = 1.0f;
    return x;
  }
  const float t = tanhf(x / a.softcap);
  if (slope) *slope = 1.0f - t * t;
  return a.softcap * t;
}

// A forward block's kQueryTile rows: online softmax over every run's visible keys, then
// out = acc / l · out_scale and lse, or with `accumulate` a log-sum-exp merge into them.
template <typename Keys>
__device__ __forceinline__ void forward_rows(const ForwardRows<float>& b, const Keys& keys,
                                             const AttentionScalars& a) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int r = warp; r < kQueryTile; r += kWarps) {
    const int64_t i = b.i0 + r;
    if (i >= b.n_q) break;
    float qv[kPerLane], acc[kPerLane];
    load_row(qv, b.q + i * b.stride, a.head_dim, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) acc[u] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t ri = 0; ri < keys.size(); ++ri) {
      const KeyRun<float> run = keys.template run<1>(ri, a.causal, i, 1);  // causality, window
      for (int64_t j = run.keys.begin; j < run.keys.end; ++j) {
        const float s =
            capped_score(dot_row(qv, run.k + j * run.stride, a.head_dim, lane), a, nullptr);
        const float m_new = fmaxf(m, s);
        const float alpha = expf(m - m_new);  // 0 on the first key (m = -inf)
        const float pj = expf(s - m_new);
        l = l * alpha + pj;
        const float* vrow = run.v + j * run.v_stride;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int d = lane + 32 * u;
          acc[u] = acc[u] * alpha + (d < a.head_dim_v ? pj * vrow[d] : 0.0f);
        }
        m = m_new;
      }
    }
    const bool empty = l == 0.0f;
    const float row_lse = empty ? -INFINITY : m + logf(l);
    const float inv = empty ? 0.0f : 1.0f / l;
    float* orow = b.out + i * b.out_stride;
    float* lse = b.lse + i * b.lse_stride;
    float ca = 0.0f, cb = inv * a.out_scale, new_lse = row_lse;
    bool write = true;
    if (a.accumulate) {
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
        if (d < a.head_dim_v) orow[d] = (ca == 0.0f ? 0.0f : ca * orow[d]) + cb * acc[u];
      }
      if (lane == 0) *lse = new_lse;
    }
  }
}

// A dQ block's kQueryTile rows: dQ += s · Σ_j P_ij (dP_ij − D_i) K_j over every run's
// visible keys.
template <typename Keys>
__device__ __forceinline__ void dq_rows(const DqRows<float>& b, const Keys& keys,
                                        const AttentionScalars& a) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float d_factor = a.dout_scale / a.out_scale;
  for (int r = warp; r < kQueryTile; r += kWarps) {
    const int64_t i = b.i0 + r;
    if (i >= b.n_q) break;
    const float L = b.lse[i * b.lse_stride];
    if (L == -INFINITY) continue;  // the row attends nothing: no gradient
    const float dl = b.delta[i * b.lse_stride] * d_factor;
    float qv[kPerLane], dov[kPerLane], acc[kPerLane];
    load_row(qv, b.q + i * b.stride, a.head_dim, lane);
    load_row(dov, b.dout + i * b.dout_stride, a.head_dim_v, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) acc[u] = 0.0f;
    for (int64_t ri = 0; ri < keys.size(); ++ri) {
      const KeyRun<float> run = keys.template run<1>(ri, a.causal, i, 1);  // causality, window
      for (int64_t j = run.keys.begin; j < run.keys.end; ++j) {
        const float* krow = run.k + j * run.stride;
        float slope;
        const float pr = expf(capped_score(dot_row(qv, krow, a.head_dim, lane), a, &slope) - L);
        const float dp =
            dot_row(dov, run.v + j * run.v_stride, a.head_dim_v, lane) * a.dout_scale;
        const float ds = pr * (dp - dl) * slope;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int d = lane + 32 * u;
          if (d < a.head_dim) acc[u] += ds * krow[d];
        }
      }
    }
    add_row(b.dq + i * b.stride, acc, a.scale, a.head_dim, lane);
  }
}

// A dK/dV block's kKeyTile key rows: dV += Σ_i P_ij dO_i and dK += s · Σ_i dS_ij Q_i over
// every run's queries that see the key.
template <typename Queries>
__device__ __forceinline__ void dkdv_rows(const DkdvRows<float>& b, const Queries& queries,
                                          const AttentionScalars& a) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float d_factor = a.dout_scale / a.out_scale;
  for (int r = warp; r < kKeyTile; r += kWarps) {
    const int64_t j = b.j0 + r;
    if (j >= b.n_k) break;
    float kv[kPerLane], vv[kPerLane], dk[kPerLane], dv[kPerLane];
    load_row(kv, b.k + j * b.stride, a.head_dim, lane);
    load_row(vv, b.v + j * b.v_stride, a.head_dim_v, lane);
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) dk[u] = dv[u] = 0.0f;
    for (int64_t ri = 0; ri < queries.size(); ++ri) {
      const QueryRun<float> run = queries.run(ri, a.causal, j, 1);
      for (int64_t i = run.rows.begin; i < run.rows.end; ++i) {
        const int64_t at = run.lse0 + i * run.lse_stride;
        const float L = run.lse[at];
        if (L == -INFINITY) continue;
        const float* qrow = run.q + i * run.stride;
        const float* grow = run.dout + i * run.dout_stride;
        float slope;
        const float pr = expf(capped_score(dot_row(kv, qrow, a.head_dim, lane), a, &slope) - L);
        const float dp = dot_row(vv, grow, a.head_dim_v, lane) * a.dout_scale;
        const float ds = pr * (dp - run.delta[at] * d_factor) * slope;
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int d = lane + 32 * u;
          if (d < a.head_dim_v) dv[u] += pr * a.dout_scale * grow[d];
          if (d < a.head_dim) dk[u] += ds * qrow[d];
        }
      }
    }
    add_row(b.dk + j * b.stride, dk, a.scale, a.head_dim, lane);
    add_row(b.dv + j * b.v_stride, dv, 1.0f, a.head_dim_v, lane);
  }
}

}  // namespace ringattn::kernels::cuda::simple

// Small device kernels around the attention kernels: filling lse with -inf, the backward's
// per-row dot product D = rowsum(out ∘ dout), the log-sum-exp merge of partial results (the
// device form of kernels/merge_lse.hpp, for the ring), packing exchanged rows, attention
// sinks, conversions. cuDNN views' results: cudnn/view_results.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/params.hpp"
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels::cuda {

void fill_floats(float* data, int64_t n, float value, cudaStream_t stream);

// delta[(b*H + h)*N + n] = sum_d out[row] * dout[row] for every row of [B, N, H, D] tensors
// (delta is laid out like lse). dout has element type `e`; out is fp32.
struct RowDotParams {
  const float* out = nullptr;
  const void* dout = nullptr;
  float* delta = nullptr;
  int64_t batch = 0, seq_len = 0, heads = 0, head_dim = 0;
};
void launch_row_dot(Elem e, const RowDotParams& p, cudaStream_t stream);

// How every backward on a [B, N, H, D] shard starts: dq and the [B, N, kv_heads, D] dk, dv
// zeroed (the passes add into them), and the row sums D of `rd` (whose head_dim is out's and
// dv's; q's and dk's is head_dim_qk, 0: the same).
void start_backward(Elem e, const RowDotParams& rd, int64_t kv_heads, float* dq, float* dk,
                    float* dv, cudaStream_t stream, int64_t head_dim_qk = 0);

// Device form of merge_lse(): all pointers are device pointers.
void launch_merge_lse(const MergeRows& m, cudaStream_t stream);

// dst[i] = src[i]·scale rounded to element type `e` (bf16 or fp16), for i < n: the fp32 out
// the engines keep, as the O that cuDNN's backward reads.
void launch_floats_to_elem(Elem e, const float* src, void* dst, int64_t n, cudaStream_t stream,
                           float scale = 1.0f);

// dst[i] = src[i]·scale (or dst[i] += src[i]·scale with `add`) for i < n, src of element type
// `e`: cuDNN's dQ, dK, dV into the engines' fp32 gradients.
void launch_elem_to_floats(Elem e, const void* src, float* dst, int64_t n, bool add,
                           cudaStream_t stream, float scale = 1.0f);

// dst[r * dpitch + c] += src[r * spitch + c] for r < height, c < width; pitches and width in
// floats (the Ulysses all-to-all summing the dK/dV of members that share a K/V head).
void add_floats_2d(float* dst, int64_t dpitch, const float* src, int64_t spitch, int64_t width,
                   int64_t height, cudaStream_t stream);

// Attention sinks on a [B, N, H, D] shard (the device form of kernels/attention_sinks.hpp):
// the forward's epilogue lse' = logaddexp(lse, sinks[h]), out *= exp(lse - lse'), and the
// sinks' gradient dsinks[h] = -sum over the shard's rows of exp(sinks[h] - lse) ·
// rowsum(out ∘ dout) (out and lse the forward's, dout of element type `e`). All pointers are
// device pointers.
struct SinkParams {
  float* out = nullptr;
  float* lse = nullptr;
  const void* dout = nullptr;
  const float* sinks = nullptr;
  float* dsinks = nullptr;
  double* partials = nullptr;  // the gradient's workspace: sink_gradient_partials(p) doubles
  int64_t batch = 0, seq_len = 0, heads = 0, head_dim = 0;
};
void launch_apply_sinks(const SinkParams& p, cudaStream_t stream);
// The gradient in parallel and deterministic: one warp per run of kSinkRunRows rows of one
// head sums the run in order into `partials`, and one warp per head adds its runs in a fixed
// order, so the order of every sum follows from the shape alone (not the device or launch).
inline constexpr int64_t kSinkRunRows = 32;
inline int64_t sink_gradient_partials(int64_t batch, int64_t seq_len, int64_t heads) {
  return heads * ((batch * seq_len + kSinkRunRows - 1) / kSinkRunRows);
}
void launch_sink_gradient(Elem e, const SinkParams& p, cudaStream_t stream);

// data[i] *= factor for i < n (the grouped combine's 1/G at the end of the ring).
void scale_floats(float* data, int64_t n, float factor, cudaStream_t stream);

// Packed rows: `rows` rows starting at element row0 of a [B, N, H, D] shard, `stride`
// elements apart, at rows buf_row.. of a buffer of K rows [buffer_rows, D] then V rows
// [buffer_rows, Dv]. row0 and stride count K's elements (rows of D); V's rows sit at the same
// row positions of a [B, N, H, Dv] shard (value_floats, kernels/cpu_flash.hpp). A launch walks `total_rows` rows numbered by the runs' `base` (runs in
// base order covering [0, total_rows) exactly); the ring packs a whole buffer (buf_row ==
// base, buffer_rows == total_rows), block-sparse adds a returned buffer in several launches
// of disjoint rows.
struct PackedRun {
  int64_t row0 = 0, stride = 0, rows = 0, base = 0, buf_row = 0;
};
struct PackParams {
  const PackedRun* runs = nullptr;  // device
  int64_t n_runs = 0;
  int64_t total_rows = 0;   // rows this launch walks
  int64_t buffer_rows = 0;  // rows of each half of the buffer
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;  // V (and dV) rows' width; 0: head_dim

  RINGATTN_HOST_DEVICE int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // V's element offset of the row at K element offset `x` (x a whole number of rows of D).
  RINGATTN_HOST_DEVICE int64_t value_elems(int64_t x) const {
    return head_dim_v > 0 ? x / head_dim * head_dim_v : x;
  }
};
// buf[K rows | V rows] = k, v at the runs' rows, in element type `e` (no conversion).
void launch_pack_rows(Elem e, const PackParams& p, const void* k, const void* v, void* buf,
                      cudaStream_t stream);
// dk, dv at the runs' rows += buf's fp32 [dK rows | dV rows]. With `rows_may_repeat` (runs of
// two patterns naming one row, dilated mixture) one thread per column adds every row in
// packing order; otherwise rows are added in parallel. Either way each element's sum is
// taken in packing order, so the result does not depend on the launch.
void launch_unpack_add_rows(const PackParams& p, const float* buf, float* dk, float* dv,
                            bool rows_may_repeat, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

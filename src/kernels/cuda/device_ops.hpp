// Small device kernels around the attention kernels: filling lse with -inf, the backward's
// per-row dot product D = rowsum(out ∘ dout), the log-sum-exp merge of partial results (the
// device form of kernels/merge_lse.hpp, for the ring), and copying a cuDNN result from its
// strided view into out/lse.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/flash_params.hpp"
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

// Device form of merge_lse(): all pointers are device pointers.
void launch_merge_lse(const MergeRows& m, cudaStream_t stream);

// One cuDNN SDPA result, laid out as the strided 4-D view [B·S, Hg, m, D] (S = N / segment
// segments, Hg heads from first_head with head step head_step, m rows per segment at
// positions offset + i·dilation), moved into out (fp32, [B, N, H, D]) and lse ([B, H, N]).
// o_view is the cuDNN output in the same view of a [B, N, H, D] scratch tensor of type `e`;
// stats is contiguous [B·S, Hg, m] fp32.
struct ViewResultParams {
  const void* o_scratch = nullptr;
  const float* stats = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  int64_t batch = 0, seq_len = 0, heads = 0, head_dim = 0;
  int64_t segment = 0, dilation = 1, offset = 0, rows = 0;  // rows = m
  int64_t first_head = 0, head_count = 0, head_step = 1;
  bool accumulate = false;
  float out_scale = 1.0f;
};
void launch_store_view_result(Elem e, const ViewResultParams& p, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

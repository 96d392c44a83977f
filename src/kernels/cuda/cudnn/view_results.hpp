// cuDNN views' results on the device: a view's output rows and stats stored into (or merged by
// lse with) the fp32 out/lse, lse gathered back as a view's stats for its backward, and a
// view's gradients added into the fp32 gradients (cudnn/view_results.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cudnn/graphs.hpp"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

// One cuDNN SDPA result, laid out as the strided 4-D view [B·S, Hg, m, D] (S = N / segment
// segments, Hg heads from first_head with head step head_step, m rows per segment at
// positions offset + i·dilation), moved into out (fp32, [B, N, H, D]) and lse ([B, H, N]); D
// is out's width (the values' head dim).
// o_view is the cuDNN output in the same view of a [B, N, H, D] scratch tensor of type `e`;
// stats is contiguous [B·S, Hg, m] fp32. Only rows keyed_begin <= i < keyed_end of the view
// see a key (the view's band, view_place): what cuDNN returns for the others (zero, NaN, a
// stats value of -inf or anything else) is never read; they are stored as out 0, lse -inf,
// and left as they are when merging. A merged row whose stat is not finite adds nothing.
struct ViewResultParams {
  const void* o_scratch = nullptr;
  const float* stats = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  int64_t batch = 0, seq_len = 0, heads = 0, head_dim = 0;
  int64_t segment = 0, dilation = 1, offset = 0, rows = 0;  // rows = m
  int64_t first_head = 0, head_count = 0, head_step = 1;
  int64_t keyed_begin = 0, keyed_end = INT64_MAX;
  bool accumulate = false;
  float out_scale = 1.0f;
};
void launch_store_view_result(Elem e, const ViewResultParams& p, cudaStream_t stream);

// Where view `v`'s rows go in out/lse of a [B, N, H, Dv] problem of shape `s` (the epilogues'
// place, out's rows v.value_dim() wide; the pointers are the caller's to set).
inline ViewResultParams view_place(const SdpaView& v, const Shape4& s) {
  ViewResultParams r;
  r.batch = s.batch, r.seq_len = s.seq_len, r.heads = s.heads, r.head_dim = v.value_dim();
  r.segment = v.segment, r.dilation = v.dilation, r.offset = v.row_offset, r.rows = v.rows;
  r.first_head = v.first_head, r.head_count = v.heads, r.head_step = v.head_step;
  r.accumulate = v.accumulate, r.out_scale = v.out_scale;
  const auto [begin, end] = rows_with_keys(v);
  r.keyed_begin = begin, r.keyed_end = end;
  return r;
}

// The backward's view of lse for cuDNN: stats (contiguous [B·S, Hg, m], the view's rows
// in the order launch_store_view_result reads them) = lse at the view's rows. p's o_scratch,
// stats and out are unused; lse is read.
void launch_gather_view_stats(const ViewResultParams& p, float* stats, cudaStream_t stream);

// dst[at] += src[at]·scale (src of element type `e`) for every element of the strided 4-D view
// at = offset + i0·strides[0] + i1·strides[1] + i2·strides[2] + i3·strides[3], i < dims: one
// cuDNN view's dQ (or dK, dV) of a ring step into the fp32 gradients. A view names each element
// once, so the adds do not race.
struct StridedView {
  int64_t offset = 0;
  int64_t dims[4] = {}, strides[4] = {};
};
void launch_add_view(Elem e, const void* src, float* dst, const StridedView& view,
                     cudaStream_t stream, float scale = 1.0f);

}  // namespace ringattn::kernels::cuda

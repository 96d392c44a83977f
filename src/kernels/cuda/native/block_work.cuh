// What one block of an attention kernel works on, for every kernel family (flash and
// block-sparse, tensor-core and fp32): its own rows (queries for the forward and the dQ pass,
// keys for the dK/dV pass), the launch's scalars, and the runs of the other side's rows it
// walks. A dense task is one run; a block-sparse tile is a list of spans, each with its own
// base, stride and causal offset. The block bodies (flash_tiles.cuh, simple_rows.cuh) are
// written once over these, so a block-sparse kernel is the flash kernel walking spans.
#pragma once

#include <cstdint>

#include "kernels/cpu_block_sparse.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/native/sparse.hpp"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

// The launch's scalars. The block-sparse kernels never scale their outputs: out_scale and
// dout_scale stay 1, which multiplies exactly.
struct AttentionScalars {
  float scale = 1.0f;
  bool causal = false;
  int head_dim = 0;    // q, k, dq, dk columns
  int head_dim_v = 0;  // v, out, dout, dv columns
  float softcap = 0.0f;  // s <- softcap · tanh(s / softcap); 0: none
  bool vector_loads = false;  // rows may be read with 16-byte copies
  bool accumulate = false;    // forward: merge into (out, lse) by log-sum-exp
  float out_scale = 1.0f;     // forward: applied when writing; backward: true O = out / out_scale
  float dout_scale = 1.0f;    // backward: true dO = dout * dout_scale
};

__device__ __forceinline__ AttentionScalars scalars_of(const FlashForwardParams& p) {
  return {.scale = p.scale,
          .causal = p.causal,
          .head_dim = p.head_dim,
          .head_dim_v = p.value_dim(),
          .softcap = p.softcap,
          .vector_loads = p.vector_loads,
          .accumulate = p.accumulate,
          .out_scale = p.out_scale};
}
__device__ __forceinline__ AttentionScalars scalars_of(const FlashBackwardParams& p) {
  return {.scale = p.scale,
          .causal = p.causal,
          .head_dim = p.head_dim,
          .head_dim_v = p.value_dim(),
          .softcap = p.softcap,
          .vector_loads = p.vector_loads,
          .out_scale = p.out_scale,
          .dout_scale = p.dout_scale};
}
// The block-sparse kernels never scale (out_scale and dout_scale 1).
__device__ __forceinline__ AttentionScalars scalars_of(const SparseForwardParams& p) {
  return {.scale = p.scale,
          .causal = p.causal,
          .head_dim = p.head_dim,
          .head_dim_v = p.value_dim(),
          .softcap = p.softcap,
          .vector_loads = p.vector_loads,
          .accumulate = p.accumulate};
}
__device__ __forceinline__ AttentionScalars scalars_of(const SparseBackwardParams& p) {
  return {.scale = p.scale,
          .causal = p.causal,
          .head_dim = p.head_dim,
          .head_dim_v = p.value_dim(),
          .softcap = p.softcap,
          .vector_loads = p.vector_loads};
}

// A forward block's query rows [i0, i0 + 64) of a view of n_q rows: row i of q at i·stride,
// of out at i·out_stride, its lse at i·lse_stride (all pointers at the view's row 0).
template <typename T>
struct ForwardRows {
  const T* q;
  float* out;
  float* lse;
  int64_t stride, lse_stride, n_q, i0;
  int64_t out_stride;
};

// A dQ block's query rows, laid out as ForwardRows (dq like q, dout like out, delta like lse).
template <typename T>
struct DqRows {
  const T* q;
  const T* dout;
  float* dq;
  const float* lse;
  const float* delta;
  int64_t stride, lse_stride, n_q, i0;
  int64_t dout_stride;
};

// A dK/dV block's key rows [j0, j0 + 64) of a view of n_k rows: row j of k and dk at
// j·stride, of v and dv at j·v_stride.
template <typename T>
struct DkdvRows {
  const T* k;
  const T* v;
  float* dk;
  float* dv;
  int64_t stride, n_k, j0;
  int64_t v_stride;
};

// A (tile, span) pair as the dense kernels' task view, so that the key-range rules
// (cpu_flash.hpp: visible_key_range, seeing_query_range, outside_reach) are theirs.
__device__ __forceinline__ SubseqTask span_view(int64_t n_q, int64_t n_k, int64_t causal_offset,
                                                int64_t window_left, int64_t window_right) {
  SubseqTask t;
  t.n_q = n_q;
  t.n_k = n_k;
  t.causal_offset = causal_offset;
  t.window_left = window_left;
  t.window_right = window_right;
  return t;
}

// One run of keys a query block attends: key j's K row at j·stride and V row at j·v_stride,
// `view` holding the keys' count, causal offset and window (the rules of cpu_flash.hpp), and
// `keys` the range to walk.
template <typename T>
struct KeyRun {
  const T* k;
  const T* v;
  int64_t stride;
  SubseqTask view;
  KeyRange keys;
  int64_t v_stride;
};

// One run of queries that attend a key block: query i's Q row at i·stride and dO row at
// i·dout_stride, its lse and D at lse0 + i·lse_stride of the launch's lse and delta; `rows`
// the range to walk.
template <typename T>
struct QueryRun {
  const T* q;
  const T* dout;
  const float* lse;
  const float* delta;
  int64_t lse0, stride, lse_stride;
  SubseqTask view;
  KeyRange rows;
  int64_t dout_stride;
};

// A dense task's keys: one run, walked on the kStep grid from the step of the first key some
// row sees (key steps wholly outside causality and the window are never loaded).
template <typename T>
struct TaskKeys {
  const T* k;  // the task's key row 0
  const T* v;
  SubseqTask task;
  int64_t v_stride;

  __device__ __forceinline__ int64_t size() const { return 1; }
  // The run for query rows [i0, i0 + rows).
  template <int kStep>
  __device__ __forceinline__ KeyRun<T> run(int64_t, bool causal, int64_t i0, int64_t rows) const {
    const KeyRange visible = visible_key_range(task, causal, i0, rows);
    const int64_t first = visible.begin / kStep * kStep;
    return {k,
            v,
            task.k_stride,
            task,
            {first, visible.end > visible.begin ? visible.end : first},
            v_stride};
  }
};

// A block-sparse query tile's keys: its key spans, each walked from the first key some row
// sees.
template <typename T>
struct SpanKeys {
  const T* k;  // the tensors' row 0: spans carry their own row offsets
  const T* v;
  const KeySpan* spans;  // the tile's first span
  int64_t count;
  int64_t n_q;  // the tile's query rows
  int64_t window_left, window_right;
  int64_t head_dim, head_dim_v;  // K's and V's row widths (spans count K's elements)

  __device__ __forceinline__ int64_t size() const { return count; }
  template <int kStep>
  __device__ __forceinline__ KeyRun<T> run(int64_t s, bool causal, int64_t i0, int64_t rows) const {
    const KeySpan sp = spans[s];
    const SubseqTask view = span_view(n_q, sp.n_k, sp.causal_offset, window_left, window_right);
    return {k + sp.k_row0,
            v + value_floats(sp.k_row0, head_dim, head_dim_v),
            sp.k_stride,
            view,
            visible_key_range(view, causal, i0, rows),
            value_floats(sp.k_stride, head_dim, head_dim_v)};
  }
};

// A dense task's queries for a key block: one run, the queries that see some of its keys.
template <typename T>
struct TaskQueries {
  const T* q;  // the task's query row 0
  const T* dout;
  const float* lse;  // the launch's: the task's lse row 0 is task.lse0
  const float* delta;
  SubseqTask task;
  int64_t dout_stride;

  __device__ __forceinline__ int64_t size() const { return 1; }
  // The run for key rows [j0, j0 + cols).
  __device__ __forceinline__ QueryRun<T> run(int64_t, bool causal, int64_t j0, int64_t cols) const {
    return {q,
            dout,
            lse,
            delta,
            task.lse0,
            task.q_stride,
            task.lse_stride,
            task,
            seeing_query_range(task, causal, j0, cols),
            dout_stride};
  }
};

// A block-sparse key tile's queries: the query spans that attend it.
template <typename T>
struct SpanQueries {
  const T* q;  // the tensors' row 0: spans carry their own row offsets
  const T* dout;
  const float* lse;
  const float* delta;
  const QuerySpan* spans;  // the tile's first span
  int64_t count;
  int64_t n_k;  // the tile's key rows
  int64_t stride, lse_stride;
  int64_t window_left, window_right;
  int64_t head_dim, head_dim_v;  // Q's and dO's row widths (spans count Q's elements)

  __device__ __forceinline__ int64_t size() const { return count; }
  __device__ __forceinline__ QueryRun<T> run(int64_t s, bool causal, int64_t j0,
                                             int64_t cols) const {
    const QuerySpan sp = spans[s];
    const SubseqTask view = span_view(sp.n_q, n_k, sp.causal_offset, window_left, window_right);
    return {q + sp.q_row0,
            dout + value_floats(sp.q_row0, head_dim, head_dim_v),
            lse,
            delta,
            sp.lse0,
            stride,
            lse_stride,
            view,
            seeing_query_range(view, causal, j0, cols),
            value_floats(stride, head_dim, head_dim_v)};
  }
};

// ---- from a launch's params ------------------------------------------------------------
// A block's rows in `view`: a dense task (SubseqTask), or a block-sparse tile
// (SparseQueryTile, SparseKeyTile) whose query strides are the launch's.
template <typename T, typename Params, typename View>
__device__ __forceinline__ ForwardRows<T> forward_rows_of(const Params& p, const ForwardItem& item,
                                                          const View& view, int64_t stride,
                                                          int64_t lse_stride) {
  return {static_cast<const T*>(p.q) + view.q_row0,
          p.out + p.value_elems(view.q_row0),
          p.lse + view.lse0,
          stride,
          lse_stride,
          view.n_q,
          item.q_begin,
          p.value_elems(stride)};
}
template <typename T, typename Params, typename View>
__device__ __forceinline__ DqRows<T> dq_rows_of(const Params& p, const ForwardItem& item,
                                                const View& view, int64_t stride,
                                                int64_t lse_stride) {
  return {static_cast<const T*>(p.q) + view.q_row0,
          static_cast<const T*>(p.dout) + p.value_elems(view.q_row0),
          p.dq + view.q_row0,
          p.lse + view.lse0,
          p.delta + view.lse0,
          stride,
          lse_stride,
          view.n_q,
          item.q_begin,
          p.value_elems(stride)};
}
template <typename T, typename Params, typename View>
__device__ __forceinline__ DkdvRows<T> dkdv_rows_of(const Params& p, const ForwardItem& item,
                                                    const View& view) {
  return {static_cast<const T*>(p.k) + view.k_row0,
          static_cast<const T*>(p.v) + p.value_elems(view.k_row0),
          p.dk + view.k_row0,
          p.dv + p.value_elems(view.k_row0),
          view.k_stride,
          view.n_k,
          item.q_begin,
          p.value_elems(view.k_stride)};
}

template <typename T, typename Params>
__device__ __forceinline__ TaskKeys<T> keys_of(const Params& p, const SubseqTask& t) {
  return {static_cast<const T*>(p.k) + t.k_row0,
          static_cast<const T*>(p.v) + p.value_elems(t.k_row0), t, p.value_elems(t.k_stride)};
}
template <typename T>
__device__ __forceinline__ TaskQueries<T> queries_of(const FlashBackwardParams& p,
                                                     const SubseqTask& t) {
  return {static_cast<const T*>(p.q) + t.q_row0,
          static_cast<const T*>(p.dout) + p.value_elems(t.q_row0),
          p.lse,
          p.delta,
          t,
          p.value_elems(t.q_stride)};
}

// `spans`: the launch's key span list (p.spans in the forward, p.key_spans in the dQ pass).
template <typename T, typename Params>
__device__ __forceinline__ SpanKeys<T> keys_of(const Params& p, const KeySpan* spans,
                                               const SparseQueryTile& tile) {
  return {static_cast<const T*>(p.k),
          static_cast<const T*>(p.v),
          spans + tile.first_span,
          tile.n_spans,
          tile.n_q,
          p.window_left,
          p.window_right,
          p.head_dim,
          p.value_dim()};
}
template <typename T>
__device__ __forceinline__ SpanQueries<T> queries_of(const SparseBackwardParams& p,
                                                     const SparseKeyTile& tile) {
  return {static_cast<const T*>(p.q),
          static_cast<const T*>(p.dout),
          p.lse,
          p.delta,
          p.query_spans + tile.first_span,
          tile.n_spans,
          tile.n_k,
          p.q_stride,
          p.lse_stride,
          p.window_left,
          p.window_right,
          p.head_dim,
          p.value_dim()};
}

}  // namespace ringattn::kernels::cuda

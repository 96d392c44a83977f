// The native forward's and backward's SubseqTasks as Hopper kernels' `Work`s
// (hopper/tiles.cuh), read through tensor maps of one launch's query and key views (strided
// rows of the batches laid end to end; hopper/task_forward.hpp's groups): TaskWork, a block per
// work item of 64 query rows walking the keys they see (the forward's and the dQ pass's), and
// TaskKeyWork, a block per work item of 64 key rows walking the queries that see them (the
// dK/dV pass's). Each row's reach is the task's causal offset and window.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu_flash.hpp"
#include "kernels/cuda/hopper/tiles.cuh"
#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda::hopper {

constexpr int64_t kFar = int64_t{1} << 30;  // past any key: no limit

// The values' head dim of a task launch: the shape's, which its params' must equal.
template <class Shape, class Params>
int task_value_dim(const Shape& s, const Params& p) {
  const int dv = s.head_dim_v > 0 ? s.head_dim_v : s.head_dim;
  if (p.head_dim != s.head_dim || p.value_dim() != dv)
    throw RuntimeFailure("the Hopper task kernels' shape (head dims " + std::to_string(s.head_dim) +
                         "/" + std::to_string(dv) + ") differs from their params' (" +
                         std::to_string(p.head_dim) + "/" + std::to_string(p.value_dim()) + ")");
  return dv;
}

struct TaskWork {
  const SubseqTask* tasks;
  const ForwardItem* items;  // this launch's
  float* out;
  float* lse;
  int rows;     // B·N: the batches' positions end to end
  int kv_rows;  // K/V positions end to end (B·N unless packed: a ring's receive rows)
  int heads, kv_heads, head_dim;
  int q_step, k_step;  // the views' row steps: position n is index n / step of its view
  bool causal;
  float out_scale;

  struct Cursor {
    int k0, k_end;  // the next key tile's first key and the last visible key + 1
    int n0, h, b;   // the task's key 0 in the key view
    int off, n_k;   // the task's causal offset and keys
  };

  __device__ __forceinline__ const SubseqTask& task() const {
    return tasks[items[blockIdx.x].task];
  }

  // The block's rows; out's rows are `out_dim` wide (the values' head dim), the tasks' row
  // offsets `row_dim` (the kernel's D, which is head_dim: constants, so that equal widths fold).
  __device__ __forceinline__ QueryRows query_rows(int row_dim, int out_dim) const {
    const ForwardItem item = items[blockIdx.x];
    const SubseqTask& t = tasks[item.task];
    const int i0 = static_cast<int>(item.q_begin);
    const int n_rows = t.n_q - i0 < kRows ? static_cast<int>(t.n_q - i0) : kRows;
    const int64_t at = t.q_row0 + i0 * t.q_stride;
    int n, h, b;
    hopper::position_of(at, head_dim, heads, rows, n, h, b);
    return {n / q_step,
            h,
            b,
            out ? out + value_floats(at, row_dim, out_dim) : nullptr,
            lse ? lse + t.lse0 + i0 * t.lse_stride : nullptr,
            value_floats(t.q_stride, row_dim, out_dim),
            t.lse_stride,
            n_rows,
            i0,
            out_scale};
  }

  __device__ __forceinline__ Cursor begin(const QueryRows& q) const {
    const SubseqTask& t = task();
    const KeyRange keys = visible_key_range(t, causal, q.row0, q.rows);
    Cursor c{};
    c.k0 = static_cast<int>(keys.begin), c.k_end = static_cast<int>(keys.end);
    c.off = static_cast<int>(t.causal_offset), c.n_k = static_cast<int>(t.n_k);
    hopper::position_of(t.k_row0, head_dim, kv_heads, kv_rows, c.n0, c.h, c.b);
    c.n0 /= k_step;
    return c;
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    if (c.k0 >= c.k_end) return false;
    t = {c.n0 + c.k0, c.h, c.b, c.k0 - c.off, c.n_k - c.k0};
    c.k0 += kRows;
    return true;
  }

  // Query i sees key j of the task iff i - window_left <= j - causal_offset <= i + right,
  // right being the window's right reach, at most 0 when causal.
  __device__ __forceinline__ Reach reach(const QueryRows& q, int local) const {
    const SubseqTask& t = task();
    auto clamped = [](int64_t w) { return static_cast<int>(w < kFar ? w : kFar); };
    const int left = t.window_left == kNoWindow ? static_cast<int>(kFar) : clamped(t.window_left);
    int right = t.window_right == kNoWindow ? static_cast<int>(kFar) : clamped(t.window_right);
    if (causal && right > 0) right = 0;
    const int i = q.row0 + local;
    return {i - left, i + right + 1};
  }

  // The dQ pass's rows in lse/delta and in dq (laid out as q, rows `d` wide).
  __device__ __forceinline__ Strided row_stats(const QueryRows& q) const {
    const SubseqTask& t = task();
    return {t.lse0 + q.row0 * t.lse_stride, t.lse_stride};
  }
  __device__ __forceinline__ Strided grad_rows(const QueryRows& q, int row_dim, int d) const {
    const SubseqTask& t = task();
    return {value_floats(t.q_row0 + q.row0 * t.q_stride, row_dim, d),
            value_floats(t.q_stride, row_dim, d)};
  }
};

// The reach of a task's window in int, causality folded into the right: {left, right}.
__device__ __forceinline__ void task_reach(const SubseqTask& t, bool causal, int& left,
                                           int& right) {
  auto clamped = [](int64_t w) { return static_cast<int>(w < kFar ? w : kFar); };
  left = t.window_left == kNoWindow ? static_cast<int>(kFar) : clamped(t.window_left);
  right = t.window_right == kNoWindow ? static_cast<int>(kFar) : clamped(t.window_right);
  if (causal && right > 0) right = 0;
}

// The dK/dV pass's work: a block per work item (block_rows key rows of a task: 64, or the
// wide fused backward's 128; ForwardItem's q_begin is the first key) walking the task's
// queries that see one of them (seeing_query_range, as the native backward), 64 at a time,
// through the query view's map.
struct TaskKeyWork {
  const SubseqTask* tasks;
  const ForwardItem* items;  // this launch's
  int rows;                  // B·N: the batches' query positions end to end
  int kv_rows;               // K/V positions end to end (B·N unless packed: a ring's receive rows)
  int heads, kv_heads, head_dim;
  int q_step, k_step;
  bool causal;
  int block_rows = kRows;

  struct Cursor {
    int i, i_end;              // the next query tile's first query and the last seeing query + 1
    int n0, h, b;              // the task's query 0 in the query view
    int off, n_q;              // the task's causal offset and queries
    int64_t lse0, lse_stride;  // the task's query 0 in lse/delta and its rows' stride there
    int64_t q_row0, q_stride;  // the task's query 0 in q (and dq) and its rows' stride there
  };

  __device__ __forceinline__ const SubseqTask& task() const {
    return tasks[items[blockIdx.x].task];
  }

  __device__ __forceinline__ QueryRows query_rows(int, int) const {
    const ForwardItem item = items[blockIdx.x];
    const SubseqTask& t = tasks[item.task];
    const int j0 = static_cast<int>(item.q_begin);
    const int n_rows = t.n_k - j0 < block_rows ? static_cast<int>(t.n_k - j0) : block_rows;
    int n, h, b;
    hopper::position_of(t.k_row0 + j0 * t.k_stride, head_dim, kv_heads, kv_rows, n, h, b);
    return {n / k_step, h, b, nullptr, nullptr, 0, 0, n_rows, j0};
  }

  __device__ __forceinline__ Cursor begin(const QueryRows& k) const {
    const SubseqTask& t = task();
    const KeyRange queries = seeing_query_range(t, causal, k.row0, k.rows);
    Cursor c{};
    c.i = static_cast<int>(queries.begin), c.i_end = static_cast<int>(queries.end);
    c.off = static_cast<int>(t.causal_offset), c.n_q = static_cast<int>(t.n_q);
    c.lse0 = t.lse0, c.lse_stride = t.lse_stride;
    c.q_row0 = t.q_row0, c.q_stride = t.q_stride;
    hopper::position_of(t.q_row0, head_dim, heads, rows, c.n0, c.h, c.b);
    c.n0 /= q_step;
    return c;
  }

  __device__ __forceinline__ bool next(Cursor& c, KeyTile& t) const {
    if (c.i >= c.i_end) return false;
    t = {c.n0 + c.i, c.h, c.b, c.i + c.off, c.n_q - c.i};
    c.i += kRows;
    return true;
  }

  // TaskWork's reach seen from key j: queries i with j - right <= i + causal_offset <=
  // j + left.
  __device__ __forceinline__ Reach reach(const QueryRows& k, int local) const {
    int left, right;
    task_reach(task(), causal, left, right);
    const int j = k.row0 + local;
    return {j - right, j + left + 1};
  }

  // The rows in dk or dv (laid out as k, rows `d` wide) and a walked query tile's columns in
  // lse/delta.
  __device__ __forceinline__ Strided grad_rows(const QueryRows& k, int row_dim, int d) const {
    const SubseqTask& t = task();
    return {value_floats(t.k_row0 + k.row0 * t.k_stride, row_dim, d),
            value_floats(t.k_stride, row_dim, d)};
  }
  __device__ __forceinline__ Strided column_stats(const Cursor& c, const KeyTile& tile) const {
    return {c.lse0 + static_cast<int64_t>(tile.base - c.off) * c.lse_stride, c.lse_stride};
  }
  // A walked query tile's rows in dq (the fused backward's) and how many there are.
  __device__ __forceinline__ Strided column_grads(const Cursor& c, const KeyTile& tile, int,
                                                  int& count) const {
    count = tile.limit < kRows ? tile.limit : kRows;
    return {c.q_row0 + static_cast<int64_t>(tile.base - c.off) * c.q_stride, c.q_stride};
  }
};

}  // namespace ringattn::kernels::cuda::hopper

// What every CUDA kernel is given: the element type and the parameter chain. The same contract
// as the CPU kernels (kernels/cpu_flash.hpp, kernels/cpu_block_sparse.hpp) on device
// pointers. A launch runs one pass: a device array of SubseqTasks (strided query and key views
// into [B, N, H, D] tensors, so dilated patterns are read in place) or block-sparse tiles, and
// a device array of work items. q, k, v and dout are bf16 or fp16 (or fp32 on the simple
// path); out, lse, dq, dk and dv are fp32, so the ring can carry and merge partial results.
// Element offsets and strides in the tasks are in elements of the tensor they index: q and k
// rows (v, out, dout and dv rows of head_dim_v sit at the same row positions:
// QkvParams::value_elems).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cpu_block_sparse.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cuda/tiles.hpp"
#include "ringattn/types.hpp"

namespace ringattn::kernels::cuda {

enum class Elem { bf16, fp16, fp32 };

const char* to_string(Elem e);
// The kernels' element type for a caller's DeviceDType.
inline Elem elem_of(DeviceDType t) {
  switch (t) {
    case DeviceDType::fp16:
      return Elem::fp16;
    case DeviceDType::fp32:
      return Elem::fp32;
    case DeviceDType::bf16:
      break;
  }
  return Elem::bf16;
}
// The caller's DeviceDType for a kernel element type (elem_of's inverse).
inline DeviceDType dtype_of(Elem e) {
  switch (e) {
    case Elem::fp16:
      return DeviceDType::fp16;
    case Elem::fp32:
      return DeviceDType::fp32;
    case Elem::bf16:
      break;
  }
  return DeviceDType::bf16;
}
inline int elem_bytes(Elem e) { return static_cast<int>(bytes_per_element(dtype_of(e))); }

// The parameter chain every kernel reads (FlashAttention's Qkv_params -> Flash_fwd_params ->
// Flash_bwd_params, in our words): QkvParams holds the tensors and scalars every kernel reads;
// each family's forward and backward extend it with their outputs and work lists. The sm_90a
// kernels' HopperAttention (hopper/dense_forward.hpp) extends it too.
struct QkvParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int head_dim = 0;    // q, k, dq, dk
  int head_dim_v = 0;  // v, out, dout, dv (0: head_dim); sm_90a: 192/128 only
  float scale = 1.0f;
  float softcap = 0.0f;  // s <- softcap · tanh(s / softcap) on the scaled scores
  bool causal = false;
  // Every row start and stride is a multiple of 8 elements (the pointers 16-byte aligned)
  // and head_dim equals the instantiated head dim, so rows can be read with 16-byte copies.
  bool vector_loads = false;
  RINGATTN_HOST_DEVICE int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // A q/k row offset or stride (elements, whole rows of head_dim) as the v/out one.
  RINGATTN_HOST_DEVICE int64_t value_elems(int64_t x) const {
    return value_floats(x, head_dim, value_dim());
  }
};

// The native forward over SubseqTasks (and the sm_90a task forward).
struct FlashForwardParams : QkvParams {
  float* out = nullptr;
  float* lse = nullptr;
  const SubseqTask* tasks = nullptr;   // device
  const ForwardItem* items = nullptr;  // device: (task, first query row), kQueryTile rows each
  int64_t n_items = 0;
  bool accumulate = false;  // merge into (out, lse) by log-sum-exp instead of writing
  float out_scale = 1.0f;   // applied when writing (not when merging), as on the CPU
};

// The native backward over SubseqTasks (and the sm_90a task backward).
struct FlashBackwardParams : QkvParams {
  const float* out = nullptr;  // as the forward wrote it (including out_scale)
  const float* lse = nullptr;  // the final lse of each row
  const void* dout = nullptr;
  const float* delta = nullptr;  // rowsum(out ∘ dout) per lse row, from launch_row_dot
  float* dq = nullptr;           // accumulated into (+=)
  float* dk = nullptr;           // accumulated into (+=)
  float* dv = nullptr;           // accumulated into (+=)
  const SubseqTask* tasks = nullptr;
  const ForwardItem* q_items = nullptr;  // (task, first query row): the dQ pass
  int64_t n_q_items = 0;
  const ForwardItem* k_items = nullptr;  // (task, first key row): the dK/dV pass
  int64_t n_k_items = 0;
  float out_scale = 1.0f;   // true O = out / out_scale
  float dout_scale = 1.0f;  // true dO = dout * dout_scale
};

// The block-sparse kernels' lists are the CPU's own structs (kernels/cpu_block_sparse.hpp:
// SparseQueryTile/KeySpan for the forward and the dQ pass, SparseKeyTile/QuerySpan for the
// dK/dV pass), uploaded as they are; a work item is (tile, first row) and covers kQueryTile
// query rows (or kKeyTile key rows) of its tile.
struct SparseForwardParams : QkvParams {
  float* out = nullptr;
  float* lse = nullptr;
  const SparseQueryTile* tiles = nullptr;  // device
  const KeySpan* spans = nullptr;          // device
  const ForwardItem* items = nullptr;      // device: (tile, first query row of the tile)
  int64_t n_items = 0;
  int64_t q_stride = 0;  // elements between consecutive query rows (q, out)
  int64_t lse_stride = 1;
  // Sliding window in the spans' index units (KeySpan/QuerySpan causal_offset), as for the CPU
  // kernels (SparseParams); kNoWindow: none.
  int64_t window_left = kNoWindow, window_right = kNoWindow;
  bool accumulate = false;  // merge into (out, lse) by log-sum-exp instead of writing
};

struct SparseBackwardParams : QkvParams {
  const void* dout = nullptr;
  const float* lse = nullptr;    // the final lse of each row
  const float* delta = nullptr;  // rowsum(out ∘ dout), laid out like lse
  float* dq = nullptr;           // accumulated into (+=)
  float* dk = nullptr;           // accumulated into (+=)
  float* dv = nullptr;           // accumulated into (+=)
  // The dQ pass: query tiles walking key spans.
  const SparseQueryTile* q_tiles = nullptr;
  const KeySpan* key_spans = nullptr;
  const ForwardItem* q_items = nullptr;  // (query tile, first query row)
  int64_t n_q_items = 0;
  // The dK/dV pass: key tiles walking query spans.
  const SparseKeyTile* k_tiles = nullptr;
  const QuerySpan* query_spans = nullptr;
  const ForwardItem* k_items = nullptr;  // (key tile, first key row)
  int64_t n_k_items = 0;
  int64_t q_stride = 0;  // elements between consecutive query rows (q, dout, dq)
  int64_t lse_stride = 1;
  int64_t window_left = kNoWindow, window_right = kNoWindow;  // as in SparseForwardParams
};

}  // namespace ringattn::kernels::cuda

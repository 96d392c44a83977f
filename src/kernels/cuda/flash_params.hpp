// The CUDA kernels' interface: the same contract as the CPU kernels (kernels/cpu_flash.hpp),
// on device pointers. A launch runs one pass: a device array of SubseqTasks (strided query
// and key views into [B, N, H, D] tensors, so dilated patterns are read in place) and a
// device array of work items. q, k, v and dout are bf16 or fp16 (or fp32 on the simple
// path); out, lse, dq, dk and dv are fp32, so the ring can carry and merge partial results.
// Element offsets and strides in the tasks are in elements of the tensor they index.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cpu_flash.hpp"
#include "kernels/cuda/tiles.hpp"
#include "ringattn/types.hpp"

namespace ringattn::kernels::cuda {

enum class Elem { bf16, fp16, fp32 };

const char* to_string(Elem e);
inline int elem_bytes(Elem e) { return e == Elem::fp32 ? 4 : 2; }
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

struct FlashForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  const SubseqTask* tasks = nullptr;   // device
  const ForwardItem* items = nullptr;  // device: (task, first query row), kQueryTile rows each
  int64_t n_items = 0;
  int head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  bool accumulate = false;  // merge into (out, lse) by log-sum-exp instead of writing
  float out_scale = 1.0f;   // applied when writing (not when merging), as on the CPU
  // Every row start and stride is a multiple of 8 elements and head_dim equals the
  // instantiated head dim, so rows can be read with 16-byte copies.
  bool vector_loads = false;
};

struct FlashBackwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
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
  int head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  float out_scale = 1.0f;   // true O = out / out_scale
  float dout_scale = 1.0f;  // true dO = dout * dout_scale
  bool vector_loads = false;
};

// Tensor-core kernels (mma.sync m16n8k16, sm_80+), one explicit instantiation per element
// type and padded head dim, in flash_fwd_hdim*.cu / flash_bwd_hdim*.cu.
template <Elem E, int kHeadDim>
void launch_flash_forward(const FlashForwardParams& p, cudaStream_t stream);
template <Elem E, int kHeadDim>
void launch_flash_backward(const FlashBackwardParams& p, cudaStream_t stream);

// Dispatch on (element type, head dim) to the instantiations above; fp32 goes to the simple
// CUDA-core kernels (simple_fp32.cu), which handle any head dim up to 256.
// Empty when the tensor-core kernels for `head_dim` in `e` fit `device`'s opt-in shared
// memory per block; otherwise why not (sizes and limit), for a note.
std::string native_kernels_fit(int64_t head_dim, Elem e, int device);

void flash_forward(Elem e, const FlashForwardParams& p, cudaStream_t stream);
void flash_backward(Elem e, const FlashBackwardParams& p, cudaStream_t stream);

void launch_simple_forward_fp32(const FlashForwardParams& p, cudaStream_t stream);
void launch_simple_backward_fp32(const FlashBackwardParams& p, cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

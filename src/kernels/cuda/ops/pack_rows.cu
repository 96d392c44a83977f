// The exchanges' row packing (see device_ops.hpp): K/V rows packed into a send buffer by runs,
// and returned dK/dV partials added back into their rows.
#include <cmath>

#include "kernels/cuda/elem_type.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/ops/launch_shape.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {

namespace {

using namespace ops_detail;

// The run holding packed row `row` (runs sorted by base, covering [0, total_rows)).
__device__ __forceinline__ int64_t run_of(const PackParams& p, int64_t row) {
  int64_t lo = 0, hi = p.n_runs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.runs[mid].base <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// One warp per packed row: its K and V rows, element by element.
template <typename T>
__global__ void pack_rows_kernel(const PackParams p, const T* k, const T* v, T* buf) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       r < p.total_rows; r += warps) {
    const PackedRun run = p.runs[run_of(p, r)];
    const int64_t at = run.row0 + (r - run.base) * run.stride;
    const int64_t br = run.buf_row + (r - run.base);
    const int64_t dv = p.value_dim(), at_v = p.value_elems(at);
    T* kb = buf + br * p.head_dim;
    T* vb = buf + p.buffer_rows * p.head_dim + br * dv;
    for (int64_t d = lane; d < p.head_dim; d += 32) kb[d] = k[at + d];
    for (int64_t d = lane; d < dv; d += 32) vb[d] = v[at_v + d];
  }
}

// Parallel over packed rows (no two name one row).
__global__ void unpack_add_kernel(const PackParams p, const float* buf, float* dk, float* dv) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       r < p.total_rows; r += warps) {
    const PackedRun run = p.runs[run_of(p, r)];
    const int64_t at = run.row0 + (r - run.base) * run.stride;
    const int64_t br = run.buf_row + (r - run.base);
    const int64_t d_v = p.value_dim(), at_v = p.value_elems(at);
    const float* kb = buf + br * p.head_dim;
    const float* vb = buf + p.buffer_rows * p.head_dim + br * d_v;
    for (int64_t d = lane; d < p.head_dim; d += 32) dk[at + d] += kb[d];
    for (int64_t d = lane; d < d_v; d += 32) dv[at_v + d] += vb[d];
  }
}

// One thread per column of K or of V, every packed row in order (rows may repeat across
// runs): threads [0, D) add dK's columns, [D, D + Dv) dV's.
__global__ void unpack_add_serial_kernel(const PackParams p, const float* buf, float* dk,
                                         float* dv) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t d_v = p.value_dim();
  if (c >= p.head_dim + d_v) return;
  const bool is_v = c >= p.head_dim;
  const int64_t d = is_v ? c - p.head_dim : c;
  const int64_t width = is_v ? d_v : p.head_dim;
  const float* half = is_v ? buf + p.buffer_rows * p.head_dim : buf;
  float* dst = is_v ? dv : dk;
  for (int64_t i = 0; i < p.n_runs; ++i) {
    const PackedRun run = p.runs[i];
    for (int64_t j = 0; j < run.rows; ++j) {
      const int64_t at = run.row0 + j * run.stride;
      dst[(is_v ? p.value_elems(at) : at) + d] += half[(run.buf_row + j) * width + d];
    }
  }
}

}  // namespace

void launch_pack_rows(Elem e, const PackParams& p, const void* k, const void* v, void* buf,
                      cudaStream_t stream) {
  if (p.total_rows == 0) return;
  const dim3 grid(blocks_for(p.total_rows, kThreads / 32)), block(kThreads);
  switch (e) {
    case Elem::bf16:
      launch_kernel("pack_rows_kernel", &pack_rows_kernel<__nv_bfloat16>, grid, block, 0, stream, p,
                    static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v),
                    static_cast<__nv_bfloat16*>(buf));
      break;
    case Elem::fp16:
      launch_kernel("pack_rows_kernel", &pack_rows_kernel<__half>, grid, block, 0, stream, p,
                    static_cast<const __half*>(k), static_cast<const __half*>(v),
                    static_cast<__half*>(buf));
      break;
    case Elem::fp32:
      launch_kernel("pack_rows_kernel", &pack_rows_kernel<float>, grid, block, 0, stream, p,
                    static_cast<const float*>(k), static_cast<const float*>(v),
                    static_cast<float*>(buf));
      break;
  }
  RINGATTN_CUDA_CHECK_LAUNCH("pack_rows_kernel");
}

void launch_unpack_add_rows(const PackParams& p, const float* buf, float* dk, float* dv,
                            bool rows_may_repeat, cudaStream_t stream) {
  if (p.total_rows == 0) return;
  if (rows_may_repeat) {
    launch_kernel("unpack_add_serial_kernel", &unpack_add_serial_kernel,
                  dim3(blocks_for(p.head_dim + p.value_dim(), 128)), dim3(128), 0, stream, p, buf, dk, dv);
    RINGATTN_CUDA_CHECK_LAUNCH("unpack_add_serial_kernel");
  } else {
    launch_kernel("unpack_add_kernel", &unpack_add_kernel,
                  dim3(blocks_for(p.total_rows, kThreads / 32)), dim3(kThreads), 0, stream, p, buf,
                  dk, dv);
    RINGATTN_CUDA_CHECK_LAUNCH("unpack_add_kernel");
  }
}

}  // namespace ringattn::kernels::cuda

// The tensor-core building blocks of the flash kernels, on the PTX instructions of
// device_seam.cuh: cp.async copies into shared memory, ldmatrix (plain and transposed),
// mma.sync m16n8k16 with fp32 accumulation, and two warp-level products that every kernel
// is written with. Fragment layouts (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type"): with g = lane / 4 and
// t = lane % 4, A (16×16) register r holds row g + 8·(r & 1), columns 2t, 2t+1 (+8 for r ≥ 2);
// B (16×8) register r holds rows 2t, 2t+1 (+8 for r = 1) of column g; the fp32 accumulator
// C (16×8) holds c0, c1 at row g and c2, c3 at row g + 8, columns 2t, 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/device_seam.cuh"

namespace ringattn::kernels::cuda {

// 16 bytes global → shared, bypassing L1; with `valid` false the 16 bytes are zero-filled
// and nothing is read (src-size 0).
__device__ __forceinline__ void cp_async_16(SmemAddr dst, const void* src, bool valid) {
  ptx::cp_async_cg_16(dst, src, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { ptx::cp_async_commit_group(); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  ptx::cp_async_wait_group<kPending>();
}

// c += a · b for one 16×8×16 tile.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    ptx::mma_m16n8k16_bf16(c, a, b0, b1);
  } else {
    static_assert(std::is_same_v<T, __half>, "mma_16816: bf16 or fp16 only");
    ptx::mma_m16n8k16_f16(c, a, b0, b1);
  }
}

// Two floats → one register of two 16-bit values, `lo` in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else
    return x;
}

// C[16 × kN] += A[16 × kK] · Bᵀ, with A the warp's 16 rows in shared memory (row-major,
// kK contiguous, row pitch kPitch elements) and B stored as kN rows of kK (the same layout):
// S = Q Kᵀ and its relatives. Both operands come in through ldmatrix without transposition.
template <typename T, int kN, int kK, int kPitch>
__device__ __forceinline__ void warp_mma_rows_rows(float (&c)[kN / 8][4], SmemPtr<T> sA,
                                                   SmemPtr<T> sB, int lane) {
  static_assert(kN % 16 == 0 && kK % 16 == 0, "tile sizes must be multiples of 16");
  // A: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
  // (rows 8-15, cols 8-15) from lanes 0-7, 8-15, 16-23, 24-31 → registers a0..a3.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_col = (lane >> 4) * 8;
  // B: matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15)
  // → b0, b1 of n-tile 2j and b0, b1 of n-tile 2j+1.
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const int b_col = ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[4];
    ptx::ldmatrix_x4(a, smem_addr(sA + a_row * kPitch + kk * 16 + a_col));
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, smem_addr(sB + (j * 16 + b_row) * kPitch + kk * 16 + b_col));
      mma_16816<T>(c[2 * j], a, b[0], b[1]);
      mma_16816<T>(c[2 * j + 1], a, b[2], b[3]);
    }
  }
}

// C[16 × kN] += A[16 × kK] · B, with A in registers as fp32 accumulator fragments of a
// 16 × kK product (P or dS, rounded to T here) and B stored row-major as kK rows of kN in
// shared memory (V, K, Q or dO), read through transposing ldmatrix: O += P V and relatives.
template <typename T, int kN, int kK, int kPitch>
__device__ __forceinline__ void warp_mma_regs_rows(float (&c)[kN / 8][4],
                                                   const float (&a_frag)[kK / 8][4], SmemPtr<T> sB,
                                                   int lane) {
  static_assert(kN % 16 == 0 && kK % 16 == 0, "tile sizes must be multiples of 16");
  // B (transposed): matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
  // → b0, b1 of n-tile 2j and b0, b1 of n-tile 2j+1.
  const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int b_col = (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    // The accumulator layout of n-tiles 2kk and 2kk+1 is the A layout of one 16×16 tile.
    uint32_t a[4];
    a[0] = pack2<T>(a_frag[2 * kk][0], a_frag[2 * kk][1]);
    a[1] = pack2<T>(a_frag[2 * kk][2], a_frag[2 * kk][3]);
    a[2] = pack2<T>(a_frag[2 * kk + 1][0], a_frag[2 * kk + 1][1]);
    a[3] = pack2<T>(a_frag[2 * kk + 1][2], a_frag[2 * kk + 1][3]);
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, smem_addr(sB + (kk * 16 + b_row) * kPitch + j * 16 + b_col));
      mma_16816<T>(c[2 * j], a, b[0], b[1]);
      mma_16816<T>(c[2 * j + 1], a, b[2], b[3]);
    }
  }
}

// Loads rows [row0, row0 + kRows) of a strided view (row r at base + r·stride, `head_dim`
// valid columns) into shared memory with row pitch kPitch. Rows at or past n_rows and
// columns at or past head_dim read as zero. With `vector` (16-byte aligned rows, head_dim ==
// kCols) it issues cp.async copies (the caller commits and waits); otherwise plain loads.
template <typename T, int kRows, int kCols, int kPitch, int kThreads>
__device__ __forceinline__ void load_rows(SmemPtr<T> dst, const T* base, int64_t stride,
                                          int64_t row0, int64_t n_rows, int head_dim, bool vector) {
  constexpr int kChunks = kCols / 8;  // 16-byte chunks per row
  for (int c = static_cast<int>(threadIdx.x); c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    const int64_t row = row0 + r;
    const bool valid = row < n_rows;
    const T* src = base + (valid ? row * stride + col : 0);
    const SmemPtr<T> d = dst + r * kPitch + col;
    if (vector) {
      cp_async_16(smem_addr(d), src, valid);
    } else {
#pragma unroll
      for (int u = 0; u < 8; ++u) d[u] = (valid && col + u < head_dim) ? src[u] : T(0.0f);
    }
  }
}

}  // namespace ringattn::kernels::cuda

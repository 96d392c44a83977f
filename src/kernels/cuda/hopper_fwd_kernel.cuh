// The Hopper (sm_90a) forward kernel's body, written once for every kind of work: the dense
// forward (hopper_fwd.cu) and the block-sparse one (hopper_sparse_fwd.cu) differ only in the
// `Work` they instantiate it with, which says which Q tile a block loads, where its rows'
// results go, which K/V tiles it walks and how far each row reaches. The producer and
// consumer warpgroups, the two-stage K/V ring under mbarriers, the wgmma products, the online
// softmax and the epilogue (write, or merge by log-sum-exp) are here.
//
// Block: warpgroup 0 produces (one thread issues the TMA loads), warpgroup 1 consumes a
// 64-row Q tile against 64-key K/V tiles. Shared memory, from a 1024-byte aligned base: the
// mbarriers (q_full, full[2], empty[2]) in the first 1024 bytes, then Q, K[2], V[2], each a
// 64-row tile stored as D/64 boxes of 64 × 64 elements (8 KiB) with the 128-byte swizzle.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/mma_primitives.cuh"
#include "ringattn/errors.hpp"

#if !RINGATTN_CUDA_EMULATION
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

namespace ringattn::kernels::cuda::hopper {

constexpr int kRows = 64;                    // query rows per block, keys per tile
constexpr uint32_t kBoxBytes = 64 * 64 * 2;  // one 64 × 64 box of 16-bit elements
constexpr int kThreads = 256;                // producer and consumer warpgroups
constexpr float kLn2f = 0.6931471805599453f;

// A block's query rows: the Q box's coordinates in the [B, N, H, D] tensor, and where row r
// of the box writes (out + r·out_stride, lse + r·lse_stride, for r < rows only). `row0` is
// the first row's index in the work's own frame (Work::reach takes it back).
struct QueryRows {
  int n, h, b;
  float* out;
  float* lse;
  int64_t out_stride, lse_stride;
  int rows, row0;
  float out_scale = 1.0f;  // applied when writing out (not when merging), as the native kernels
};

// One K/V tile a block walks: the box's coordinates in the [B, N, HKV, D] tensors and where
// its columns sit in the rows' reach: column c holds a key that a row of reach [lo, hi) may
// see iff lo <= base + c < hi and c < limit.
struct KeyTile {
  int n, h, b;
  int base, limit;
};

// The keys a query row may see, in KeyTile::base's frame: [lo, hi).
struct Reach {
  int lo, hi;
};

template <class Work>
struct Args {
  TmaDesc q, k, v;
  float scale_log2;
  bool accumulate;  // merge into (out, lse) by log-sum-exp instead of writing them
  Work work;
};

__host__ __device__ constexpr uint32_t tile_bytes(int head_dim) {
  return static_cast<uint32_t>(head_dim / 64) * kBoxBytes;
}
__host__ __device__ constexpr uint32_t smem_bytes(int head_dim) {
  return 1024 + 5 * tile_bytes(head_dim) + 1024;  // + the alignment slack
}

// A wgmma descriptor with the 128-byte swizzle (bits as in the PTX ISA).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((start >> 4) & 0x3fff) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3fff) << 32) | (static_cast<uint64_t>(1) << 62);
}

#if RINGATTN_CUDA_EMULATION
inline uint32_t u32(SmemAddr a) { return a.offset; }
inline SmemAddr at(uint32_t a) { return SmemAddr{a}; }
#else
__device__ __forceinline__ uint32_t u32(uint32_t a) { return a; }
__device__ __forceinline__ uint32_t at(uint32_t a) { return a; }
#endif

template <int kD, bool kBf16, class Work>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_fwd_kernel(const RINGATTN_GRID_CONSTANT Args<Work> p) {
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  constexpr int kHalves = kD / 64;
  constexpr uint32_t kTile = tile_bytes(kD);
  const uint32_t raw = u32(smem_addr(dynamic_smem<unsigned char>()));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bar_q = base, q_s = base + 1024;
  auto full = [&](int s) { return base + 8 + 8 * static_cast<uint32_t>(s); };
  auto empty = [&](int s) { return base + 24 + 8 * static_cast<uint32_t>(s); };
  auto k_s = [&](int s) { return q_s + kTile * (1 + static_cast<uint32_t>(s)); };
  auto v_s = [&](int s) { return q_s + kTile * (3 + static_cast<uint32_t>(s)); };

  const QueryRows qr = p.work.query_rows(kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  if (threadIdx.x == 0) {
    ptx::mbarrier_init(at(bar_q), 1);
    for (int s = 0; s < 2; ++s) {
      ptx::mbarrier_init(at(full(s)), 1);
      ptx::mbarrier_init(at(empty(s)), 128);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: one thread issues every load
    ptx::setmaxnreg<false, 40>();
    if (threadIdx.x != 0) return;
    ptx::mbarrier_arrive_expect_tx(at(bar_q), kTile);
    for (int x = 0; x < kHalves; ++x)
      ptx::tma_load_4d(at(q_s + static_cast<uint32_t>(x) * kBoxBytes), p.q, at(bar_q), 64 * x, qr.h,
                       qr.n, qr.b);
    typename Work::Cursor cursor = p.work.begin(qr);
    KeyTile t;
    for (int j = 0; p.work.next(cursor, t); ++j) {
      const int s = j & 1, use = j >> 1;
      ptx::mbarrier_wait(at(empty(s)), static_cast<unsigned>((use + 1) & 1));
      ptx::mbarrier_arrive_expect_tx(at(full(s)), 2 * kTile);
      for (int x = 0; x < kHalves; ++x) {
        ptx::tma_load_4d(at(k_s(s) + static_cast<uint32_t>(x) * kBoxBytes), p.k, at(full(s)),
                         64 * x, t.h, t.n, t.b);
        ptx::tma_load_4d(at(v_s(s) + static_cast<uint32_t>(x) * kBoxBytes), p.v, at(full(s)),
                         64 * x, t.h, t.n, t.b);
      }
    }
    return;
  }

  // The consumer warpgroup: warp w of it owns rows 16w..16w+15 of the tile; a lane holds
  // rows lane/4 and lane/4 + 8 of those (index r = 0, 1), as wgmma's accumulator does.
  ptx::setmaxnreg<true, 232>();
  const int local0 = 16 * (warp - 4) + lane / 4;
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) reach[r] = p.work.reach(qr, local0 + 8 * r);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  ptx::mbarrier_wait(at(bar_q), 0);
  typename Work::Cursor cursor = p.work.begin(qr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(full(s)), static_cast<unsigned>(use & 1));
    float sc[32];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t step =
          static_cast<uint32_t>(kk / 4) * kBoxBytes + 32u * static_cast<uint32_t>(kk % 4);
      ptx::wgmma_ss<64, kBf16>(sc, sw128_desc(q_s + step, 16, 1024),
                               sw128_desc(k_s(s) + step, 16, 1024), kk > 0 ? 1 : 0);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    // Scores in the log2 domain; columns outside the row's reach are masked.
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lo[r] = reach[r].lo - t.base;
      hi[r] = reach[r].hi - t.base < t.limit ? reach[r].hi - t.base : t.limit;
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int r = (i >> 1) & 1;
      const int col = 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
      const float x = col < lo[r] || col >= hi[r] ? -INFINITY : sc[i] * p.scale_log2;
      sc[i] = x;
      tile_max[r] = fmaxf(tile_max[r], x);
    }
    float corr[2], base_m[2], tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      base_m[r] = m_new == -INFINITY ? 0.0f : m_new;
      corr[r] = exp2f(m[r] - base_m[r]);  // 0 while m was -inf
      m[r] = m_new;
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int r = (i >> 1) & 1;
      sc[i] = exp2f(sc[i] - base_m[r]);
      tile_sum[r] += sc[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + tile_sum[r];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] *= corr[(i >> 1) & 1];
    // P as wgmma's register A, 16 keys per step: the accumulator's 8-column slices 2kk and
    // 2kk + 1 are mma.m16n8k16's A fragment (rows r, r + 8; keys 2t.., 8 + 2t..).
    uint32_t a[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x) a[kk][x] = pack2<T>(sc[8 * kk + 2 * x], sc[8 * kk + 2 * x + 1]);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ptx::wgmma_rs_tb<kD, kBf16>(
          o, a[kk], sw128_desc(v_s(s) + 2048u * static_cast<uint32_t>(kk), kBoxBytes, 1024), 1);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::mbarrier_arrive(at(empty(s)));
  }
  // The epilogue: out = o / l and lse = (m + log2 l)·ln 2, written, or merged into the
  // (out, lse) already there as merge_lse_row does. Every lane of a row reads the old lse
  // before the row's first lane writes the new one.
  float row_lse[2], inv[2], old_lse[2];
  bool valid[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    valid[r] = local0 + 8 * r < qr.rows;
    row_lse[r] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2f : -INFINITY;
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    old_lse[r] = p.accumulate && valid[r]
                     ? qr.lse[static_cast<int64_t>(local0 + 8 * r) * qr.lse_stride]
                     : -INFINITY;
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    const int64_t row = local0 + 8 * r;
    float ca = 0.0f, cb = p.accumulate ? inv[r] : inv[r] * qr.out_scale, new_lse = row_lse[r];
    if (p.accumulate) {
      if (row_lse[r] == -INFINITY) continue;  // nothing to add
      if (old_lse[r] != -INFINITY) {
        const float mx = fmaxf(old_lse[r], row_lse[r]);
        const float wa = expf(old_lse[r] - mx), wb = expf(row_lse[r] - mx);
        const float norm = 1.0f / (wa + wb);
        ca = wa * norm;
        cb = wb * norm * inv[r];
        new_lse = mx + logf(wa + wb);
      }
    }
    float* out = qr.out + row * qr.out_stride;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) {
      if (((i >> 1) & 1) != r) continue;
      float& x = out[8 * (i / 4) + 2 * (lane % 4) + (i & 1)];
      const float mine = o[i] * cb;
      x = ca == 0.0f ? mine : ca * x + mine;
    }
    if (lane % 4 == 0) qr.lse[row * qr.lse_stride] = new_lse;
  }
#else
  (void)p;
#endif
}

// The [B, N, H, D] position of an element offset into such a tensor (of `heads` heads).
__device__ __forceinline__ void position_of(int64_t offset, int head_dim, int heads, int seq_len,
                                            int& n, int& h, int& b) {
  const int64_t row = offset / head_dim;
  h = static_cast<int>(row % heads);
  const int64_t flat = row / heads;
  n = static_cast<int>(flat % seq_len);
  b = static_cast<int>(flat / seq_len);
}

// A [B, N, heads, D] tensor of 16-bit elements as a rank-4 tensor map: dimensions (D, heads,
// N, B), boxes of 64 × 1 × 64 × 1 with the 128-byte swizzle, zeros out of bounds. With `step`
// > 1 the map is the strided view of rows phase, phase + step, ... (< N) of every batch: row
// index n of the map is row phase + n·step of the tensor (a dilated pattern's rows; with
// batch 1 and seq_len B·N, of the batches' rows end to end).
inline TmaDesc tensor_map(const void* base, Elem elem, int batch, int seq_len, int heads,
                          int head_dim, int phase = 0, int step = 1) {
  const uint64_t d = static_cast<uint64_t>(head_dim);
  const uint64_t dims[4] = {d, static_cast<uint64_t>(heads),
                            static_cast<uint64_t>((seq_len - phase + step - 1) / step),
                            static_cast<uint64_t>(batch)};
  uint64_t strides[3] = {2 * d, 2 * d * static_cast<uint64_t>(heads) * static_cast<uint64_t>(step),
                         2 * d * static_cast<uint64_t>(heads) * static_cast<uint64_t>(seq_len)};
  // Dimensions may not overlap; with one batch its stride is never used, so it can be the
  // view's whole span (which passes N when the last row of the view's step grid is past N).
  if (batch == 1 && dims[2] * strides[1] > strides[2]) strides[2] = dims[2] * strides[1];
  base = static_cast<const char*>(base) + 2 * d * static_cast<uint64_t>(heads) *
                                              static_cast<uint64_t>(phase);
  const uint32_t box[4] = {64, 1, kRows, 1};
  TmaDesc map;
#if RINGATTN_CUDA_EMULATION
  (void)elem;
  const std::string why = emu::encode_tensor_map_tiled(
      map, 2, 4, base, dims, strides, box, emu::TmaSwizzle::bytes128, emu::TmaOobFill::zeros);
  if (!why.empty()) throw RuntimeFailure("the Hopper forward's tensor map is refused: " + why);
#else
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) throw RuntimeFailure("the driver has no cuTensorMapEncodeTiled");
  const uint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult rc = encode(
      &map, elem == Elem::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS)
    throw RuntimeFailure("cuTensorMapEncodeTiled refused the Hopper forward's tensor map (error " +
                         std::to_string(static_cast<int>(rc)) + ")");
#endif
  return map;
}

// "" when the Hopper kernels can run D = head_dim in `elem` on `device`, else why not.
inline std::string device_unsupported(int head_dim, Elem elem, int device) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return "head dim " + std::to_string(head_dim) + " (64, 128 or 256)";
  if (elem == Elem::fp32) return "fp32 inputs (bf16 or fp16)";
  int major = 0, minor = 0;
  RINGATTN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  RINGATTN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0)
    return "compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           " (the kernel is sm_90a's)";
#if !RINGATTN_CUDA_EMULATION && !defined(RINGATTN_SM90A_KERNELS)
  return "this build has no sm_90a code";
#endif
  return "";
}

// Launches hopper_fwd_kernel<kD, kBf16, Work> on `grid` (shared memory raised on every
// launch: the attribute is per device).
template <int kD, bool kBf16, class Work>
void launch(const char* name, const Args<Work>& a, dim3 grid, cudaStream_t stream) {
  auto* kernel = &hopper_fwd_kernel<kD, kBf16, Work>;
  const int smem = static_cast<int>(smem_bytes(kD));
  RINGATTN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_kernel(name, kernel, grid, dim3(kThreads), static_cast<std::size_t>(smem), stream, a);
  RINGATTN_CUDA_CHECK_LAUNCH("hopper_fwd_kernel");
}

// The (head dim, dtype) switch.
template <class Work>
void launch_for(int head_dim, Elem elem, const char* name, const Args<Work>& a, dim3 grid,
                cudaStream_t stream) {
  const bool bf16 = elem == Elem::bf16;
  if (head_dim == 64)
    bf16 ? launch<64, true>(name, a, grid, stream) : launch<64, false>(name, a, grid, stream);
  else if (head_dim == 128)
    bf16 ? launch<128, true>(name, a, grid, stream) : launch<128, false>(name, a, grid, stream);
  else
    bf16 ? launch<256, true>(name, a, grid, stream) : launch<256, false>(name, a, grid, stream);
}

}  // namespace ringattn::kernels::cuda::hopper

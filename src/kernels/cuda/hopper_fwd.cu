// The Hopper forward kernel (see hopper_fwd.hpp). Block: warpgroup 0 produces (one thread
// issues the TMA loads), warpgroup 1 consumes a 64-row Q tile against 64-key K/V tiles in a
// two-stage ring of buffers. Shared memory, from a 1024-byte aligned base: the mbarriers
// (q_full, full[2], empty[2]) in the first 1024 bytes, then Q, K[2], V[2], each a 64-row
// tile stored as D/64 boxes of 64 × 64 elements (8 KiB) with the 128-byte swizzle.
#include "kernels/cuda/hopper_fwd.hpp"

#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/mma_primitives.cuh"
#include "ringattn/errors.hpp"

#if !RINGATTN_CUDA_EMULATION
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

namespace ringattn::kernels::cuda {

namespace {

constexpr int kRows = 64;                     // query rows per block, keys per tile
constexpr uint32_t kBoxBytes = 64 * 64 * 2;   // one 64 × 64 box of 16-bit elements
constexpr int kThreads = 256;                 // producer and consumer warpgroups
constexpr float kLn2f = 0.6931471805599453f;

struct HopperFwdArgs {
  TmaDesc q, k, v;
  float* out;
  float* lse;
  int batch, seq_len, heads, kv_heads;
  float scale_log2;
  int left, right;  // query p sees keys [p - left, p + right]
  const int* cu_seqlens;  // packed documents (null: one), n_docs + 1 offsets
  int n_docs;
};

// The document [start, end) holding row `row` (the whole sequence without packing).
__device__ __forceinline__ void document_of(const HopperFwdArgs& p, int row, int& start,
                                            int& end) {
  start = 0, end = p.seq_len;
  if (!p.cu_seqlens || row >= p.seq_len) return;
  int lo = 0, hi = p.n_docs - 1;  // the last document whose start is <= row
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.cu_seqlens[mid] <= row) lo = mid; else hi = mid - 1;
  }
  start = p.cu_seqlens[lo], end = p.cu_seqlens[lo + 1];
}

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

template <int kD, bool kBf16>
__global__ void __launch_bounds__(kThreads, 1) hopper_fwd_kernel(const RINGATTN_GRID_CONSTANT HopperFwdArgs p) {
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

  const int q_tile = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const int hk = h / (p.heads / p.kv_heads);
  // The key tiles some row of this query tile can see: [j0, j1].
  const int all_tiles = (p.seq_len + kRows - 1) / kRows;
  const int last_row = kRows * q_tile + kRows - 1 < p.seq_len - 1 ? kRows * q_tile + kRows - 1
                                                                   : p.seq_len - 1;
  int first_start, first_end, last_start, last_end;
  document_of(p, kRows * q_tile, first_start, first_end);
  document_of(p, last_row, last_start, last_end);
  const int lo_reach = kRows * q_tile - p.left, hi_reach = last_row + p.right;
  const int lo = lo_reach > first_start ? lo_reach : first_start;
  const int hi = hi_reach < last_end - 1 ? hi_reach : last_end - 1;
  const int j0 = lo > 0 ? lo / kRows : 0;
  const int j1 = hi / kRows < all_tiles - 1 ? hi / kRows : all_tiles - 1;
  const int n_tiles = j1 - j0 + 1;
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
      ptx::tma_load_4d(at(q_s + static_cast<uint32_t>(x) * kBoxBytes), p.q, at(bar_q), 64 * x, h,
                       kRows * q_tile, b);
    for (int j = 0; j < n_tiles; ++j) {
      const int s = j & 1, use = j >> 1;
      ptx::mbarrier_wait(at(empty(s)), static_cast<unsigned>((use + 1) & 1));
      ptx::mbarrier_arrive_expect_tx(at(full(s)), 2 * kTile);
      for (int x = 0; x < kHalves; ++x) {
        ptx::tma_load_4d(at(k_s(s) + static_cast<uint32_t>(x) * kBoxBytes), p.k, at(full(s)),
                         64 * x, hk, kRows * (j0 + j), b);
        ptx::tma_load_4d(at(v_s(s) + static_cast<uint32_t>(x) * kBoxBytes), p.v, at(full(s)),
                         64 * x, hk, kRows * (j0 + j), b);
      }
    }
    return;
  }

  // The consumer warpgroup: warp w of it owns rows 16w..16w+15 of the tile; a lane holds
  // rows lane/4 and lane/4 + 8 of those (index r = 0, 1), as wgmma's accumulator does.
  ptx::setmaxnreg<true, 232>();
  const int row0 = kRows * q_tile + 16 * (warp - 4) + lane / 4;
  int doc_start[2], doc_end[2];
  for (int r = 0; r < 2; ++r) document_of(p, row0 + 8 * r, doc_start[r], doc_end[r]);
  float o[kD / 2];
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  ptx::mbarrier_wait(at(bar_q), 0);
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(full(s)), static_cast<unsigned>(use & 1));
    float sc[32];
    ptx::wgmma_fence();
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t step = static_cast<uint32_t>(kk / 4) * kBoxBytes + 32u * static_cast<uint32_t>(kk % 4);
      ptx::wgmma_ss<64, kBf16>(sc, sw128_desc(q_s + step, 16, 1024),
                               sw128_desc(k_s(s) + step, 16, 1024), kk > 0 ? 1 : 0);
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    // Scores in the log2 domain, masked: keys past N, and (causal) after the query.
    float tile_max[2] = {-INFINITY, -INFINITY};
    for (int i = 0; i < 32; ++i) {
      const int r = (i >> 1) & 1;
      const int key = kRows * (j0 + j) + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
      const int row = row0 + 8 * r;
      float x = sc[i] * p.scale_log2;
      if (key >= p.seq_len || key > row + p.right || key < row - p.left || key < doc_start[r] ||
          key >= doc_end[r])
        x = -INFINITY;
      sc[i] = x;
      tile_max[r] = fmaxf(tile_max[r], x);
    }
    float corr[2], base_m[2], tile_sum[2] = {0.0f, 0.0f};
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      base_m[r] = m_new == -INFINITY ? 0.0f : m_new;
      corr[r] = exp2f(m[r] - base_m[r]);  // 0 while m was -inf
      m[r] = m_new;
    }
    for (int i = 0; i < 32; ++i) {
      const int r = (i >> 1) & 1;
      sc[i] = exp2f(sc[i] - base_m[r]);
      tile_sum[r] += sc[i];
    }
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + tile_sum[r];
    for (int i = 0; i < kD / 2; ++i) o[i] *= corr[(i >> 1) & 1];
    // P as wgmma's register A, 16 keys per step: the accumulator's 8-column slices 2kk and
    // 2kk + 1 are mma.m16n8k16's A fragment (rows r, r + 8; keys 2t.., 8 + 2t..).
    uint32_t a[4][4];
    for (int kk = 0; kk < 4; ++kk)
      for (int x = 0; x < 4; ++x) a[kk][x] = pack2<T>(sc[8 * kk + 2 * x], sc[8 * kk + 2 * x + 1]);
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk)
      ptx::wgmma_rs_tb<kD, kBf16>(o, a[kk],
                                  sw128_desc(v_s(s) + 2048u * static_cast<uint32_t>(kk), kBoxBytes, 1024),
                                  1);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    ptx::mbarrier_arrive(at(empty(s)));
  }
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = row0 + 8 * r;
    if (row >= p.seq_len) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* out = p.out + ((static_cast<int64_t>(b) * p.seq_len + row) * p.heads + h) * kD;
    for (int i = 0; i < kD / 2; ++i)
      if (((i >> 1) & 1) == r) out[8 * (i / 4) + 2 * (lane % 4) + (i & 1)] = o[i] * inv;
    if (lane % 4 == 0)
      p.lse[(static_cast<int64_t>(b) * p.heads + h) * p.seq_len + row] =
          l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2f : -INFINITY;
  }
#else
  (void)p;
#endif
}

// A [B, N, heads, D] tensor of 16-bit elements as a rank-4 tensor map: dimensions (D, heads,
// N, B), boxes of 64 × 1 × 64 × 1 with the 128-byte swizzle, zeros out of bounds.
TmaDesc tensor_map(const void* base, const HopperForwardParams& p, int heads) {
  const uint64_t d = static_cast<uint64_t>(p.head_dim);
  const uint64_t dims[4] = {d, static_cast<uint64_t>(heads), static_cast<uint64_t>(p.seq_len),
                            static_cast<uint64_t>(p.batch)};
  const uint64_t strides[3] = {2 * d, 2 * d * static_cast<uint64_t>(heads),
                               2 * d * static_cast<uint64_t>(heads) * static_cast<uint64_t>(p.seq_len)};
  const uint32_t box[4] = {64, 1, kRows, 1};
  TmaDesc map;
#if RINGATTN_CUDA_EMULATION
  const std::string why = emu::encode_tensor_map_tiled(map, 2, 4, base, dims, strides, box,
                                                       emu::TmaSwizzle::bytes128,
                                                       emu::TmaOobFill::zeros);
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
      &map, p.elem == Elem::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS)
    throw RuntimeFailure("cuTensorMapEncodeTiled refused the Hopper forward's tensor map (error " +
                         std::to_string(static_cast<int>(rc)) + ")");
#endif
  return map;
}

template <int kD, bool kBf16>
void launch(const HopperForwardParams& p, cudaStream_t stream) {
  auto reach = [&](int64_t w) {
    return static_cast<int>(w < 0 || w > p.seq_len ? p.seq_len : w);
  };
  HopperFwdArgs a{tensor_map(p.q, p, p.heads), tensor_map(p.k, p, p.kv_heads),
                  tensor_map(p.v, p, p.kv_heads), p.out, p.lse, p.batch, p.seq_len,
                  p.heads, p.kv_heads, p.scale * 1.4426950408889634f,
                  reach(p.window_left), p.causal ? 0 : reach(p.window_right), p.cu_seqlens,
                  p.n_docs};
  auto* kernel = &hopper_fwd_kernel<kD, kBf16>;
  const int smem = static_cast<int>(smem_bytes(kD));
  RINGATTN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>((p.seq_len + kRows - 1) / kRows),
                  static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  launch_kernel("hopper_fwd_kernel", kernel, grid, dim3(kThreads), static_cast<std::size_t>(smem),
                stream, a);
  RINGATTN_CUDA_CHECK_LAUNCH("hopper_fwd_kernel");
}

}  // namespace

std::string hopper_forward_unsupported(const HopperForwardParams& p, int device) {
  if (p.head_dim != 64 && p.head_dim != 128) return "head dim " + std::to_string(p.head_dim) + " (64 or 128)";
  if (p.elem == Elem::fp32) return "fp32 inputs (bf16 or fp16)";
  if (p.kv_heads <= 0 || p.heads % p.kv_heads != 0) return "query heads not a multiple of K/V heads";
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

void hopper_forward(const HopperForwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_forward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper forward kernel cannot run: " + why);
  const bool bf16 = p.elem == Elem::bf16;
  if (p.head_dim == 64)
    bf16 ? launch<64, true>(p, stream) : launch<64, false>(p, stream);
  else
    bf16 ? launch<128, true>(p, stream) : launch<128, false>(p, stream);
}

}  // namespace ringattn::kernels::cuda

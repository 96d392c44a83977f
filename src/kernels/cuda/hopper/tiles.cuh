// The pieces every Hopper (sm_90a) attention kernel is built from: the 64-row tiles and what
// a `Work` hands a block (its rows, the tiles it walks, each row's reach), the block's shared
// memory (mbarriers, tiles loaded once, a two-stage ring of tile pairs), the producer's TMA
// loads, the two wgmma products (a 64 × 64 tile from two K-major tiles; a 64 × D tile from a
// register tile and an N-major one), the accumulator's layout, the tensor maps and the
// (head dim, dtype) launch switch. The forward (hopper/forward_mainloop.cuh) and the backward
// (hopper/launch_dense_backward.cu) are written against these.
//
// Shared memory, from a 1024-byte aligned base: the mbarriers (resident, full[stages],
// empty[stages]; two stages but in the ping-pong forward's 128-key steps) in the first 1024
// bytes, then the resident tiles and the ring (stage s: tiles (0, s) and (1, s)), each a 64-row
// tile stored as D/64 boxes of 64 × 64 elements (8 KiB) with the 128-byte swizzle.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/environment.hpp"
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/hopper/dense_forward.hpp"
#include "kernels/cuda/mma_primitives.cuh"
#include "kernels/cuda/params.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "ringattn/errors.hpp"

#if !RINGATTN_CUDA_EMULATION
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

namespace ringattn::kernels::cuda::hopper {

constexpr int kRows = 64;                    // rows per block, rows per walked tile
constexpr uint32_t kBoxBytes = 64 * 64 * 2;  // one 64 × 64 box of 16-bit elements
constexpr int kThreads = 256;                // producer and consumer warpgroups

// Blocks per SM a kernel is compiled for: two where two blocks' shared memory fits (head dims
// up to 128), so one block's consumer runs its wgmma while the other's runs its softmax (the
// overlap FlashAttention-3 gets from ping-pong between two consumer warpgroups of one block,
// left here to the warp schedulers). The 65,536 registers are split 128 per thread at launch;
// the producer gives back down to 32 and the consumer takes 224 (setmaxnreg; at 24 the
// block-sparse producer spilled). One block per SM keeps 40 and 232. Two blocks are the
// faster choice where they fit (docs/PERFORMANCE.md).
template <int kD>
inline constexpr int kBlocksPerSm = kD <= 128 ? 2 : 1;
template <int kD>
inline constexpr unsigned kProducerRegs = kBlocksPerSm<kD> == 2 ? 32u : 40u;
template <int kD>
inline constexpr unsigned kConsumerRegs = kBlocksPerSm<kD> == 2 ? 224u : 232u;
constexpr float kLn2f = 0.6931471805599453f;
constexpr float kLog2ef = 1.4426950408889634f;

// The log2-domain logit of a raw score S = q·k: S·scale·log2e, or with a soft-cap c,
// c·tanh(S·scale/c)·log2e (cap_in = scale/c, cap_log2 = c·log2e; 0 without a cap). The cap's
// slope d(capped)/d(scaled) = 1 − tanh² scales dS in the backward: from the score itself
// (slope_at_score), or from a logit the softmax already holds (slope_at_logit), tanh being
// logit / cap_log2.
// The kernels read the cap through the compile-time kCap (CapOf<Work>), so a kernel built for
// uncapped work holds no cap code at all (its registers, and ptxas's spills, are as they were).
struct Logits {
  float scale_log2 = 0.0f, cap_in = 0.0f, cap_log2 = 0.0f;

  __host__ __device__ bool capped() const { return cap_log2 > 0.0f; }
  template <bool kCap>
  __device__ __forceinline__ float logit(float s) const {
    if constexpr (kCap)
      return cap_log2 * tanhf(s * cap_in);
    else
      return s * scale_log2;
  }
  template <bool kCap>
  __device__ __forceinline__ float slope_at_score(float s) const {
    if constexpr (kCap) {
      const float t = tanhf(s * cap_in);
      return 1.0f - t * t;
    } else {
      return 1.0f;
    }
  }
  __device__ __forceinline__ float slope_at_logit(float logit) const {
    const float t = logit / cap_log2;
    return 1.0f - t * t;
  }
};
inline Logits logits_of(float scale, float softcap) {
  Logits lg;
  lg.scale_log2 = scale * kLog2ef;
  if (softcap > 0.0f) lg.cap_in = scale / softcap, lg.cap_log2 = softcap * kLog2ef;
  return lg;
}

// A Work whose job soft-caps its logits: the launches run the kernels' instantiation for it
// (CapOf<Work>::value, the kernels' kCap) where Logits::capped(), and the uncapped one
// otherwise.
template <class Work>
struct Capped : Work {
  static constexpr bool kCapped = true;
};
template <class Work>
struct CapOf {
  static constexpr bool value = false;
};
template <class Work>
struct CapOf<Capped<Work>> {
  static constexpr bool value = true;
};

// Whether the 64-key fused backward stores dS with stmatrix (backward_mainloop.cuh's
// store_ds) over `Work` at D = 128: where ptxas spills less with it (work_dense.cuh says
// true), until a GPU weighs the two stores. At D = 64 every fused form takes it.
template <class Work>
struct StmatrixDs {
  static constexpr bool value = false;
};
template <class Work>
struct StmatrixDs<Capped<Work>> : StmatrixDs<Work> {};

// A block's rows: the box's coordinates in the [B, N, H, D] tensor its rows come from, and
// (the forward's) where row r of the box writes (out + r·out_stride, lse + r·lse_stride, for
// r < rows only). `row0` is the first row's index in the work's own frame (Work::reach takes
// it back).
struct QueryRows {
  int n, h, b;
  float* out;
  float* lse;
  int64_t out_stride, lse_stride;
  int rows, row0;
  float out_scale = 1.0f;  // applied when writing out (not when merging), as the native kernels
};

// One tile a block walks: the box's coordinates in the walked tensors and where its columns
// sit in the rows' reach: column c may be seen by a row of reach [lo, hi) iff
// lo <= base + c < hi and c < limit.
struct KeyTile {
  int n, h, b;
  int base, limit;
};

// The columns a row may see, in KeyTile::base's frame: [lo, hi).
struct Reach {
  int lo, hi;
};

// Rows of a tensor (or of lse/delta) a fixed distance apart: row r is element at + r·stride.
struct Strided {
  int64_t at, stride;
};

// Row `reach` against tile `t`, in the tile's column frame.
__device__ __forceinline__ Reach columns_of(const Reach& reach, const KeyTile& t) {
  const int hi = reach.hi - t.base;
  return {reach.lo - t.base, hi < t.limit ? hi : t.limit};
}

// The consumer warpgroup's 64 × N accumulator (wgmma's): warp w owns rows 16w..16w+15, a
// lane rows lane/4 and lane/4 + 8 of those; register i holds row index acc_row(i) (0 or 1)
// and column acc_col(i, lane).
__device__ __forceinline__ int acc_row(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ int acc_col(int i, int lane) {
  return 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
}

__host__ __device__ constexpr uint32_t tile_bytes(int head_dim) {
  return static_cast<uint32_t>(head_dim / 64) * kBoxBytes;
}
// The shared memory of Stages<head_dim, resident, stages, head_dim_v> (0: head_dim) and slack.
__host__ __device__ constexpr uint32_t smem_bytes(int head_dim, int resident, int stages = 2,
                                                  int head_dim_v = 0) {
  const uint32_t dv = tile_bytes(head_dim_v > 0 ? head_dim_v : head_dim);
  return 1024 + (resident > 0 ? tile_bytes(head_dim) : 0u) +
         static_cast<uint32_t>(resident > 1 ? resident - 1 : 0) * dv +
         static_cast<uint32_t>(stages) * (tile_bytes(head_dim) + dv) + 1024;  // + slack
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

// The block's shared memory: kResident tiles loaded once (under one barrier) and the ring of
// kStages stages (two but in the ping-pong forward's 128-key steps). Tile 0 of the residents
// and of each stage is kD wide, the others kDv (values of their own head dim: V, dO); with
// kDv != kD one or two residents (Q; K and V; Q and dO) and the ring's (K, V) or (Q, dO).
template <int kD, int kResident, int kStages = 2, int kDv = kD>
struct Stages {
  static_assert(kStages >= 2 && 8 + 16 * kStages <= 1024, "the barriers fit the first 1 KiB");
  static_assert(kDv == kD || kResident <= 2, "a kD tile, then kDv ones");
  static constexpr uint32_t kTile = tile_bytes(kD), kTileV = tile_bytes(kDv);
  static constexpr uint32_t kResidentEnd =
      1024 + kTile + static_cast<uint32_t>(kResident - 1) * kTileV;
  uint32_t base;

  __device__ __forceinline__ static Stages of_block() {
    const uint32_t raw = u32(smem_addr(dynamic_smem<unsigned char>()));
    return {(raw + 1023u) & ~1023u};
  }
  __device__ __forceinline__ uint32_t resident_full() const { return base; }
  __device__ __forceinline__ uint32_t full(int s) const {
    return base + 8 + 8 * static_cast<uint32_t>(s);
  }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return base + 8 + 8 * static_cast<uint32_t>(kStages + s);
  }
  __device__ __forceinline__ uint32_t resident(int i) const {
    return base + 1024 + (i == 0 ? 0u : kTile + kTileV * static_cast<uint32_t>(i - 1));
  }
  __device__ __forceinline__ uint32_t ring(int tensor, int s) const {
    return base + kResidentEnd +
           (tensor == 0
                ? kTile * static_cast<uint32_t>(s)
                : kTile * static_cast<uint32_t>(kStages) + kTileV * static_cast<uint32_t>(s));
  }

  // Thread 0 initialises the barriers; the caller then synchronises the block. Every one of
  // the `consumers` threads (one warpgroup's, or the ping-pong forward's two) frees a stage;
  // `fillers` arrivals fill one (the producer's arrive.expect_tx, and the fused backward's
  // stats warp's lanes).
  __device__ __forceinline__ void init_barriers(unsigned consumers = 128,
                                                unsigned fillers = 1) const {
    if (threadIdx.x != 0) return;
    ptx::mbarrier_init(at(resident_full()), 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(at(full(s)), fillers);
      ptx::mbarrier_init(at(empty(s)), consumers);
    }
    ptx::fence_barrier_init();
  }
};

// Zeroes rows [from, kRows) of stage s's two ring tiles: the rows a TMA box read past the
// end of the walked view or span (another batch's, view's or span's rows: masked, but a
// non-finite value there would turn a product's 0 into NaN; the native kernels zero-fill
// them too). The consumers' `threads` threads (one warpgroup's 128, or the wide fused
// backward's 256; `thread` 0..threads - 1) each store, fence the stores to the async proxy,
// and meet at named barrier 1 before any wgmma reads the stage.
// A row of a box is 128 contiguous bytes whatever the swizzle, so whole rows are zeroed.
template <int kD, int kResident, int kDv>
__device__ __forceinline__ void zero_tail_rows(const Stages<kD, kResident, 2, kDv>& st, int s,
                                               int from, int thread, int threads = 128) {
  const auto base = dynamic_smem<uint32_t>();
  const uint32_t base_addr = u32(smem_addr(base));
  constexpr int kWordsPerRow = 128 / 4;
  const int words = (kRows - from) * kWordsPerRow;
  for (int tensor = 0; tensor < 2; ++tensor)
#pragma unroll
    for (int box = 0; box < (tensor == 0 ? kD : kDv) / 64; ++box) {
      const uint32_t row0 = st.ring(tensor, s) + static_cast<uint32_t>(box) * kBoxBytes +
                            static_cast<uint32_t>(from) * 128u;
      const auto dst = base + static_cast<std::ptrdiff_t>((row0 - base_addr) / 4);
      for (int w = thread; w < words; w += threads) dst[w] = 0u;
    }
  ptx::fence_proxy_async_shared();
  __syncwarp();  // bar.sync is aligned: the warp's lanes, reconverged after the loop
  ptx::named_barrier_sync(1, static_cast<unsigned>(threads));
}

// The producer thread's loads: the 64-row box of `rows` from each resident map (the second
// for kResident == 2 only, `resident1_rows` rows further on: the ping-pong forward's second
// half of a 128-row Q tile; with kResident == 4, rows and rows + 64 of each map, the wide
// fused backward's 128 keys of K into resident 0 and 1, of V into 2 and 3), then for every
// tile the work walks, that box of both ring maps into the next ring stage once the consumers
// have freed it. The second resident and ring map are kDv wide (the Stages' kDv).
template <int kD, int kResident, int kStages, int kDv, class Work>
__device__ __forceinline__ void produce(const Stages<kD, kResident, kStages, kDv>& st,
                                        const Work& work, const QueryRows& rows,
                                        const TmaDesc& resident0, const TmaDesc& resident1,
                                        const TmaDesc& ring0, const TmaDesc& ring1,
                                        int resident1_rows = 0) {
  constexpr int kHalves = (kD > kDv ? kD : kDv) / 64;
  constexpr uint32_t kTile = tile_bytes(kD), kTileV = tile_bytes(kDv);
  ptx::mbarrier_arrive_expect_tx(at(st.resident_full()), kTile + (kResident - 1) * kTileV);
  for (int x = 0; x < kHalves; ++x) {
    const uint32_t box = static_cast<uint32_t>(x) * kBoxBytes;
    if (x < kD / 64)
      ptx::tma_load_4d(at(st.resident(0) + box), resident0, at(st.resident_full()), 64 * x, rows.h,
                       rows.n, rows.b);
    if constexpr (kResident == 2)
      if (x < kDv / 64)
        ptx::tma_load_4d(at(st.resident(1) + box), resident1, at(st.resident_full()), 64 * x,
                         rows.h, rows.n + resident1_rows, rows.b);
    if constexpr (kResident == 4) {
      ptx::tma_load_4d(at(st.resident(1) + box), resident0, at(st.resident_full()), 64 * x, rows.h,
                       rows.n + kRows, rows.b);
      ptx::tma_load_4d(at(st.resident(2) + box), resident1, at(st.resident_full()), 64 * x, rows.h,
                       rows.n, rows.b);
      ptx::tma_load_4d(at(st.resident(3) + box), resident1, at(st.resident_full()), 64 * x, rows.h,
                       rows.n + kRows, rows.b);
    }
  }
  typename Work::Cursor cursor = work.begin(rows);
  KeyTile t;
  for (int j = 0; work.next(cursor, t); ++j) {
    const int s = j % kStages, use = j / kStages;
    ptx::mbarrier_wait(at(st.empty(s)), static_cast<unsigned>((use + 1) & 1));
    ptx::mbarrier_arrive_expect_tx(at(st.full(s)), kTile + kTileV);
    for (int x = 0; x < kHalves; ++x) {
      const uint32_t box = static_cast<uint32_t>(x) * kBoxBytes;
      if (x < kD / 64)
        ptx::tma_load_4d(at(st.ring(0, s) + box), ring0, at(st.full(s)), 64 * x, t.h, t.n, t.b);
      if (x < kDv / 64)
        ptx::tma_load_4d(at(st.ring(1, s) + box), ring1, at(st.full(s)), 64 * x, t.h, t.n, t.b);
    }
  }
}

// Issues acc (64 × 64) = A·Bᵀ over the head dim, A and B 64-row tiles stored K-major, as one
// committed wgmma group: acc may not be touched until a wait_group covers it.
template <int kD, bool kBf16>
__device__ __forceinline__ void issue_ss(float (&acc)[32], uint32_t a_tile, uint32_t b_tile) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t step =
        static_cast<uint32_t>(kk / 4) * kBoxBytes + 32u * static_cast<uint32_t>(kk % 4);
    ptx::wgmma_ss<64, kBf16>(acc, sw128_desc(a_tile + step, 16, 1024),
                             sw128_desc(b_tile + step, 16, 1024), kk > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}

// This lane's part of a 64 × kD tile in shared memory (K-major, 128-byte swizzle, D/64 boxes)
// as wgmma's register A, for each 16 columns kk of the head dim: a[kk][x] holds row local0 +
// 8(x % 2), columns 16kk + 8(x / 2) + 2(lane % 4) and the next (mma.m16n8k16's A fragment,
// which is how issue_rs packs an accumulator tile). Generic 4-byte shared loads, once the
// tile's barrier has completed; the swizzle XORs a row's 16-byte chunk index with row % 8.
template <int kD>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[kD / 16][4], uint32_t tile,
                                                 int local0, int lane) {
  const auto base = dynamic_smem<uint32_t>();
  const uint32_t base_addr = u32(smem_addr(base));
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = local0 + 8 * (x % 2), col = 16 * kk + 8 * (x / 2) + 2 * (lane % 4);
      const int byte = 2 * (col % 64);
      const uint32_t at_byte = tile + static_cast<uint32_t>(col / 64) * kBoxBytes +
                               static_cast<uint32_t>(row) * 128u +
                               static_cast<uint32_t>(((byte / 16) ^ (row % 8)) * 16 + byte % 16);
      a[kk][x] = base[(at_byte - base_addr) / 4];
    }
}

// Issues acc (64 × 64) = A·Bᵀ over the head dim as one committed wgmma group, A in registers
// (load_a_fragments), B a 64-row tile stored K-major: the same product as issue_ss, reading
// only B from shared memory (64 flops a byte instead of 32, the SM's shared-memory rate being
// 128 bytes a clock against about 4096 dense bf16 flops).
template <int kD, bool kBf16>
__device__ __forceinline__ void issue_rs_k(float (&acc)[32], const uint32_t (&a)[kD / 16][4],
                                           uint32_t b_tile) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t step =
        static_cast<uint32_t>(kk / 4) * kBoxBytes + 32u * static_cast<uint32_t>(kk % 4);
    ptx::wgmma_rs<64, kBf16>(acc, a[kk], sw128_desc(b_tile + step, 16, 1024), kk > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}

// Issues acc (64 × 64) = A·Bᵀ with A from registers (kRegA: its fragments `a_regs`, as
// issue_rs_k) or from its tile `a_tile` (as issue_ss).
template <int kD, bool kBf16, bool kRegA>
__device__ __forceinline__ void issue_a_bt(float (&acc)[32],
                                           const uint32_t (&a_regs)[kRegA ? kD / 16 : 1][4],
                                           uint32_t a_tile, uint32_t b_tile) {
  if constexpr (kRegA)
    issue_rs_k<kD, kBf16>(acc, a_regs, b_tile);
  else
    issue_ss<kD, kBf16>(acc, a_tile, b_tile);
}

// Issues acc (64 × kD) += A·B over 64 rows of B as one committed wgmma group: A this lane's
// part of a 64 × 64 accumulator-layout tile (rounded to the element type: wgmma's register
// A, 16 columns per step, is mma.m16n8k16's A fragment, the accumulator's 8-column slices 2kk
// and 2kk + 1), B a 64-row tile read N-major.
template <int kD, bool kBf16>
__device__ __forceinline__ void issue_rs(float (&acc)[kD / 2], const float (&a_tile)[32],
                                         uint32_t b_tile) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  uint32_t a[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x)
      a[kk][x] = pack2<T>(a_tile[8 * kk + 2 * x], a_tile[8 * kk + 2 * x + 1]);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ptx::wgmma_rs_tb<kD, kBf16>(
        acc, a[kk], sw128_desc(b_tile + 2048u * static_cast<uint32_t>(kk), kBoxBytes, 1024), 1);
  ptx::wgmma_commit_group();
}

// acc += A·B as issue_rs, waited for.
template <int kD, bool kBf16>
__device__ __forceinline__ void product_rs(float (&acc)[kD / 2], const float (&a_tile)[32],
                                           uint32_t b_tile) {
  issue_rs<kD, kBf16>(acc, a_tile, b_tile);
  ptx::wgmma_wait_group<0>();
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
  base = static_cast<const char*>(base) +
         2 * d * static_cast<uint64_t>(heads) * static_cast<uint64_t>(phase);
  const uint32_t box[4] = {64, 1, kRows, 1};
  TmaDesc map;
#if RINGATTN_CUDA_EMULATION
  (void)elem;
  const std::string why = emu::encode_tensor_map_tiled(
      map, 2, 4, base, dims, strides, box, emu::TmaSwizzle::bytes128, emu::TmaOobFill::zeros);
  if (!why.empty()) throw RuntimeFailure("the Hopper kernels' tensor map is refused: " + why);
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
    throw RuntimeFailure("cuTensorMapEncodeTiled refused the Hopper kernels' tensor map (error " +
                         std::to_string(static_cast<int>(rc)) + ")");
#endif
  return map;
}

// "" when the Hopper kernels can run D = head_dim (values of head_dim_v; 0: head_dim) in
// `elem` on `device`, else why not.
inline std::string device_unsupported(int head_dim, Elem elem, int device, int head_dim_v = 0) {
  if (head_dim_v > 0 && head_dim_v != head_dim) {
    if (!hopper_value_dim_pair(head_dim, head_dim_v))
      return "head dims " + std::to_string(head_dim) + "/" + std::to_string(head_dim_v) +
             " for queries and keys/values (values of their own head dim: 192/128 only)";
  } else if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return "head dim " + std::to_string(head_dim) + " (64, 128 or 256)";
  }
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

// The value of the Hopper kernels' environment switch `variable` ("" when unset or empty), or
// an InputError naming the variable (exit 2) where it is none of `allowed`: a mistyped A/B
// switch would otherwise run the default and be measured as the form it names.
inline std::string hopper_switch(Env variable, std::initializer_list<const char*> allowed) {
  const char* v = environment_value(variable);
  if (!v || !*v) return "";
  std::string list;
  for (const char* a : allowed) {
    if (std::string(v) == a) return v;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  throw InputError(environment_name(variable), "'" + std::string(v) + "' is not one of " + list);
}

// Launches `kernel` on `grid` with `smem` bytes of dynamic shared memory (raised on every
// launch: the attribute is per device).
// RINGATTN_HOPPER_BLOCKS_PER_SM=1 pads each block's shared memory past half an SM's, so one
// block runs per SM: the A/B against the two that kBlocksPerSm allows (read once).
inline bool one_block_per_sm() {
  static const bool one = hopper_switch(Env::hopper_blocks_per_sm, {"1", "2"}) == "1";
  return one;
}

// Whether the kernels keep their resident tiles in registers as wgmma's register A where
// they fit (D <= 128): the forward's Q for S = Q·Kᵀ, the dQ pass's Q and dO for S = Q·Kᵀ and
// dP = dO·Vᵀ, and at D = 64 the dK/dV pass's K and V for Sᵀ and dPᵀ. Only with
// RINGATTN_HOPPER_QREGS=1 (read once), until an sm_90 has measured it against the default
// (hopper_ab.py's "qregs" column): a product with both operands in shared memory reads 32
// flops a byte there, at the SM's shared-memory rate; with A in registers, 64.
inline bool qregs_chosen() {
  static const bool on = hopper_switch(Env::hopper_qregs, {"0", "1"}) == "1";
  return on;
}

template <class Args>
void launch(const char* name, void (*kernel)(Args), const Args& a, dim3 grid, int smem,
            cudaStream_t stream, int threads = kThreads) {
  constexpr int kHalfSm = 116 * 1024;  // more than half of an H100's 228 KiB per SM
  if (one_block_per_sm() && smem < kHalfSm) smem = kHalfSm;
  RINGATTN_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_kernel(name, kernel, grid, dim3(static_cast<unsigned>(threads)),
                static_cast<std::size_t>(smem), stream, a);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    throw_cuda_error(err, (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
}

// The (head dim, dtype) switch: f.template operator()<kD, kBf16>() for head dims 64, 128, 256.
template <class F>
void dispatch(int head_dim, Elem elem, F&& f) {
  const bool bf16 = elem == Elem::bf16;
  if (head_dim == 64) {
    bf16 ? f.template operator()<64, true>() : f.template operator()<64, false>();
    return;
  }
  if (head_dim == 128) {
    bf16 ? f.template operator()<128, true>() : f.template operator()<128, false>();
    return;
  }
  if (head_dim == 256) {
    bf16 ? f.template operator()<256, true>() : f.template operator()<256, false>();
    return;
  }
  throw RuntimeFailure("the Hopper kernels have no instantiation for head dim " +
                       std::to_string(head_dim));
}

// The (D, Dv, dtype) switch for values of their own head dim: f.template operator()<kD, kDv,
// kBf16>() for the one pair hopper_value_dim_pair() admits.
template <class F>
void dispatch_value_dim(int head_dim, int head_dim_v, Elem elem, F&& f) {
  if (!hopper_value_dim_pair(head_dim, head_dim_v))
    throw RuntimeFailure("the Hopper kernels have no instantiation for head dims " +
                         std::to_string(head_dim) + "/" + std::to_string(head_dim_v));
  elem == Elem::bf16 ? f.template operator()<192, 128, true>()
                     : f.template operator()<192, 128, false>();
}

}  // namespace ringattn::kernels::cuda::hopper

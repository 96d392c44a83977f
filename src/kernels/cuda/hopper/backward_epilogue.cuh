// The Hopper (sm_90a) backward's epilogues: dK/dV (and the two-pass dQ) added from a block's
// accumulator into the fp32 gradients (add_rows), and the fused kernels' dQ path: its part
// staged in fp32 over the stage's tiles or the wide kernel's sdQ (stage_dq_part, staged_row)
// and added into dq by the drain warp's bulk reduce-adds (drain_dq), with the fused kernels'
// barriers and shared-memory layout they share with the main loop
// (hopper/backward_mainloop.cuh).
#pragma once

#include <cstdint>

#include "kernels/cuda/hopper/backward_softmax.cuh"

namespace ringattn::kernels::cuda::hopper {

// Adds this lane's rows of the block's 64 × kD accumulator, times `factor`, into `g`'s rows
// `rows` (element offsets) for the block's `count` rows.
template <int kD>
__device__ __forceinline__ void add_rows(float* g, const float (&acc)[kD / 2], float factor,
                                         const Strided& rows, int count, int local0, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = local0 + 8 * r;
    if (local >= count) continue;
    float* row = g + rows.at + local * rows.stride;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i)
      if (acc_row(i) == r) row[acc_col(i, lane)] += acc[i] * factor;
  }
}

enum FusedBarrier : unsigned {
  kDsReady = 2,
  kDqFull = 3 /* and 4 */,
  kDsFree = 5,
  kDqFree = 6,  // the wide kernel: the drain has read sdQ (its own staging)
  kDsOwn = 7 /* and 8 */,  // the wide kernel at D = 64: warpgroup w's dS box is whole
  kDqPart = 9              // the wide kernel at D = 64: one warpgroup's dQ part is in sdQ
};
constexpr unsigned kConsumerThreads = 128, kDrainThreads = 32;

template <int kD>
inline constexpr int kFusedBlocksPerSm = 2;

// `x`, its value hidden from the optimiser: the addresses built from it are then built where
// they are used, each tile, instead of being hoisted out of the walk into registers (dS's 32
// store addresses a lane spilled at D = 128).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
#if !RINGATTN_CUDA_EMULATION
  asm volatile("" : "+r"(x));
#endif
  return x;
}

// The fused kernel's shared memory: Stages<kD, 2>'s (two resident tiles, a two-stage ring of
// two), then the dS tile (one 64 × 64 box), then each stage's column stats (64 lse, 64 delta).
// `groups` consumer warpgroups of 64 keys each (1, or the wide kernel's 2): 2·groups resident
// tiles (K's, then V's), the ring's four, a dS box per group, in fused_ds_buffers(groups)
// copies: the wide kernel (one block an SM) double-buffers dS by tile parity, so a tile's dS
// store need not wait for every load of the previous tile's (FlashAttention-3's scheme), and
// so does the 64-key kernel at D = 64 (66 KiB a block); at D = 128 its two blocks an SM take
// 214 KiB, and 8 KiB more each would not fit.
__host__ __device__ constexpr int fused_ds_buffers(int head_dim, int groups) {
  return groups == 2 || head_dim <= 64 ? 2 : 1;
}
// Where the fused kernel's stages end, from the aligned base: Stages<kD, 2·groups, 2, kDv>'s
// tiles (smem_bytes less its alignment slack). head_dim_v 0: head_dim.
__host__ __device__ constexpr uint32_t fused_stage_end(int head_dim, int groups = 1,
                                                       int head_dim_v = 0) {
  return smem_bytes(head_dim, 2 * groups, 2, head_dim_v) - 1024;
}
// Whether a fused kernel stages dQ in an sdQ of its own: the wide kernel, and the one at
// values of their own head dim (192/128: 64 rows of 192 fp32 do not fit over the stage's Q
// and dO tiles, 24 + 16 KiB). The 64-key kernel at D <= 128 stages over the stage.
__host__ __device__ constexpr bool fused_own_sdq(int head_dim, int groups, int head_dim_v = 0) {
  return groups == 2 || (head_dim_v > 0 && head_dim_v != head_dim);
}
constexpr uint32_t kStatsStageBytes = 2 * kRows * 4;
// The wide kernel stages dQ in an sdQ of its own after the stats (one block an SM leaves room
// for it): 64 rows of head_dim fp32 at a pitch padded by 16 bytes. A store instruction writes
// words 2(lane % 4) (+1) of eight rows: at 4·head_dim bytes (a multiple of 128) every row
// started on bank 0, eight-way conflicts; rows 4 banks apart conflict two ways, the least for
// rows that start 16-byte aligned (as the bulk reduce's source must) under this pattern.
__host__ __device__ constexpr uint32_t sdq_pitch(int head_dim) {
  return 4u * static_cast<uint32_t>(head_dim) + 16u;
}
__host__ __device__ constexpr uint32_t fused_smem_bytes(int head_dim, int groups = 1,
                                                        int head_dim_v = 0) {
  return smem_bytes(head_dim, 2 * groups, 2, head_dim_v) +
         static_cast<uint32_t>(fused_ds_buffers(head_dim, groups) * groups) * kBoxBytes +
         2 * kStatsStageBytes +
         (fused_own_sdq(head_dim, groups, head_dim_v) ? kRows * sdq_pitch(head_dim) : 0u);
}

// Where staged row `row` (of 64, kD fp32 each) of stage s lies. The 64-key kernel (two
// resident tiles) stages over the stage's first tile for rows 0-31, its second for 32-63:
// rows 4·kD bytes apart start on one bank, so a store instruction's eight rows conflict eight
// ways (rotating each row within its slot spread them, but took ptxas from 28 to 48 bytes of
// spills at D = 128; a padded pitch needs its own sdQ, which its two blocks an SM leave no
// room for). With kOwnSdq (fused_own_sdq: the wide kernel, values of their own head dim) the
// rows are in its own sdQ at `sdq`, sdq_pitch apart, whatever the stage.
template <bool kOwnSdq, int kD, int kResident, int kDv>
__device__ __forceinline__ uint32_t staged_row(const Stages<kD, kResident, 2, kDv>& st,
                                               uint32_t sdq, int s, int row) {
  if constexpr (kOwnSdq) {
    (void)st, (void)s;
    return sdq + static_cast<uint32_t>(row) * sdq_pitch(kD);
  } else {
    (void)sdq;
    return row < 32 ? st.ring(0, s) + static_cast<uint32_t>(row) * 4u * kD
                    : st.ring(1, s) + static_cast<uint32_t>(row - 32) * 4u * kD;
  }
}

// dQ's part of a walked query tile, head-dim columns [64·chunk, 64·chunk + 64), into `dq`:
// dS (this lane's register A fragments `ds`, kKeys / 16 steps of 16 keys) times the resident
// K (step kk's 16 keys are rows 16(kk % 4).. of resident tile first_tile + kk / 4, read
// N-major), waited for. The block's keys (first_tile 0), or at D = 64 in the wide kernel one
// warpgroup's own 64 (first_tile w).
template <int kKeys, int kD, bool kBf16, int kResident, int kDv>
__device__ __forceinline__ void dq_part(float (&dq)[32], const Stages<kD, kResident, 2, kDv>& st,
                                        const uint32_t (&ds)[kKeys / 16][4], int first_tile,
                                        int chunk) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    ptx::wgmma_rs_tb<64, kBf16>(
        dq, ds[kk],
        sw128_desc(opaque(st.resident(first_tile + kk / 4)) +
                       static_cast<uint32_t>(chunk) * kBoxBytes +
                       2048u * static_cast<uint32_t>(kk % 4),
                   kBoxBytes, 1024),
        kk > 0 ? 1 : 0);
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();
}

// Stores dQ's part `dq` (dq_part's, columns [64·chunk, 64·chunk + 64)) times `scale` in fp32
// at stage s's staged rows (staged_row; the wide kernel's sdQ at `sdq`) for the drain warp;
// kAdd: adds it to what the same positions hold (the other warpgroup's part, at D = 64 in
// the wide kernel), so that the drain reduces one sum.
template <bool kAdd, bool kOwnSdq, int kD, int kResident, int kDv>
__device__ __forceinline__ void stage_dq_rows(const Stages<kD, kResident, 2, kDv>& st,
                                              uint32_t sdq, int s, const float (&dq)[32],
                                              int chunk, float scale, int local0, int lane) {
  const auto sbase = dynamic_smem<float>();
  const uint32_t sbase_addr = u32(smem_addr(sbase));
  const int row0 = static_cast<int>(opaque(static_cast<uint32_t>(local0)));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const uint32_t row_at =
        staged_row<kOwnSdq>(st, sdq, s, row) + 256u * static_cast<uint32_t>(chunk);
    const auto dst = sbase + static_cast<std::ptrdiff_t>((row_at - sbase_addr) / 4);
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      if (acc_row(i) != r) continue;
      const int col = acc_col(i, lane);
      if constexpr (kAdd) {
        dst[col] = dst[col] + dq[i] * scale;
        dst[col + 1] = dst[col + 1] + dq[i + 1] * scale;
      } else {
        dst[col] = dq[i] * scale;
        dst[col + 1] = dq[i + 1] * scale;
      }
    }
  }
}

// dq_part, then stage_dq_rows (no add).
template <int kKeys, bool kOwnSdq, int kD, bool kBf16, int kResident, int kDv>
__device__ __forceinline__ void stage_dq_part(const Stages<kD, kResident, 2, kDv>& st,
                                              uint32_t sdq, int s,
                                              const uint32_t (&ds)[kKeys / 16][4], int chunk,
                                              float scale, int local0, int lane) {
  float dq[32];
  dq_part<kKeys, kD, kBf16>(dq, st, ds, 0, chunk);
  stage_dq_rows<false, kOwnSdq>(st, sdq, s, dq, chunk, scale, local0, lane);
}

// The drain warp: for every query tile the block walks (the same walk as the producer's and
// the consumers'), waits for its staged dQ part (the `consumers` threads' arrivals), adds
// each row into dq with one bulk reduce-add, and, once the reductions have read the rows,
// frees them: the 64-key kernel's stage (its `empty` barrier counts the drain's arrival
// alone), or the wide kernel's sdQ (kDqFree, which the consumers wait on before staging the
// next tile's part; arrived at before each later tile's wait, so none is left pending at
// exit). See hopper_bwd_fused_kernel.
template <bool kOwnSdq, int kD, int kResident, int kDv, class Work>
__device__ __forceinline__ void drain_dq(const BackwardArgs<Work>& p,
                                         const Stages<kD, kResident, 2, kDv>& st, uint32_t sdq,
                                         const QueryRows& kr, int lane, unsigned consumers) {
  constexpr uint32_t kRowBytes = 4u * kD;
  typename Work::Cursor cursor = p.work.begin(kr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1;
    int count = 0;
    const Strided rows = p.work.column_grads(cursor, t, kD, count);
    if (kOwnSdq && j > 0) ptx::named_barrier_arrive(kDqFree, consumers + kDrainThreads);
    ptx::named_barrier_sync(kDqFull + static_cast<unsigned>(j & 1), consumers + kDrainThreads);
    for (int r = lane; r < count; r += 32)
      ptx::bulk_reduce_add_f32(p.dq + rows.at + r * rows.stride,
                               at(staged_row<kOwnSdq>(st, sdq, s, r)), kRowBytes);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();
    __syncwarp();
    if (!kOwnSdq && lane == 0) ptx::mbarrier_arrive(at(st.empty(s)));  // the producer may refill
  }
  ptx::bulk_wait_group<0>();
}

}  // namespace ringattn::kernels::cuda::hopper

// The Hopper (sm_90a) backward's epilogues: dK/dV (and the two-pass dQ) added from a block's
// accumulator into the fp32 gradients (add_rows), and the fused kernels' dQ path: its part
// staged in fp32 over the stage's tiles (stage_dq_part, staged_row) and added into dq by the
// drain warp's bulk reduce-adds (drain_dq), with the fused kernels' barriers and shared-memory
// layout they share with the main loop (hopper/backward_mainloop.cuh).
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

enum FusedBarrier : unsigned { kDsReady = 2, kDqFull = 3 /* and 4 */, kDsFree = 5 };
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
// tiles (K's, then V's), the ring's four, a dS box per group.
__host__ __device__ constexpr uint32_t fused_stage_end(int head_dim, int groups = 1) {
  return 1024 + static_cast<uint32_t>(2 * groups + 4) * tile_bytes(head_dim);  // from base
}
constexpr uint32_t kStatsStageBytes = 2 * kRows * 4;
__host__ __device__ constexpr uint32_t fused_smem_bytes(int head_dim, int groups = 1) {
  return smem_bytes(head_dim, 2 * groups) + static_cast<uint32_t>(groups) * kBoxBytes +
         2 * kStatsStageBytes;
}

// Where staged row `row` (of 64, kD fp32 each) of stage s lies: over the stage's first tile
// for rows 0-31, its second for 32-63. Each row is stored rotated by staged_rotation(row)
// bytes within its slot (element c at byte (4c + rotation) mod 4kD): with a pitch of 4kD
// bytes every row would start on the same bank, and the eight rows one store instruction
// writes would conflict eight ways; rotated by 32 bytes a row over four rows, a warp's paired
// stores (st_shared_f32x2) land on distinct banks (each half-warp on all 32), and scalar ones
// at most two ways. The drain adds a row back in order as two bulk reduce-adds (drain_dq).
template <int kD, int kResident>
__device__ __forceinline__ uint32_t staged_row(const Stages<kD, kResident>& st, int s, int row) {
  return row < 32 ? st.ring(0, s) + static_cast<uint32_t>(row) * 4u * kD
                  : st.ring(1, s) + static_cast<uint32_t>(row - 32) * 4u * kD;
}
__host__ __device__ constexpr uint32_t staged_rotation(int row) {
  return 32u * static_cast<uint32_t>(row % 4);
}

// dQ's part of a walked query tile, head-dim columns [64·chunk, 64·chunk + 64): dS (this
// lane's register A fragments `ds`, kKeys / 16 steps of 16 keys: the block's keys) times the
// resident K (step kk's 16 keys are rows 16(kk % 4).. of resident tile kk / 4, read N-major),
// waited for, times `scale`, stored in fp32 at stage s's staged rows (staged_row) for the
// drain warp.
template <int kKeys, int kD, bool kBf16, int kResident>
__device__ __forceinline__ void stage_dq_part(const Stages<kD, kResident>& st, int s,
                                              const uint32_t (&ds)[kKeys / 16][4], int chunk,
                                              float scale, int local0, int lane) {
  const auto sbase = dynamic_smem<float>();
  const uint32_t sbase_addr = u32(smem_addr(sbase));
  float dq[32];
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    ptx::wgmma_rs_tb<64, kBf16>(
        dq, ds[kk],
        sw128_desc(opaque(st.resident(kk / 4)) + static_cast<uint32_t>(chunk) * kBoxBytes +
                       2048u * static_cast<uint32_t>(kk % 4),
                   kBoxBytes, 1024),
        kk > 0 ? 1 : 0);
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();
  const int row0 = static_cast<int>(opaque(static_cast<uint32_t>(local0)));
  constexpr uint32_t kRowBytes = 4u * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const uint32_t slot = staged_row(st, s, row), rotation = staged_rotation(row);
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      if (acc_row(i) != r) continue;
      // Columns col, col + 1 (col even): one 8-byte pair, never split by the rotation's wrap.
      const uint32_t col =
          64u * static_cast<uint32_t>(chunk) + static_cast<uint32_t>(acc_col(i, lane));
      const uint32_t at = slot + (4u * col + rotation) % kRowBytes;
      ptx::st_shared_f32x2(sbase + static_cast<std::ptrdiff_t>((at - sbase_addr) / 4),
                           dq[i] * scale, dq[i + 1] * scale);
    }
  }
}

// The drain warp: for every query tile the block walks (the same walk as the producer's and
// the consumers'), waits for its staged dQ part (the `consumers` threads' arrivals), adds
// each row into dq with one bulk reduce-add, and frees the stage; see hopper_bwd_fused_kernel.
template <int kD, int kResident, class Work>
__device__ __forceinline__ void drain_dq(const BackwardArgs<Work>& p,
                                         const Stages<kD, kResident>& st, const QueryRows& kr,
                                         int lane, unsigned consumers) {
  constexpr uint32_t kRowBytes = 4u * kD;
  typename Work::Cursor cursor = p.work.begin(kr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1;
    int count = 0;
    const Strided rows = p.work.column_grads(cursor, t, kD, count);
    ptx::named_barrier_sync(kDqFull + static_cast<unsigned>(j & 1), consumers + kDrainThreads);
    for (int r = lane; r < count; r += 32) {
      // The row's columns from 0 start `rotation` bytes into its slot and wrap to its start.
      float* row = p.dq + rows.at + r * rows.stride;
      const uint32_t slot = staged_row(st, s, r), rotation = staged_rotation(r);
      ptx::bulk_reduce_add_f32(row, at(slot + rotation), kRowBytes - rotation);
      if (rotation > 0)
        ptx::bulk_reduce_add_f32(row + (kRowBytes - rotation) / 4, at(slot), rotation);
    }
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(at(st.empty(s)));  // the producer may refill it
  }
  ptx::bulk_wait_group<0>();
}

}  // namespace ringattn::kernels::cuda::hopper

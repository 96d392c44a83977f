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
// tiles (K's, then V's), the ring's four, a dS box per group, in fused_ds_buffers(groups)
// copies: the wide kernel (one block an SM) double-buffers dS by tile parity, so a tile's dS
// store need not wait for every load of the previous tile's (FlashAttention-3's scheme); two
// 64-key blocks share an SM, and 8 KiB more each would not fit.
__host__ __device__ constexpr int fused_ds_buffers(int groups) { return groups == 2 ? 2 : 1; }
__host__ __device__ constexpr uint32_t fused_stage_end(int head_dim, int groups = 1) {
  return 1024 + static_cast<uint32_t>(2 * groups + 4) * tile_bytes(head_dim);  // from base
}
constexpr uint32_t kStatsStageBytes = 2 * kRows * 4;
__host__ __device__ constexpr uint32_t fused_smem_bytes(int head_dim, int groups = 1) {
  return smem_bytes(head_dim, 2 * groups) +
         static_cast<uint32_t>(fused_ds_buffers(groups) * groups) * kBoxBytes +
         2 * kStatsStageBytes;
}

// Where staged row `row` (of 64, kD fp32 each) of stage s lies: over the stage's first tile
// for rows 0-31, its second for 32-63. (Rows 4·kD bytes apart start on one bank, so a store
// instruction's eight rows conflict eight ways. Rotating each row within its slot spread them,
// but the wrapped addresses took ptxas from 0 to 16 bytes of spills in the wide kernel and
// from 28 to 48 in the fused one at D = 128; a padded pitch needs its own sdQ, which the
// 64-key kernel's two blocks an SM leave no room for. Left for a GPU to weigh.)
template <int kD, int kResident>
__device__ __forceinline__ uint32_t staged_row(const Stages<kD, kResident>& st, int s, int row) {
  return row < 32 ? st.ring(0, s) + static_cast<uint32_t>(row) * 4u * kD
                  : st.ring(1, s) + static_cast<uint32_t>(row - 32) * 4u * kD;
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
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const uint32_t row_at = staged_row(st, s, row) + 256u * static_cast<uint32_t>(chunk);
    const auto dst = sbase + static_cast<std::ptrdiff_t>((row_at - sbase_addr) / 4);
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      if (acc_row(i) != r) continue;
      const int col = acc_col(i, lane);
      dst[col] = dq[i] * scale;
      dst[col + 1] = dq[i + 1] * scale;
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
    for (int r = lane; r < count; r += 32)
      ptx::bulk_reduce_add_f32(p.dq + rows.at + r * rows.stride, at(staged_row(st, s, r)),
                               kRowBytes);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(at(st.empty(s)));  // the producer may refill it
  }
  ptx::bulk_wait_group<0>();
}

}  // namespace ringattn::kernels::cuda::hopper

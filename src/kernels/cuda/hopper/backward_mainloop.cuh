// The Hopper (sm_90a) backward kernels' main loops, written once for every kind of work: the
// dense backward (hopper/launch_dense_backward.cu), the block-sparse one
// (hopper/launch_sparse_backward.cu) and the task one differ only in the `Work` of each pass,
// which says which tile a block keeps resident, where its rows' lse, delta and gradients are,
// which tiles of the other side it walks (and where their lse and delta are) and how far each
// row reaches. P and dS are recomputed from the forward's lse as FlashAttention-2 does
// (docs/SEMANTICS.md; hopper/backward_softmax.cuh) and sit in registers, in wgmma's
// accumulator layout, until they are wgmma's register A: nothing is transposed in shared
// memory. The epilogues are hopper/backward_epilogue.cuh's. In the two passes each gradient
// element has one writer, so the result is deterministic; the fused kernels add dQ by bulk
// reductions.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/hopper/backward_epilogue.cuh"
#include "kernels/cuda/hopper/tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

// Which key-side gradients a dK/dV launch accumulates: both (D <= 128), or at D = 256 one per
// launch, since dK and dV of 64 × 256 in fp32 would take 256 registers a thread together. The
// dV launch then skips dPᵀ and dK's products (two of four); the dK launch, dV's (one).
enum KeyGrads : int { kGradDv = 1, kGradDk = 2, kGradBoth = 3 };

// dK and/or dV (kGrads) of a 64-key tile from every query tile the work walks for it. K and V
// are resident; the ring carries (Q, dO). Accumulator columns are queries, so lse and delta
// are per column. kDv: the values' head dim (V and dO tiles, dV's accumulator; MLA's 128
// beside D = 192, whose dK and dV then take a launch each).
template <int kD, bool kBf16, class Work, int kGrads, bool kRegA = false, int kDv = kD>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kD>)
    hopper_bwd_dkdv_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 2, 2, kDv> st = Stages<kD, 2, 2, kDv>::of_block();
  const QueryRows kr = p.work.query_rows(kD, kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: one thread issues every load
    ptx::setmaxnreg<false, kProducerRegs<kD>>();
    if (threadIdx.x == 0) produce(st, p.work, kr, p.k, p.v, p.q, p.dout);
    return;
  }

  ptx::setmaxnreg<true, kConsumerRegs<kD>>();
  const int local0 = 16 * (warp - 4) + lane / 4;  // this lane's keys: local0, local0 + 8
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) reach[r] = p.work.reach(kr, local0 + 8 * r);
  constexpr bool kWantDv = (kGrads & kGradDv) != 0, kDk = (kGrads & kGradDk) != 0;
  // An unused accumulator is one register (the compiler drops it), not kD / 2.
  float dk[kDk ? kD / 2 : 1], dv[kWantDv ? kDv / 2 : 1];
#pragma unroll
  for (float& x : dk) x = 0.0f;
#pragma unroll
  for (float& x : dv) x = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  // kRegA (D = 64): K and V read once into registers as wgmma's register A, so Sᵀ and dPᵀ
  // read only Q and dO from shared memory. At D = 128, K alone beside dK's and dV's
  // accumulators spilled 240-284 bytes (ptxas).
  static_assert(!kRegA || (kD == 64 && kDv == kD), "K and V in registers fit at D = 64 only");
  [[maybe_unused]] uint32_t ka[kRegA ? kD / 16 : 1][4], va[kRegA ? kD / 16 : 1][4];
  if constexpr (kRegA) {
    load_a_fragments<kD>(ka, st.resident(0), local0, lane);
    load_a_fragments<kD>(va, st.resident(1), local0, lane);
  }
  typename Work::Cursor cursor = p.work.begin(kr);
  KeyTile t;  // here a query tile: t.n its first query, t.h its query head
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    if (t.limit < kRows) zero_tail_rows(st, s, t.limit, static_cast<int>(threadIdx.x) - 128);
    const GlobalColumnStats<Work> stats{p, p.work.column_stats(cursor, t)};
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = columns_of(reach[r], t);
    float pt[32];  // Sᵀ, then Pᵀ (probs_t), then dSᵀ (grads_t)
    issue_a_bt<kD, kBf16, kRegA>(pt, ka, st.resident(0), st.ring(0, s));
    ptx::wgmma_wait_group<0>();
    probs_t<CapOf<Work>::value>(pt, p.logits, cols, stats, lane);
    // dV += Pᵀ·dO, then dPᵀ = V·dOᵀ, each waited for: under one wait, the packed Pᵀ would
    // be live beside dPᵀ's accumulator, and ptxas spills 72-80 bytes at D = 128.
    if constexpr (kWantDv) product_rs<kDv, kBf16>(dv, pt, st.ring(1, s));  // dO as stored
    if constexpr (!kDk) {
      ptx::mbarrier_arrive(at(st.empty(s)));
      continue;
    }
    cap_slopes_t<CapOf<Work>::value>(pt, p.logits, cols, stats, lane);
    float dpt[32];
    issue_a_bt<kDv, kBf16, kRegA>(dpt, va, st.resident(1), st.ring(1, s));
    ptx::wgmma_wait_group<0>();
    grads_t(pt, dpt, p.dout_scale, cols, stats, lane);                // dSᵀ (0 where Pᵀ is)
    if constexpr (kDk) product_rs<kD, kBf16>(dk, pt, st.ring(0, s));  // dK += dSᵀ·Q
    ptx::mbarrier_arrive(at(st.empty(s)));
  }
  if constexpr (kDk)
    add_rows<kD>(p.dk, dk, p.scale, p.work.grad_rows(kr, kD, kD), kr.rows, local0, lane);
  if constexpr (kWantDv)
    add_rows<kDv>(p.dv, dv, p.dout_scale, p.work.grad_rows(kr, kD, kDv), kr.rows, local0, lane);
#else
  (void)p;
#endif
}

// dQ of a 64-query tile from the key tiles the work walks for it, as the forward walks
// them. Q and dO are resident; the ring carries (K, V). kRegA (D <= 128): Q and dO are read
// once into registers as wgmma's register A, so S and dP read only K and V from shared memory.
// kDv: the values' head dim (dO and V tiles, the width dP = dO·Vᵀ sums over).
template <int kD, bool kBf16, class Work, bool kRegA = false, int kDv = kD>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kD>)
    hopper_bwd_dq_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
  static_assert(!kRegA || (kD <= 128 && kDv == kD), "Q and dO in registers take D/2 of them");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 2, 2, kDv> st = Stages<kD, 2, 2, kDv>::of_block();
  const QueryRows qr = p.work.query_rows(kD, kD);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {
    ptx::setmaxnreg<false, kProducerRegs<kD>>();
    if (threadIdx.x == 0) produce(st, p.work, qr, p.q, p.dout, p.k, p.v);
    return;
  }

  ptx::setmaxnreg<true, kConsumerRegs<kD>>();
  const int local0 = 16 * (warp - 4) + lane / 4;  // this lane's queries: local0, local0 + 8
  const Strided stats = p.work.row_stats(qr);
  Reach reach[2];
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    reach[r] = p.work.reach(qr, local0 + 8 * r);
    const bool valid = local0 + 8 * r < qr.rows;
    const int64_t at_row = stats.at + (local0 + 8 * r) * stats.stride;
    lse2[r] = valid ? lse_log2(p.lse, at_row) : INFINITY;
    dlt[r] = valid ? p.delta[at_row] * p.delta_factor : 0.0f;
  }
  float dq[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dq[i] = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  [[maybe_unused]] uint32_t qa[kRegA ? kD / 16 : 1][4], da[kRegA ? kD / 16 : 1][4];
  if constexpr (kRegA) {
    load_a_fragments<kD>(qa, st.resident(0), local0, lane);
    load_a_fragments<kD>(da, st.resident(1), local0, lane);
  }
  typename Work::Cursor cursor = p.work.begin(qr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    if (t.limit < kRows) zero_tail_rows(st, s, t.limit, static_cast<int>(threadIdx.x) - 128);
    float sc[32], dp[32];  // S = Q·Kᵀ and dP = dO·Vᵀ (dO as stored), under one wait
    issue_a_bt<kD, kBf16, kRegA>(sc, qa, st.resident(0), st.ring(0, s));
    issue_a_bt<kDv, kBf16, kRegA>(dp, da, st.resident(1), st.ring(1, s));
    ptx::wgmma_wait_group<0>();
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = columns_of(reach[r], t);
    // dS = P ∘ (dP − delta) (∘ the cap's slope), 0 where the query does not see the key.
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int r = acc_row(i);
      sc[i] = seen(cols[r], acc_col(i, lane))
                  ? exp2f(p.logits.template logit<CapOf<Work>::value>(sc[i]) - lse2[r]) *
                        (dp[i] * p.dout_scale - dlt[r]) *
                        p.logits.template slope_at_score<CapOf<Work>::value>(sc[i])
                  : 0.0f;
    }
    product_rs<kD, kBf16>(dq, sc, st.ring(0, s));  // dQ += dS·K
    ptx::mbarrier_arrive(at(st.empty(s)));
  }
  add_rows<kD>(p.dq, dq, p.scale, p.work.grad_rows(qr, kD, kD), qr.rows, local0, lane);
#else
  (void)p;
#endif
}

// Stores this lane's part of dSᵀ (accumulator layout: rows keys local0, local0 + 8; columns
// queries) as dS in `tile` (row = query, 64 keys of 2 bytes, K-major, 128-byte swizzle: the
// 16-byte chunk index of a row XORed with row % 8), rounded to the element type.
//
// kStmatrix: the warp stores its part with four stmatrix.x4.trans (FlashAttention-3's dS
// store) instead of 32 scalar 16-bit stores. The accumulator's 8 × 8 blocks are ldmatrix
// fragments: block (c, h), columns 8c..8c + 7 and the warp's rows 8h..8h + 7, is this lane's
// registers 4c + 2h and 4c + 2h + 1, packed in one b16x2; stored transposed, its row q
// (query 8c + q) is keys 8h..8h + 7 of the warp's 16, one 16-byte chunk. Instruction k stores
// blocks (2k + j / 2, j % 2) for j = 0..3; lane l gives the address of row l % 8 of block l / 8.
// ptxas (sm_90a) decides where, until a GPU weighs the two: at D = 128 the 64-key fused
// kernel over dense work (StmatrixDs) spills less with it; the wide kernel's spill stores
// rose from 0 to 44 bytes (capped: 0 to 16), so it keeps the scalar stores. At D = 64 every
// fused form takes it (spill stores unchanged but for the wide kernel: tasks 40 to 32,
// block-sparse 136 to 144, in the 32-register producer warps' walk).
template <bool kBf16, bool kStmatrix>
__device__ __forceinline__ void store_ds(uint32_t tile, const float (&dst)[32], int local0,
                                         int lane) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  if constexpr (kStmatrix) {
    const int chunk0 = (local0 - lane / 4) / 8;  // the warp's first 8 keys' 16-byte chunk
    const int j = lane / 8, q = lane % 8;        // the block and its row this lane addresses
    // Row q of block (2k + j / 2, j % 2): query 16k + 8(j / 2) + q, whose row % 8 is q.
    const uint32_t row = tile + static_cast<uint32_t>(8 * (j / 2) + q) * 128u +
                         static_cast<uint32_t>(((chunk0 + j % 2) ^ q) * 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t r[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int i = 4 * (2 * k + m / 2) + 2 * (m % 2);
        r[m] = pack2<T>(dst[i], dst[i + 1]);
      }
      ptx::stmatrix_x4_trans(at(row + 2048u * static_cast<uint32_t>(k)), r);
    }
  } else {
    const auto base = dynamic_smem<uint16_t>();
    const uint32_t base_addr = u32(smem_addr(base));
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int key = local0 + 8 * acc_row(i), query = acc_col(i, lane);
      const int byte = 2 * key;
      const uint32_t at_byte = tile + static_cast<uint32_t>(query) * 128u +
                               static_cast<uint32_t>(((byte / 16) ^ (query % 8)) * 16 + byte % 16);
      base[(at_byte - base_addr) / 2] = static_cast<uint16_t>(pack2<T>(dst[i], 0.0f) & 0xffffu);
    }
  }
}

// The stats warp (the producer warpgroup's third): for every query tile the block walks, once
// the stage is free (the producer's wait), its columns' lse in the log2 domain (+inf where a
// query saw nothing) and delta · delta_factor into the stage's stats slot, +inf and 0 past the
// tile's rows; every lane then arrives at the stage's `full` barrier, which completes with the
// TMA bytes and these 32 arrivals. The consumers read the slot unguarded: no global loads, and
// none of their branches, in the walk's softmax.
constexpr unsigned kStatsArrivals = 32;

// Stage s's stats slot (64 lse, then 64 delta), `stats_at` the first slot's shared address.
__device__ __forceinline__ SmemPtr<float> stats_slot(uint32_t stats_at, int s) {
  const auto sbase = dynamic_smem<float>();
  return sbase +
         static_cast<std::ptrdiff_t>(
             (stats_at + kStatsStageBytes * static_cast<uint32_t>(s) - u32(smem_addr(sbase))) / 4);
}

template <int kD, int kResident, int kDv, class Work>
__device__ __forceinline__ void stage_stats(const BackwardArgs<Work>& p,
                                            const Stages<kD, kResident, 2, kDv>& st,
                                            uint32_t stats_at,
                                            const QueryRows& kr, int lane) {
  typename Work::Cursor cursor = p.work.begin(kr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.empty(s)), static_cast<unsigned>((use + 1) & 1));
    const Strided rows = p.work.column_stats(cursor, t);
    int count = 0;  // the tile's query rows (those dQ's part is added to)
    (void)p.work.column_grads(cursor, t, kD, count);
    const auto slot = stats_slot(stats_at, s);
    for (int c = lane; c < kRows; c += 32) {
      const bool row = c < count;
      slot[c] = row ? lse_log2(p.lse, rows.at + c * rows.stride) : INFINITY;
      slot[kRows + c] = row ? p.delta[rows.at + c * rows.stride] * p.delta_factor : 0.0f;
    }
    ptx::mbarrier_arrive(at(st.full(s)));
  }
}

// One walked query tile of a fused kernel's consumer warpgroup, its keys' K and V in
// `k_tile` and `v_tile`, the tile's Q and dO in `q_tile` and `do_tile`: Sᵀ = K·Qᵀ, Pᵀ
// (probs_t), dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ in `pt` (grads_t), dK += dSᵀ·Q, as
// hopper_bwd_dkdv_kernel takes them: each product waited for at once (kOverlap false), or in
// FlashAttention-3's order (RINGATTN_HOPPER_BWD_SCHEDULE=overlap): Sᵀ and dPᵀ issued
// together, the softmax under dPᵀ, dV's product issued and dS computed under it. ptxas
// (sm_90a, D = 128, dense) spills 20 bytes instead of 4 in the 64-key kernel (capped: 40
// instead of 0) and 16 instead of 0 in the wide one: which order wins is a GPU's to say.
// kDv: the values' head dim (V and dO tiles; dPᵀ sums over it); kWantDv false (values of
// their own head dim, whose dV is a launch of its own): no dV product.
template <int kD, bool kBf16, bool kOverlap, int kDv, bool kWantDv, class Work, class Stats>
__device__ __forceinline__ void key_tile_grads(float (&pt)[32], float (&dk)[kD / 2],
                                               float (&dv)[kWantDv ? kDv / 2 : 1], uint32_t k_tile,
                                               uint32_t v_tile, uint32_t q_tile, uint32_t do_tile,
                                               const BackwardArgs<Work>& p, const Reach (&cols)[2],
                                               const Stats& stats, int lane) {
  [[maybe_unused]] uint32_t no_regs[1][4];
  float dpt[32];
  if constexpr (kOverlap) {
    issue_a_bt<kD, kBf16, false>(pt, no_regs, opaque(k_tile), q_tile);
    issue_a_bt<kDv, kBf16, false>(dpt, no_regs, opaque(v_tile), do_tile);
    ptx::wgmma_wait_group<1>();  // Sᵀ; dPᵀ runs on under the softmax
    probs_t<CapOf<Work>::value>(pt, p.logits, cols, stats, lane);
    if constexpr (kWantDv) {
      issue_rs<kDv, kBf16>(dv, pt, do_tile);  // dV += Pᵀ·dO
      ptx::wgmma_wait_group<1>();             // dPᵀ; dV's product runs on under dS
    } else {
      ptx::wgmma_wait_group<0>();
    }
    cap_slopes_t<CapOf<Work>::value>(pt, p.logits, cols, stats, lane);
  } else {
    issue_a_bt<kD, kBf16, false>(pt, no_regs, opaque(k_tile), q_tile);
    ptx::wgmma_wait_group<0>();
    probs_t<CapOf<Work>::value>(pt, p.logits, cols, stats, lane);
    if constexpr (kWantDv) product_rs<kDv, kBf16>(dv, pt, do_tile);  // dV += Pᵀ·dO
    cap_slopes_t<CapOf<Work>::value>(pt, p.logits, cols, stats, lane);
    issue_a_bt<kDv, kBf16, false>(dpt, no_regs, opaque(v_tile), do_tile);
    ptx::wgmma_wait_group<0>();
  }
  grads_t(pt, dpt, p.dout_scale, cols, stats, lane);
  product_rs<kD, kBf16>(dk, pt, q_tile);  // dK += dSᵀ·Q (and dV's product waited for)
}
// The fused backward: one launch, a block per 64-key tile as hopper_bwd_dkdv_kernel's (K and V
// resident, the (Q, dO) tiles of every query tile that sees the keys streamed through the
// ring), which also takes dQ's part from its keys, dQ += dS·K, and adds it into dq with the
// bulk reduce-add (cp.reduce.async.bulk .add.f32) instead of a second pass that recomputes S
// and dP (five products a tile pair instead of seven). Blocks add into a dq row in whatever
// order they reach it, so dq's fp32 sums are not deterministic: `--deterministic` runs the two
// passes. D <= 128 (at D = 256 dK and dV alone fill the consumer's registers).
//
// Per query tile (ring stage s), the consumer warpgroup takes dSᵀ as hopper_bwd_dkdv_kernel
// does, then stores it as dS (queries × keys, K-major, the 128-byte swizzle: a tile wgmma
// reads as register A) to shared memory and meets at named barrier kDsReady: dS is whole, and
// no consumer reads the stage's Q and dO any more. It loads its rows of dS back as register A
// (then meets at kDsFree, so that the next tile's dS waits for every load of this one) and
// takes dQ's part 64 columns at a time against the resident K (read N-major). Each part,
// times the scale, is staged in fp32 over the stage's own two tiles (rows 0-31 over Q's,
// 32-63 over dO's: 64 × kD × 4 bytes is two tiles), fenced to the async proxy, and the
// consumers arrive at kDqFull + (tile parity). The drain warp (the producer warpgroup's
// second) waits there, issues one bulk reduce-add per staged row into dq (lanes take rows
// lane, lane + 32), waits until the reductions have read the stage and frees it for the
// producer: the stage's `empty` barrier counts the drain's arrival alone. The parity keeps
// the consumers' arrivals for tile j + 2 apart from tile j's: they need stage s refilled,
// which waits for the drain to have taken tile j. At exit the drain waits for its
// reductions to complete.
//
// The stats warp (the producer warpgroup's third) stages each query tile's lse and delta in
// shared memory beside its Q and dO (stage_stats), so the consumers' softmax makes no global
// loads: FlashAttention-3's producer loads them with TMA; ringattn's rows of a dilated
// pattern's lse are strided, so a warp of plain loads serves every Work alike.
//
// Shared memory is Stages<kD, 2>'s, one dS box and 1 KiB of stats: 107 KiB at D = 128, so two
// blocks share an SM (two consumer warpgroups, one block's softmax under the other's products).
// At D = 64 (58 KiB) dS is double-buffered by tile parity as in the wide kernel (66 KiB), and
// no kDsFree barrier waits for the previous tile's loads.
// One block of a fused backward with kGroups consumer warpgroups (1: hopper_bwd_fused_kernel,
// 2: hopper_bwd_fused_wide_kernel), the producer warpgroup at kProducer registers a thread and
// the consumers at kConsumer. Consumer warpgroup w owns keys 64w..64w + 63 of the block's
// 64·kGroups (K and V resident as tiles w and kGroups + w) and box w of the dS tile; once
// dS is whole each takes dQ's head-dim chunks w, w + kGroups, ... over all the block's keys.
//
// kDv != kD (values of their own head dim, 192/128): dV is a launch of its own (the two
// passes' dV kernel), since dK's 96 and dV's 64 accumulator registers a thread would not fit
// beside dS and dQ's part; this block takes dK and dQ's part, staging dQ (64 × 192 fp32, more
// than the stage's Q and dO tiles) in an sdQ of its own as the wide kernel does.
template <int kD, bool kBf16, class Work, int kGroups, unsigned kProducer, unsigned kConsumer,
          bool kOverlap, int kDv = kD>
__device__ __forceinline__ void fused_backward_block(const BackwardArgs<Work>& p) {
  static_assert(kGroups == 1 || kD / 64 == kGroups || kD == 64,
                "wide: one dQ chunk a warpgroup, or at D = 64 one key tile");
  constexpr unsigned kConsumers = kConsumerThreads * kGroups;
  constexpr int kKeys = kRows * kGroups;
  // The wide kernel at D = 64 splits dQ's part by keys, not head-dim columns (a 32-column
  // half of the resident K's 64 would be half a 128-byte swizzle row as wgmma's B).
  constexpr bool kKeySplit = kGroups == 2 && kD == 64;
  constexpr int kDqKeys = kKeySplit ? kRows : kKeys;  // the keys a dQ part sums over
  static_assert(kDv == kD || kGroups == 1, "values of their own head dim: the 64-key kernel");
  constexpr bool kWantDv = kDv == kD;  // else dV is a launch of its own
  using St = Stages<kD, 2 * kGroups, 2, kDv>;
  const St st = St::of_block();
  constexpr int kDsBuffers = fused_ds_buffers(kD, kGroups);
  const uint32_t ds_tiles = st.base + fused_stage_end(kD, kGroups, kDv);
  const uint32_t stats_at = ds_tiles + static_cast<uint32_t>(kDsBuffers * kGroups) * kBoxBytes;
  // With an sdQ of its own (after the stats: the wide kernel, values of their own head dim)
  // the consumers free a stage once they have read its Q and dO (kDsReady), before its dQ
  // part is even computed.
  constexpr bool kOwnSdq = fused_own_sdq(kD, kGroups, kDv);
  const uint32_t sdq = stats_at + 2 * kStatsStageBytes;
  const QueryRows kr = p.work.query_rows(kD, kD);  // the block's up to kKeys keys
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  // A stage is freed by the drain warp once its reductions read it (the 64-key kernel) or by
  // every consumer thread at kDsReady (the wide one), and filled by the producer's TMA and the
  // stats warp's 32 lanes.
  st.init_barriers(kOwnSdq ? kConsumers : 1, 1 + kStatsArrivals);
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: thread 0 loads, warp 1 drains dQ, warp 2 stats
    ptx::setmaxnreg<false, kProducer>();
    if (threadIdx.x == 0) produce(st, p.work, kr, p.k, p.v, p.q, p.dout);
    if (warp == 1) drain_dq<kOwnSdq>(p, st, sdq, kr, lane, kConsumers);
    if (warp == 2) stage_stats(p, st, stats_at, kr, lane);
    return;
  }

  ptx::setmaxnreg<true, kConsumer>();
  const int w = kGroups == 1 ? 0 : (warp - 4) / 4;      // this consumer warpgroup
  const int local0 = 16 * ((warp - 4) % 4) + lane / 4;  // its keys local0, local0 + 8; dS rows
  const int key0 = kRows * w + local0;                  // those keys in the block's
  // A key row past the block's (the resident box's next rows: another task's or view's keys,
  // or zero fill) sees nothing: its dK and dV are never written, but its dS would reach dQ.
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    reach[r] = key0 + 8 * r < kr.rows ? p.work.reach(kr, key0 + 8 * r) : Reach{0, 0};
  float dk[kD / 2], dv[kWantDv ? kDv / 2 : 1];
#pragma unroll
  for (float& x : dk) x = 0.0f;
#pragma unroll
  for (float& x : dv) x = 0.0f;
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  typename Work::Cursor cursor = p.work.begin(kr);
  KeyTile t;
  for (int j = 0; p.work.next(cursor, t); ++j) {
    const int s = j & 1, use = j >> 1;
    ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
    if (t.limit < kRows)
      zero_tail_rows(st, s, t.limit, static_cast<int>(threadIdx.x) - 128,
                     static_cast<int>(kConsumers));
    const auto slot = stats_slot(stats_at, s);
    const StagedColumnStats stats{slot, slot + kRows};
    Reach cols[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) cols[r] = columns_of(reach[r], t);
    float pt[32];  // dSᵀ of this warpgroup's keys
    key_tile_grads<kD, kBf16, kOverlap, kDv, kWantDv>(pt, dk, dv, st.resident(w),
                                                      st.resident(kGroups + w), st.ring(0, s),
                                                      st.ring(1, s), p, cols, stats, lane);
    // With one dS buffer, the previous tile's dS has been loaded by every consumer (kDsFree)
    // before this one's overwrites it. With two (by tile parity), tile j's buffer last held
    // tile j - 2's dS, which every consumer that reads it loaded before arriving at tile
    // j - 1's kDsReady (kDsOwn + w when split by keys), and this consumer has passed that
    // barrier: no wait.
    const uint32_t ds_tile =
        ds_tiles + static_cast<uint32_t>((j % kDsBuffers) * kGroups) * kBoxBytes;
    if constexpr (kDsBuffers == 1) ptx::named_barrier_sync(kDsFree, kConsumers);
    constexpr bool kStmatrix = kD == 64 || (kGroups == 1 && StmatrixDs<Work>::value);
    store_ds<kBf16, kStmatrix>(ds_tile + static_cast<uint32_t>(w) * kBoxBytes, pt,
                               static_cast<int>(opaque(static_cast<uint32_t>(local0))),
                               static_cast<int>(opaque(static_cast<uint32_t>(lane))));
    __syncwarp();
    // dS whole (split by keys: this warpgroup's box); Q and dO read.
    if constexpr (kKeySplit)
      ptx::named_barrier_sync(kDsOwn + static_cast<unsigned>(w), kConsumerThreads);
    else
      ptx::named_barrier_sync(kDsReady, kConsumers);
    if constexpr (kOwnSdq) ptx::mbarrier_arrive(at(st.empty(s)));  // the producer may refill
    uint32_t ds[kDqKeys / 16][4];  // 64 queries × the keys this warpgroup's dQ part sums over
    load_a_fragments<kDqKeys>(
        ds, ds_tile + (kKeySplit ? static_cast<uint32_t>(w) * kBoxBytes : 0u),
        static_cast<int>(opaque(static_cast<uint32_t>(local0))),
        static_cast<int>(opaque(static_cast<uint32_t>(lane))));
    if constexpr (kGroups == 1) {
      // An sdQ of its own holds the previous tile's part until the drain has read it.
      if constexpr (kOwnSdq)
        if (j > 0) ptx::named_barrier_sync(kDqFree, kConsumers + kDrainThreads);
#pragma unroll
      for (int chunk = 0; chunk < kD / 64; ++chunk)
        stage_dq_part<kKeys, kOwnSdq, kD, kBf16>(st, sdq, s, ds, chunk, p.scale, local0, lane);
      ptx::fence_proxy_async_shared();
      __syncwarp();
    } else {
      float dq[32];  // split by columns: chunk w over the block's keys; by keys: this one's
      dq_part<kDqKeys, kD, kBf16>(dq, st, ds, kKeySplit ? w : 0, kKeySplit ? 0 : w);
      // sdQ holds the previous tile's part until the drain's reductions have read it.
      if (j > 0) ptx::named_barrier_sync(kDqFree, kConsumers + kDrainThreads);
      // Split by keys, the warpgroups take turns (by tile parity) to store their part and to
      // add theirs to it once stored (kDqPart), so that the drain reduces one sum a row.
      const bool adds = kKeySplit && w == (j & 1);
      if (adds) {
        ptx::named_barrier_sync(kDqPart, kConsumers);
        stage_dq_rows<true, kOwnSdq>(st, sdq, s, dq, 0, p.scale, local0, lane);
      } else {
        stage_dq_rows<false, kOwnSdq>(st, sdq, s, dq, kKeySplit ? 0 : w, p.scale, local0, lane);
      }
      ptx::fence_proxy_async_shared();
      __syncwarp();
      if (kKeySplit && !adds) ptx::named_barrier_arrive(kDqPart, kConsumers);
    }
    ptx::named_barrier_arrive(kDqFull + static_cast<unsigned>(j & 1), kConsumers + kDrainThreads);
  }
  add_rows<kD>(p.dk, dk, p.scale, p.work.grad_rows(kr, kD, kD), kr.rows, key0, lane);
  if constexpr (kWantDv)
    add_rows<kDv>(p.dv, dv, p.dout_scale, p.work.grad_rows(kr, kD, kDv), kr.rows, key0, lane);
}

// kOverlap: key_tile_grads' order (RINGATTN_HOPPER_BWD_SCHEDULE=overlap).
template <int kD, bool kBf16, class Work, bool kOverlap = false>
__global__ void __launch_bounds__(kThreads, kFusedBlocksPerSm<kD>)
    hopper_bwd_fused_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
  static_assert(kD <= 128, "dK, dV and dQ's part fit the consumer's registers at D <= 128");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  // Two blocks an SM split its registers: the producer warpgroup 32 a thread (its drain warp
  // walks the work too), the consumer 224.
  fused_backward_block<kD, kBf16, Work, 1, 32u, 224u, kOverlap>(p);
#else
  (void)p;
#endif
}

// The fused backward at values of their own head dim (MLA's 192/128): dK and dQ's part of a
// 64-key tile in one launch beside the two passes' dV kernel (hopper_bwd_dkdv_kernel with
// kGradDv), so six products a tile pair instead of eight. 180 KiB (its sdQ: 64 × 192 fp32),
// one block an SM, the producer warpgroup at 40 registers and the consumer at 232.
template <int kD, bool kBf16, class Work, bool kOverlap, int kDv>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_bwd_fused_dk_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
  static_assert(kDv != kD, "values of their own head dim; else hopper_bwd_fused_kernel");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  fused_backward_block<kD, kBf16, Work, 1, 40u, 232u, kOverlap, kDv>(p);
#else
  (void)p;
#endif
}

// The wide fused backward, FlashAttention-3's block shape: a block per 128-key tile (the
// work's 128-row blocks: DenseWork's and TaskKeyWork's block_rows), with two consumer
// warpgroups, warpgroup w owning keys 64w..64w + 63 (K and V as resident tiles w and 2 + w),
// so one (Q, dO) load and one dQ reduction serve 128 keys instead of 64. Per walked query
// tile each warpgroup takes its keys' dSᵀ as hopper_bwd_fused_kernel does and stores it as
// box w of a 64 × 128 dS tile; then (both met at kDsReady, 256 threads) each loads the whole
// dS as register A (8 steps of 16 keys) and takes head-dim columns [64w, 64w + 64) of dQ's
// part against the resident K: at D = 128 the two warpgroups share the dQ product with no
// sum between them. The drain warp waits for both (kDqFull: 256 + 32) and adds each 512-byte
// row with one bulk reduce-add.
//
// At D = 64 the single 64-column part is split by keys instead: each warpgroup loads only its
// own dS box (after a barrier of its own, kDsOwn + w, not kDsReady) and takes dQ's part from
// its 64 keys against its resident K; the two parts are summed in sdQ, one warpgroup storing
// its part and the other (meeting it at kDqPart) adding its own, by turns (tile parity), so
// the drain still reduces one 256-byte row per query instead of two.
//
// As FlashAttention-3, dQ's part is staged in an sdQ of its own (padded rows: two-way store
// conflicts instead of eight), not over the stage: the consumers free the stage for the
// producer's next (Q, dO) as soon as they have read it (kDsReady), and wait only for the
// drain to have read the previous tile's sdQ (kDqFree) before staging the next part.
//
// Shared memory: Stages<kD, 4> (K's and V's two 64-key tiles, the two-stage ring), two 64 ×
// 128 dS tiles (by tile parity: no kDsFree barrier, one block-wide barrier a tile), the stats
// and sdQ: 196 KiB at D = 128 (115 KiB at D = 64), one block an SM. Registers
// (launch bounds 384 × 1): the producer warpgroup gives back down to 32 a thread and the
// consumers take 232 (128·32 + 256·232 = 63,488 of 65,536), as the ping-pong forward. ptxas
// spills nothing at D = 128 over dense work (32 bytes over tasks, 124 block-sparse: the
// 32-register producer warps' walk); at 24 and 240 (FlashAttention-3's split) dense spilled 48.
constexpr int kWideThreads = 384;

template <int kD, bool kBf16, class Work, bool kOverlap = false>
__global__ void __launch_bounds__(kWideThreads, 1)
    hopper_bwd_fused_wide_kernel(const RINGATTN_GRID_CONSTANT BackwardArgs<Work> p) {
  static_assert(kD == 64 || kD == 128, "dQ's part split by 64 head-dim columns, or by keys");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  fused_backward_block<kD, kBf16, Work, 2, 32u, 232u, kOverlap>(p);
#else
  (void)p;
#endif
}

}  // namespace ringattn::kernels::cuda::hopper

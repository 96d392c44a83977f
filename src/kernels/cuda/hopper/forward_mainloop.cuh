// The Hopper (sm_90a) forward kernels' main loops, written once for every kind of work: the dense
// forward (hopper/launch_dense_forward.cu) and the block-sparse one
// (hopper/launch_sparse_forward.cu) differ only in the `Work` they instantiate it with, which says
// which Q tile a block loads, where its rows' results go, which K/V tiles it walks and how far each
// row reaches. The online softmax is hopper/forward_softmax.cuh's, the epilogue (write, or merge by
// log-sum-exp) hopper/forward_epilogue.cuh's, the pipeline's pieces (producer, K/V ring under
// mbarriers, wgmma products) hopper/tiles.cuh's.
//
// Block: warpgroup 0 produces (one thread issues the TMA loads), warpgroup 1 consumes a
// 64-row Q tile (resident) against 64-key K/V tiles (the ring's tensors 0 and 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/hopper/dense_forward.hpp"  // HopperForwardForm
#include "kernels/cuda/hopper/forward_epilogue.cuh"
#include "kernels/cuda/hopper/forward_softmax.cuh"
#include "kernels/cuda/hopper/tiles.cuh"

namespace ringattn::kernels::cuda::hopper {

template <class Work>
struct Args {
  TmaDesc q, k, v;
  Logits logits;  // S → the log2-domain (soft-capped) logit
  bool accumulate;  // merge into (out, lse) by log-sum-exp instead of writing them
  Work work;
};
// kOverlap: the next tile's S = Q·Kᵀ is issued before this tile's softmax and runs under it
// (FlashAttention-3's intra-warpgroup overlap), at the cost of a second 64 × 64 score tile in
// registers; without it each product is waited for before the softmax. kQRegs (D <= 128): the
// Q tile is read once into registers as wgmma's register A, so S = Q·Kᵀ reads only K from
// shared memory (issue_a_bt's register-A form), for D/4 more registers a thread.
// kDv: the values' head dim (V's tiles, O's accumulator and out; MLA's 128 beside D = 192).
template <int kD, bool kBf16, class Work, bool kOverlap, bool kQRegs = false, int kDv = kD>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kD>)
    hopper_fwd_kernel(const RINGATTN_GRID_CONSTANT Args<Work> p) {
  static_assert(!kQRegs || kD <= 128, "Q in registers takes D/4 of them");
  static_assert(kDv == kD || (!kOverlap && !kQRegs), "values of their own width: the plain loop");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  const Stages<kD, 1, 2, kDv> st = Stages<kD, 1, 2, kDv>::of_block();
  const QueryRows qr = p.work.query_rows(kD, kDv);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers();
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: one thread issues every load
    ptx::setmaxnreg<false, kProducerRegs<kD>>();
    if (threadIdx.x == 0) produce(st, p.work, qr, p.q, p.q, p.k, p.v);
    return;
  }

  // The consumer warpgroup: a lane holds rows local0 and local0 + 8 of the tile (index
  // r = 0, 1), as wgmma's accumulator does.
  ptx::setmaxnreg<true, kConsumerRegs<kD>>();
  const int local0 = 16 * (warp - 4) + lane / 4;
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) reach[r] = p.work.reach(qr, local0 + 8 * r);
  float o[kDv / 2];
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  [[maybe_unused]] uint32_t qa[kQRegs ? kD / 16 : 1][4];
  if constexpr (kQRegs) load_a_fragments<kD>(qa, st.resident(0), local0, lane);
  typename Work::Cursor cursor = p.work.begin(qr);
  KeyTile t, t_next{};
  float sc[32], s_next[32];
  bool have = p.work.next(cursor, t);
  const int thread = static_cast<int>(threadIdx.x) - 128;  // in the consumer warpgroup
  if (kOverlap && have) {
    ptx::mbarrier_wait(at(st.full(0)), 0);
    if (t.limit < kRows) zero_tail_rows(st, 0, t.limit, thread);
    issue_a_bt<kD, kBf16, kQRegs>(sc, qa, st.resident(0), st.ring(0, 0));
    ptx::wgmma_wait_group<0>();
  }
  for (int j = 0; have; ++j) {
    const int s = j & 1, use = j >> 1;
    bool more = false;
    if constexpr (kOverlap) {  // S of the next tile, in flight under this tile's softmax
      more = p.work.next(cursor, t_next);
      if (more) {
        const int s2 = (j + 1) & 1, use2 = (j + 1) >> 1;
        ptx::mbarrier_wait(at(st.full(s2)), static_cast<unsigned>(use2 & 1));
        if (t_next.limit < kRows) zero_tail_rows(st, s2, t_next.limit, thread);
        issue_a_bt<kD, kBf16, kQRegs>(s_next, qa, st.resident(0), st.ring(0, s2));
      }
    } else {
      ptx::mbarrier_wait(at(st.full(s)), static_cast<unsigned>(use & 1));
      if (t.limit < kRows) zero_tail_rows(st, s, t.limit, thread);
      issue_a_bt<kD, kBf16, kQRegs>(sc, qa, st.resident(0), st.ring(0, s));
      ptx::wgmma_wait_group<0>();
    }
    softmax_step<kDv, CapOf<Work>::value>(sc, reach, t, lane, p.logits, m, l, o);
    issue_rs<kDv, kBf16>(o, sc, st.ring(1, s));
    ptx::wgmma_wait_group<0>();  // O += P·V, and the next S under kOverlap
    ptx::mbarrier_arrive(at(st.empty(s)));
    if constexpr (kOverlap) {
#pragma unroll
      for (int i = 0; i < 32; ++i) sc[i] = s_next[i];
      t = t_next;
      have = more;
    } else {
      have = p.work.next(cursor, t);
    }
  }
  write_rows<kDv>(p.accumulate, qr, local0, o, m, l, lane);
#else
  (void)p;
#endif
}

// The ping-pong forward (FlashAttention-3's inter-warpgroup overlap, within one block): three
// warpgroups, the producer and two consumers, over a 128-row Q tile whose two 64-row halves
// are resident (consumer c takes rows [64c, 64c + 64) of the work's block); both consumers
// read every K/V stage, which is freed once all 256 of their threads arrived. Named barriers
// 2 and 3 pass the tensor cores back and forth: a consumer issues its products (S = Q·Kᵀ,
// then O += P·V) only on its turn and hands the turn on once they are issued, so one
// consumer's softmax runs while the other's products do, and the K/V tiles are loaded once
// for 128 rows. Consumer 0 moves first; consumer 1 skips the hand-over after its last
// products, so every bar.sync has its bar.arrive and none is left pending at exit.
//
// kStep key tiles make one softmax step: 1 (64 keys, two ring stages), or 2 (128 keys, four
// stages: the two tiles' S products are issued together, one max and one rescale of O serve
// both, and a turn covers twice the products; a last step with one tile masks the other).
// Only works whose walked tiles are whole (DenseWork: rows past the view are the tensor map's
// zero fill) run here; a tile with rows to zero would need both consumers to zero it before
// either's turn.
//
// Registers: one block per SM (launch bounds 384 × 1), the producer gives back down to 32
// and the consumers take 232 each (128·32 + 256·232 = 63,488 of 65,536).
constexpr int kPingPongThreads = 384;
constexpr unsigned kPingPongConsumers = 256;  // both consumer warpgroups' threads

template <int kD, bool kBf16, class Work, int kStep>
__global__ void __launch_bounds__(kPingPongThreads, 1)
    hopper_fwd_pingpong_kernel(const RINGATTN_GRID_CONSTANT Args<Work> p) {
  static_assert(Work::kWholeTiles, "the ping-pong forward zeroes no tile rows");
  static_assert(kStep == 1 || kStep == 2, "one or two key tiles a step");
#if RINGATTN_CUDA_EMULATION || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
  constexpr int kStages = 2 * kStep;
  const Stages<kD, 2, kStages> st = Stages<kD, 2, kStages>::of_block();
  const QueryRows qr = p.work.query_rows(kD, kD);  // the block's 2 × 64 rows
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  st.init_barriers(kPingPongConsumers);
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup: one thread issues every load
    ptx::setmaxnreg<false, 32>();
    if (threadIdx.x == 0) produce(st, p.work, qr, p.q, p.q, p.k, p.v, kRows);
    return;
  }

  ptx::setmaxnreg<true, 232>();
  const int c = (warp - 4) / 4;  // this consumer: 0 or 1
  const unsigned my_turn = 2u + static_cast<unsigned>(c), next_turn = 3u - static_cast<unsigned>(c);
  const int local0 = kRows * c + 16 * ((warp - 4) % 4) + lane / 4;
  Reach reach[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) reach[r] = p.work.reach(qr, local0 + 8 * r);
  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  ptx::mbarrier_wait(at(st.resident_full()), 0);
  typename Work::Cursor cursor = p.work.begin(qr);
  // Up to kStep walked tiles into ts; how many.
  auto fetch = [&](KeyTile(&ts)[kStep]) {
    int n = 0;
#pragma unroll
    for (int u = 0; u < kStep; ++u)
      if (n == u && p.work.next(cursor, ts[u])) ++n;
    return n;
  };
  KeyTile t[kStep], t_next[kStep];
  float sc[kStep][32];
  int have = fetch(t);
  if (have > 0 && c == 1)
    ptx::named_barrier_arrive(2, kPingPongConsumers);  // consumer 0 takes the first turn
  for (int g = 0; have > 0;) {  // g: the walk's index of this step's first tile
    const int more = fetch(t_next);
#pragma unroll
    for (int u = 0; u < kStep; ++u)
      if (u < have)
        ptx::mbarrier_wait(at(st.full((g + u) % kStages)),
                           static_cast<unsigned>(((g + u) / kStages) & 1));
    ptx::named_barrier_sync(my_turn, kPingPongConsumers);
#pragma unroll
    for (int u = 0; u < kStep; ++u)
      if (u < have) issue_ss<kD, kBf16>(sc[u], st.resident(c), st.ring(0, (g + u) % kStages));
    ptx::named_barrier_arrive(next_turn, kPingPongConsumers);
    ptx::wgmma_wait_group<0>();
    softmax_tiles<kD, kStep, CapOf<Work>::value>(sc, reach, t, have, lane, p.logits, m, l, o);
    ptx::named_barrier_sync(my_turn, kPingPongConsumers);
#pragma unroll
    for (int u = 0; u < kStep; ++u)
      if (u < have) issue_rs<kD, kBf16>(o, sc[u], st.ring(1, (g + u) % kStages));
    if (c == 0 || more > 0) ptx::named_barrier_arrive(next_turn, kPingPongConsumers);
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int u = 0; u < kStep; ++u)
      if (u < have) ptx::mbarrier_arrive(at(st.empty((g + u) % kStages)));
#pragma unroll
    for (int u = 0; u < kStep; ++u) t[u] = t_next[u];
    g += have;
    have = more;
  }
  write_rows<kD>(p.accumulate, qr, local0, o, m, l, lane);
#else
  (void)p;
#endif
}

}  // namespace ringattn::kernels::cuda::hopper

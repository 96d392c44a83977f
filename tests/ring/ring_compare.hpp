// The distributed engine against the single-process Plan, shared by the MPI test and the
// virtual-rank test: the same golden and randomized configs, each rank checking its shard.
#pragma once

#include <string>
#include <vector>

#include "ring/communicator.hpp"
#include "ringattn/config.hpp"

namespace ringattn::testing {

inline constexpr double kRingTolerance = 1e-5;

struct RingInputs {
  std::vector<float> q, k, v, dout;  // k: [B, N, HKV, D], v: [B, N, HKV, Dv], dout [B, N, H, Dv]
};
struct FullResult {  // dk: [B, N, HKV, D], dv: [B, N, HKV, Dv], out [B, N, H, Dv]
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward and backward with the single-process Plan.
FullResult single_process(const AttentionConfig& cfg, const RingInputs& in);

// Whether every tensor of `a` has the same bytes as `b`'s.
bool same_bits(const FullResult& a, const FullResult& b);
// Forward and backward with the float64 reference, rounded to float32.
FullResult float64_reference(const AttentionConfig& cfg, const RingInputs& in);

// Runs RingPlan on this rank of `comm` (small tiles, `threads` threads) and EXPECTs its shard of
// out, lse, dq, dk, dv within kRingTolerance of `want`, and its forward bytes equal to the minimum.
// `in` and `want` are [B, N, H, D]; with cfg.layout bhnd the ring computes on head-major copies
// of the shards.
void expect_ring_matches(const AttentionConfig& cfg, const RingInputs& in, const FullResult& want,
                         ring::Communicator& comm, const std::string& what, int threads);

// Golden grouped and mixture cases (names for load_golden).
std::vector<std::string> ring_golden_cases();

struct RandomRingCase {
  const char* name;
  Shape4 shape;
  AttentionKind attention;
  Combine combine;
  std::vector<int64_t> segments, dilations;
  int64_t kv_heads = 0;                         // 0: as many as the query heads
  int64_t window_left = -1, window_right = -1;  // -1: no window / R omitted
  std::vector<int64_t> seqlens = {};            // packed document lengths; empty: one sequence
  int64_t head_dim_v = 0;                       // 0: the head dim
  double softcap = 0;  // with a cap, the scale makes the scores' std about the cap
};
// N = 240 splits over 1..4 ranks (and 2P for zigzag: 2, 4, 6, 8); segments straddle shards.
std::vector<RandomRingCase> random_ring_cases();
// Grouped-query attention (kv_heads < heads), same lengths: MQA and HKV = H/2, dense,
// grouped and mixture.
std::vector<RandomRingCase> gqa_ring_cases();
// Sliding windows (dense, N = 240): 0, narrower than a shard, spanning shards, wider than N,
// asymmetric (right reaches are dropped under causal), with GQA.
std::vector<RandomRingCase> window_ring_cases();
// Packed sequences (dense): documents of length 1, shorter than a shard and spanning several
// shards, with GQA and windows; and N = 252, which 2P does not divide at P = 4 (causal runs
// then take the balanced layout).
std::vector<RandomRingCase> packed_ring_cases();
// Values of their own head dim (192/128, 64/32, 40/24) and soft-capped logits (c = 1, 30, 50),
// dense, dilated, GQA, windows and packed documents.
std::vector<RandomRingCase> mla_softcap_ring_cases();
AttentionConfig config_of(const RandomRingCase& c, bool causal);
RingInputs random_inputs(const AttentionConfig& cfg);

}  // namespace ringattn::testing

// Runs the single-process CPU Plan forward and backward on seeded random inputs: what the
// feature tests (GQA, windows, packed sequences) compare with the float64 reference.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "ringattn/config.hpp"
#include "single/plan.hpp"

namespace ringattn::testing {

struct Tensors {
  std::vector<float> q, k, v, dout;  // k [B, N, HKV, D], v [B, N, HKV, Dv], dout [B, N, H, Dv]
};

// q [B, N, H, D], k [B, N, HKV, D], v [B, N, HKV, Dv], dout [B, N, H, Dv]: normal(0, 1) from
// `seed`.
Tensors random_tensors(const AttentionConfig& cfg, uint64_t seed);

struct PlanResult {
  std::vector<float> out, lse, dq, dk, dv;
  // Everything, concatenated (for bitwise comparisons).
  std::vector<float> all() const;
};

// Copies of `x` ([B, N, H, D] rows of shape `s`) laid out [B, H, N, D], and back: the tensors
// TensorLayout::bhnd runs read (for a shard, N is its local length).
std::vector<float> head_major_copy(const std::vector<float>& x, const Shape4& s);
std::vector<float> token_major_copy(const std::vector<float>& x, const Shape4& s);

// Plan(cfg, opts).forward then .backward, outputs prefilled with NaN so that an unwritten
// element shows.
PlanResult run_plan(const AttentionConfig& cfg, const Tensors& in, PlanOptions opts);

// Every tensor of `got` (from `in`) within `tol` relative error of the float64 reference.
void expect_matches_float64(const AttentionConfig& cfg, const Tensors& in, const PlanResult& got,
                            double tol = 1e-5);

// The same bits with each of `threads` threads as with one (tiles 32 x 64).
void expect_same_bits_for_thread_counts(const AttentionConfig& cfg, const Tensors& in,
                                        std::initializer_list<int> threads);

}  // namespace ringattn::testing

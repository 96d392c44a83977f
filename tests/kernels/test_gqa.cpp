// Grouped-query attention (GQA, MQA) on one process. The float64 reference with HKV K/V heads
// is checked against the definition written out here: the same problem as multi-head
// attention with each K/V head repeated for the H / HKV query heads that share it, whose
// dK/dV summed over those query heads are the GQA gradients. Then the CPU plan (K/V read in
// place through strided views) against that reference, and its determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "plan_runner.hpp"
#include "random.hpp"
#include "ringattn/reference.hpp"
#include "single/plan.hpp"

namespace ringattn {
namespace {

struct GqaCase {
  Shape4 shape;  // heads = H (query heads)
  int64_t kv_heads;
  AttentionKind attention;
  Combine combine;
  std::vector<int64_t> segments, dilations;
  bool causal;
};

std::string name_of(const GqaCase& c) {
  std::ostringstream os;
  os << (c.attention == AttentionKind::dense ? "dense" : to_string(c.combine)) << "_B"
     << c.shape.batch << "N" << c.shape.seq_len << "H" << c.shape.heads << "KV" << c.kv_heads << "D"
     << c.shape.head_dim;
  for (std::size_t i = 0; i < c.segments.size(); ++i)
    os << "_w" << c.segments[i] << "r" << c.dilations[i];
  if (c.causal) os << "_causal";
  return os.str();
}

AttentionConfig config_of(const GqaCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.kv_heads = c.kv_heads;
  cfg.attention = c.attention;
  cfg.combine = c.combine;
  cfg.segments = c.segments;
  cfg.dilations = c.dilations;
  cfg.causal = c.causal;
  return cfg;
}

std::vector<GqaCase> reference_cases() {
  using A = AttentionKind;
  using C = Combine;
  std::vector<GqaCase> v;
  for (bool causal : {false, true}) {
    v.push_back({{2, 24, 4, 8}, 1, A::dense, C::grouped, {}, {}, causal});  // MQA
    v.push_back({{1, 20, 6, 4}, 3, A::dense, C::grouped, {}, {}, causal});  // HKV = H/2
    // grouped: 3 pattern groups of 2 heads over 2 K/V groups of 3: K/V head 0 serves
    // patterns 0 and 1
    v.push_back({{1, 24, 6, 8}, 2, A::dilated, C::grouped, {8, 12, 24}, {1, 2, 3}, causal});
    // mixture: the query heads sharing a K/V head use different offsets
    v.push_back({{1, 24, 4, 8}, 1, A::dilated, C::mixture, {6, 24}, {2, 3}, causal});
    v.push_back({{2, 16, 4, 8}, 2, A::dilated, C::mixture, {8, 16}, {1, 4}, causal});
  }
  return v;
}

// [B, N, HKV, D] -> [B, N, H, D]: query head j gets a copy of K/V head j / (H / HKV).
std::vector<float> repeat_kv_heads(const std::vector<float>& kv, const Shape4& s,
                                   int64_t kv_heads) {
  std::vector<float> out(static_cast<std::size_t>(s.numel()));
  const int64_t group = s.heads / kv_heads;
  for (int64_t bt = 0; bt < s.batch * s.seq_len; ++bt)
    for (int64_t j = 0; j < s.heads; ++j)
      std::copy_n(kv.data() + (bt * kv_heads + j / group) * s.head_dim, s.head_dim,
                  out.data() + (bt * s.heads + j) * s.head_dim);
  return out;
}

// [B, N, H, D] -> [B, N, HKV, D]: the sum over the query heads of each group.
std::vector<double> sum_over_groups(const std::vector<double>& full, const Shape4& s,
                                    int64_t kv_heads) {
  std::vector<double> out(static_cast<std::size_t>(s.batch * s.seq_len * kv_heads * s.head_dim));
  const int64_t group = s.heads / kv_heads;
  for (int64_t bt = 0; bt < s.batch * s.seq_len; ++bt)
    for (int64_t j = 0; j < s.heads; ++j)
      for (int64_t d = 0; d < s.head_dim; ++d)
        out[static_cast<std::size_t>((bt * kv_heads + j / group) * s.head_dim + d)] +=
            full[static_cast<std::size_t>((bt * s.heads + j) * s.head_dim + d)];
  return out;
}

// Largest |got - want| relative to the largest |want| (infinities must match exactly).
double max_relative_difference(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

class GqaReference : public ::testing::TestWithParam<GqaCase> {};

TEST_P(GqaReference, EqualsMultiHeadAttentionWithRepeatedKvHeadsAndSummedGradients) {
  const GqaCase& c = GetParam();
  const AttentionConfig gqa = config_of(c);
  AttentionConfig mha = gqa;
  mha.kv_heads.reset();
  const Shape4 s = c.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_kv = static_cast<std::size_t>(gqa.kv_shape().numel());
  const uint64_t seed = std::hash<std::string>{}(name_of(c));
  const auto q = testing::random_normal(n, seed + 1), k = testing::random_normal(n_kv, seed + 2),
             v = testing::random_normal(n_kv, seed + 3), dout = testing::random_normal(n, seed + 4);
  const auto k_rep = repeat_kv_heads(k, s, c.kv_heads), v_rep = repeat_kv_heads(v, s, c.kv_heads);

  const ReferenceForward got = reference_forward(gqa, q.data(), k.data(), v.data());
  const ReferenceForward want = reference_forward(mha, q.data(), k_rep.data(), v_rep.data());
  const ReferenceGradients g = reference_backward(gqa, q.data(), k.data(), v.data(), dout.data());
  const ReferenceGradients w =
      reference_backward(mha, q.data(), k_rep.data(), v_rep.data(), dout.data());
  // Forward rows and dQ do the same arithmetic on the same values; dK/dV sum the group in
  // another order.
  EXPECT_EQ(got.out, want.out);
  EXPECT_EQ(got.lse, want.lse);
  EXPECT_EQ(g.dq, w.dq);
  ASSERT_EQ(g.dk.size(), n_kv);
  ASSERT_EQ(g.dv.size(), n_kv);
  EXPECT_LE(max_relative_difference(g.dk, sum_over_groups(w.dk, s, c.kv_heads)), 1e-13);
  EXPECT_LE(max_relative_difference(g.dv, sum_over_groups(w.dv, s, c.kv_heads)), 1e-13);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GqaReference, ::testing::ValuesIn(reference_cases()),
                         [](const auto& p) { return name_of(p.param); });

TEST(GqaReference, KvHeadsEqualToHeadsIsMultiHeadAttention) {
  AttentionConfig cfg;
  cfg.shape = {1, 16, 2, 8};
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto q = testing::random_normal(n, 1), k = testing::random_normal(n, 2),
             v = testing::random_normal(n, 3);
  const ReferenceForward mha = reference_forward(cfg, q.data(), k.data(), v.data());
  cfg.kv_heads = 2;
  const ReferenceForward explicit_kv = reference_forward(cfg, q.data(), k.data(), v.data());
  EXPECT_EQ(mha.out, explicit_kv.out);
  EXPECT_EQ(mha.lse, explicit_kv.lse);
}

// ---- the CPU plan ------------------------------------------------------------------------

struct PlanCase {
  GqaCase c;
  int64_t q_tile, k_tile;  // 0: automatic
};

std::vector<PlanCase> plan_cases() {
  using A = AttentionKind;
  using C = Combine;
  std::vector<PlanCase> v;
  for (bool causal : {false, true}) {
    // MQA and HKV = H/2, dense, partial tiles; one K/V head for B·H = 8 query tasks
    v.push_back({{{2, 130, 4, 32}, 1, A::dense, C::grouped, {}, {}, causal}, 32, 48});
    v.push_back({{{1, 100, 6, 16}, 3, A::dense, C::grouped, {}, {}, causal}, 0, 0});
    v.push_back({{{1, 96, 8, 64}, 4, A::dense, C::grouped, {}, {}, causal}, 16, 32});
    for (C comb : {C::grouped, C::mixture}) {
      // dilations that do not divide their segment; grouped head groups that straddle K/V
      // groups (6 heads, 3 patterns, 2 K/V heads)
      v.push_back(
          {{{2, 120, 6, 16}, 2, A::dilated, comb, {24, 40, 120}, {1, 3, 7}, causal}, 8, 16});
      // MQA under mixture: every query head's offsets select different rows of the one K/V
      // head
      v.push_back({{{1, 192, 4, 32}, 1, A::dilated, comb, {64, 192}, {2, 3}, causal}, 0, 0});
      // HKV = H/2 with a dilation larger than its segment
      v.push_back({{{1, 64, 4, 24}, 2, A::dilated, comb, {8, 16}, {1, 32}, causal}, 0, 0});
    }
  }
  return v;
}

using testing::PlanResult;
using testing::random_tensors;
using testing::run_plan;
using testing::Tensors;

class GqaPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(GqaPlan, MatchesFloat64Reference) {
  const PlanCase& pc = GetParam();
  const AttentionConfig cfg = config_of(pc.c);
  const Tensors in = random_tensors(cfg, std::hash<std::string>{}(name_of(pc.c)));
  const PlanResult got = run_plan(cfg, in, PlanOptions{2, pc.q_tile, pc.k_tile});
  testing::expect_matches_float64(cfg, in, got);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GqaPlan, ::testing::ValuesIn(plan_cases()), [](const auto& p) {
  std::string name = name_of(p.param.c);
  if (p.param.q_tile)
    name += "_t" + std::to_string(p.param.q_tile) + "x" + std::to_string(p.param.k_tile);
  return name;
});

// The query heads of a K/V group add into the same dK/dV rows, one backward call per place
// in the group: bit for bit the same result for any thread count, with many tasks (one task
// per thread) and with few (the split query-tile / key-tile backward).
TEST(GqaPlan, ResultsAreBitwiseIdenticalAcrossThreadCounts) {
  using A = AttentionKind;
  using C = Combine;
  const std::vector<GqaCase> cases = {
      {{2, 256, 6, 32}, 2, A::dilated, C::mixture, {64, 256}, {1, 3}, true},
      {{2, 192, 6, 16}, 3, A::dilated, C::grouped, {48, 96, 192}, {1, 2, 3}, false},
      {{1, 300, 4, 40}, 1, A::dense, C::grouped, {}, {}, true},   // 4 tasks, one K/V head
      {{1, 300, 2, 40}, 1, A::dense, C::grouped, {}, {}, false},  // 1 task per call
  };
  for (const GqaCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    const AttentionConfig cfg = config_of(c);
    const Tensors in = random_tensors(cfg, 31);
    testing::expect_same_bits_for_thread_counts(cfg, in, {2, 3, 7});
  }
}

// HKV = H given explicitly is multi-head attention: the same bits as leaving it unset.
TEST(GqaPlan, KvHeadsEqualToHeadsGivesTheMultiHeadBits) {
  AttentionConfig cfg;
  cfg.shape = {1, 128, 4, 16};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::mixture;
  cfg.segments = {32, 128};
  cfg.dilations = {1, 2};
  cfg.causal = true;
  const Tensors in = random_tensors(cfg, 41);
  const std::vector<float> mha = run_plan(cfg, in, PlanOptions{2, 16, 32}).all();
  cfg.kv_heads = 4;
  const std::vector<float> explicit_kv = run_plan(cfg, in, PlanOptions{2, 16, 32}).all();
  EXPECT_EQ(0, std::memcmp(mha.data(), explicit_kv.data(), mha.size() * sizeof(float)));
}

}  // namespace
}  // namespace ringattn

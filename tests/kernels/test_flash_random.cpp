// Randomised comparisons of the fast CPU path with the float64 reference over many shapes:
// batch > 1, heads not divisible by the number of groups, head dims 8..256, dilations that
// do not divide their segment, dilations larger than their segment, causal, both combine
// modes, dense, and tiles small enough that every tile-boundary case occurs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "random.hpp"
#include "ringattn/reference.hpp"
#include "single/plan.hpp"

namespace ringattn {
namespace {

constexpr double kTol = 1e-5;

struct RandomCase {
  Shape4 shape;
  AttentionKind attention;
  Combine combine;
  std::vector<int64_t> segments, dilations;
  bool causal;
  int64_t q_tile, k_tile;  // 0: automatic
  std::optional<double> scale;
};

std::string name_of(const RandomCase& c) {
  std::ostringstream os;
  os << (c.attention == AttentionKind::dense ? "dense" : to_string(c.combine)) << "_B"
     << c.shape.batch << "N" << c.shape.seq_len << "H" << c.shape.heads << "D" << c.shape.head_dim;
  for (std::size_t i = 0; i < c.segments.size(); ++i)
    os << "_w" << c.segments[i] << "r" << c.dilations[i];
  if (c.causal) os << "_causal";
  if (c.q_tile) os << "_t" << c.q_tile << "x" << c.k_tile;
  return os.str();
}

AttentionConfig config_of(const RandomCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.attention = c.attention;
  cfg.combine = c.combine;
  cfg.segments = c.segments;
  cfg.dilations = c.dilations;
  cfg.causal = c.causal;
  cfg.scale = c.scale;
  return cfg;
}

std::vector<RandomCase> cases() {
  using A = AttentionKind;
  using C = Combine;
  std::vector<RandomCase> v;
  for (bool causal : {false, true}) {
    // dense, head dims across the supported range, partial tiles
    v.push_back({{1, 100, 2, 8}, A::dense, C::grouped, {}, {}, causal, 0, 0, {}});
    v.push_back({{2, 130, 3, 64}, A::dense, C::grouped, {}, {}, causal, 32, 48, {}});
    v.push_back({{1, 96, 2, 256}, A::dense, C::grouped, {}, {}, causal, 0, 0, {}});
    v.push_back({{1, 77, 1, 100}, A::dense, C::grouped, {}, {}, causal, 16, 16, 0.05});
    for (C comb : {C::grouped, C::mixture}) {
      // dilations that do not divide their segment, uneven head groups, tiny tiles
      v.push_back({{2, 120, 5, 16}, A::dilated, comb, {24, 40, 120}, {1, 3, 7}, causal, 8, 16, {}});
      // a dilation larger than its segment (selects at most one position per segment)
      v.push_back({{1, 64, 4, 24}, A::dilated, comb, {8, 16}, {1, 32}, causal, 0, 0, {}});
      // segments spanning many tiles, head dim 128
      v.push_back(
          {{1, 512, 3, 128}, A::dilated, comb, {128, 256, 512}, {1, 2, 4}, causal, 32, 64, {}});
      // head dim 32, 7 heads over 3 groups, default tiles
      v.push_back({{1, 192, 7, 32}, A::dilated, comb, {64, 96, 192}, {2, 3, 5}, causal, 0, 0, {}});
    }
  }
  return v;
}

class FlashRandom : public ::testing::TestWithParam<RandomCase> {};

TEST_P(FlashRandom, MatchesFloat64Reference) {
  const RandomCase& rc = GetParam();
  const AttentionConfig cfg = config_of(rc);
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto rows = static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len);
  const uint64_t seed = std::hash<std::string>{}(name_of(rc));
  const auto q = testing::random_normal(n, seed + 1), k = testing::random_normal(n, seed + 2),
             v = testing::random_normal(n, seed + 3), dout = testing::random_normal(n, seed + 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(n, nan), lse(rows, nan), dq(n, nan), dk(n, nan), dv(n, nan);

  Plan plan(cfg, PlanOptions{2, rc.q_tile, rc.k_tile});
  plan.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
  plan.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                dk.data(), dv.data());

  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  const ReferenceGradients g = reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
  EXPECT_LE(relative_error(out.data(), ref.out.data(), n), kTol);
  EXPECT_LE(relative_error(lse.data(), ref.lse.data(), rows), kTol);
  EXPECT_LE(relative_error(dq.data(), g.dq.data(), n), kTol);
  EXPECT_LE(relative_error(dk.data(), g.dk.data(), n), kTol);
  EXPECT_LE(relative_error(dv.data(), g.dv.data(), n), kTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashRandom, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return name_of(p.param); });

// Each task has one writer and a fixed order of tiles, so results do not depend on the
// number of threads: bit-for-bit.
TEST(FlashDeterminism, ResultsAreBitwiseIdenticalAcrossThreadCounts) {
  AttentionConfig cfg;
  cfg.shape = {2, 256, 5, 32};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::mixture;
  cfg.segments = {64, 256};
  cfg.dilations = {1, 3};
  cfg.causal = true;
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto rows = static_cast<std::size_t>(2 * 5 * 256);
  const auto q = testing::random_normal(n, 11), k = testing::random_normal(n, 12),
             v = testing::random_normal(n, 13), dout = testing::random_normal(n, 14);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    std::vector<float> out(n), lse(rows), dq(n), dk(n), dv(n);
    Plan plan(cfg, PlanOptions{threads, 32, 64});
    plan.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
    plan.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                  dk.data(), dv.data());
    std::vector<float> all = out;
    for (const auto* t : {&lse, &dq, &dk, &dv}) all.insert(all.end(), t->begin(), t->end());
    results.push_back(std::move(all));
  }
  for (std::size_t i = 1; i < results.size(); ++i)
    EXPECT_EQ(0,
              std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)));
}

// With many small tasks per thread the forward runs whole tasks (task-major) instead of the
// longest-first list of query tiles: 96 causal tasks of 64 rows take the task-major path on
// 1 and 3 threads and the list on 4 (largest task > 1/32 of a thread's share); the bits
// must not change.
TEST(FlashDeterminism, TaskMajorForwardGivesTheItemOrderBits) {
  AttentionConfig cfg;
  cfg.shape = {1, 2048, 4, 16};
  cfg.attention = AttentionKind::dilated;
  cfg.segments = {64, 128};
  cfg.dilations = {1, 2};
  cfg.causal = true;
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto rows = static_cast<std::size_t>(4 * 2048);
  const auto q = testing::random_normal(n, 21), k = testing::random_normal(n, 22),
             v = testing::random_normal(n, 23);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3, 4}) {
    std::vector<float> out(n), lse(rows);
    Plan plan(cfg, PlanOptions{threads, 32, 64});
    plan.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
    out.insert(out.end(), lse.begin(), lse.end());
    results.push_back(std::move(out));
  }
  for (std::size_t i = 1; i < results.size(); ++i)
    EXPECT_EQ(0,
              std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)));
}

// With fewer tasks than threads (B·H = 1, or a few dilated tasks), the backward splits into a
// query-tile pass and a key-tile pass that make the fused pass's calls in its order: the
// same bits for every thread count, and the float64 reference's answer.
TEST(FlashDeterminism, SplitBackwardForFewTasksGivesTheFusedBits) {
  struct Case {
    const char* name;
    AttentionConfig cfg;
  };
  std::vector<Case> cases;
  for (bool causal : {false, true}) {
    AttentionConfig dense;
    dense.shape = {1, 300, 1, 40};
    dense.causal = causal;
    cases.push_back({causal ? "dense causal, one task" : "dense, one task", dense});
    AttentionConfig dilated;
    dilated.shape = {1, 384, 2, 32};
    dilated.attention = AttentionKind::dilated;
    dilated.segments = {96, 384};
    dilated.dilations = {1, 2};
    dilated.causal = causal;
    cases.push_back({causal ? "dilated causal, few tasks" : "dilated, few tasks", dilated});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto n = static_cast<std::size_t>(c.cfg.shape.numel());
    const auto rows =
        static_cast<std::size_t>(c.cfg.shape.batch * c.cfg.shape.heads * c.cfg.shape.seq_len);
    const auto q = testing::random_normal(n, 21), k = testing::random_normal(n, 22),
               v = testing::random_normal(n, 23), dout = testing::random_normal(n, 24);
    std::vector<std::vector<float>> grads;
    for (int threads : {1, 2, 4, 7}) {
      std::vector<float> out(n), lse(rows), dq(n), dk(n), dv(n);
      Plan plan(c.cfg, PlanOptions{threads, 32, 64});
      plan.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
      plan.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                    dk.data(), dv.data());
      std::vector<float> all = dq;
      all.insert(all.end(), dk.begin(), dk.end());
      all.insert(all.end(), dv.begin(), dv.end());
      grads.push_back(std::move(all));
    }
    for (std::size_t i = 1; i < grads.size(); ++i)
      EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[i].data(), grads[0].size() * sizeof(float)))
          << "thread count index " << i;
    const ReferenceGradients ref =
        reference_backward(c.cfg, q.data(), k.data(), v.data(), dout.data());
    const float* g = grads.back().data();
    EXPECT_LE(relative_error(g, ref.dq.data(), n), 1e-5);
    EXPECT_LE(relative_error(g + n, ref.dk.data(), n), 1e-5);
    EXPECT_LE(relative_error(g + 2 * n, ref.dv.data(), n), 1e-5);
  }
}

// Inputs large in magnitude push scores far from 0: the online softmax must stay finite.
TEST(FlashStability, LargeScoresStayFiniteAndExact) {
  AttentionConfig cfg;
  cfg.shape = {1, 200, 2, 16};
  cfg.causal = true;
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  auto q = testing::random_normal(n, 21, 6.0f), k = testing::random_normal(n, 22, 6.0f);
  const auto v = testing::random_normal(n, 23);
  std::vector<float> out(n), lse(2 * 200);
  Plan plan(cfg, PlanOptions{2, 16, 32});
  plan.forward(q.data(), k.data(), v.data(), out.data(), lse.data());
  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  EXPECT_LE(relative_error(out.data(), ref.out.data(), n), kTol);
  EXPECT_LE(relative_error(lse.data(), ref.lse.data(), lse.size()), kTol);
}

}  // namespace
}  // namespace ringattn

// Sliding-window attention (--window L[,R]) on one process. The float64 reference is checked
// against the definition written out here (every row a softmax over the keys of
// [p - L, p + R], causal keeping t <= p; gradients by central differences of that forward);
// then the CPU plan against the reference, and its determinism.
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

struct WindowCase {
  Shape4 shape;
  int64_t kv_heads;
  int64_t left;
  int64_t right;  // -1: omitted
  bool causal;
};

std::string name_of(const WindowCase& c) {
  std::ostringstream os;
  os << "B" << c.shape.batch << "N" << c.shape.seq_len << "H" << c.shape.heads << "KV" << c.kv_heads
     << "D" << c.shape.head_dim << "_L" << c.left;
  if (c.right >= 0) os << "R" << c.right;
  if (c.causal) os << "_causal";
  return os.str();
}

AttentionConfig config_of(const WindowCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.kv_heads = c.kv_heads;
  cfg.causal = c.causal;
  cfg.window_left = c.left;
  if (c.right >= 0) cfg.window_right = c.right;
  return cfg;
}

// ---- the definition, in the test ----------------------------------------------------------

bool attends(const WindowCase& c, int64_t p, int64_t t) {
  const int64_t right = c.causal ? 0 : (c.right >= 0 ? c.right : c.left);
  return t >= p - c.left && t <= p + right;
}

struct Definition {
  std::vector<double> out, lse;
};

// out/lse straight from the definition, in double, on double inputs (so that the central
// differences below see no float rounding).
Definition define(const WindowCase& c, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v) {
  const Shape4 s = c.shape;
  const int64_t group = s.heads / c.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  Definition d{std::vector<double>(static_cast<std::size_t>(s.numel()), 0.0),
               std::vector<double>(static_cast<std::size_t>(s.batch * s.heads * s.seq_len),
                                   -std::numeric_limits<double>::infinity())};
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t p = 0; p < s.seq_len; ++p) {
        const double* qr = q.data() + ((b * s.seq_len + p) * s.heads + h) * s.head_dim;
        std::vector<int64_t> keys;
        std::vector<double> score;
        for (int64_t t = 0; t < s.seq_len; ++t) {
          if (!attends(c, p, t)) continue;
          const double* kr = k.data() + ((b * s.seq_len + t) * c.kv_heads + h / group) * s.head_dim;
          double dot = 0;
          for (int64_t i = 0; i < s.head_dim; ++i) dot += qr[i] * kr[i];
          keys.push_back(t);
          score.push_back(scale * dot);
        }
        if (keys.empty()) continue;
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double x : score) sum += std::exp(x - mx);
        d.lse[static_cast<std::size_t>((b * s.heads + h) * s.seq_len + p)] = mx + std::log(sum);
        double* o = d.out.data() + ((b * s.seq_len + p) * s.heads + h) * s.head_dim;
        for (std::size_t j = 0; j < keys.size(); ++j) {
          const double w = std::exp(score[j] - mx) / sum;
          const double* vr =
              v.data() + ((b * s.seq_len + keys[j]) * c.kv_heads + h / group) * s.head_dim;
          for (int64_t i = 0; i < s.head_dim; ++i) o[i] += w * vr[i];
        }
      }
  return d;
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

std::vector<WindowCase> reference_cases() {
  std::vector<WindowCase> v;
  for (bool causal : {false, true}) {
    v.push_back({{1, 12, 2, 4}, 2, 0, -1, causal});   // window 0: only itself
    v.push_back({{2, 10, 2, 4}, 1, 3, -1, causal});   // MQA, symmetric
    v.push_back({{1, 11, 4, 3}, 2, 50, -1, causal});  // window > N: dense
    v.push_back({{1, 12, 2, 4}, 2, 2, 0, causal});    // left only
  }
  v.push_back({{1, 12, 2, 4}, 2, 1, 4, false});  // asymmetric
  v.push_back({{1, 9, 2, 5}, 1, 0, 3, false});   // right only
  return v;
}

class WindowReference : public ::testing::TestWithParam<WindowCase> {};

TEST_P(WindowReference, ForwardAndGradientsMatchTheDefinition) {
  const WindowCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  const auto n = static_cast<std::size_t>(c.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const uint64_t seed = std::hash<std::string>{}(name_of(c));
  const auto q = testing::random_normal(n, seed + 1), k = testing::random_normal(n_kv, seed + 2),
             v = testing::random_normal(n_kv, seed + 3), dout = testing::random_normal(n, seed + 4);

  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  const Definition want = define(c, widen(q), widen(k), widen(v));
  EXPECT_LE(max_abs_diff(ref.out, want.out), 1e-12);
  EXPECT_LE(max_abs_diff(ref.lse, want.lse), 1e-12);

  // Gradients of sum(out ∘ dout) by central differences of the definition.
  const ReferenceGradients g = reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
  std::vector<double> x[3] = {widen(q), widen(k), widen(v)};
  const std::vector<double>* got[3] = {&g.dq, &g.dk, &g.dv};
  const double eps = 1e-5;
  auto loss = [&] {
    const Definition d = define(c, x[0], x[1], x[2]);
    double l = 0;
    for (std::size_t i = 0; i < n; ++i) l += d.out[i] * static_cast<double>(dout[i]);
    return l;
  };
  for (int which = 0; which < 3; ++which) {
    ASSERT_EQ(got[which]->size(), x[which].size());
    for (std::size_t i = 0; i < x[which].size(); ++i) {
      const double keep = x[which][i];
      x[which][i] = keep + eps;
      const double up = loss();
      x[which][i] = keep - eps;
      const double down = loss();
      x[which][i] = keep;
      EXPECT_NEAR((*got[which])[i], (up - down) / (2 * eps), 1e-7)
          << "tensor "
          << "qkv"[which] << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowReference, ::testing::ValuesIn(reference_cases()),
                         [](const auto& p) { return name_of(p.param); });

// A window wider than the sequence is dense attention, bit for bit in the reference.
TEST(WindowReference, WindowWiderThanTheSequenceIsDense) {
  AttentionConfig cfg;
  cfg.shape = {1, 16, 2, 8};
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto q = testing::random_normal(n, 1), k = testing::random_normal(n, 2),
             v = testing::random_normal(n, 3);
  const ReferenceForward dense = reference_forward(cfg, q.data(), k.data(), v.data());
  cfg.window_left = 16;
  const ReferenceForward wide = reference_forward(cfg, q.data(), k.data(), v.data());
  EXPECT_EQ(dense.out, wide.out);
  EXPECT_EQ(dense.lse, wide.lse);
}

// ---- the CPU plan ------------------------------------------------------------------------

struct PlanCase {
  WindowCase c;
  int64_t q_tile, k_tile;  // 0: automatic
};

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> v;
  for (bool causal : {false, true}) {
    v.push_back({{{1, 130, 2, 16}, 2, 0, -1, causal}, 32, 48});     // window 0
    v.push_back({{{2, 200, 4, 32}, 4, 37, -1, causal}, 32, 48});    // tiles partly covered
    v.push_back({{{1, 150, 4, 16}, 1, 1000, -1, causal}, 32, 64});  // window > N, MQA
    v.push_back({{{1, 257, 6, 24}, 2, 64, 0, causal}, 0, 0});       // GQA, automatic tiles
    v.push_back({{{1, 300, 2, 8}, 1, 5, -1, causal}, 16, 32});      // most tiles skipped
  }
  v.push_back({{{1, 180, 4, 16}, 2, 3, 40, false}, 32, 48});  // asymmetric
  v.push_back({{{2, 160, 2, 16}, 2, 50, 7, false}, 16, 64});
  v.push_back({{{1, 96, 4, 8}, 4, 0, 20, false}, 16, 16});  // right only
  return v;
}

using testing::PlanResult;
using testing::random_tensors;
using testing::run_plan;
using testing::Tensors;

std::string plan_name(const PlanCase& pc) {
  std::string name = name_of(pc.c);
  if (pc.q_tile) name += "_t" + std::to_string(pc.q_tile) + "x" + std::to_string(pc.k_tile);
  return name;
}

class WindowPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(WindowPlan, MatchesFloat64Reference) {
  const PlanCase& pc = GetParam();
  const AttentionConfig cfg = config_of(pc.c);
  const Tensors in = random_tensors(cfg, std::hash<std::string>{}(plan_name(pc)));
  const PlanResult got = run_plan(cfg, in, PlanOptions{2, pc.q_tile, pc.k_tile});
  testing::expect_matches_float64(cfg, in, got);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowPlan, ::testing::ValuesIn(plan_cases()),
                         [](const auto& p) { return plan_name(p.param); });

// Bit for bit the same for any thread count: with many tasks (the fused backward) and with
// few (the split query-tile / key-tile backward, which must visit the same tile pairs).
TEST(WindowPlan, ResultsAreBitwiseIdenticalAcrossThreadCounts) {
  const std::vector<WindowCase> cases = {
      {{2, 256, 6, 32}, 2, 40, -1, true},
      {{2, 192, 6, 16}, 3, 17, 70, false},
      {{1, 300, 2, 40}, 1, 33, -1, false},  // 2 tasks: the split backward
      {{1, 300, 1, 16}, 1, 0, 5, false},    // 1 task
  };
  for (const WindowCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    const AttentionConfig cfg = config_of(c);
    const Tensors in = random_tensors(cfg, 31);
    testing::expect_same_bits_for_thread_counts(cfg, in, {2, 3, 7});
  }
}

// A window that covers the whole sequence visits the same tiles and masks nothing: the
// dense bits.
TEST(WindowPlan, WindowCoveringTheSequenceGivesTheDenseBits) {
  for (bool causal : {false, true}) {
    AttentionConfig cfg;
    cfg.shape = {1, 200, 2, 16};
    cfg.causal = causal;
    const Tensors in = random_tensors(cfg, 7);
    const std::vector<float> dense = run_plan(cfg, in, PlanOptions{2, 32, 48}).all();
    cfg.window_left = 199;
    const std::vector<float> wide = run_plan(cfg, in, PlanOptions{2, 32, 48}).all();
    EXPECT_EQ(0, std::memcmp(dense.data(), wide.data(), dense.size() * sizeof(float))) << causal;
  }
}

}  // namespace
}  // namespace ringattn

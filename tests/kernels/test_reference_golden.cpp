// The float64 reference against the golden grouped/mixture cases (forward and all three
// gradients), plus small hand-checkable properties of the selection rules and of
// relative_error. Uses no function from src/core/config.cpp, so it checks the reference alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "golden.hpp"
#include "random.hpp"
#include "ringattn/reference.hpp"

namespace ringattn {
namespace {

using testing::golden_case_names;
using testing::GoldenCase;
using testing::load_golden;
using testing::random_normal;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGoldenTolerance = 1e-5;  // the acceptance bound in the golden README

std::vector<std::string> reference_case_names() {
  std::vector<std::string> names = golden_case_names("grouped");
  for (auto& name : golden_case_names("mixture")) names.push_back(name);
  return names;
}

// ---- golden cases -------------------------------------------------------------------------

class ReferenceGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceGolden, ForwardAndGradientsMatch) {
  const GoldenCase c = load_golden(GetParam());
  const std::size_t n = static_cast<std::size_t>(c.cfg.shape.numel());
  ASSERT_EQ(c.q.size(), n);
  ASSERT_EQ(c.out.size(), n);

  const ReferenceForward fwd = reference_forward(c.cfg, c.q.data(), c.k.data(), c.v.data());
  const ReferenceGradients grads =
      reference_backward(c.cfg, c.q.data(), c.k.data(), c.v.data(), c.dout.data());

  // The golden arrays are the float32 roundings of a float64 computation, so they play the
  // float "got" against our double "want": no second rounding enters the comparison.
  const double err_out = relative_error(c.out.data(), fwd.out.data(), n);
  const double err_dq = relative_error(c.dq.data(), grads.dq.data(), n);
  const double err_dk = relative_error(c.dk.data(), grads.dk.data(), n);
  const double err_dv = relative_error(c.dv.data(), grads.dv.data(), n);
  std::printf("[ relerr   ] %-26s out %.2e  dq %.2e  dk %.2e  dv %.2e\n", c.name.c_str(), err_out,
              err_dq, err_dk, err_dv);
  EXPECT_LT(err_out, kGoldenTolerance);
  EXPECT_LT(err_dq, kGoldenTolerance);
  EXPECT_LT(err_dk, kGoldenTolerance);
  EXPECT_LT(err_dv, kGoldenTolerance);
}

// A named function rather than a lambda: the macro's own parameter is called `info`, and a
// lambda parameter of that name trips -Wshadow.
std::string case_test_name(const ::testing::TestParamInfo<std::string>& param_info) {
  return param_info.param;
}

INSTANTIATE_TEST_SUITE_P(Golden, ReferenceGolden, ::testing::ValuesIn(reference_case_names()),
                         case_test_name);

// An empty case list would make the suite above pass vacuously.
TEST(ReferenceGoldenData, HasGroupedAndMixtureCases) {
  EXPECT_FALSE(golden_case_names("grouped").empty());
  EXPECT_FALSE(golden_case_names("mixture").empty());
}

// ---- small properties ---------------------------------------------------------------------

struct Inputs {
  std::vector<float> q, k, v, dout;
};

Inputs random_inputs(const Shape4& shape, uint64_t seed) {
  const auto n = static_cast<std::size_t>(shape.numel());
  return {random_normal(n, seed), random_normal(n, seed + 1), random_normal(n, seed + 2),
          random_normal(n, seed + 3)};
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;  // also equal infinities
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

double dot(const float* a, const float* b, int64_t n) {
  double sum = 0.0;
  for (int64_t d = 0; d < n; ++d) sum += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return sum;
}

std::size_t row_at(const Shape4& s, int64_t b, int64_t p, int64_t h) {
  return static_cast<std::size_t>(((b * s.seq_len + p) * s.heads + h) * s.head_dim);
}

std::size_t lse_at(const Shape4& s, int64_t b, int64_t h, int64_t p) {
  return static_cast<std::size_t>((b * s.heads + h) * s.seq_len + p);
}

TEST(Reference, DenseEqualsGroupedWithOneFullSegment) {
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionConfig dense;
    dense.shape = {2, 24, 3, 8};
    dense.causal = causal;
    AttentionConfig grouped = dense;
    grouped.attention = AttentionKind::dilated;
    grouped.combine = Combine::grouped;
    grouped.segments = {24};
    grouped.dilations = {1};
    const Inputs in = random_inputs(dense.shape, 7);

    const auto fd = reference_forward(dense, in.q.data(), in.k.data(), in.v.data());
    const auto fg = reference_forward(grouped, in.q.data(), in.k.data(), in.v.data());
    EXPECT_LE(max_abs_diff(fd.out, fg.out), 1e-14);
    EXPECT_LE(max_abs_diff(fd.lse, fg.lse), 1e-14);
    for (double l : fd.lse) EXPECT_TRUE(std::isfinite(l));  // dense: every row attends

    const auto gd =
        reference_backward(dense, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
    const auto gg =
        reference_backward(grouped, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
    EXPECT_LE(max_abs_diff(gd.dq, gg.dq), 1e-14);
    EXPECT_LE(max_abs_diff(gd.dk, gg.dk), 1e-14);
    EXPECT_LE(max_abs_diff(gd.dv, gg.dv), 1e-14);
  }
}

// Dilation larger than the segment: at most one position per segment survives, and it can
// only attend to itself. Three groups, one head each:
//   group 0: w=4, r=8, o=0 -> p%4 == 0       (one per segment)
//   group 1: w=4, r=8, o=1 -> p%4 == 1       (one per segment)
//   group 2: w=2, r=4, o=2 -> p%2 == 2 never (offset past the segment: nothing)
TEST(Reference, DilationLargerThanSegmentSelectsAtMostOnePerSegment) {
  AttentionConfig cfg;
  cfg.shape = {1, 16, 3, 4};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::grouped;
  cfg.segments = {4, 4, 2};
  cfg.dilations = {8, 8, 4};
  const Shape4& s = cfg.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  const Inputs in = random_inputs(s, 11);
  const auto fwd = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());

  const int64_t expected_selected_offset[3] = {0, 1, -1};  // -1: no position selected
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t p = 0; p < s.seq_len; ++p) {
      SCOPED_TRACE("head " + std::to_string(h) + " position " + std::to_string(p));
      const bool selected = p % 4 == expected_selected_offset[h];
      const double lse = fwd.lse[lse_at(s, 0, h, p)];
      const std::size_t at = row_at(s, 0, p, h);
      for (int64_t d = 0; d < s.head_dim; ++d) {
        // A lone key has softmax weight 1: the output is its value, divided by G = 3.
        const double want = selected ? static_cast<double>(in.v[at + d]) / 3.0 : 0.0;
        EXPECT_NEAR(fwd.out[at + d], want, 1e-12);
      }
      if (selected)
        EXPECT_NEAR(lse, scale * dot(&in.q[at], &in.k[at], s.head_dim), 1e-12);
      else
        EXPECT_EQ(lse, -kInf);
    }
}

// Causal: the first selected query of every segment has only itself to attend to.
TEST(Reference, CausalFirstSelectedQueryAttendsOnlyItself) {
  AttentionConfig cfg;
  cfg.shape = {2, 32, 4, 8};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::grouped;
  cfg.segments = {8, 16};
  cfg.dilations = {2, 4};
  cfg.causal = true;
  cfg.scale = 0.3;
  const Shape4& s = cfg.shape;
  const Inputs in = random_inputs(s, 21);
  const auto fwd = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());

  // Heads {0,1} are group 0 (w=8, o=0); heads {2,3} are group 1 (w=16, o=1 % 4 = 1).
  const int64_t segment_of_head[4] = {8, 8, 16, 16};
  const int64_t offset_of_head[4] = {0, 0, 1, 1};
  int checked = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t start = 0; start < s.seq_len; start += segment_of_head[h]) {
        const int64_t p = start + offset_of_head[h];
        const std::size_t at = row_at(s, b, p, h);
        EXPECT_NEAR(fwd.lse[lse_at(s, b, h, p)], 0.3 * dot(&in.q[at], &in.k[at], s.head_dim),
                    1e-12);
        for (int64_t d = 0; d < s.head_dim; ++d)
          EXPECT_NEAR(fwd.out[at + d], static_cast<double>(in.v[at + d]) / 2.0, 1e-12);
        ++checked;
      }
  EXPECT_EQ(checked, 2 * (2 * 4 + 2 * 2));
}

// With q = 0 every score is 0, so a softmax over a multiset of keys weights each key by its
// multiplicity: a key two patterns both select counts twice.
TEST(Reference, MixtureCountsKeysSelectedByTwoPatternsTwice) {
  AttentionConfig cfg;
  cfg.shape = {1, 8, 1, 2};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::mixture;
  cfg.segments = {8, 4};
  cfg.dilations = {1, 2};  // head 0: pattern 0 all of [0,8); pattern 1 {0,2} and {4,6}
  const Shape4& s = cfg.shape;
  std::vector<float> q(8 * 2, 0.0f), k = random_normal(16, 31), v(16);
  for (int64_t t = 0; t < 8; ++t) {
    v[2 * t] = static_cast<float>(t);
    v[2 * t + 1] = 1.0f;
  }
  const auto fwd = reference_forward(cfg, q.data(), k.data(), v.data());

  // Query 0 is selected by both: keys 0..7 once, keys 0 and 2 once more: 10 keys in all.
  EXPECT_NEAR(fwd.lse[lse_at(s, 0, 0, 0)], std::log(10.0), 1e-12);
  EXPECT_NEAR(fwd.out[0], (0 + 1 + 2 + 3 + 4 + 5 + 6 + 7 + 0 + 2) / 10.0, 1e-12);
  EXPECT_NEAR(fwd.out[1], 1.0, 1e-12);
  // Query 1 only by pattern 0: keys 0..7 once each.
  EXPECT_NEAR(fwd.lse[lse_at(s, 0, 0, 1)], std::log(8.0), 1e-12);
  EXPECT_NEAR(fwd.out[2], 28.0 / 8.0, 1e-12);
  // Query 6: pattern 0 (keys 0..7) and pattern 1 (keys 4, 6).
  EXPECT_NEAR(fwd.out[12], (28.0 + 4 + 6) / 10.0, 1e-12);
}

// The golden mixture cases all contain a dilation-1 pattern, so none has a row that no pattern
// selects; this one does. Head 0, offsets 0: pattern 0 selects p%4 in {0,2}, pattern 1 p%4 == 0.
TEST(Reference, MixtureRowsSelectedByNoPatternAreEmpty) {
  AttentionConfig cfg;
  cfg.shape = {1, 8, 1, 2};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::mixture;
  cfg.segments = {4, 4};
  cfg.dilations = {2, 4};
  const Shape4& s = cfg.shape;
  std::vector<float> q(16, 0.0f), k = random_normal(16, 51), v(16);
  for (int64_t t = 0; t < 8; ++t) {
    v[2 * t] = static_cast<float>(t);
    v[2 * t + 1] = 1.0f;
  }
  const auto fwd = reference_forward(cfg, q.data(), k.data(), v.data());
  for (int64_t p = 0; p < 8; ++p) {
    SCOPED_TRACE("position " + std::to_string(p));
    const double lse = fwd.lse[lse_at(s, 0, 0, p)];
    const double out0 = fwd.out[row_at(s, 0, p, 0)];
    const double seg = static_cast<double>(p / 4 * 4);
    switch (p % 4) {
      case 0:  // keys seg (twice) and seg + 2
        EXPECT_NEAR(lse, std::log(3.0), 1e-12);
        EXPECT_NEAR(out0, (2 * seg + seg + 2) / 3.0, 1e-12);
        break;
      case 2:  // keys seg and seg + 2, once each
        EXPECT_NEAR(lse, std::log(2.0), 1e-12);
        EXPECT_NEAR(out0, seg + 1.0, 1e-12);
        break;
      default:
        EXPECT_EQ(lse, -kInf);
        EXPECT_EQ(out0, 0.0);
    }
  }
}

TEST(Reference, LoneKeyRowsPassDoutToDvAndEmptyRowsGetNoGradient) {
  AttentionConfig cfg;
  cfg.shape = {1, 8, 1, 4};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::grouped;
  cfg.segments = {2};
  cfg.dilations = {4};  // offset 0: only even positions, each alone in its segment
  const Inputs in = random_inputs(cfg.shape, 41);
  const auto g = reference_backward(cfg, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  for (int64_t p = 0; p < 8; ++p)
    for (int64_t d = 0; d < 4; ++d) {
      const auto i = static_cast<std::size_t>(p * 4 + d);
      // A lone key: softmax weight 1 whatever the score, so dq = dk = 0 and dv = dout.
      EXPECT_EQ(g.dq[i], 0.0);
      EXPECT_EQ(g.dk[i], 0.0);
      EXPECT_EQ(g.dv[i], p % 2 == 0 ? static_cast<double>(in.dout[i]) : 0.0);
    }
}

// ---- relative_error -----------------------------------------------------------------------

TEST(RelativeError, InfinitePositionsMustMatchAndAreExcluded) {
  const float inf_f = std::numeric_limits<float>::infinity();
  const std::vector<double> want = {3.0, -kInf, 4.0};
  const std::vector<float> want_f = {3.0f, -inf_f, 4.0f};

  const std::vector<float> exact = {3.0f, -inf_f, 4.0f};
  EXPECT_EQ(relative_error(exact.data(), want.data(), 3), 0.0);
  EXPECT_EQ(relative_error(exact.data(), want_f.data(), 3), 0.0);

  // The -inf slot is left out of both norms: ||(0, 0.5)|| / ||(3, 4)|| = 0.1.
  const std::vector<float> close = {3.0f, -inf_f, 4.5f};
  EXPECT_NEAR(relative_error(close.data(), want.data(), 3), 0.1, 1e-12);
  EXPECT_NEAR(relative_error(close.data(), want_f.data(), 3), 0.1, 1e-12);

  const std::vector<float> finite_there = {3.0f, -1e30f, 4.0f};
  const std::vector<float> wrong_sign = {3.0f, inf_f, 4.0f};
  for (const auto* got : {&finite_there, &wrong_sign}) {
    EXPECT_EQ(relative_error(got->data(), want.data(), 3), kInf);
    EXPECT_EQ(relative_error(got->data(), want_f.data(), 3), kInf);
  }
}

TEST(RelativeError, NanAndInfiniteGotAndZeroWant) {
  const float nan_f = std::numeric_limits<float>::quiet_NaN();
  const float inf_f = std::numeric_limits<float>::infinity();
  const std::vector<double> want = {1.0, 2.0};
  const std::vector<float> with_nan = {1.0f, nan_f};
  const std::vector<float> with_inf = {1.0f, inf_f};
  EXPECT_EQ(relative_error(with_nan.data(), want.data(), 2), kInf);
  EXPECT_EQ(relative_error(with_inf.data(), want.data(), 2), kInf);

  // ||want|| == 0: the error is ||got||, so 0 when both are zero.
  const std::vector<double> zeros = {0.0, 0.0};
  const std::vector<float> zeros_f = {0.0f, 0.0f};
  const std::vector<float> small = {3e-3f, 4e-3f};
  EXPECT_EQ(relative_error(zeros_f.data(), zeros.data(), 2), 0.0);
  EXPECT_NEAR(relative_error(small.data(), zeros.data(), 2), 5e-3, 1e-9);
  EXPECT_NEAR(relative_error(small.data(), zeros_f.data(), 2), 5e-3, 1e-9);
  // Only infinities in want, all matched: nothing finite left, both norms 0.
  const std::vector<double> all_inf = {-kInf};
  const std::vector<float> got_inf = {-inf_f};
  EXPECT_EQ(relative_error(got_inf.data(), all_inf.data(), 1), 0.0);
}

}  // namespace
}  // namespace ringattn

// The fast CPU path (Plan::forward / Plan::backward) against every grouped and mixture
// golden case: output and all three gradients within relative Frobenius error 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "golden.hpp"
#include "ringattn/reference.hpp"
#include "single/plan.hpp"

namespace ringattn {
namespace {

constexpr double kTol = 1e-5;

class FlashGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(FlashGolden, ForwardAndGradientsMatchGolden) {
  const testing::GoldenCase c = testing::load_golden(GetParam());
  const Shape4 s = c.cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Poisoned outputs: any element the kernels forget to write stays NaN and fails.
  std::vector<float> out(n, nan), lse(rows, nan), dq(n, nan), dk(n, nan), dv(n, nan);

  for (int threads : {1, 2}) {
    Plan plan(c.cfg, PlanOptions{threads});
    plan.forward(c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data());
    plan.backward(c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data(), c.dout.data(),
                  dq.data(), dk.data(), dv.data());
    const double e_out = relative_error(out.data(), c.out.data(), n);
    const double e_dq = relative_error(dq.data(), c.dq.data(), n);
    const double e_dk = relative_error(dk.data(), c.dk.data(), n);
    const double e_dv = relative_error(dv.data(), c.dv.data(), n);
    std::printf("  %s threads=%d: out %.2e dq %.2e dk %.2e dv %.2e\n", c.name.c_str(), threads,
                e_out, e_dq, e_dk, e_dv);
    EXPECT_LE(e_out, kTol);
    EXPECT_LE(e_dq, kTol);
    EXPECT_LE(e_dk, kTol);
    EXPECT_LE(e_dv, kTol);
    const ReferenceForward ref = reference_forward(c.cfg, c.q.data(), c.k.data(), c.v.data());
    EXPECT_LE(relative_error(lse.data(), ref.lse.data(), rows), kTol);
  }
}

std::vector<std::string> dilated_cases() {
  auto g = testing::golden_case_names("grouped");
  auto m = testing::golden_case_names("mixture");
  g.insert(g.end(), m.begin(), m.end());
  return g;
}

INSTANTIATE_TEST_SUITE_P(Golden, FlashGolden, ::testing::ValuesIn(dilated_cases()),
                         [](const auto& p) { return p.param; });

TEST(FlashGolden, AllDilatedCasesArePresent) { EXPECT_EQ(dilated_cases().size(), 6u); }

}  // namespace
}  // namespace ringattn

// Values of their own head dim (multi-head latent attention: q and k of D, v and out of Dv) and
// logit soft-capping (s <- c·tanh(s / c)) on the single-process CPU plan, forward and every
// gradient, against the float64 reference; and the reference itself against the definitions
// written out here (a soft-capped problem is checked against finite differences of its loss).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "plan_runner.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/reference.hpp"
#include "single/plan.hpp"

namespace ringattn {
namespace {

struct Case {
  const char* name;
  int64_t d, dv;
  double softcap;
  // The feature under the pair: dense, causal, GQA, window, packed, dilated, head-major.
  void (*shape_it)(AttentionConfig&);
};

void dense(AttentionConfig&) {}
void causal(AttentionConfig& c) { c.causal = true; }
void gqa(AttentionConfig& c) {
  c.kv_heads = 2;
  c.causal = true;
}
void window(AttentionConfig& c) {
  c.window_left = 9;
  c.window_right = 4;
}
void packed(AttentionConfig& c) {
  c.cu_seqlens = {0, 17, 40, c.shape.seq_len};
  c.causal = true;
}
void dilated(AttentionConfig& c) {
  c.attention = AttentionKind::dilated;
  c.segments = {16, 48};
  c.dilations = {1, 2};
}
void mixture(AttentionConfig& c) {
  dilated(c);
  c.combine = Combine::mixture;
  c.causal = true;
}
void head_major(AttentionConfig& c) {
  c.layout = TensorLayout::bhnd;
  c.kv_layout = TensorLayout::bhnd;
  c.kv_heads = 2;
}

AttentionConfig config_of(const Case& c) {
  AttentionConfig cfg;
  cfg.shape = {2, 48, 4, c.d};
  cfg.head_dim_v = c.dv;
  cfg.softcap = c.softcap;
  // Scores of about the cap's size (std ~ c), so that the cap changes the answer; the plain
  // scale otherwise.
  if (c.softcap > 0) cfg.scale = c.softcap / std::sqrt(static_cast<double>(c.d));
  c.shape_it(cfg);
  return cfg;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const struct {
    const char* name;
    void (*f)(AttentionConfig&);
  } features[] = {{"dense", dense},     {"causal", causal},  {"gqa", gqa},
                  {"window", window},   {"packed", packed},  {"dilated", dilated},
                  {"mixture", mixture}, {"bhnd", head_major}};
  const std::pair<int64_t, int64_t> dims[] = {{192, 128}, {64, 32}, {40, 24}};
  for (const auto& f : features) {
    for (const auto& [d, dv] : dims) v.push_back({f.name, d, dv, 0.0, f.f});
    for (double c : {1.0, 30.0, 50.0}) v.push_back({f.name, 64, 64, c, f.f});
    v.push_back({f.name, 40, 24, 30.0, f.f});  // both at once
  }
  return v;
}

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  std::ostringstream os;
  os << info.param.name << "_D" << info.param.d << "_Dv" << info.param.dv;
  if (info.param.softcap > 0) os << "_cap" << info.param.softcap;
  return os.str();
}

// The plan's tensors in the config's layouts, and its results back in [B, N, H, D].
testing::PlanResult run_in_layout(const AttentionConfig& cfg, const testing::Tensors& in,
                                  PlanOptions opts) {
  if (cfg.layout == TensorLayout::bnhd) return testing::run_plan(cfg, in, opts);
  using testing::head_major_copy, testing::token_major_copy;
  const Shape4 s = cfg.shape, sk = cfg.kv_shape(), sv = cfg.v_shape(), so = cfg.out_shape();
  const testing::Tensors hm{head_major_copy(in.q, s), head_major_copy(in.k, sk),
                            head_major_copy(in.v, sv), head_major_copy(in.dout, so)};
  testing::PlanResult r = testing::run_plan(cfg, hm, opts);
  return {token_major_copy(r.out, so), r.lse, token_major_copy(r.dq, s), token_major_copy(r.dk, sk),
          token_major_copy(r.dv, sv)};
}

class MlaSoftcap : public ::testing::TestWithParam<Case> {};

TEST_P(MlaSoftcap, PlanMatchesFloat64) {
  const AttentionConfig cfg = config_of(GetParam());
  const testing::Tensors in = testing::random_tensors(cfg, 56);
  if (cfg.softcapped()) {
    // The cap must matter: the reference without it differs by far more than the tolerance.
    AttentionConfig uncapped = cfg;
    uncapped.softcap = 0;
    const ReferenceForward a = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
    const ReferenceForward b = reference_forward(uncapped, in.q.data(), in.k.data(), in.v.data());
    std::vector<float> b32(b.out.begin(), b.out.end());
    EXPECT_GT(relative_error(b32.data(), a.out.data(), a.out.size()), 1e-2);
  }
  for (const PlanOptions& opts : {PlanOptions{2, 32, 64}, PlanOptions{1, 0, 0}}) {
    const testing::PlanResult got = run_in_layout(cfg, in, opts);
    // Logits of the cap's size (up to ~3c before it) leave fp32 a few ulps of c in each score.
    testing::expect_matches_float64(cfg, in, got, cfg.softcapped() ? 5e-5 : 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, MlaSoftcap, ::testing::ValuesIn(cases()), name_of);

// The reference's soft-capped gradients are the loss's derivatives: sum(out · dout) by central
// differences in q, k and v (a few elements each).
TEST(MlaSoftcapReference, GradientsAreTheLossDerivatives) {
  AttentionConfig cfg;
  cfg.shape = {1, 12, 2, 6};
  cfg.head_dim_v = 4;
  cfg.kv_heads = 1;
  cfg.causal = true;
  cfg.softcap = 2.0;
  cfg.scale = 1.5;
  testing::Tensors in = testing::random_tensors(cfg, 7);
  const ReferenceGradients g =
      reference_backward(cfg, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  auto loss = [&] {
    const ReferenceForward f = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
    double sum = 0;
    for (std::size_t i = 0; i < f.out.size(); ++i) sum += f.out[i] * in.dout[i];
    return sum;
  };
  const float h = 1e-3f;
  for (auto [x, grad] : {std::pair{&in.q, &g.dq}, {&in.k, &g.dk}, {&in.v, &g.dv}}) {
    ASSERT_EQ(x->size(), grad->size());
    for (std::size_t i = 0; i < x->size(); i += 7) {
      const float keep = (*x)[i];
      (*x)[i] = keep + h;
      const double up = loss();
      (*x)[i] = keep - h;
      const double down = loss();
      (*x)[i] = keep;
      const double numeric = (up - down) / (2.0 * (static_cast<double>(keep + h) - keep));
      EXPECT_NEAR((*grad)[i], numeric, 2e-3 * (1.0 + std::abs(numeric))) << "element " << i;
    }
  }
}

// What the pieces are: out has Dv columns and equals the plain problem's when Dv = D; a cap
// far above every score changes nothing measurable.
TEST(MlaSoftcapReference, ReducesToThePlainProblem) {
  AttentionConfig cfg;
  cfg.shape = {1, 16, 2, 8};
  cfg.causal = true;
  const testing::Tensors in = testing::random_tensors(cfg, 3);
  const ReferenceForward plain = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
  AttentionConfig capped = cfg;
  capped.softcap = 1e6;
  const ReferenceForward far = reference_forward(capped, in.q.data(), in.k.data(), in.v.data());
  AttentionConfig same = cfg;
  same.head_dim_v = 8;
  const ReferenceForward s = reference_forward(same, in.q.data(), in.k.data(), in.v.data());
  ASSERT_EQ(far.out.size(), plain.out.size());
  ASSERT_EQ(s.out.size(), plain.out.size());
  for (std::size_t i = 0; i < plain.out.size(); ++i) {
    EXPECT_NEAR(far.out[i], plain.out[i], 1e-9);
    EXPECT_EQ(s.out[i], plain.out[i]);
  }
}

TEST(MlaSoftcapConfig, ValidationNamesTheField) {
  AttentionConfig cfg;
  cfg.shape = {1, 16, 2, 8};
  for (double bad : {-1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    cfg.softcap = bad;
    try {
      validate(cfg);
      ADD_FAILURE() << "softcap " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "config.softcap");
    }
  }
  cfg.softcap = 0;
  for (int64_t bad : {int64_t{0}, int64_t{-3}, kMaxHeadDim + 1}) {
    cfg.head_dim_v = bad;
    try {
      validate(cfg);
      ADD_FAILURE() << "head_dim_v " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "config.head_dim_v");
    }
  }
}

}  // namespace
}  // namespace ringattn

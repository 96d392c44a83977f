// The CPU plan on [B, H, N, D] tensors (TensorLayout::bhnd, PyTorch SDPA's convention)
// computes what it computes on [B, N, H, D]: the kernels read either through strided views,
// so out, lse and dQ are the same bits; dK and dV are summed per tile pair in scratch when a
// head's rows are strided and in place when they are contiguous, so they agree to rounding
// and are checked against the float64 reference. Every feature the plan has (causal, GQA,
// dilated grouped and mixture, windows, packed sequences), and determinism over threads.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "plan_runner.hpp"
#include "ringattn/tensor.hpp"
#include "single/plan.hpp"

namespace ringattn {
namespace {

struct LayoutCase {
  std::string name;
  AttentionConfig cfg;
};

std::vector<LayoutCase> cases() {
  std::vector<LayoutCase> v;
  const auto add = [&](std::string name, auto&& set) {
    AttentionConfig c;
    c.shape = {2, 96, 4, 16};
    set(c);
    v.push_back({std::move(name), c});
  };
  add("dense", [](AttentionConfig&) {});
  add("causal", [](AttentionConfig& c) { c.causal = true; });
  add("gqa_causal", [](AttentionConfig& c) {
    c.kv_heads = 2;
    c.causal = true;
  });
  add("dilated_grouped", [](AttentionConfig& c) {
    c.attention = AttentionKind::dilated;
    c.segments = {24, 48};
    c.dilations = {1, 2};
  });
  add("dilated_mixture_causal_mqa", [](AttentionConfig& c) {
    c.attention = AttentionKind::dilated;
    c.combine = Combine::mixture;
    c.segments = {32, 96};
    c.dilations = {1, 3};
    c.causal = true;
    c.kv_heads = 1;
  });
  add("window", [](AttentionConfig& c) {
    c.window_left = 20;
    c.window_right = 5;
  });
  add("packed_causal", [](AttentionConfig& c) {
    c.cu_seqlens = {0, 40, 41, 96};
    c.causal = true;
  });
  return v;
}

using testing::head_major_copy;
using testing::token_major_copy;

class Layout : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(Layout, HeadMajorTensorsGiveTheSameAttention) {
  const AttentionConfig& cfg = GetParam().cfg;
  const Shape4 s = cfg.shape, skv = cfg.kv_shape();
  const testing::Tensors in = testing::random_tensors(cfg, 11);
  const PlanOptions opts{2, 32, 64};  // several tiles per head
  const testing::PlanResult rows = testing::run_plan(cfg, in, opts);

  AttentionConfig hm_cfg = cfg;
  hm_cfg.layout = TensorLayout::bhnd;
  const testing::Tensors hm_in{head_major_copy(in.q, s), head_major_copy(in.k, skv),
                               head_major_copy(in.v, skv), head_major_copy(in.dout, s)};
  const testing::PlanResult hm = testing::run_plan(hm_cfg, hm_in, opts);
  testing::PlanResult back;
  back.out = token_major_copy(hm.out, s);
  back.lse = hm.lse;  // [B, H, N] in both layouts
  back.dq = token_major_copy(hm.dq, s);
  back.dk = token_major_copy(hm.dk, skv);
  back.dv = token_major_copy(hm.dv, skv);

  EXPECT_EQ(back.out, rows.out);
  EXPECT_EQ(back.lse, rows.lse);
  EXPECT_EQ(back.dq, rows.dq);
  testing::expect_matches_float64(cfg, in, back);
  testing::expect_same_bits_for_thread_counts(hm_cfg, hm_in, {2, 3});
}

INSTANTIATE_TEST_SUITE_P(Features, Layout, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return p.param.name; });

TEST(Layout, TheLayoutCopiesAreInverse) {
  const Shape4 s{2, 5, 3, 4};
  std::vector<float> x(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  const std::vector<float> y = head_major_copy(x, s);
  // [b][h][n][d] of y is [b][n][h][d] of x
  EXPECT_EQ(y[((1 * 3 + 2) * 5 + 4) * 4 + 3], x[((1 * 5 + 4) * 3 + 2) * 4 + 3]);
  EXPECT_EQ(token_major_copy(y, s), x);
}

}  // namespace
}  // namespace ringattn

// cuDNN's fused attention graphs (cudnn-frontend) for the configurations the GPU suite runs,
// checked by the frontend's own validate() on the host: shapes, strides, the diagonal band
// (causal, sliding windows), GQA head mapping, per-document views of packed sequences and
// the dilated strided views, forward with stats and backward, bf16 and fp16, for Hopper
// (sm_90) and Ampere (sm_80). Needs cuDNN loadable (not a GPU); skipped with the reason
// otherwise. The GPU suite then runs the same graphs against float64.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/cudnn_graphs.hpp"

namespace ringattn::kernels::cuda {
namespace {

struct Case {
  std::string name;
  AttentionConfig cfg;
  std::size_t views = 1;
};

AttentionConfig dense(int64_t n, int64_t h, int64_t d) {
  AttentionConfig c;
  c.shape = {2, n, h, d};
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"dense_D64", dense(256, 4, 64)});
  c.push_back({"dense_D128", dense(256, 4, 128)});
  AttentionConfig causal = dense(256, 4, 128);
  causal.causal = true;
  c.push_back({"causal_D128", causal});
  AttentionConfig gqa = causal;
  gqa.shape.heads = 8;
  gqa.kv_heads = 2;
  c.push_back({"gqa_8to2_causal", gqa});
  AttentionConfig mqa = dense(256, 8, 64);
  mqa.kv_heads = 1;
  c.push_back({"mqa_8to1", mqa});
  AttentionConfig window = causal;
  window.window_left = 64;
  c.push_back({"causal_window_64", window});
  AttentionConfig two_sided = dense(256, 4, 64);
  two_sided.window_left = 32;
  two_sided.window_right = 16;
  c.push_back({"window_32_16", two_sided});
  AttentionConfig packed = causal;
  packed.cu_seqlens = {0, 64, 192, 256};
  c.push_back({"packed_3_documents_causal", packed, 3});
  AttentionConfig grouped = dense(512, 6, 64);
  grouped.attention = AttentionKind::dilated;
  grouped.segments = {128, 256, 512};
  grouped.dilations = {1, 2, 4};
  c.push_back({"dilated_grouped", grouped, 3});
  AttentionConfig grouped_causal = grouped;
  grouped_causal.causal = true;
  c.push_back({"dilated_grouped_causal", grouped_causal, 3});
  AttentionConfig mixture = grouped;
  mixture.combine = Combine::mixture;
  // Per pattern, one view per offset class of heads: 1 + 2 + 4.
  c.push_back({"dilated_mixture", mixture, 7});
  AttentionConfig grouped_gqa = grouped;
  grouped_gqa.kv_heads = 3;  // groups of 2 query heads read one K/V head each
  c.push_back({"dilated_grouped_gqa", grouped_gqa, 3});
  return c;
}

class CudnnGraphs : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnGraphs, EveryViewsForwardAndBackwardGraphValidates) {
  std::string library;
  if (!cudnn_loadable(&library)) GTEST_SKIP() << "SKIPPED: " << library;
  const Case& c = GetParam();
  std::string why;
  ASSERT_EQ(sdpa_views(c.cfg, &why).size(), c.views) << why;
  for (const DeviceDType dtype : {DeviceDType::bf16, DeviceDType::fp16})
    for (const int sm : {90, 80})
      for (const SdpaGraphCheck& check : validate_sdpa_graphs(c.cfg, dtype, sm))
        EXPECT_EQ(check.status, "")
            << library << ", sm_" << sm << ", " << to_string(dtype) << ", view " << check.view
            << (check.kind == SdpaGraphKind::forward ? " forward" : " backward");
}

std::string case_name(const ::testing::TestParamInfo<Case>& p) { return p.param.name; }

INSTANTIATE_TEST_SUITE_P(Suite, CudnnGraphs, ::testing::ValuesIn(cases()), case_name);

TEST(CudnnViews, WhatCudnnCannotReadInPlaceIsRefusedWithTheReason) {
  AttentionConfig head_major = dense(64, 2, 64);
  head_major.layout = TensorLayout::bhnd;
  std::string why;
  EXPECT_TRUE(sdpa_views(head_major, &why).empty());
  EXPECT_NE(why.find("[B,N,H,D]"), std::string::npos) << why;
  AttentionConfig mixture_gqa = dense(512, 8, 64);
  mixture_gqa.attention = AttentionKind::dilated;
  mixture_gqa.combine = Combine::mixture;
  mixture_gqa.segments = {256, 512};
  mixture_gqa.dilations = {1, 2};
  mixture_gqa.kv_heads = 4;
  why.clear();
  EXPECT_TRUE(sdpa_views(mixture_gqa, &why).empty());
  EXPECT_NE(why.find("GQA"), std::string::npos) << why;
}

// validate() does check: graphs cuDNN cannot run are refused with its reason.
TEST(CudnnViews, GraphsCudnnCannotRunFailValidation) {
  std::string library;
  if (!cudnn_loadable(&library)) GTEST_SKIP() << "SKIPPED: " << library;
  AttentionConfig c = dense(128, 2, 64);
  c.causal = true;
  SdpaView v = sdpa_views(c, nullptr).at(0);
  EXPECT_EQ(validate_sdpa_view(v, SdpaGraphKind::forward, DeviceDType::bf16, 90), "");
  SdpaView strided_dim = v;  // cuDNN reads a head's D elements contiguous
  strided_dim.q_stride[3] = 2;
  EXPECT_NE(validate_sdpa_view(strided_dim, SdpaGraphKind::forward, DeviceDType::bf16, 90), "");
  SdpaView negative_band = v;
  negative_band.right_bound = -1;
  EXPECT_NE(validate_sdpa_view(negative_band, SdpaGraphKind::backward, DeviceDType::fp16, 90), "");
}

TEST(CudnnViews, BandsFollowTheDenseRule) {
  AttentionConfig c = dense(128, 2, 64);
  c.causal = true;
  c.window_left = 16;
  const std::vector<SdpaView> v = sdpa_views(c, nullptr);
  ASSERT_EQ(v.size(), 1u);
  // Keys j with p - 16 <= j <= p: cuDNN's i - left_bound < j <= i + right_bound.
  EXPECT_EQ(v[0].left_bound, 17);
  EXPECT_EQ(v[0].right_bound, 0);
  EXPECT_FLOAT_EQ(v[0].scale, 0.125f);
}

}  // namespace
}  // namespace ringattn::kernels::cuda

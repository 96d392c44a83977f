// cuDNN's fused attention graphs (cudnn-frontend) for the configurations the GPU suite runs,
// checked by the frontend's own validate() on the host: shapes, strides, the diagonal band
// (causal, sliding windows), GQA head mapping, per-document views of packed sequences and
// the dilated strided views, forward with stats and backward, bf16 and fp16, for Hopper
// (sm_90) and Ampere (sm_80). Needs cuDNN loadable (not a GPU); skipped with the reason
// otherwise. The GPU suite then runs the same graphs against float64.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_skip.hpp"
#include "kernels/cuda/cudnn/graphs.hpp"
#include "ring/ring_cudnn_views.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "ringattn/reference.hpp"

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

// Values of their own head dim (V, O, dO, dV tensors Dv wide through their own strides) and
// the soft-cap as cuDNN's score modifier (c·tanh(s/c) on the scaled score, the band as a mask
// inside the modifier; its backward from the frontend's Softcap functor): DeepSeek's 192/128
// causal, 64/32 with GQA, a cap of 30 with a causal window, 50 with a two-sided window, and
// both over a grouped dilated pattern's strided views; forward and backward, bf16 and fp16, on
// Hopper (printed; every one validates with the cuDNN 9 of the CUDA 13 toolkit. Where a GPU's
// cuDNN refuses a graph, CudaPlan runs the native kernels and says why).
TEST(CudnnViews, ValueHeadDimAndSoftcapGraphsValidate) {
  std::string library;
  if (!cudnn_loadable(&library)) GTEST_SKIP() << "SKIPPED: " << library;
  struct Mla {
    const char* name;
    AttentionConfig cfg;
  };
  std::vector<Mla> cases;
  AttentionConfig mla = dense(256, 4, 192);
  mla.causal = true;
  mla.head_dim_v = 128;
  cases.push_back({"mla_192_128_causal", mla});
  AttentionConfig mla_gqa = dense(256, 8, 64);
  mla_gqa.kv_heads = 2;
  mla_gqa.head_dim_v = 32;
  cases.push_back({"mla_64_32_gqa", mla_gqa});
  AttentionConfig cap = dense(256, 4, 128);
  cap.causal = true;
  cap.window_left = 64;
  cap.softcap = 30;
  cases.push_back({"cap30_causal_window", cap});
  AttentionConfig cap_two_sided = dense(256, 4, 64);
  cap_two_sided.window_left = 32;
  cap_two_sided.window_right = 16;
  cap_two_sided.softcap = 50;
  cases.push_back({"cap50_window_32_16", cap_two_sided});
  AttentionConfig cap_dilated = dense(512, 6, 64);
  cap_dilated.attention = AttentionKind::dilated;
  cap_dilated.segments = {128, 256, 512};
  cap_dilated.dilations = {1, 2, 4};
  cap_dilated.softcap = 20;
  cap_dilated.head_dim_v = 32;
  cases.push_back({"cap20_mla_64_32_dilated", cap_dilated});
  for (const Mla& c : cases) {
    const std::vector<SdpaView> views = sdpa_views(c.cfg, nullptr);
    ASSERT_FALSE(views.empty()) << c.name;
    EXPECT_EQ(views[0].value_dim(), c.cfg.effective_head_dim_v()) << c.name;
    EXPECT_EQ(views[0].softcap, static_cast<float>(c.cfg.softcap)) << c.name;
    for (const DeviceDType dtype : {DeviceDType::bf16, DeviceDType::fp16})
      for (const SdpaGraphCheck& check : validate_sdpa_graphs(c.cfg, dtype, 90)) {
        std::printf("  %s %s view %zu %s: %s\n", c.name, to_string(dtype), check.view,
                    check.kind == SdpaGraphKind::forward ? "forward" : "backward",
                    check.status.empty() ? "validates" : check.status.c_str());
        EXPECT_EQ(check.status, "") << library << ", " << c.name;
      }
  }
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

// The GPU ring's --kernel cudnn: every step's views (ring_cudnn_views.hpp) of dense rings,
// causal zigzag with GQA, non-causal with MQA and causal balanced (chunks of unequal
// lengths), values of their own head dim with a soft-cap, P = 2 and 4, every rank, validate
// forward and
// backward, bf16 and fp16, on Hopper and Ampere: rectangles whose key rows differ from their
// query rows, bands offset from the diagonal, and K/V read from the packed receive buffer.
TEST(CudnnViews, EveryRingStepsGraphsValidate) {
  std::string library;
  if (!cudnn_loadable(&library)) GTEST_SKIP() << "SKIPPED: " << library;
  AttentionConfig causal_gqa = dense(256, 8, 128);
  causal_gqa.causal = true;
  causal_gqa.kv_heads = 2;
  AttentionConfig mqa = dense(256, 4, 64);
  mqa.kv_heads = 1;
  AttentionConfig balanced = dense(252, 2, 64);  // causal, 252 % 2P != 0 at P = 4: balanced
  balanced.causal = true;
  // Bands with both bounds, rows trimmed where a step's rows see no key.
  AttentionConfig window = dense(256, 4, 64);
  window.causal = true;
  window.window_left = 20;
  AttentionConfig two_sided = dense(256, 4, 128);
  two_sided.window_left = 7, two_sided.window_right = 3;
  AttentionConfig packed = dense(256, 4, 64);  // a one-token document, one straddling shards
  packed.causal = true;
  packed.cu_seqlens = {0, 1, 100, 256};
  // Values of their own head dim read in the shard and in the packed receive buffer, the cap
  // as the score modifier with each step's band inside it.
  AttentionConfig mla_cap = dense(256, 4, 128);
  mla_cap.causal = true;
  mla_cap.kv_heads = 2;
  mla_cap.window_left = 20;
  mla_cap.head_dim_v = 64;
  mla_cap.softcap = 30;
  for (const AttentionConfig& cfg :
       {causal_gqa, mqa, balanced, window, two_sided, packed, mla_cap})
    for (const int world : {2, 4}) {
      const ring::ShardLayout layout = ring::make_layout(cfg, world);
      if (cfg.shape.seq_len == 252 && world == 4) {
        EXPECT_FALSE(layout.zigzag);
      }
      for (int r = 0; r < world; ++r) {
        const ring::RingSchedule s = ring::build_ring_schedule(cfg, layout, r, {64, 128});
        for (std::size_t t = 0; t < s.steps.size(); ++t) {
          std::string why;
          const std::vector<SdpaView> views = ring::ring_step_views(cfg, layout, s.steps[t], &why);
          ASSERT_TRUE(why.empty()) << why;
          for (const SdpaView& v : views)
            for (const DeviceDType dtype : {DeviceDType::bf16, DeviceDType::fp16})
              for (const int sm : {90, 80})
                for (const SdpaGraphKind kind : {SdpaGraphKind::forward, SdpaGraphKind::backward})
                  // A one-token document's 1 x 1 backward is refused by cuDNN 9.19 ("s_q =
                  // s_kv = 1"); the ring then keeps that step's forward on cuDNN and runs its
                  // backward on ours (CudaRing.CudnnRefusedBackwardKeepsTheStepsForwardOnCudnn).
                  if (kind == SdpaGraphKind::backward && v.rows == 1 && v.kv_rows == 1)
                    std::printf("  1 x 1 backward: %s\n",
                                validate_sdpa_view(v, kind, dtype, sm).c_str());
                  else
                    EXPECT_EQ(validate_sdpa_view(v, kind, dtype, sm), "")
                      << library << ", P " << world << " rank " << r << " step " << t << ", sm_"
                      << sm << ", " << to_string(dtype)
                      << (kind == SdpaGraphKind::forward ? " forward" : " backward");
        }
      }
    }
}

// On a GPU (skipped, with the reason, elsewhere): the graphs built and run by CudnnGraphPlan,
// forward (out, lse) and backward (dq, dk, dv) in bf16 against the float64 reference of the
// bf16-rounded inputs, dense, causal GQA, sliding window and packed documents.
std::vector<float> device_bf16_to_host(const DeviceBuffer& b, std::size_t n) {
  std::vector<uint16_t> bits(n);
  EXPECT_EQ(cudaMemcpy(bits.data(), b.data(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t w = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &w, 4);
  }
  return out;
}

class CudnnGraphRun : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnGraphRun, ForwardAndBackwardMatchTheFloat64Reference) {
  REQUIRE_GPU();
  std::string library;
  if (!cudnn_loadable(&library)) GTEST_SKIP() << "SKIPPED: " << library;
  const AttentionConfig& cfg = GetParam().cfg;
  const Shape4& s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  std::vector<float> q(n), k(n_kv), v(n_kv), dout(n);
  uint32_t state = 12345;
  for (auto* t : {&q, &k, &v, &dout}) {
    for (float& x : *t) {
      state = state * 1664525u + 1013904223u;
      x = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
    }
    round_to_device_dtype(t->data(), t->size(), DeviceDType::bf16);
  }
  std::unique_ptr<CudnnGraphPlan> plan;
  try {
    plan = std::make_unique<CudnnGraphPlan>(cfg, DeviceDType::bf16, 0, nullptr, true);
  } catch (const std::exception& e) {
    GTEST_SKIP() << "SKIPPED: cuDNN cannot run it here: " << e.what();
  }
  std::printf("  %s: built in %.1f ms (%s)\n", GetParam().name.c_str(), plan->build_ms(),
              plan->description().c_str());
  auto up = [](const std::vector<float>& h, const char* what) {
    DeviceBuffer b(h.size() * 2, what, 0);
    b.upload(h.data(), h.size(), DeviceDType::bf16);
    return b;
  };
  DeviceBuffer dq_ = up(q, "q"), dk_ = up(k, "k"), dv_ = up(v, "v"), ddo = up(dout, "dout");
  DeviceBuffer o(n * 2, "out", 0), gq(n * 2, "dq", 0), gk(n_kv * 2, "dk", 0), gv(n_kv * 2, "dv", 0);
  DeviceBuffer stats(static_cast<std::size_t>(plan->stats_floats()) * 4, "stats", 0);
  for (DeviceBuffer* b : {&o, &gq, &gk, &gv}) b->zero();
  plan->forward(dq_.data(), dk_.data(), dv_.data(), o.data(), stats.as<float>());
  plan->backward(dq_.data(), dk_.data(), dv_.data(), o.data(), ddo.data(), stats.as<float>(),
                 gq.data(), gk.data(), gv.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  const ReferenceGradients g = reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
  EXPECT_LE(relative_error(device_bf16_to_host(o, n).data(), ref.out.data(), n), 1e-2);
  EXPECT_LE(relative_error(device_bf16_to_host(gq, n).data(), g.dq.data(), n), 2e-2);
  EXPECT_LE(relative_error(device_bf16_to_host(gk, n_kv).data(), g.dk.data(), n_kv), 2e-2);
  EXPECT_LE(relative_error(device_bf16_to_host(gv, n_kv).data(), g.dv.data(), n_kv), 2e-2);
  if (plan->views().size() == 1) {  // one view: its stats are the lse [B, H, N]
    std::vector<float> lse(static_cast<std::size_t>(plan->stats_floats()));
    stats.download(lse.data(), lse.size());
    EXPECT_LE(relative_error(lse.data(), ref.lse.data(), lse.size()), 1e-4);
  }
}

std::vector<Case> run_cases() {
  std::vector<Case> c;
  c.push_back({"dense", dense(256, 4, 64)});
  AttentionConfig gqa = dense(256, 8, 128);
  gqa.causal = true;
  gqa.kv_heads = 2;
  c.push_back({"gqa_causal", gqa});
  AttentionConfig window = dense(256, 4, 64);
  window.causal = true;
  window.window_left = 32;
  c.push_back({"window_causal", window});
  AttentionConfig packed = dense(256, 4, 64);
  packed.causal = true;
  packed.cu_seqlens = {0, 64, 192, 256};
  c.push_back({"packed_causal", packed});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudnnGraphRun, ::testing::ValuesIn(run_cases()),
                         [](const auto& p) { return p.param.name; });

}  // namespace
}  // namespace ringattn::kernels::cuda

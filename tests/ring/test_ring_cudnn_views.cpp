// The GPU ring's steps as cuDNN views (ring_cudnn_views.hpp), on the host: for every rank and
// step of dense rings (non-causal, causal zigzag and balanced, GQA, MQA, batches), the (query
// row, key row) pairs the views attend, cuDNN's band applied, are exactly the pairs the
// step's tasks attend; what is not such a grid is refused with the reason. cuDNN's own
// validate() of these views' graphs is in test_cudnn_graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ring/ring_cudnn_views.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"

namespace ringattn::ring {
namespace {

using Pairs = std::vector<std::pair<int64_t, int64_t>>;  // (q element, k element) of each row pair

Pairs task_pairs(const RingStep& st, bool causal) {
  Pairs p;
  for (const Wave& w : st.waves)
    for (const kernels::SubseqTask& t : w.tasks)
      for (int64_t i = 0; i < t.n_q; ++i)
        for (int64_t j = 0; j < t.n_k; ++j)
          if (!causal || j <= i + t.causal_offset)
            p.emplace_back(t.q_row0 + i * t.q_stride, t.k_row0 + j * t.k_stride);
  std::sort(p.begin(), p.end());
  return p;
}

Pairs view_pairs(const std::vector<kernels::cuda::SdpaView>& views) {
  Pairs p;
  for (const auto& v : views) {
    const int64_t group = v.heads / v.kv_heads;
    EXPECT_FALSE(v.left_bound.has_value());
    for (int64_t b = 0; b < v.batch; ++b)
      for (int64_t h = 0; h < v.heads; ++h)
        for (int64_t i = 0; i < v.rows; ++i)
          for (int64_t j = 0; j < v.kv_rows; ++j)
            if (!v.right_bound || j <= i + *v.right_bound)
              p.emplace_back(v.q_offset + b * v.q_stride[0] + h * v.q_stride[1] + i * v.q_stride[2],
                             v.kv_offset + b * v.kv_stride[0] + h / group * v.kv_stride[1] +
                                 j * v.kv_stride[2]);
  }
  std::sort(p.begin(), p.end());
  return p;
}

AttentionConfig dense(int64_t b, int64_t n, int64_t h, int64_t d, bool causal,
                      int64_t kv_heads = 0) {
  AttentionConfig c;
  c.shape = {b, n, h, d};
  c.causal = causal;
  if (kv_heads > 0) c.kv_heads = kv_heads;
  return c;
}

TEST(RingCudnnViews, EveryStepsViewsAttendExactlyItsTasksPairs) {
  struct Case {
    const char* name;
    AttentionConfig cfg;
  };
  const std::vector<Case> cases = {
      {"dense", dense(2, 96, 4, 8, false)},
      {"causal", dense(2, 96, 4, 8, true)},
      {"causal_gqa_4to2", dense(1, 96, 4, 8, true, 2)},
      {"mqa_4to1", dense(2, 96, 4, 8, false, 1)},
      {"causal_balanced", dense(1, 60, 2, 8, true)},  // 60 % 2P != 0 at P = 4: balanced
  };
  for (const Case& c : cases)
    for (int world = 1; world <= 4; ++world) {
      const ShardLayout layout = make_layout(c.cfg, world);
      for (int r = 0; r < world; ++r) {
        const RingSchedule s = build_ring_schedule(c.cfg, layout, r, {16, 32});
        for (std::size_t t = 0; t < s.steps.size(); ++t) {
          const RingStep& st = s.steps[t];
          std::string why;
          const auto views = ring_step_views(c.cfg, layout, st, &why);
          const std::string where = std::string(c.name) + " P " + std::to_string(world) + " rank " +
                                    std::to_string(r) + " step " + std::to_string(t) + " (" +
                                    layout.name() + ")";
          ASSERT_TRUE(why.empty()) << where << ": " << why;
          const Pairs want = task_pairs(st, c.cfg.causal);
          EXPECT_EQ(views.empty(), want.empty()) << where;
          EXPECT_TRUE(view_pairs(views) == want) << where;
          for (const auto& v : views) {
            EXPECT_EQ(v.segment, layout.local_len) << where;
            EXPECT_EQ(v.q_offset, v.row_offset * c.cfg.shape.heads * c.cfg.shape.head_dim) << where;
          }
        }
      }
    }
}

// The zigzag's steps as TransformerEngine runs them: step 0 three views (two causal diagonals
// and one whole rectangle), every later step unmasked rectangles.
TEST(RingCudnnViews, ZigzagStepsAreDiagonalsThenRectangles) {
  const AttentionConfig cfg = dense(1, 128, 2, 8, true);
  const ShardLayout layout = make_layout(cfg, 4);
  ASSERT_TRUE(layout.zigzag);
  for (int r = 0; r < 4; ++r) {
    const RingSchedule s = build_ring_schedule(cfg, layout, r, {16, 32});
    std::string why;
    const auto first = ring_step_views(cfg, layout, s.steps[0], &why);
    ASSERT_EQ(first.size(), 3u) << why;
    int diagonals = 0;
    for (const auto& v : first) diagonals += v.right_bound == 0 ? 1 : 0;
    EXPECT_EQ(diagonals, 2);
    for (std::size_t t = 1; t < s.steps.size(); ++t) {
      const auto views = ring_step_views(cfg, layout, s.steps[t], &why);
      // Queries of both local chunks × the sender's first chunk, or the second local chunk ×
      // each of the sender's two chunks (a view per key chunk).
      ASSERT_TRUE(views.size() == 1 || views.size() == 2)
          << "rank " << r << " step " << t << ": " << why;
      for (const auto& v : views) EXPECT_FALSE(v.right_bound.has_value());
    }
  }
}

TEST(RingCudnnViews, WhatIsNotAGridIsRefusedWithTheReason) {
  AttentionConfig dilated = dense(1, 128, 4, 8, false);
  dilated.attention = AttentionKind::dilated;
  dilated.segments = {64, 128};
  dilated.dilations = {1, 2};
  AttentionConfig window = dense(1, 128, 2, 8, true);
  window.window_left = 16;
  AttentionConfig packed = dense(1, 128, 2, 8, true);
  packed.cu_seqlens = {0, 48, 128};
  AttentionConfig head_major = dense(1, 128, 2, 8, false);
  head_major.layout = TensorLayout::bhnd;
  const std::vector<std::pair<AttentionConfig, std::string>> refused = {
      {dilated, "dilated"}, {window, "window"}, {packed, "packed"}, {head_major, "[B,N,H,D]"}};
  for (const auto& [cfg, word] : refused) {
    const std::string why = ring_cudnn_unsupported(cfg);
    EXPECT_NE(why.find(word), std::string::npos) << why;
    if (cfg.layout == TensorLayout::bhnd) continue;  // the ring schedules [B,N,H,D] only
    const ShardLayout layout = make_layout(cfg, 2);
    const RingSchedule s = build_ring_schedule(cfg, layout, 0, {16, 32});
    std::string step_why;
    EXPECT_TRUE(ring_step_views(cfg, layout, s.steps[0], &step_why).empty());
    EXPECT_EQ(step_why, why);
  }
}

}  // namespace
}  // namespace ringattn::ring

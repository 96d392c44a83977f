// The GPU ring's steps as cuDNN views (ring_cudnn_views.hpp), on the host: for every rank and
// step of dense rings (non-causal, causal zigzag and balanced, GQA, MQA, batches, sliding
// windows, packed documents), the (query row, key row) pairs the views attend, cuDNN's band
// applied, are exactly the pairs the step's tasks attend, and every view row sees a key (cuDNN
// is never asked for a row without one); what is not such a grid is refused with the reason.
// cuDNN's own validate() of these views' graphs is in test_cudnn_graphs.
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
          if ((!causal || j <= i + t.causal_offset) &&
              (t.window_left >= kernels::kNoWindow || j >= i + t.causal_offset - t.window_left) &&
              (t.window_right >= kernels::kNoWindow || j <= i + t.causal_offset + t.window_right))
            p.emplace_back(t.q_row0 + i * t.q_stride, t.k_row0 + j * t.k_stride);
  std::sort(p.begin(), p.end());
  return p;
}

Pairs view_pairs(const std::vector<kernels::cuda::SdpaView>& views) {
  Pairs p;
  for (const auto& v : views) {
    const int64_t group = v.heads / v.kv_heads;
    // Bounds cuDNN takes: right >= 0, left >= 1; and no row without a key.
    EXPECT_GE(v.right_bound.value_or(0), 0);
    EXPECT_GE(v.left_bound.value_or(1), 1);
    for (int64_t i = 0; i < v.rows; ++i) {
      int64_t seen = 0;
      for (int64_t j = 0; j < v.kv_rows; ++j)
        seen += (!v.right_bound || j <= i + *v.right_bound) && (!v.left_bound || i - *v.left_bound < j);
      EXPECT_GT(seen, 0) << "view row " << i << " sees no key";
    }
    for (int64_t b = 0; b < v.batch; ++b)
      for (int64_t h = 0; h < v.heads; ++h)
        for (int64_t i = 0; i < v.rows; ++i)
          for (int64_t j = 0; j < v.kv_rows; ++j)
            if ((!v.right_bound || j <= i + *v.right_bound) &&
                (!v.left_bound || i - *v.left_bound < j))
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

AttentionConfig windowed(AttentionConfig c, int64_t left, int64_t right = -1) {
  c.window_left = left;
  if (right >= 0) c.window_right = right;
  return c;
}

AttentionConfig packed(AttentionConfig c, std::vector<int64_t> cu) {
  c.cu_seqlens = std::move(cu);
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
      // Windows narrower than a chunk (rows that see no key of some step), wider, two-sided.
      {"causal_window_5", windowed(dense(1, 96, 2, 8, true), 5)},
      {"causal_window_40_gqa", windowed(dense(2, 96, 4, 8, true, 2), 40)},
      {"window_7_3", windowed(dense(1, 96, 2, 8, false), 7, 3)},
      // Packed documents, a one-token one among them, documents straddling shards.
      {"packed_causal", packed(dense(1, 96, 2, 8, true), {0, 1, 30, 31, 70, 96})},
      {"packed_dense_gqa", packed(dense(1, 96, 4, 8, false, 2), {0, 50, 51, 96})},
      {"packed_window", windowed(packed(dense(1, 96, 2, 8, true), {0, 40, 41, 96}), 9)},
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

// The zigzag's steps as TransformerEngine runs them, rows adjacent in the key (or query)
// buffer joined into one view: step 0 two banded views over the three blocks of the local
// chunks (two causal diagonals and the rectangle between, joined with one of them), every
// later step one unmasked rectangle (both local chunks × the sender's first chunk, or the
// second local chunk × the sender's two chunks, adjacent in the receive buffer).
TEST(RingCudnnViews, ZigzagStepsAreDiagonalsThenRectanglesOneViewPerAdjacentBlock) {
  const AttentionConfig cfg = dense(1, 128, 2, 8, true);
  const ShardLayout layout = make_layout(cfg, 4);
  ASSERT_TRUE(layout.zigzag);
  for (int r = 0; r < 4; ++r) {
    const RingSchedule s = build_ring_schedule(cfg, layout, r, {16, 32});
    std::string why;
    const int64_t chunk = cfg.shape.seq_len / 8;
    const auto first = ring_step_views(cfg, layout, s.steps[0], &why);
    ASSERT_EQ(first.size(), 2u) << why;
    EXPECT_TRUE(first[0].right_bound.has_value() && first[1].right_bound.has_value());
    EXPECT_EQ(first[0].rows * first[0].kv_rows + first[1].rows * first[1].kv_rows,
              3 * chunk * chunk);
    for (std::size_t t = 1; t < s.steps.size(); ++t) {
      const auto views = ring_step_views(cfg, layout, s.steps[t], &why);
      ASSERT_EQ(views.size(), 1u) << "rank " << r << " step " << t << ": " << why;
      EXPECT_FALSE(views[0].right_bound.has_value());
      EXPECT_EQ(views[0].rows * views[0].kv_rows, 2 * chunk * chunk);
    }
  }
}

TEST(RingCudnnViews, WhatIsNotAGridIsRefusedWithTheReason) {
  AttentionConfig dilated = dense(1, 128, 4, 8, false);
  dilated.attention = AttentionKind::dilated;
  dilated.segments = {64, 128};
  dilated.dilations = {1, 2};
  AttentionConfig head_major = dense(1, 128, 2, 8, false);
  head_major.layout = TensorLayout::bhnd;
  const std::vector<std::pair<AttentionConfig, std::string>> refused = {
      {dilated, "dilated"}, {head_major, "[B,N,H,D]"}};
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

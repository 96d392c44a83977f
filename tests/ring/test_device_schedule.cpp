// The schedule as the CUDA kernels read it (single/device_schedule.hpp), checked on the host:
// per pass, the query items cover every (task, query row) exactly once and the key items
// every (task, key row) exactly once, with task indices into the flat array; pass ranges
// are contiguous; row alignment for 16-byte copies is reported as the shapes imply.
#include <gtest/gtest.h>

#include <map>

#include "kernels/cuda/tiles.hpp"
#include "single/device_schedule.hpp"
#include "single/schedule.hpp"

namespace ringattn::single {
namespace {

constexpr int64_t kTile = 64;

AttentionConfig dilated(Combine c, bool causal, int64_t n, int64_t h, int64_t d) {
  AttentionConfig cfg;
  cfg.shape = {2, n, h, d};
  cfg.attention = AttentionKind::dilated;
  cfg.combine = c;
  cfg.segments = {n / 4, n / 2, n};
  cfg.dilations = {1, 2, 4};
  cfg.causal = causal;
  return cfg;
}

FlatSchedule flat(const AttentionConfig& cfg) {
  return flatten_schedule(build_local_schedule(cfg, {kTile, kTile}), cfg.causal, kTile);
}

void expect_exact_cover(const AttentionConfig& cfg) {
  const FlatSchedule f = flat(cfg);
  const LocalSchedule s = build_local_schedule(cfg, {kTile, kTile});
  ASSERT_EQ(f.passes.size(), s.passes.size());
  EXPECT_EQ(f.clear_outputs_first, s.clear_outputs_first);
  int64_t task0 = 0, q0 = 0, k0 = 0;
  for (std::size_t pi = 0; pi < f.passes.size(); ++pi) {
    const DevicePass& p = f.passes[pi];
    EXPECT_EQ(p.q_item0, q0);
    EXPECT_EQ(p.k_item0, k0);
    EXPECT_EQ(p.accumulate, s.passes[pi].accumulate);
    EXPECT_EQ(p.out_scale, s.passes[pi].out_scale);
    const auto n_tasks = static_cast<int64_t>(s.passes[pi].tasks.size());
    std::map<int64_t, std::vector<int>> q_seen, k_seen;  // task → hits per row
    for (int64_t t = task0; t < task0 + n_tasks; ++t) {
      q_seen[t].assign(static_cast<std::size_t>(f.tasks[static_cast<std::size_t>(t)].n_q), 0);
      k_seen[t].assign(static_cast<std::size_t>(f.tasks[static_cast<std::size_t>(t)].n_k), 0);
    }
    for (int64_t i = p.q_item0; i < p.q_item0 + p.n_q_items; ++i) {
      const auto& it = f.q_items[static_cast<std::size_t>(i)];
      ASSERT_GE(it.task, task0);
      ASSERT_LT(it.task, task0 + n_tasks);
      auto& rows = q_seen[it.task];
      for (int64_t r = it.q_begin; r < std::min<int64_t>(it.q_begin + kTile, rows.size()); ++r)
        ++rows[static_cast<std::size_t>(r)];
    }
    for (int64_t i = p.k_item0; i < p.k_item0 + p.n_k_items; ++i) {
      const auto& it = f.k_items[static_cast<std::size_t>(i)];
      ASSERT_GE(it.task, task0);
      ASSERT_LT(it.task, task0 + n_tasks);
      auto& rows = k_seen[it.task];
      for (int64_t r = it.q_begin; r < std::min<int64_t>(it.q_begin + kTile, rows.size()); ++r)
        ++rows[static_cast<std::size_t>(r)];
    }
    for (const auto& [t, rows] : q_seen)
      for (std::size_t r = 0; r < rows.size(); ++r)
        ASSERT_EQ(rows[r], 1) << "pass " << pi << " task " << t << " query row " << r;
    for (const auto& [t, rows] : k_seen)
      for (std::size_t r = 0; r < rows.size(); ++r)
        ASSERT_EQ(rows[r], 1) << "pass " << pi << " task " << t << " key row " << r;
    for (int64_t t = 0; t < n_tasks; ++t) {
      const auto& a = f.tasks[static_cast<std::size_t>(task0 + t)];
      const auto& b = s.passes[pi].tasks[static_cast<std::size_t>(t)];
      EXPECT_EQ(a.q_row0, b.q_row0);
      EXPECT_EQ(a.k_stride, b.k_stride);
      EXPECT_EQ(a.lse0, b.lse0);
    }
    // The key items split by backward range: contiguous, in order, each range's items only
    // for its own tasks, so no two items of one launch write the same dK/dV rows.
    ASSERT_EQ(p.k_ranges.size(), s.passes[pi].backward_ends.size());
    int64_t next = p.k_item0;
    std::size_t range_begin = 0;
    for (std::size_t ri = 0; ri < p.k_ranges.size(); ++ri) {
      const ItemRange& r = p.k_ranges[ri];
      EXPECT_EQ(r.first, next);
      next += r.count;
      const std::size_t range_end = s.passes[pi].backward_ends[ri];
      std::map<int64_t, int> k_row0s;  // key rows written in this launch
      for (int64_t i = r.first; i < r.first + r.count; ++i) {
        const int64_t t = f.k_items[static_cast<std::size_t>(i)].task - task0;
        EXPECT_GE(t, static_cast<int64_t>(range_begin));
        EXPECT_LT(t, static_cast<int64_t>(range_end));
      }
      for (std::size_t t = range_begin; t < range_end; ++t)
        EXPECT_EQ(++k_row0s[s.passes[pi].tasks[t].k_row0], 1) << "range " << ri;
      range_begin = range_end;
    }
    EXPECT_EQ(next, p.k_item0 + p.n_k_items);
    task0 += n_tasks;
    q0 += p.n_q_items;
    k0 += p.n_k_items;
  }
  EXPECT_EQ(task0, static_cast<int64_t>(f.tasks.size()));
  EXPECT_EQ(q0, static_cast<int64_t>(f.q_items.size()));
  EXPECT_EQ(k0, static_cast<int64_t>(f.k_items.size()));
}

TEST(DeviceSchedule, GroupedItemsCoverEveryRowOnce) {
  expect_exact_cover(dilated(Combine::grouped, false, 1024, 6, 64));
  expect_exact_cover(dilated(Combine::grouped, true, 1024, 5, 32));
}

TEST(DeviceSchedule, MixtureItemsCoverEveryRowOncePerPass) {
  expect_exact_cover(dilated(Combine::mixture, false, 512, 4, 128));
  expect_exact_cover(dilated(Combine::mixture, true, 512, 3, 40));
}

// Grouped-query attention: one key-item range per place in a K/V group (query heads sharing
// a K/V head add into its dK/dV in separate launches); packed documents and windows.
TEST(DeviceSchedule, GqaPackedAndWindowedItemsCoverEveryRowOnce) {
  AttentionConfig cfg;
  cfg.shape = {2, 300, 6, 64};
  cfg.kv_heads = 2;
  cfg.cu_seqlens = {0, 1, 120, 130, 300};
  for (bool causal : {false, true}) {
    cfg.causal = causal;
    cfg.window_left.reset();
    expect_exact_cover(cfg);
    cfg.window_left = 17;
    expect_exact_cover(cfg);
  }
  cfg.kv_heads = 6;
  expect_exact_cover(cfg);
  cfg.attention = AttentionKind::dilated;
  cfg.kv_heads = 3;
  cfg.window_left.reset();
  cfg.cu_seqlens.clear();
  cfg.segments = {150, 300};
  cfg.dilations = {1, 3};
  expect_exact_cover(cfg);
}

TEST(DeviceSchedule, DenseWithPartialTiles) {
  AttentionConfig cfg;
  cfg.shape = {3, 200, 2, 64};
  expect_exact_cover(cfg);
  cfg.causal = true;
  expect_exact_cover(cfg);
}

TEST(DeviceSchedule, KeyItemsAreMostExpensiveFirstUnderCausal) {
  AttentionConfig cfg;
  cfg.shape = {1, 1000, 1, 64};
  cfg.causal = true;
  const FlatSchedule f = flat(cfg);
  ASSERT_EQ(f.k_items.size(), 16u);
  // The first key tile is seen by every query; the last by the fewest.
  EXPECT_EQ(f.k_items.front().q_begin, 0);
  EXPECT_EQ(f.k_items.back().q_begin, 960);
}

TEST(DeviceSchedule, RowAlignmentFollowsTheHeadDim) {
  EXPECT_TRUE(rows_aligned(flat(dilated(Combine::grouped, false, 256, 4, 64)), 8));
  EXPECT_TRUE(rows_aligned(flat(dilated(Combine::mixture, false, 256, 4, 96)), 8));
  // D = 36: head h starts at 36·h elements, not a multiple of 8 for odd h.
  EXPECT_FALSE(rows_aligned(flat(dilated(Combine::grouped, false, 256, 4, 36)), 8));
}

TEST(DeviceSchedule, HeadDimsPadToTheInstantiatedOnes) {
  using kernels::cuda::padded_head_dim;
  EXPECT_EQ(padded_head_dim(1), 64);
  EXPECT_EQ(padded_head_dim(32), 64);
  EXPECT_EQ(padded_head_dim(64), 64);
  EXPECT_EQ(padded_head_dim(65), 128);
  EXPECT_EQ(padded_head_dim(96), 128);
  EXPECT_EQ(padded_head_dim(128), 128);
  EXPECT_EQ(padded_head_dim(200), 256);
  EXPECT_EQ(padded_head_dim(256), 256);
}

}  // namespace
}  // namespace ringattn::single

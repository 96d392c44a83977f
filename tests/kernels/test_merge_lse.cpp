// The log-sum-exp merge, the heart of the ring: attention over any split of the keys,
// computed piece by piece (with the causal offset a ring step would use) and merged,
// equals attention over all keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/cpu_flash.hpp"
#include "kernels/merge_lse.hpp"
#include "random.hpp"
#include "ringattn/config.hpp"
#include "ringattn/reference.hpp"

namespace ringattn {
namespace {

using kernels::ForwardItem;
using kernels::SubseqTask;
using kernels::TileConfig;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Single-head [n, d] tensors (row stride d): queries against keys [j0, j0 + nk).
void attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
            int64_t n, int64_t d, int64_t j0, int64_t nk, bool causal, std::vector<float>& out,
            std::vector<float>& lse) {
  const TileConfig tiles{16, 24};
  SubseqTask t;
  t.q_row0 = 0;
  t.q_stride = d;
  t.lse0 = 0;
  t.lse_stride = 1;
  t.k_row0 = j0 * d;
  t.k_stride = d;
  t.n_q = n;
  t.n_k = nk;
  t.causal_offset = -j0;  // key j (local) is global key j + j0: allowed when j + j0 <= i
  std::vector<ForwardItem> items;
  for (int64_t i0 = 0; i0 < n; i0 += tiles.q_tile) items.push_back({0, i0});
  std::vector<float> ws(2 * kernels::forward_workspace_floats(tiles, d));
  kernels::ForwardParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.lse = lse.data();
  p.head_dim = d;
  p.scale = 0.3f;
  p.causal = causal;
  std::vector<SubseqTask> tasks{t};
  kernels::flash_forward(p, tasks, items, tiles, 2, ws.data());
}

class MergeSplits : public ::testing::TestWithParam<bool> {};

TEST_P(MergeSplits, MergedPiecesEqualUnsplitAttention) {
  const bool causal = GetParam();
  const int64_t n = 97, d = 20;
  const auto q = testing::random_normal(static_cast<std::size_t>(n * d), 1);
  const auto k = testing::random_normal(static_cast<std::size_t>(n * d), 2);
  const auto v = testing::random_normal(static_cast<std::size_t>(n * d), 3);
  std::vector<float> full(static_cast<std::size_t>(n * d)), full_lse(static_cast<std::size_t>(n));
  attend(q, k, v, n, d, 0, n, causal, full, full_lse);

  std::mt19937 gen(causal ? 7 : 8);
  for (int trial = 0; trial < 20; ++trial) {
    // Random cut points, possibly empty pieces, pieces in random order.
    std::vector<int64_t> cuts{0, n};
    const int pieces = 1 + trial % 5;
    for (int i = 1; i < pieces; ++i)
      cuts.push_back(std::uniform_int_distribution<int64_t>(0, n)(gen));
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::size_t> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);

    std::vector<float> acc(static_cast<std::size_t>(n * d), 0.0f),
        acc_lse(static_cast<std::size_t>(n), kNegInf);
    for (std::size_t pi : order) {
      const int64_t j0 = cuts[pi], nk = cuts[pi + 1] - cuts[pi];
      std::vector<float> part(acc.size()), part_lse(acc_lse.size());
      attend(q, k, v, n, d, j0, nk, causal, part, part_lse);
      kernels::MergeRows m;
      m.acc_out = acc.data();
      m.acc_lse = acc_lse.data();
      m.part_out = part.data();
      m.part_lse = part_lse.data();
      m.rows = n;
      m.d = d;
      m.acc_out_stride = m.part_out_stride = d;
      kernels::merge_lse(m);
    }
    EXPECT_LE(relative_error(acc.data(), full.data(), acc.size()), 1e-6) << "trial " << trial;
    EXPECT_LE(relative_error(acc_lse.data(), full_lse.data(), acc_lse.size()), 1e-6);
  }

  // And the unsplit kernel result is the float64 reference (dense, one head).
  AttentionConfig cfg;
  cfg.shape = {1, n, 1, d};
  cfg.causal = causal;
  cfg.scale = 0.3f;
  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  EXPECT_LE(relative_error(full.data(), ref.out.data(), full.size()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Causal, MergeSplits, ::testing::Bool());

TEST(MergeLseRow, EmptyPartIsIdentityAndEmptyAccumulatorTakesPart) {
  float o[3] = {1, 2, 3}, l = 0.5f;
  const float p[3] = {9, 9, 9};
  kernels::merge_lse_row(o, &l, p, kNegInf, 3);
  EXPECT_EQ(o[0], 1.0f);
  EXPECT_EQ(l, 0.5f);
  float e[3] = {0, 0, 0}, le = kNegInf;
  kernels::merge_lse_row(e, &le, o, 0.5f, 3);
  EXPECT_EQ(e[2], 3.0f);
  EXPECT_EQ(le, 0.5f);
}

TEST(MergeLseRow, HugeLseGapsDoNotOverflow) {
  float o[1] = {1.0f}, l = 1000.0f;
  const float p[1] = {5.0f};
  kernels::merge_lse_row(o, &l, p, -1000.0f, 1);
  EXPECT_FLOAT_EQ(o[0], 1.0f);
  EXPECT_FLOAT_EQ(l, 1000.0f);
  kernels::merge_lse_row(o, &l, p, 1000.0f, 1);  // equal weights
  EXPECT_FLOAT_EQ(o[0], 3.0f);
  EXPECT_NEAR(l, 1000.0f + std::log(2.0f), 1e-3);
}

// A rank's shard in one call: out rows [B, n, H] against lse [B, H, n] (MergeRows::lse_heads),
// the same result as merging each row with its own lse (to rounding: the library's copy of
// the row merge may contract into FMAs where this file's does not).
TEST(MergeLseShard, ShardRowsFindTheirHeadMajorLse) {
  const int64_t B = 2, n = 5, H = 3, d = 4, rows = B * n * H;
  std::vector<float> acc = testing::random_normal(static_cast<std::size_t>(rows * d), 1);
  std::vector<float> part = testing::random_normal(static_cast<std::size_t>(rows * d), 2);
  std::vector<float> acc_lse = testing::random_normal(static_cast<std::size_t>(rows), 3);
  std::vector<float> part_lse = testing::random_normal(static_cast<std::size_t>(rows), 4);
  acc_lse[7] = kNegInf;    // a row with no keys yet
  part_lse[11] = kNegInf;  // a step with no keys for a row
  std::vector<float> want = acc, want_lse = acc_lse;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t r = (b * n + i) * H + h, l = (b * H + h) * n + i;
        EXPECT_EQ(kernels::shard_lse_index(r, H, n), l);
        kernels::merge_lse_row(want.data() + r * d, &want_lse[static_cast<std::size_t>(l)],
                               part.data() + r * d, part_lse[static_cast<std::size_t>(l)], d);
      }
  kernels::MergeRows m;
  m.acc_out = acc.data();
  m.acc_lse = acc_lse.data();
  m.part_out = part.data();
  m.part_lse = part_lse.data();
  m.rows = rows;
  m.d = d;
  m.acc_out_stride = m.part_out_stride = d;
  m.lse_heads = H;
  m.lse_rows = n;
  kernels::merge_lse(m);
  EXPECT_LE(relative_error(acc.data(), want.data(), acc.size()), 1e-6);
  for (std::size_t r = 0; r < acc_lse.size(); ++r) EXPECT_NEAR(acc_lse[r], want_lse[r], 1e-5) << r;
}

}  // namespace
}  // namespace ringattn

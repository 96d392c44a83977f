// The Ulysses x ring split model (ring/ulysses_model.hpp): which splits are valid, which link
// each part uses, that the choice moves toward Ulysses as rings grow across slow links, and
// that the C++ port gives bench/ring_model.py's numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ring/ulysses_model.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

ModelShape gpu_shape(int world, int64_t seq_len, int64_t heads, int64_t kv_heads) {
  return {.world = world,
          .ranks_per_node = 8,
          .seq_len = seq_len,
          .heads = heads,
          .kv_heads = kv_heads,
          .head_dim = 128,
          .elem_bytes = 2};
}

std::vector<int> ulysses_degrees(const std::vector<SplitEstimate>& splits) {
  std::vector<int> us;
  for (const SplitEstimate& e : splits) us.push_back(e.ulysses);
  return us;
}

TEST(UlyssesModel, SplitMustDivideRanksAndHeads) {
  EXPECT_TRUE(ulysses_split_valid(32, 32, 64, 1));
  EXPECT_TRUE(ulysses_split_valid(32, 32, 64, 8));
  EXPECT_FALSE(ulysses_split_valid(32, 32, 64, 3));   // divides neither
  EXPECT_FALSE(ulysses_split_valid(32, 32, 48, 3));   // P but not H
  EXPECT_FALSE(ulysses_split_valid(32, 32, 16, 32));  // H but not P
  EXPECT_FALSE(ulysses_split_valid(12, 12, 16, 8));   // P but not H
}

TEST(UlyssesModel, GroupedQueryNeedsWholeOrSharedKvHeads) {
  EXPECT_TRUE(ulysses_split_valid(32, 8, 64, 8));   // one K/V head per rank
  EXPECT_TRUE(ulysses_split_valid(32, 8, 64, 4));   // two K/V heads per rank
  EXPECT_TRUE(ulysses_split_valid(32, 8, 64, 16));  // H/U = 2 query heads of one K/V head (4)
  EXPECT_TRUE(ulysses_split_valid(32, 8, 64, 32));
  EXPECT_FALSE(ulysses_split_valid(12, 4, 12, 3));  // 4 query heads per rank over 2 K/V heads
  EXPECT_FALSE(ulysses_split_valid(12, 4, 12, 6));  // H/U = 2 does not divide H/H_kv = 3
  EXPECT_TRUE(ulysses_split_valid(12, 4, 12, 12));
}

TEST(UlyssesModel, EstimatesEveryValidSplitAscending) {
  const auto splits = estimate_splits(gpu_shape(64, 1 << 20, 32, 8), h100_nodes());
  EXPECT_EQ(ulysses_degrees(splits), (std::vector<int>{1, 2, 4, 8, 16, 32}));
  for (const SplitEstimate& e : splits) EXPECT_EQ(e.ulysses * e.ring, 64);
  EXPECT_EQ(splits.front().a2a_s, 0.0);  // the plain ring has no all-to-all
  const auto twelve = estimate_splits(gpu_shape(12, 12 << 10, 12, 4), h100_nodes());
  EXPECT_EQ(ulysses_degrees(twelve), (std::vector<int>{1, 2, 4, 12}));
}

TEST(UlyssesModel, RejectsShapesItCannotPrice) {
  EXPECT_THROW(estimate_splits(gpu_shape(0, 1024, 32, 8), h100_nodes()), InputError);
  EXPECT_THROW(estimate_splits(gpu_shape(8, 1024, 32, 12), h100_nodes()), InputError);
}

TEST(UlyssesModel, OneNodeUsesOnlyTheIntraNodeLink) {
  const ModelShape s = gpu_shape(8, 1 << 16, 32, 32);
  Links slow = h100_nodes();
  slow.inter_gbs /= 100;
  const auto fast_splits = estimate_splits(s, h100_nodes());
  const auto slow_splits = estimate_splits(s, slow);
  ASSERT_EQ(fast_splits.size(), slow_splits.size());
  for (std::size_t i = 0; i < fast_splits.size(); ++i)
    EXPECT_EQ(fast_splits[i].total_s, slow_splits[i].total_s) << "U=" << fast_splits[i].ulysses;
}

TEST(UlyssesModel, AllToAllLeavesTheNodeOnlyWhenGroupsSpanNodes) {
  const ModelShape s = gpu_shape(64, 1 << 18, 32, 32);
  Links slow = h100_nodes();
  slow.inter_gbs /= 100;
  const auto fast_splits = estimate_splits(s, h100_nodes());
  const auto slow_splits = estimate_splits(s, slow);
  for (std::size_t i = 0; i < fast_splits.size(); ++i) {
    const int u = fast_splits[i].ulysses;
    if (u <= 8)
      EXPECT_EQ(fast_splits[i].a2a_s, slow_splits[i].a2a_s) << "U=" << u;
    else
      EXPECT_GT(slow_splits[i].a2a_s, fast_splits[i].a2a_s) << "U=" << u;
  }
}

TEST(UlyssesModel, UlyssesGrowsWithRanksAcrossSlowLinks) {
  // Weak scaling at 1,024 tokens per GPU, 4x400 Gb/s per 8-GPU node: the ring's per-step
  // compute is fixed while its steps multiply, so larger groups pay off as P grows.
  Links links = h100_nodes();
  links.inter_gbs = 22.5;
  int previous = 1;
  for (int p = 8; p <= 1024; p *= 2) {
    const int u = recommend_ulysses(gpu_shape(p, 1024 * int64_t(p), 32, 32), links);
    EXPECT_GE(u, previous) << "P=" << p;
    previous = u;
  }
  EXPECT_EQ(previous, 32);
  EXPECT_EQ(recommend_ulysses(gpu_shape(8, 1 << 20, 32, 32), links), 1);
}

// Expected values: the "total_s" and "recommended_ulysses" lines of
//   python3 bench/ring_model.py --recommend ARGS
// with ARGS as in each case's comment.
void expect_python_totals(const ModelShape& s, const Links& l, int recommended,
                          const std::vector<double>& totals) {
  const auto splits = estimate_splits(s, l);
  ASSERT_EQ(splits.size(), totals.size());
  for (std::size_t i = 0; i < totals.size(); ++i)
    EXPECT_NEAR(splits[i].total_s, totals[i], 1e-9 * totals[i]) << "U=" << splits[i].ulysses;
  EXPECT_EQ(recommend_ulysses(s, l), recommended);
}

TEST(UlyssesModel, MatchesPythonGqaCausalTrainingOnH100) {
  // --world 64 --ranks-per-node 8 --seq-len 1048576 --heads 32 --kv-heads 8 --head-dim 128
  // --causal --backward
  ModelShape s = gpu_shape(64, 1048576, 32, 8);
  s.causal = s.backward = true;
  expect_python_totals(s, h100_nodes(), 1,
                       {1.5246561238493868, 1.5267524978938312, 1.5278606849160534,
                        1.5285347784271646, 1.5622941398493868, 1.576346378071609});
}

TEST(UlyssesModel, MatchesPythonPastTheLeafWithFourNicsPerNode) {
  // --world 512 --ranks-per-node 8 --seq-len 1048576 --heads 32 --kv-heads 8 --head-dim 128
  // --causal --backward --ib-gbs 22.5
  ModelShape s = gpu_shape(512, 1048576, 32, 8);
  s.causal = s.backward = true;
  Links l = h100_nodes();
  l.inter_gbs = 22.5;
  expect_python_totals(s, l, 8,
                       {0.9733852722767645, 0.4865959610868622, 0.24381965124039112,
                        0.19131184730339557, 0.20089151948117334, 0.2053645790367289});
}

// Values of their own head dim (MLA's 192/128): S = Q·Kᵀ sums over 192, P·V over 128, and v,
// out, dout and dv move 128 wide. Counting 192 for the values too, the model picks U = 128.
TEST(UlyssesModel, MatchesPythonWithValuesOfTheirOwnHeadDim) {
  // --world 512 --ranks-per-node 8 --seq-len 65536 --heads 128 --kv-heads 128 --head-dim 192
  // --head-dim-v 128 --causal --backward
  ModelShape s = gpu_shape(512, 65536, 128, 128);
  s.head_dim = 192;
  s.head_dim_v = 128;
  s.causal = s.backward = true;
  expect_python_totals(s, h100_nodes(), 64,
                       {0.6158054212380445, 0.30747358949831116, 0.15337857881884445,
                        0.0764728838599111, 0.04051167847537778, 0.022687907350755557,
                        0.015870504834844444, 0.016650769669688887});
  s.head_dim_v = 0;  // 192 for the values too
  EXPECT_EQ(recommend_ulysses(s, h100_nodes()), 128);
}

TEST(UlyssesModel, MatchesPythonMhaForwardAcrossNodes) {
  // --world 256 --ranks-per-node 8 --seq-len 262144 --heads 32 --kv-heads 32 --head-dim 128
  expect_python_totals(gpu_shape(256, 262144, 32, 32), h100_nodes(), 16,
                       {0.10021384033962666, 0.050053367434808885, 0.02506755549184,
                        0.012763498539235555, 0.01247166027776, 0.013140878411093333});
}

TEST(UlyssesModel, MatchesPythonOnCpuHosts) {
  // --world 32 --ranks-per-node 4 --seq-len 2048 --heads 16 --kv-heads 16 --head-dim 64
  // --elem 4 --fwd-tflops 0.15 --bwd-tflops 0.06 --nvlink-gbs 10 --nvlink-lat-us 5
  // --ib-gbs 1.2 --ib-lat-us 50 --spine-factor 1        (cpu_hosts())
  const ModelShape s{.world = 32,
                     .ranks_per_node = 4,
                     .seq_len = 2048,
                     .heads = 16,
                     .kv_heads = 16,
                     .head_dim = 64,
                     .elem_bytes = 4};
  expect_python_totals(s, cpu_hosts(), 4,
                       {0.015205954773333334, 0.0075899298133333334, 0.003964689493333334,
                        0.005046712746666666, 0.005901539413333333});
}

}  // namespace
}  // namespace ringattn::ring

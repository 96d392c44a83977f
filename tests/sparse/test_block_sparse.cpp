// The block-sparse plan on one rank: the blockmask golden cases, and randomized masks and
// patterns (causal or not, empty rows, tiles smaller than blocks and blocks smaller than
// tiles) against the float64 reference, forward and gradients. Outputs start as NaN, so an
// element the kernels never write shows up as an error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "block_masks.hpp"
#include "golden.hpp"
#include "random.hpp"
#include "ring/communicator.hpp"
#include "ringattn/reference.hpp"
#include "sparse/pattern.hpp"
#include "sparse/sparse_plan.hpp"

namespace ringattn::sparse {
namespace {

constexpr double kTol = 1e-5;

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result run_plan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                const std::vector<float>& q, const std::vector<float>& k,
                const std::vector<float>& v, const std::vector<float>& dout, PlanOptions opts) {
  auto comm = ring::make_local_communicator();
  SparsePlan plan(cfg, std::move(lists), *comm, opts);
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto rows = static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  Result r{std::vector<float>(n, nan), std::vector<float>(rows, nan), std::vector<float>(n, nan),
           std::vector<float>(n_kv, nan), std::vector<float>(n_kv, nan)};
  plan.forward(q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
  plan.backward(q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), dout.data(), r.dq.data(),
                r.dk.data(), r.dv.data());
  return r;
}

void expect_close(const Result& r, const ReferenceForward& f, const ReferenceGradients& g,
                  const std::string& what) {
  const std::size_t n = r.out.size(), rows = r.lse.size();
  const double eo = relative_error(r.out.data(), f.out.data(), n);
  const double el = relative_error(r.lse.data(), f.lse.data(), rows);
  const double eq = relative_error(r.dq.data(), g.dq.data(), n);
  const double ek = relative_error(r.dk.data(), g.dk.data(), n);
  const double ev = relative_error(r.dv.data(), g.dv.data(), n);
  EXPECT_LE(eo, kTol) << what;
  EXPECT_LE(el, kTol) << what;
  EXPECT_LE(eq, kTol) << what;
  EXPECT_LE(ek, kTol) << what;
  EXPECT_LE(ev, kTol) << what;
  std::printf("  %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", what.c_str(), eo, el, eq, ek,
              ev);
}

class BlockSparseGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(BlockSparseGolden, MatchesGoldenAndReference) {
  const auto c = testing::load_golden(GetParam());
  AttentionConfig cfg = c.cfg;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = c.block_size;
  const int64_t nb = cfg.shape.seq_len / cfg.block_size;
  auto lists = std::make_shared<const BlockLists>(
      lists_from_mask(c.block_mask.data(), cfg.shape.heads, cfg.shape.heads, nb, cfg.block_size));
  for (const PlanOptions& opts : {PlanOptions{1}, PlanOptions{2, 16, 32}, PlanOptions{3, 8, 16}}) {
    const Result r = run_plan(cfg, lists, c.q, c.k, c.v, c.dout, opts);
    const std::size_t n = r.out.size();
    EXPECT_LE(relative_error(r.out.data(), c.out.data(), n), kTol);
    EXPECT_LE(relative_error(r.dq.data(), c.dq.data(), n), kTol);
    EXPECT_LE(relative_error(r.dk.data(), c.dk.data(), n), kTol);
    EXPECT_LE(relative_error(r.dv.data(), c.dv.data(), n), kTol);
    const auto pb = mask_problem(cfg, c.block_mask, cfg.shape.heads);
    expect_close(r, reference_forward_blocks(pb, c.q.data(), c.k.data(), c.v.data()),
                 reference_backward_blocks(pb, c.q.data(), c.k.data(), c.v.data(), c.dout.data()),
                 c.name + " threads " + std::to_string(opts.threads));
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, BlockSparseGolden,
                         ::testing::ValuesIn(testing::golden_case_names("blockmask")),
                         [](const auto& p) { return p.param; });

struct RandomMaskCase {
  const char* name;
  Shape4 shape;
  int64_t block_size;
  double density;  // probability a block pair is allowed
  bool shared;     // one [nb, nb] mask for every head
  int64_t q_tile, k_tile;
};

class BlockSparseRandom : public ::testing::TestWithParam<std::tuple<RandomMaskCase, bool>> {};

TEST_P(BlockSparseRandom, MatchesReference) {
  const auto& [rc, causal] = GetParam();
  AttentionConfig cfg;
  cfg.shape = rc.shape;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = rc.block_size;
  cfg.causal = causal;
  const int64_t nb = cfg.shape.seq_len / rc.block_size, mh = rc.shared ? 1 : cfg.shape.heads;
  std::mt19937_64 gen(static_cast<uint64_t>(nb * 131 + (causal ? 7 : 0)));
  std::bernoulli_distribution keep(rc.density);
  std::vector<uint8_t> mask(static_cast<std::size_t>(mh * nb * nb));
  for (auto& m : mask) m = keep(gen) ? 1 : 0;
  // Some query blocks attend to nothing: they must output 0 and lse -inf.
  for (int64_t j = 0; j < nb; ++j) mask[static_cast<std::size_t>(nb + j)] = 0;
  auto lists = std::make_shared<const BlockLists>(
      lists_from_mask(mask.data(), mh, cfg.shape.heads, nb, rc.block_size));
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto q = testing::random_normal(n, 11), k = testing::random_normal(n, 12),
             v = testing::random_normal(n, 13), dout = testing::random_normal(n, 14);
  const Result r = run_plan(cfg, lists, q, k, v, dout, PlanOptions{2, rc.q_tile, rc.k_tile});
  const auto pb = mask_problem(cfg, mask, mh);
  expect_close(r, reference_forward_blocks(pb, q.data(), k.data(), v.data()),
               reference_backward_blocks(pb, q.data(), k.data(), v.data(), dout.data()),
               std::string(rc.name) + (causal ? " causal" : ""));
  // The empty query block (block 1 of head 0 when shared or not) reads 0 and -inf.
  const int64_t H = cfg.shape.heads, D = cfg.shape.head_dim;
  for (int64_t p = rc.block_size; p < 2 * rc.block_size; ++p) {
    EXPECT_EQ(r.lse[static_cast<std::size_t>(p)], -std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < D; ++c) EXPECT_EQ(r.out[static_cast<std::size_t>(p * H * D + c)], 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Masks, BlockSparseRandom,
    ::testing::Combine(
        ::testing::Values(
            RandomMaskCase{"bs16_D32_dense_tiles", {2, 192, 3, 32}, 16, 0.3, false, 0, 0},
            RandomMaskCase{"bs32_D64_small_tiles", {1, 256, 2, 64}, 32, 0.4, true, 16, 8},
            RandomMaskCase{"bs64_D16_tile_lt_block", {1, 256, 2, 16}, 64, 0.5, false, 16, 32},
            RandomMaskCase{"bs8_D128", {1, 128, 2, 128}, 8, 0.2, false, 0, 0},
            RandomMaskCase{"bs16_D256_dense_mask", {1, 96, 1, 256}, 16, 1.0, true, 0, 0}),
        ::testing::Bool()),
    [](const auto& p) {
      return std::string(std::get<0>(p.param).name) + (std::get<1>(p.param) ? "_causal" : "");
    });

// Generated patterns through the same plan, against the reference fed from the generator's
// own definition of the mask (mask_from_lists is checked against brute force elsewhere).
TEST(BlockSparsePatterns, GeneratedPatternsMatchReference) {
  for (const char* text : {"local:window=64+global:blocks=1", "bigbird:window=96,global=1,random=2",
                           "strided:stride=3+local", "dilated-blocks"}) {
    for (bool causal : {false, true}) {
      AttentionConfig cfg;
      cfg.shape = {1, 384, 4, 32};
      cfg.attention = AttentionKind::block_sparse;
      cfg.block_size = 32;
      cfg.causal = causal;
      const Geometry g{384, 32, 4};
      const auto lists = std::make_shared<const BlockLists>(
          build_lists(parse_pattern(text, g, {96, 384}, {1, 3}, 5), g));
      const std::vector<uint8_t> mask = mask_from_lists(*lists);
      const auto n = static_cast<std::size_t>(cfg.shape.numel());
      const auto q = testing::random_normal(n, 21), k = testing::random_normal(n, 22),
                 v = testing::random_normal(n, 23), dout = testing::random_normal(n, 24);
      const Result r = run_plan(cfg, lists, q, k, v, dout, PlanOptions{2});
      const auto pb = mask_problem(cfg, mask, cfg.shape.heads);
      expect_close(r, reference_forward_blocks(pb, q.data(), k.data(), v.data()),
                   reference_backward_blocks(pb, q.data(), k.data(), v.data(), dout.data()),
                   std::string(text) + (causal ? " causal" : ""));
    }
  }
}

// One thread per (batch, K/V head) task runs the fused backward (5 products per tile pair);
// more threads than tasks run the split one (7). Both must give the same bits, with every
// feature that changes how tiles are cut: causality, GQA, windows, documents, tiles smaller
// and larger than blocks.
TEST(BlockSparsePatterns, BackwardIsDeterministicAcrossThreadCounts) {
  struct Case {
    const char* name;
    Shape4 shape;
    int64_t kv_heads, bs, q_tile, k_tile;
    bool causal;
    int64_t window;
    std::vector<int64_t> cu_seqlens;
  };
  for (const Case& c : {Case{"bigbird", {1, 512, 2, 32}, 2, 32, 0, 0, false, -1, {}},
                        Case{"causal gqa", {2, 512, 4, 32}, 2, 32, 16, 48, true, -1, {}},
                        Case{"mqa window", {1, 512, 3, 16}, 1, 64, 24, 32, false, 40, {}},
                        Case{"packed window causal",
                             {1, 512, 2, 32},
                             1,
                             32,
                             0,
                             0,
                             true,
                             70,
                             {0, 1, 100, 101, 333, 512}}}) {
    AttentionConfig cfg;
    cfg.shape = c.shape;
    cfg.attention = AttentionKind::block_sparse;
    cfg.block_size = c.bs;
    cfg.causal = c.causal;
    cfg.kv_heads = c.kv_heads;
    if (c.window >= 0) cfg.window_left = c.window;
    cfg.cu_seqlens = c.cu_seqlens;
    const Geometry g{c.shape.seq_len, c.bs, c.shape.heads};
    const auto lists =
        std::make_shared<const BlockLists>(build_lists(parse_pattern("bigbird", g, {}, {}, 1), g));
    const auto n = static_cast<std::size_t>(cfg.shape.numel());
    const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
    const auto q = testing::random_normal(n, 1), k = testing::random_normal(n_kv, 2),
               v = testing::random_normal(n_kv, 3), dout = testing::random_normal(n, 4);
    const Result fused = run_plan(cfg, lists, q, k, v, dout, PlanOptions{1, c.q_tile, c.k_tile});
    for (int threads : {2, 5}) {
      const Result r =
          run_plan(cfg, lists, q, k, v, dout, PlanOptions{threads, c.q_tile, c.k_tile});
      EXPECT_EQ(fused.out, r.out) << c.name << " threads " << threads;
      EXPECT_EQ(fused.dq, r.dq) << c.name << " threads " << threads;
      EXPECT_EQ(fused.dk, r.dk) << c.name << " threads " << threads;
      EXPECT_EQ(fused.dv, r.dv) << c.name << " threads " << threads;
    }
  }
}

}  // namespace
}  // namespace ringattn::sparse

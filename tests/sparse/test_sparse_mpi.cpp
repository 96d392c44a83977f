// Distributed block-sparse attention under mpiexec (P = 1..4, label `mpi`): golden block
// masks, randomized masks and generated patterns give the single-process result within 1e-5,
// forward and gradients, in contiguous and zigzag layouts; each rank sends exactly the
// computed minimum; a local pattern talks only to its ring neighbours; random patterns are
// identical on every rank. Values of their own head dim with soft-capped logits (MLA's
// 192/128) also match float64, K and V travelling at their own widths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "golden.hpp"
#include "mpi_gtest_main.hpp"
#include "random.hpp"
#include "ring/communicator.hpp"
#include "ringattn/reference.hpp"
#include "sparse/pattern.hpp"
#include "sparse/sparse_plan.hpp"

namespace ringattn::sparse {
namespace {

ring::Communicator* g_comm = nullptr;
constexpr double kTol = 1e-5;

struct Inputs {
  std::vector<float> q, k, v, dout;
};

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// Runs one process's plan on the full tensors and the distributed plan on this rank's
// shard; compares the shard. Returns the single-process results.
Outputs compare(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                const Inputs& in, const std::string& what) {
  const Shape4 s = cfg.shape;
  const int64_t g = cfg.effective_kv_heads(), dv_dim = cfg.effective_head_dim_v();
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_kv = static_cast<std::size_t>(s.batch * s.seq_len * g * s.head_dim);
  const auto n_v = static_cast<std::size_t>(s.batch * s.seq_len * g * dv_dim);
  const auto n_out = static_cast<std::size_t>(s.batch * s.seq_len * s.heads * dv_dim);
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  std::vector<float> out(n_out), lse(rows), dq(n), dk(n_kv), dv(n_v);
  {
    auto local = ring::make_local_communicator();
    SparsePlan single(cfg, lists, *local, PlanOptions{1});
    single.forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
    single.backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), in.dout.data(),
                    dq.data(), dk.data(), dv.data());
  }
  SparsePlan plan(cfg, lists, *g_comm, PlanOptions{2, 16, 32});
  const ring::ShardLayout& l = plan.layout();
  const int rank = g_comm->rank();
  const auto ln = static_cast<std::size_t>(s.batch * l.local_len * s.heads * s.head_dim);
  const auto ln_kv = static_cast<std::size_t>(s.batch * l.local_len * g * s.head_dim);
  const auto ln_v = static_cast<std::size_t>(s.batch * l.local_len * g * dv_dim);
  const auto ln_out = static_cast<std::size_t>(s.batch * l.local_len * s.heads * dv_dim);
  const auto lrows = static_cast<std::size_t>(s.batch * s.heads * l.local_len);
  // This rank's rows of a [B, N, heads, dim] tensor (dim: D, or Dv for v, dv, out, dout).
  auto shard = [&](const std::vector<float>& full, int64_t heads, int64_t dim) {
    const int64_t inner = heads * dim;
    std::vector<float> part(static_cast<std::size_t>(s.batch * l.local_len * inner));
    ring::extract_rows(l, rank, s.batch, inner, full.data(), part.data());
    return part;
  };
  const int64_t h = s.heads, d = s.head_dim;
  const auto q = shard(in.q, h, d), k = shard(in.k, g, d), v = shard(in.v, g, dv_dim),
             dout = shard(in.dout, h, dv_dim);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lo(ln_out, nan), llse(lrows, nan), ldq(ln, nan), ldk(ln_kv, nan),
      ldv(ln_v, nan);
  plan.forward(q.data(), k.data(), v.data(), lo.data(), llse.data());
  plan.backward(q.data(), k.data(), v.data(), lo.data(), llse.data(), dout.data(), ldq.data(),
                ldk.data(), ldv.data());
  std::vector<float> want_lse(lrows);
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
    for (const ring::Chunk& c : l.chunks(rank))
      std::copy_n(lse.data() + bh * s.seq_len + c.begin, c.length,
                  want_lse.data() + bh * l.local_len + c.local_begin);
  const double e_out = relative_error(lo.data(), shard(out, h, dv_dim).data(), ln_out);
  const double e_lse = relative_error(llse.data(), want_lse.data(), lrows);
  const double e_dq = relative_error(ldq.data(), shard(dq, h, d).data(), ln);
  const double e_dk = relative_error(ldk.data(), shard(dk, g, d).data(), ln_kv);
  const double e_dv = relative_error(ldv.data(), shard(dv, g, dv_dim).data(), ln_v);
  EXPECT_LE(e_out, kTol) << what << " rank " << rank;
  EXPECT_LE(e_lse, kTol) << what << " rank " << rank;
  EXPECT_LE(e_dq, kTol) << what << " rank " << rank;
  EXPECT_LE(e_dk, kTol) << what << " rank " << rank;
  EXPECT_LE(e_dv, kTol) << what << " rank " << rank;
  const int64_t minimum = minimum_bytes_sent(cfg, *lists, l, rank);
  EXPECT_EQ(plan.last_forward().bytes_sent, minimum) << what << " rank " << rank;
  if (rank == 0)
    std::printf(
        "  %s P=%d%s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e, sent %lld bytes, "
        "%d peers\n",
        what.c_str(), g_comm->size(), l.zigzag ? " zigzag" : "", e_out, e_lse, e_dq, e_dk, e_dv,
        static_cast<long long>(plan.last_forward().bytes_sent), plan.peers());
  return {out, lse, dq, dk, dv};
}

Inputs random_inputs(const Shape4& s, uint64_t seed) {
  const auto n = static_cast<std::size_t>(s.numel());
  return {testing::random_normal(n, seed), testing::random_normal(n, seed + 1),
          testing::random_normal(n, seed + 2), testing::random_normal(n, seed + 3)};
}

class SparseGoldenMpi : public ::testing::TestWithParam<std::string> {};

TEST_P(SparseGoldenMpi, EqualsSingleProcess) {
  const auto c = testing::load_golden(GetParam());
  AttentionConfig cfg = c.cfg;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = c.block_size;
  const int64_t nb = cfg.shape.seq_len / cfg.block_size;
  if (nb % g_comm->size() != 0)
    GTEST_SKIP() << nb << " blocks do not split over P=" << g_comm->size();
  auto lists = std::make_shared<const BlockLists>(
      lists_from_mask(c.block_mask.data(), cfg.shape.heads, cfg.shape.heads, nb, cfg.block_size));
  compare(cfg, lists, {c.q, c.k, c.v, c.dout}, c.name);
}

INSTANTIATE_TEST_SUITE_P(Golden, SparseGoldenMpi,
                         ::testing::ValuesIn(testing::golden_case_names("blockmask")),
                         [](const auto& p) { return p.param; });

// N = 384 in blocks of 16 (24 blocks) splits into whole blocks, and whole half-blocks for
// the zigzag layout, over 1..4 ranks.
AttentionConfig config(Shape4 shape, int64_t bs, bool causal) {
  AttentionConfig cfg;
  cfg.shape = shape;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = bs;
  cfg.causal = causal;
  return cfg;
}

class SparsePatternMpi : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(SparsePatternMpi, EqualsSingleProcess) {
  const auto& [text, causal] = GetParam();
  const AttentionConfig cfg = config({2, 384, 3, 32}, 16, causal);
  const Geometry g{384, 16, 3};
  auto lists = std::make_shared<const BlockLists>(
      build_lists(parse_pattern(text, g, {96, 384}, {1, 4}, 9), g));
  compare(cfg, lists, random_inputs(cfg.shape, 40), std::string(text) + (causal ? " causal" : ""));
}

INSTANTIATE_TEST_SUITE_P(Patterns, SparsePatternMpi,
                         ::testing::Combine(::testing::Values("local:window=64",
                                                              "local:window=96+global:blocks=2",
                                                              "bigbird:window=48,global=1,random=3",
                                                              "strided:stride=5", "dilated-blocks"),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           std::string n = std::get<0>(p.param);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n + (std::get<1>(p.param) ? "_causal" : "");
                         });

TEST(SparseMpi, RandomMasksEqualSingleProcess) {
  for (bool causal : {false, true}) {
    const AttentionConfig cfg = config({1, 384, 2, 48}, 16, causal);
    const int64_t nb = 24;
    std::mt19937_64 gen(99);
    std::bernoulli_distribution keep(0.25);
    std::vector<uint8_t> mask(static_cast<std::size_t>(2 * nb * nb));
    for (auto& m : mask) m = keep(gen) ? 1 : 0;
    auto lists = std::make_shared<const BlockLists>(lists_from_mask(mask.data(), 2, 2, nb, 16));
    compare(cfg, lists, random_inputs(cfg.shape, 50),
            causal ? "random mask causal" : "random mask");
  }
}

// Grouped-query attention, sliding windows and packed sequences (token_rule.hpp): the same
// comparison, K/V heads only on the wire, documents cut at their bounds.
TEST(SparseMpi, GqaWindowsAndPackedSequencesEqualSingleProcess) {
  struct Case {
    const char* name;
    int64_t kv_heads, window;
    std::vector<int64_t> cu_seqlens;
    bool causal;
  };
  for (const Case& c :
       {Case{"gqa 4:2", 2, -1, {}, true}, Case{"mqa", 1, -1, {}, false},
        Case{"window 40", 2, 40, {}, false}, Case{"window 24 causal mqa", 1, 24, {}, true},
        Case{"packed", 4, -1, {0, 1, 77, 83, 300, 384}, true},
        Case{"packed window gqa", 2, 30, {0, 150, 151, 384}, false}}) {
    AttentionConfig cfg = config({2, 384, 4, 32}, 16, c.causal);
    cfg.kv_heads = c.kv_heads;
    if (c.window >= 0) cfg.window_left = c.window;
    cfg.cu_seqlens = c.cu_seqlens;
    const Geometry g{384, 16, 4};
    auto lists = std::make_shared<const BlockLists>(
        build_lists(parse_pattern("bigbird:window=96,global=1,random=3", g, {}, {}, 3), g));
    Inputs in = random_inputs(cfg.shape, 60);
    const auto n_kv = static_cast<std::size_t>(2 * 384 * c.kv_heads * 32);
    in.k.resize(n_kv);
    in.v.resize(n_kv);
    compare(cfg, lists, in, c.name);
  }
}

// Multi-head latent attention's head dims (q, k of 192; v, out of 128) with soft-capped
// logits (scores of about the cap's size, so that the cap matters), GQA, causal: every rank's
// shard equals the single-process plan, which equals float64; K and V travel at their own
// widths (the minimum counts D + Dv per row, and compare() checks each rank sends it).
TEST(SparseMpi, MlaSoftcapEqualsSingleProcessAndFloat64) {
  for (const bool causal : {true, false}) {
    AttentionConfig cfg = config({1, 192, 4, 192}, 16, causal);
    cfg.kv_heads = 2;
    cfg.head_dim_v = 128;
    cfg.softcap = 30;
    cfg.scale = 30 / std::sqrt(192.0);
    const Geometry g{192, 16, 4};
    auto lists = std::make_shared<const BlockLists>(
        build_lists(parse_pattern("local:window=48+global:blocks=1", g, {}, {}, 0), g));
    const auto n = static_cast<std::size_t>(cfg.shape.numel());
    const std::size_t n_k = n / 2, n_v = n_k / 192 * 128, n_out = n / 192 * 128;
    const Inputs in{testing::random_normal(n, 70), testing::random_normal(n_k, 71),
                    testing::random_normal(n_v, 72), testing::random_normal(n_out, 73)};
    const std::string what = causal ? "mla softcap causal" : "mla softcap";
    const Outputs single = compare(cfg, lists, in, what);
    BlockReferenceProblem pb = block_problem_of(cfg);
    pb.key_blocks = [&lists](int64_t h, int64_t i) {
      std::vector<int64_t> keys;
      for (int32_t j : lists->of_head(h).row(i)) keys.push_back(j);
      return keys;
    };
    const ReferenceForward f = reference_forward_blocks(pb, in.q.data(), in.k.data(), in.v.data());
    const ReferenceGradients gr =
        reference_backward_blocks(pb, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
    BlockReferenceProblem plain = pb;
    plain.softcap = 0;
    const ReferenceForward uncapped =
        reference_forward_blocks(plain, in.q.data(), in.k.data(), in.v.data());
    const std::vector<float> u32(uncapped.out.begin(), uncapped.out.end());
    EXPECT_GT(relative_error(u32.data(), f.out.data(), f.out.size()), 1e-2) << what;
    // Scores of the cap's size leave fp32 a few ulps of the cap in each (as the dense tests).
    constexpr double kCapTol = 5e-5;
    EXPECT_LE(relative_error(single.out.data(), f.out.data(), f.out.size()), kCapTol) << what;
    EXPECT_LE(relative_error(single.lse.data(), f.lse.data(), f.lse.size()), kCapTol) << what;
    EXPECT_LE(relative_error(single.dq.data(), gr.dq.data(), gr.dq.size()), kCapTol) << what;
    EXPECT_LE(relative_error(single.dk.data(), gr.dk.data(), gr.dk.size()), kCapTol) << what;
    EXPECT_LE(relative_error(single.dv.data(), gr.dv.data(), gr.dv.size()), kCapTol) << what;
  }
}

TEST(SparseMpi, LocalPatternTalksOnlyToNeighbours) {
  const AttentionConfig cfg = config({1, 384, 2, 16}, 16, false);
  const Geometry g{384, 16, 2};
  auto lists = std::make_shared<const BlockLists>(
      build_lists(parse_pattern("local:window=64", g, {}, {}, 0), g));
  SparsePlan plan(cfg, lists, *g_comm, PlanOptions{1});
  EXPECT_LE(plan.peers(), std::min(2, g_comm->size() - 1));
}

TEST(SparseMpi, RandomPatternIsIdenticalOnEveryRank) {
  const Geometry g{4096, 16, 4};
  const BlockLists l = build_lists(parse_pattern("random:blocks=7,seed=1234", g, {}, {}, 0), g);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every list
  for (const BlockCsr& c : l.lists)
    for (int32_t j : c.cols) h = (h ^ static_cast<uint64_t>(j)) * 1099511628211ull;
  std::vector<uint64_t> all(static_cast<std::size_t>(g_comm->size()));
  g_comm->gather(&h, sizeof h, all.data());
  if (g_comm->rank() == 0) {
    for (uint64_t x : all) EXPECT_EQ(x, all[0]);
  }
}

}  // namespace
}  // namespace ringattn::sparse

int main(int argc, char** argv) {
  return ringattn::testing::run_gtests_on_ranks(argc, argv, ringattn::sparse::g_comm);
}

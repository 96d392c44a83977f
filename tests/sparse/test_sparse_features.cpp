// Block-sparse attention with grouped-query attention, sliding windows and packed sequences
// (docs/SEMANTICS.md): a key is attended when its block is listed *and* the dense rule allows
// the pair. Every case runs the plan on one rank and on P = 1..4 virtual ranks against the
// float64 reference (which applies the rule itself, position by position), forward and
// gradients; every rank sends exactly the minimum; and the exact pair count the FLOPs and the
// imbalance use equals a brute-force count.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <mutex>

#include "block_masks.hpp"
#include "plan_runner.hpp"
#include "random.hpp"
#include "ring/communicator.hpp"
#include "ring/inproc_communicator.hpp"
#include "ringattn/reference.hpp"
#include "sparse/pattern.hpp"
#include "sparse/sparse_plan.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn::sparse {
namespace {

constexpr double kTol = 1e-5;

struct FeatureCase {
  const char* name;
  Shape4 shape;
  int64_t kv_heads, block_size;
  bool causal;
  int64_t window_left = -1, window_right = -1;  // -1: none (right: the default)
  std::vector<int64_t> seqlens;                 // empty: one document
  const char* pattern = nullptr;                // nullptr: a random mask (density 0.35)
  int64_t q_tile = 0, k_tile = 0;
};

AttentionConfig config_of(const FeatureCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = c.block_size;
  cfg.causal = c.causal;
  cfg.kv_heads = c.kv_heads;
  if (c.window_left >= 0) cfg.window_left = c.window_left;
  if (c.window_right >= 0) cfg.window_right = c.window_right;
  if (!c.seqlens.empty()) cfg.cu_seqlens = cu_seqlens_of(c.seqlens);
  validate(cfg);
  return cfg;
}

std::vector<uint8_t> mask_of(const FeatureCase& c, const AttentionConfig& cfg) {
  const int64_t nb = cfg.shape.seq_len / c.block_size, h = cfg.shape.heads;
  if (c.pattern) return pattern_mask(c.pattern, cfg.shape.seq_len, c.block_size, h);
  return random_mask(h, nb, static_cast<uint64_t>(nb * 977 + h), 1);
}

BlockReferenceProblem problem_of(const AttentionConfig& cfg, const std::vector<uint8_t>& mask) {
  return mask_problem(cfg, mask, cfg.shape.heads);
}

// The pairs the rule allows, counted the slow way: every (query, key) position pair.
double brute_force_pairs(const AttentionConfig& cfg, const std::vector<uint8_t>& mask) {
  const int64_t n = cfg.shape.seq_len, bs = cfg.block_size, nb = n / bs;
  std::vector<int64_t> doc(static_cast<std::size_t>(n), 0);
  for (std::size_t d = 0; d + 1 < cfg.cu_seqlens.size(); ++d)
    for (int64_t p = cfg.cu_seqlens[d]; p < cfg.cu_seqlens[d + 1]; ++p)
      doc[static_cast<std::size_t>(p)] = static_cast<int64_t>(d);
  const int64_t left = cfg.windowed() ? *cfg.window_left : n;
  const int64_t right = cfg.causal ? 0 : (cfg.windowed() ? cfg.window_right.value_or(left) : n);
  double total = 0;
  for (int64_t h = 0; h < cfg.shape.heads; ++h)
    for (int64_t p = 0; p < n; ++p)
      for (int64_t t = 0; t < n; ++t)
        total += mask[static_cast<std::size_t>((h * nb + p / bs) * nb + t / bs)] &&
                 doc[static_cast<std::size_t>(p)] == doc[static_cast<std::size_t>(t)] &&
                 t >= p - left && t <= p + right;
  return total;
}

struct Tensors {
  std::vector<float> q, k, v, dout;
};

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// The shard of `full` ([B, N, heads·D] rows, or lse [B·H, N]) that `rank` owns under `l`.
std::vector<float> rows_of(const ring::ShardLayout& l, int rank, const Shape4& s, int64_t heads,
                           const std::vector<float>& full) {
  std::vector<float> part(static_cast<std::size_t>(s.batch * l.local_len * heads * s.head_dim));
  ring::extract_rows(l, rank, s.batch, heads * s.head_dim, full.data(), part.data());
  return part;
}
std::vector<float> lse_of(const ring::ShardLayout& l, int rank, const Shape4& s,
                          const std::vector<double>& full) {
  std::vector<float> part(static_cast<std::size_t>(s.batch * s.heads * l.local_len));
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
    for (const ring::Chunk& c : l.chunks(rank))
      for (int64_t x = 0; x < c.length; ++x)
        part[static_cast<std::size_t>(bh * l.local_len + c.local_begin + x)] =
            static_cast<float>(full[static_cast<std::size_t>(bh * s.seq_len + c.begin + x)]);
  return part;
}
std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// This rank's outputs, always returned as [B, N/P, heads, D] rows; with cfg.layout bhnd the
// plan reads and writes head-major copies of the shards.
Outputs run_rank(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                 const Tensors& full, ring::Communicator& comm, const FeatureCase& c) {
  SparsePlan plan(cfg, std::move(lists), comm, PlanOptions{2, c.q_tile, c.k_tile});
  const ring::ShardLayout& l = plan.layout();
  const Shape4& s = cfg.shape;
  const int64_t g = cfg.effective_kv_heads();
  const int r = comm.rank();
  const bool hm = cfg.layout == TensorLayout::bhnd;
  auto shape_of = [&](int64_t heads) { return Shape4{s.batch, l.local_len, heads, s.head_dim}; };
  auto shard = [&](const std::vector<float>& x, int64_t heads) {
    const std::vector<float> rows = rows_of(l, r, s, heads, x);
    return hm ? testing::head_major_copy(rows, shape_of(heads)) : rows;
  };
  const auto q = shard(full.q, s.heads), k = shard(full.k, g), v = shard(full.v, g),
             dout = shard(full.dout, s.heads);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Outputs o{std::vector<float>(q.size(), nan),
            std::vector<float>(static_cast<std::size_t>(s.batch * s.heads * l.local_len), nan),
            std::vector<float>(q.size(), nan), std::vector<float>(k.size(), nan),
            std::vector<float>(k.size(), nan)};
  plan.forward(q.data(), k.data(), v.data(), o.out.data(), o.lse.data());
  plan.backward(q.data(), k.data(), v.data(), o.out.data(), o.lse.data(), dout.data(), o.dq.data(),
                o.dk.data(), o.dv.data());
  EXPECT_EQ(plan.last_forward().bytes_sent, minimum_bytes_sent(cfg, plan.lists(), l, r))
      << c.name << " rank " << r << " of " << comm.size();
  if (hm)
    for (auto [x, heads] : {std::pair{&o.out, s.heads}, std::pair{&o.dq, s.heads},
                            std::pair{&o.dk, g}, std::pair{&o.dv, g}})
      *x = testing::token_major_copy(*x, shape_of(heads));
  return o;
}

class SparseFeatures : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(SparseFeatures, MatchFloat64OnOneAndFourRanks) {
  const FeatureCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  const Shape4& s = cfg.shape;
  const int64_t g = cfg.effective_kv_heads();
  const std::vector<uint8_t> mask = mask_of(c, cfg);
  const int64_t nb = s.seq_len / c.block_size;
  auto lists = std::make_shared<const BlockLists>(
      lists_from_mask(mask.data(), s.heads, s.heads, nb, c.block_size));
  EXPECT_EQ(attended_token_pairs(*lists, cfg), brute_force_pairs(cfg, mask)) << c.name;

  const auto nq = static_cast<std::size_t>(s.numel());
  const auto nkv = static_cast<std::size_t>(s.batch * s.seq_len * g * s.head_dim);
  const Tensors in{testing::random_normal(nq, 71), testing::random_normal(nkv, 72),
                   testing::random_normal(nkv, 73), testing::random_normal(nq, 74)};
  const BlockReferenceProblem pb = problem_of(cfg, mask);
  const ReferenceForward f = reference_forward_blocks(pb, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients gr =
      reference_backward_blocks(pb, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  // The reference rounded to float once (6e-8 relative), so shards compare with float rows.
  const Outputs want{to_float(f.out), {}, to_float(gr.dq), to_float(gr.dk), to_float(gr.dv)};

  for (int p = 1; p <= 4; ++p) {
    if (s.seq_len % (p * c.block_size) != 0) continue;
    std::vector<double> worst(5, 0.0);
    std::mutex mu;
    const int code = ring::run_virtual_ranks(p, [&](ring::Communicator& comm) {
      const Outputs o = run_rank(cfg, lists, in, comm, c);
      const ring::ShardLayout l = sparse_layout(cfg, p);
      const int r = comm.rank();
      const double e[5] = {
          relative_error(o.out.data(), rows_of(l, r, s, s.heads, want.out).data(), o.out.size()),
          relative_error(o.lse.data(), lse_of(l, r, s, f.lse).data(), o.lse.size()),
          relative_error(o.dq.data(), rows_of(l, r, s, s.heads, want.dq).data(), o.dq.size()),
          relative_error(o.dk.data(), rows_of(l, r, s, g, want.dk).data(), o.dk.size()),
          relative_error(o.dv.data(), rows_of(l, r, s, g, want.dv).data(), o.dv.size())};
      std::lock_guard<std::mutex> lock(mu);
      for (int x = 0; x < 5; ++x)
        worst[static_cast<std::size_t>(x)] = std::max(worst[static_cast<std::size_t>(x)], e[x]);
      return 0;
    });
    EXPECT_EQ(code, 0) << c.name << " P=" << p;
    for (int x = 0; x < 5; ++x)
      EXPECT_LE(worst[static_cast<std::size_t>(x)], kTol)
          << c.name << " P=" << p << " (out, lse, dq, dk, dv)[" << x << "]";
    std::printf("  %s P=%d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", c.name, p, worst[0],
                worst[1], worst[2], worst[3], worst[4]);
  }
}

// On [B, H, N, D] tensors the plan computes the same bits as on [B, N, H, D] (which the test
// above checks against float64), on every world size: only the rows' strides change, and the
// kernels read strided key rows through packed copies of the same values.
TEST_P(SparseFeatures, HeadMajorTensorsGiveTheSameBitsOnOneToFourRanks) {
  const FeatureCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  AttentionConfig hm_cfg = cfg;
  hm_cfg.layout = TensorLayout::bhnd;
  const Shape4& s = cfg.shape;
  const int64_t g = cfg.effective_kv_heads();
  const std::vector<uint8_t> mask = mask_of(c, cfg);
  auto lists = std::make_shared<const BlockLists>(
      lists_from_mask(mask.data(), s.heads, s.heads, s.seq_len / c.block_size, c.block_size));
  const auto nq = static_cast<std::size_t>(s.numel());
  const auto nkv = static_cast<std::size_t>(s.batch * s.seq_len * g * s.head_dim);
  const Tensors in{testing::random_normal(nq, 81), testing::random_normal(nkv, 82),
                   testing::random_normal(nkv, 83), testing::random_normal(nq, 84)};
  for (int p = 1; p <= 4; ++p) {
    if (s.seq_len % (p * c.block_size) != 0) continue;
    std::vector<Outputs> rows(static_cast<std::size_t>(p)), heads(static_cast<std::size_t>(p));
    for (bool hm : {false, true}) {
      const int code = ring::run_virtual_ranks(p, [&](ring::Communicator& comm) {
        (hm ? heads : rows)[static_cast<std::size_t>(comm.rank())] =
            run_rank(hm ? hm_cfg : cfg, lists, in, comm, c);
        return 0;
      });
      ASSERT_EQ(code, 0) << c.name << " P=" << p << (hm ? " bhnd" : " bnhd");
    }
    for (std::size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(heads[r].out, rows[r].out) << c.name << " P=" << p << " rank " << r;
      EXPECT_EQ(heads[r].lse, rows[r].lse) << c.name << " P=" << p << " rank " << r;
      EXPECT_EQ(heads[r].dq, rows[r].dq) << c.name << " P=" << p << " rank " << r;
      EXPECT_EQ(heads[r].dk, rows[r].dk) << c.name << " P=" << p << " rank " << r;
      EXPECT_EQ(heads[r].dv, rows[r].dv) << c.name << " P=" << p << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SparseFeatures,
    ::testing::Values(
        FeatureCase{
            "gqa_4to2_local_causal", {1, 384, 4, 32}, 2, 16, true, -1, -1, {}, "local:window=64"},
        FeatureCase{"mqa_random", {2, 192, 3, 16}, 1, 16, false, -1, -1, {}, nullptr, 8, 16},
        FeatureCase{"window_20", {1, 384, 2, 32}, 2, 16, false, 20, -1, {}, "local:window=96"},
        FeatureCase{"window_7_31_random", {1, 192, 2, 16}, 1, 16, false, 7, 31, {}, nullptr, 8, 8},
        FeatureCase{"window_30_causal_gqa",
                    {1, 384, 4, 16},
                    2,
                    16,
                    true,
                    30,
                    -1,
                    {},
                    "local:window=64+global:blocks=1"},
        FeatureCase{"window_0", {1, 192, 2, 16}, 2, 16, false, 0, -1, {}, nullptr},
        FeatureCase{"window_0_causal", {1, 192, 2, 16}, 2, 16, true, 0, -1, {}, nullptr},
        FeatureCase{"window_past_n", {1, 192, 2, 16}, 1, 16, true, 1000, -1, {}, nullptr},
        FeatureCase{"packed_random_causal_gqa",
                    {1, 384, 4, 16},
                    2,
                    16,
                    true,
                    -1,
                    -1,
                    {1, 5, 40, 130, 1, 207},
                    nullptr,
                    8,
                    16},
        FeatureCase{"packed_bigbird",
                    {2, 384, 2, 32},
                    2,
                    32,
                    false,
                    -1,
                    -1,
                    {100, 3, 200, 81},
                    "bigbird:window=96,global=1,random=2"},
        FeatureCase{"packed_window_gqa_causal",
                    {1, 384, 4, 16},
                    1,
                    16,
                    true,
                    24,
                    -1,
                    {1, 60, 17, 250, 56},
                    "local:window=96"},
        FeatureCase{"packed_window_two_sided",
                    {1, 192, 2, 16},
                    2,
                    16,
                    false,
                    9,
                    4,
                    {50, 1, 141},
                    nullptr,
                    16,
                    8},
        FeatureCase{"packed_one_token_documents",
                    {1, 96, 2, 16},
                    1,
                    16,
                    true,
                    -1,
                    -1,
                    std::vector<int64_t>(96, 1),
                    nullptr}),
    [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace ringattn::sparse

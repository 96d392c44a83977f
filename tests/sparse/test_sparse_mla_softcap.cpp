// Block-sparse attention with values of their own head dim (q and k of D, v and out of Dv, as
// multi-head latent attention trains) and soft-capped logits (s <- c·tanh(s / c)), on one rank
// and on P = 1..4 virtual ranks: every rank's out, lse, dq, dk and dv against the float64
// block reference, with causality, GQA, windows, packed documents and head-major tensors; K and
// V travel at their own widths (each rank sends exactly the minimum, which counts D + Dv per
// row); and with attention sinks through the library API, the sinks' gradient too. Soft-capped
// cases take scores of about the cap's size, and check that the cap changes the answer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "block_masks.hpp"
#include "job/comm_access.hpp"
#include "plan_runner.hpp"
#include "random.hpp"
#include "ring/communicator.hpp"
#include "ring/inproc_communicator.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/ringattn.hpp"
#include "sparse/pattern.hpp"
#include "sparse/sparse_plan.hpp"

namespace ringattn::sparse {
namespace {

// Logits of the cap's size (up to ~3c before it) leave fp32 a few ulps of c in each score.
double tolerance_of(const AttentionConfig& cfg) { return cfg.softcapped() ? 5e-5 : 1e-5; }

struct MlaCase {
  const char* name;
  Shape4 shape;  // head_dim: D of q and k
  int64_t dv;    // v's and out's head dim
  double softcap;
  int64_t kv_heads, block_size;
  bool causal;
  int64_t window_left = -1, window_right = -1;  // -1: none (right: the default)
  std::vector<int64_t> seqlens;                 // empty: one document
  const char* pattern = nullptr;                // nullptr: a random mask (density 0.35)
  TensorLayout layout = TensorLayout::bnhd;
  int64_t q_tile = 0, k_tile = 0;
};

// gtest names a failing case by this, not by its bytes.
void PrintTo(const MlaCase& c, std::ostream* os) { *os << c.name; }

AttentionConfig config_of(const MlaCase& c) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.head_dim_v = c.dv;
  cfg.softcap = c.softcap;
  // Scores with std ~ c, so that the cap matters.
  if (c.softcap > 0) cfg.scale = c.softcap / std::sqrt(static_cast<double>(c.shape.head_dim));
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = c.block_size;
  cfg.causal = c.causal;
  cfg.kv_heads = c.kv_heads;
  cfg.layout = c.layout;
  if (c.window_left >= 0) cfg.window_left = c.window_left;
  if (c.window_right >= 0) cfg.window_right = c.window_right;
  if (!c.seqlens.empty()) cfg.cu_seqlens = cu_seqlens_of(c.seqlens);
  validate(cfg);
  return cfg;
}

// [H, nb, nb]: the pattern's blocks, or a random mask with every diagonal block.
std::vector<uint8_t> mask_of(const MlaCase& c, const AttentionConfig& cfg) {
  const int64_t nb = cfg.shape.seq_len / c.block_size, h = cfg.shape.heads;
  if (c.pattern) return pattern_mask(c.pattern, cfg.shape.seq_len, c.block_size, h);
  return random_mask(h, nb, static_cast<uint64_t>(nb * 131 + h), h);
}

BlockReferenceProblem problem_of(const AttentionConfig& cfg, const std::vector<uint8_t>& mask,
                                 int64_t heads_in_mask) {
  return mask_problem(cfg, mask, heads_in_mask);
}

// Full [B, N, heads, dim] inputs: q [H, D], k [G, D], v [G, Dv], dout [H, Dv].
testing::Tensors inputs_of(const AttentionConfig& cfg, uint64_t seed) {
  return testing::random_tensors(cfg, seed);
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// The soft-cap must matter: without it the float64 answer moves by far more than the
// tolerance. Returns that distance (0 without a cap).
double cap_effect(const BlockReferenceProblem& pb, const testing::Tensors& in) {
  if (!(pb.softcap > 0)) return 0;
  BlockReferenceProblem plain = pb;
  plain.softcap = 0;
  const ReferenceForward a = reference_forward_blocks(pb, in.q.data(), in.k.data(), in.v.data());
  const ReferenceForward b = reference_forward_blocks(plain, in.q.data(), in.k.data(), in.v.data());
  const std::vector<float> b32 = to_float(b.out);
  return relative_error(b32.data(), a.out.data(), a.out.size());
}

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// The shard `rank` owns under `l` of a full [B, N, width] tensor.
std::vector<float> rows_of(const ring::ShardLayout& l, int rank, int64_t batch, int64_t width,
                           const std::vector<float>& full) {
  std::vector<float> part(static_cast<std::size_t>(batch * l.local_len * width));
  ring::extract_rows(l, rank, batch, width, full.data(), part.data());
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

// The widths (heads × head dim) of q, k, v and out rows.
struct Widths {
  int64_t q, k, v, out;
};
Widths widths_of(const AttentionConfig& cfg) {
  const int64_t h = cfg.shape.heads, g = cfg.effective_kv_heads();
  const int64_t d = cfg.shape.head_dim, dv = cfg.effective_head_dim_v();
  return {h * d, g * d, g * dv, h * dv};
}

// This rank's outputs as [B, N/P, heads, dim] rows, whatever cfg.layout is (head-major runs
// read and write head-major copies of the shards).
Outputs run_rank(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                 const testing::Tensors& full, ring::Communicator& comm, const MlaCase& c) {
  SparsePlan plan(cfg, std::move(lists), comm, PlanOptions{2, c.q_tile, c.k_tile});
  const ring::ShardLayout& l = plan.layout();
  const Shape4& s = cfg.shape;
  const int64_t h = s.heads, g = cfg.effective_kv_heads();
  const int64_t d = s.head_dim, dv = cfg.effective_head_dim_v();
  const int r = comm.rank();
  const bool hm = cfg.layout == TensorLayout::bhnd;
  auto shape_of = [&](int64_t heads, int64_t dim) {
    return Shape4{s.batch, l.local_len, heads, dim};
  };
  auto shard = [&](const std::vector<float>& x, int64_t heads, int64_t dim) {
    const std::vector<float> rows = rows_of(l, r, s.batch, heads * dim, x);
    return hm ? testing::head_major_copy(rows, shape_of(heads, dim)) : rows;
  };
  const auto q = shard(full.q, h, d), k = shard(full.k, g, d), v = shard(full.v, g, dv),
             dout = shard(full.dout, h, dv);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Outputs o{std::vector<float>(dout.size(), nan),
            std::vector<float>(static_cast<std::size_t>(s.batch * h * l.local_len), nan),
            std::vector<float>(q.size(), nan), std::vector<float>(k.size(), nan),
            std::vector<float>(v.size(), nan)};
  plan.forward(q.data(), k.data(), v.data(), o.out.data(), o.lse.data());
  plan.backward(q.data(), k.data(), v.data(), o.out.data(), o.lse.data(), dout.data(), o.dq.data(),
                o.dk.data(), o.dv.data());
  EXPECT_EQ(plan.last_forward().bytes_sent, minimum_bytes_sent(cfg, plan.lists(), l, r))
      << c.name << " rank " << r << " of " << comm.size();
  if (hm) {
    o.out = testing::token_major_copy(o.out, shape_of(h, dv));
    o.dq = testing::token_major_copy(o.dq, shape_of(h, d));
    o.dk = testing::token_major_copy(o.dk, shape_of(g, d));
    o.dv = testing::token_major_copy(o.dv, shape_of(g, dv));
  }
  return o;
}

std::string name_of(const ::testing::TestParamInfo<MlaCase>& info) {
  std::ostringstream os;
  os << info.param.name << "_D" << info.param.shape.head_dim << "_Dv" << info.param.dv;
  if (info.param.softcap > 0) os << "_cap" << info.param.softcap;
  return os.str();
}

class SparseMlaSoftcap : public ::testing::TestWithParam<MlaCase> {};

TEST_P(SparseMlaSoftcap, MatchFloat64OnOneToFourRanks) {
  const MlaCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  const Shape4& s = cfg.shape;
  const Widths w = widths_of(cfg);
  const std::vector<uint8_t> mask = mask_of(c, cfg);
  const int64_t nb = s.seq_len / c.block_size;
  auto lists = std::make_shared<const BlockLists>(
      lists_from_mask(mask.data(), s.heads, s.heads, nb, c.block_size));
  const testing::Tensors in = inputs_of(cfg, 91);
  const BlockReferenceProblem pb = problem_of(cfg, mask, s.heads);
  const double tol = tolerance_of(cfg);
  if (cfg.softcapped()) {
    const double moved = cap_effect(pb, in);
    EXPECT_GT(moved, 100 * tol) << c.name << ": the cap must change the answer";
    std::printf("  %s: the cap moves out by %.1e\n", c.name, moved);
  }
  const ReferenceForward f = reference_forward_blocks(pb, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients gr =
      reference_backward_blocks(pb, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  ASSERT_EQ(f.out.size(), in.dout.size());
  ASSERT_EQ(gr.dv.size(), in.v.size());
  const Outputs want{to_float(f.out), {}, to_float(gr.dq), to_float(gr.dk), to_float(gr.dv)};

  int worlds = 0;
  for (int p = 1; p <= 4; ++p) {
    if (s.seq_len % (p * c.block_size) != 0) continue;
    ++worlds;
    std::vector<double> worst(5, 0.0);
    std::mutex mu;
    const int code = ring::run_virtual_ranks(p, [&](ring::Communicator& comm) {
      const Outputs o = run_rank(cfg, lists, in, comm, c);
      const ring::ShardLayout l = sparse_layout(cfg, p);
      const int r = comm.rank();
      const int64_t b = s.batch;
      const double e[5] = {
          relative_error(o.out.data(), rows_of(l, r, b, w.out, want.out).data(), o.out.size()),
          relative_error(o.lse.data(), lse_of(l, r, s, f.lse).data(), o.lse.size()),
          relative_error(o.dq.data(), rows_of(l, r, b, w.q, want.dq).data(), o.dq.size()),
          relative_error(o.dk.data(), rows_of(l, r, b, w.k, want.dk).data(), o.dk.size()),
          relative_error(o.dv.data(), rows_of(l, r, b, w.v, want.dv).data(), o.dv.size())};
      const std::lock_guard<std::mutex> lock(mu);
      for (std::size_t x = 0; x < 5; ++x) worst[x] = std::max(worst[x], e[x]);
      return 0;
    });
    EXPECT_EQ(code, 0) << c.name << " P=" << p;
    for (std::size_t x = 0; x < 5; ++x)
      EXPECT_LE(worst[x], tol) << c.name << " P=" << p << " (out, lse, dq, dk, dv)[" << x << "]";
    std::printf("  %s P=%d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", c.name, p, worst[0],
                worst[1], worst[2], worst[3], worst[4]);
  }
  EXPECT_GE(worlds, 2) << c.name << ": run on one rank and on several";
}

// K rows of D floats and V rows of Dv travel, so the minimum is the equal-width one scaled by
// (D + Dv) / 2D, exactly; the plan sends it (checked above on every rank).
TEST_P(SparseMlaSoftcap, MinimumBytesCountKAndVAtTheirOwnWidths) {
  const MlaCase& c = GetParam();
  const AttentionConfig cfg = config_of(c);
  AttentionConfig same = cfg;
  same.head_dim_v.reset();
  const Shape4& s = cfg.shape;
  const std::vector<uint8_t> mask = mask_of(c, cfg);
  const BlockLists lists =
      lists_from_mask(mask.data(), s.heads, s.heads, s.seq_len / c.block_size, c.block_size);
  const int64_t d = s.head_dim, dv = cfg.effective_head_dim_v();
  for (int p = 2; p <= 4; ++p) {
    if (s.seq_len % (p * c.block_size) != 0) continue;
    const ring::ShardLayout l = sparse_layout(cfg, p);
    for (int r = 0; r < p; ++r) {
      const int64_t equal = minimum_bytes_sent(same, lists, l, r);
      EXPECT_EQ(minimum_bytes_sent(cfg, lists, l, r) * 2 * d, equal * (d + dv))
          << c.name << " P=" << p << " rank " << r;
    }
  }
}

// D/Dv of multi-head latent attention (192/128) and two narrower pairs; caps 1, 30 and 50 (and
// none); causal, GQA, MQA, windows, packed documents, head-major tensors; strided and unstrided
// K/V rows; the fused backward (B·G >= 2 threads) and the split one (B·G = 1). One case a
// line, as a table (clang-format would give each field its own line).
// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Cases, SparseMlaSoftcap,
    ::testing::Values(
        MlaCase{"mla_local_causal_gqa", {1, 256, 4, 192}, 128, 0.0, 2, 32, true, -1, -1, {},
                "local:window=64"},
        MlaCase{"mla_random_cap50", {1, 128, 2, 192}, 128, 50.0, 1, 16, true, -1, -1, {}, nullptr,
                TensorLayout::bnhd, 8, 16},
        MlaCase{"mla_bigbird_cap1_bhnd", {1, 256, 2, 192}, 128, 1.0, 2, 32, false, -1, -1, {},
                "bigbird:window=96,global=1,random=2", TensorLayout::bhnd},
        MlaCase{"window_random", {2, 192, 2, 64}, 32, 0.0, 1, 16, false, 20, -1, {}, nullptr,
                TensorLayout::bnhd, 8, 16},
        MlaCase{"window_random_cap30", {2, 192, 2, 64}, 32, 30.0, 1, 16, false, 7, 31, {}, nullptr,
                TensorLayout::bnhd, 8, 8},
        MlaCase{"packed_causal_gqa", {1, 192, 4, 40}, 24, 0.0, 2, 16, true, -1, -1,
                {1, 5, 40, 130, 16}, nullptr, TensorLayout::bnhd, 8, 16},
        MlaCase{"packed_causal_gqa_cap1", {1, 192, 4, 40}, 24, 1.0, 2, 16, true, -1, -1,
                {1, 5, 40, 130, 16}, nullptr, TensorLayout::bnhd, 8, 16},
        MlaCase{"packed_window_cap30", {1, 384, 4, 40}, 24, 30.0, 1, 16, true, 24, -1,
                {1, 60, 17, 250, 56}, "local:window=96"},
        MlaCase{"window_two_sided_cap50_bhnd", {1, 192, 2, 40}, 24, 50.0, 2, 16, false, 9, 4, {},
                nullptr, TensorLayout::bhnd, 16, 8},
        MlaCase{"equal_dims_cap30_gqa", {2, 192, 4, 64}, 64, 30.0, 2, 16, true, -1, -1, {},
                "local:window=64+global:blocks=1"},
        MlaCase{"global_cap50", {1, 192, 2, 64}, 32, 50.0, 2, 16, false, -1, -1, {},
                "local:window=32+global:blocks=1", TensorLayout::bnhd, 16, 16}),
    name_of);
// clang-format on

// Attention sinks with both features, through the library API (the sinks are one epilogue
// above the plan): every rank's shard and the sinks' gradient, summed over the ranks, against
// the float64 reference, whose sink logit is not capped. A query block that lists no key
// leaves rows that only the sink sees.
struct SinkCase {
  const char* name;
  Shape4 shape;
  int64_t dv;
  double softcap;
  int64_t kv_heads;
  bool causal;
  int64_t window_left = -1;
  std::vector<int64_t> seqlens;
};

void PrintTo(const SinkCase& c, std::ostream* os) { *os << c.name; }

// Rows `rows` of a full [B, N, width] tensor.
template <typename T>
std::vector<float> gather(const std::vector<T>& full, int64_t batch, int64_t n, int64_t width,
                          const std::vector<int64_t>& rows) {
  std::vector<float> out;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p : rows)
      for (int64_t c = 0; c < width; ++c)
        out.push_back(static_cast<float>(full[static_cast<std::size_t>((b * n + p) * width + c)]));
  return out;
}

class SparseMlaSoftcapSinks : public ::testing::TestWithParam<SinkCase> {};

TEST_P(SparseMlaSoftcapSinks, EveryRankAndTheSinksGradientMatchFloat64) {
  const SinkCase& c = GetParam();
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.head_dim_v = c.dv;
  cfg.softcap = c.softcap;
  cfg.scale = c.softcap / std::sqrt(static_cast<double>(c.shape.head_dim));
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = 8;
  cfg.causal = c.causal;
  cfg.kv_heads = c.kv_heads;
  if (c.window_left >= 0) cfg.window_left = c.window_left;
  if (!c.seqlens.empty()) cfg.cu_seqlens = cu_seqlens_of(c.seqlens);
  const Shape4& s = cfg.shape;
  const int64_t nb = s.seq_len / cfg.block_size;
  std::vector<uint8_t> mask(static_cast<std::size_t>(nb * nb), 0);
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < nb; ++j)
      mask[static_cast<std::size_t>(i * nb + j)] = i != 2 && (j == 0 || (i * 3 + j) % 4 == 0);
  const testing::Tensors in = inputs_of(cfg, 17);
  const Widths w = widths_of(cfg);
  // A strong sink, a weak one, none (-inf) and an ordinary one.
  const std::vector<float> sinks = {2.5f, -1.0f, -std::numeric_limits<float>::infinity(), 0.3f};
  ASSERT_EQ(static_cast<int64_t>(sinks.size()), s.heads);
  BlockReferenceProblem pb = problem_of(cfg, mask, 1);
  pb.sinks = sinks;
  EXPECT_GT(cap_effect(pb, in), 100 * tolerance_of(cfg)) << c.name;
  const ReferenceForward f = reference_forward_blocks(pb, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients g =
      reference_backward_blocks(pb, in.q.data(), in.k.data(), in.v.data(), in.dout.data());

  for (const int p : {1, 2, 3}) {
    if (s.seq_len % (p * cfg.block_size) != 0) continue;
    JobSpec spec;
    spec.config = cfg;
    spec.device = Device::cpu;
    spec.threads = 1;
    spec.timeout_s = 60;
    spec.sinks = true;
    spec.block_sparse.mask = std::make_shared<const std::vector<uint8_t>>(mask);
    spec.block_sparse.mask_dims = {nb, nb};
    std::mutex mu;
    std::vector<std::string> failures;
    std::vector<double> dsinks(sinks.size(), 0.0);
    const int code = ring::run_virtual_ranks(p, [&](ring::Communicator& rc) {
      Comm comm = CommAccess::borrow(rc);
      Engine e = make_engine(spec, comm);
      const std::vector<int64_t> rows = e.local_rows();
      const int64_t b = s.batch, n = s.seq_len;
      const auto q = gather(in.q, b, n, w.q, rows), k = gather(in.k, b, n, w.k, rows),
                 v = gather(in.v, b, n, w.v, rows), dout = gather(in.dout, b, n, w.out, rows);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> out(dout.size(), nan), dq(q.size(), nan), dk(k.size(), nan),
          dv(v.size(), nan), ds(sinks.size(), nan);
      std::vector<float> lse(static_cast<std::size_t>(b * s.heads) * rows.size(), nan);
      e.forward(q.data(), k.data(), v.data(), out.data(), lse.data(), sinks.data());
      e.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                 dk.data(), dv.data(), sinks.data(), ds.data());
      std::vector<float> want_lse;
      for (int64_t bh = 0; bh < b * s.heads; ++bh)
        for (int64_t r : rows)
          want_lse.push_back(static_cast<float>(f.lse[static_cast<std::size_t>(bh * n + r)]));
      const double tol = tolerance_of(cfg);
      const struct {
        const char* what;
        const std::vector<float>& got;
        std::vector<float> want;
      } checks[] = {{"out", out, gather(f.out, b, n, w.out, rows)},
                    {"lse", lse, want_lse},
                    {"dq", dq, gather(g.dq, b, n, w.q, rows)},
                    {"dk", dk, gather(g.dk, b, n, w.k, rows)},
                    {"dv", dv, gather(g.dv, b, n, w.v, rows)}};
      const std::lock_guard<std::mutex> lock(mu);
      for (const auto& x : checks) {
        const double e_x = relative_error(x.got.data(), x.want.data(), x.want.size());
        if (x.got.size() != x.want.size() || !(e_x <= tol))
          failures.push_back(std::string(x.what) + " rank " + std::to_string(comm.rank()) +
                             " P=" + std::to_string(p) + ": " + std::to_string(e_x));
      }
      for (std::size_t h = 0; h < sinks.size(); ++h) dsinks[h] += ds[h];
      return 0;
    });
    ASSERT_EQ(code, 0) << c.name << " P=" << p;
    for (const std::string& x : failures) ADD_FAILURE() << c.name << ": " << x;
    const std::vector<float> got(dsinks.begin(), dsinks.end());
    ASSERT_EQ(g.dsinks.size(), got.size());
    const double e = relative_error(got.data(), g.dsinks.data(), got.size());
    EXPECT_LE(e, tolerance_of(cfg)) << c.name << " dsinks P=" << p;
    EXPECT_EQ(got[2], 0.0f) << "a head without a sink (-inf) has no sink gradient";
    std::printf("  %s P=%d: dsinks %.1e\n", c.name, p, e);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, SparseMlaSoftcapSinks,
    ::testing::Values(
        SinkCase{"mla_cap30_causal_gqa", {1, 96, 4, 192}, 128, 30.0, 2, true, -1, {}},
        SinkCase{"d64_dv32_cap1_window", {2, 96, 4, 64}, 32, 1.0, 4, false, 20, {}},
        SinkCase{"d40_dv24_cap50_packed", {1, 96, 4, 40}, 24, 50.0, 1, true, -1, {1, 30, 65}}),
    [](const auto& p) { return std::string(p.param.name); });

// The job layer hands block-sparse runs with both features to the CPU plans, on one rank and
// on several; under Ulysses (whose all-to-alls move head_dim-wide rows) values of their own
// head dim are refused by name, and the cap alone is taken.
TEST(SparseMlaSoftcapJob, BlockSparseTakesBothFeaturesOnSeveralRanks) {
  AttentionConfig cfg;
  cfg.shape = {1, 64, 2, 64};
  cfg.head_dim_v = 32;
  cfg.softcap = 30;
  cfg.attention = AttentionKind::block_sparse;
  cfg.block_size = 16;
  JobSpec spec;
  spec.config = cfg;
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.block_sparse.pattern = "local:window=32";
  for (const int p : {1, 2}) {
    const int code = ring::run_virtual_ranks(p, [&](ring::Communicator& rc) {
      Comm comm = CommAccess::borrow(rc);
      const Engine e = make_engine(spec, comm);
      EXPECT_EQ(e.local_out_shape().head_dim, 32);
      EXPECT_EQ(e.local_v_shape().head_dim, 32);
      EXPECT_EQ(e.local_shape().head_dim, 64);
      return 0;
    });
    EXPECT_EQ(code, 0) << "P=" << p;
  }
  // Ulysses moves v, out, dout and dv as rows of Dv (tests/job/test_ulysses.cpp checks its
  // results against the pure ring's).
  spec.ulysses = 2;
  const int code = ring::run_virtual_ranks(2, [&](ring::Communicator& rc) {
    Comm comm = CommAccess::borrow(rc);
    EXPECT_EQ(make_engine(spec, comm).local_out_shape().head_dim, 32);
    return 0;
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace ringattn::sparse

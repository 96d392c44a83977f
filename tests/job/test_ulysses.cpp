// Ulysses x ring through the library API on P = 4 and 8 virtual ranks with U = 2 and 4: every
// rank's shard against the float64 reference (forward and gradients), against the pure ring
// (U = 1) on the same ranks, the all-to-all's and the ring's bytes each equal to their
// computed minimum, local_rows equal to shard_rows; and the splits that cannot work refused
// naming --ulysses.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "job/comm_access.hpp"
#include "job_cases.hpp"
#include "random.hpp"
#include "ring/inproc_communicator.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/ringattn.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn {
namespace {

using Case = testing::JobCase;
using testing::rows_of;

std::vector<Case> cases() {
  std::vector<Case> c;
  AttentionConfig dense;
  dense.shape = {2, 128, 8, 16};
  c.push_back({"dense", dense, ""});
  AttentionConfig causal = dense;
  causal.causal = true;
  c.push_back({"causal", causal, ""});
  AttentionConfig gqa = causal;  // U = 2, 4 divide the K/V heads: they split
  gqa.kv_heads = 4;
  c.push_back({"gqa_split_causal", gqa, ""});
  AttentionConfig shared = dense;  // U = 4 does not divide 2 K/V heads: each goes to 2 ranks
  shared.kv_heads = 2;
  shared.window_left = 24;
  shared.window_right = 8;
  c.push_back({"gqa_shared_window", shared, ""});
  AttentionConfig mqa = causal;
  mqa.kv_heads = 1;
  c.push_back({"mqa_causal", mqa, ""});
  AttentionConfig dilated = dense;  // 3 head groups of 3, 3, 2 heads: slices cross them
  dilated.attention = AttentionKind::dilated;
  dilated.segments = {32, 64, 128};
  dilated.dilations = {1, 2, 4};
  c.push_back({"dilated_grouped", dilated, ""});
  AttentionConfig mixture = dilated;
  mixture.combine = Combine::mixture;
  mixture.causal = true;
  c.push_back({"dilated_mixture_causal", mixture, ""});
  AttentionConfig packed = causal;
  packed.cu_seqlens = {0, 40, 100, 128};
  c.push_back({"packed_causal", packed, ""});
  AttentionConfig sparse = dense;
  sparse.attention = AttentionKind::block_sparse;
  sparse.block_size = 8;
  sparse.causal = true;
  c.push_back({"block_sparse_causal", sparse, "local:window=16+global:blocks=1"});
  AttentionConfig per_head = dense;  // dilated blocks: each head its own list
  per_head.attention = AttentionKind::block_sparse;
  per_head.block_size = 8;
  per_head.segments = {32, 64};
  per_head.dilations = {1, 2};
  c.push_back({"block_sparse_dilated_blocks", per_head, "dilated-blocks"});
  AttentionConfig mla = gqa;  // values of their own head dim: v, out, dv of 8 columns
  mla.head_dim_v = 8;
  c.push_back({"mla_gqa_split_causal", mla, ""});
  AttentionConfig capped = shared;  // soft-capped scores of about the cap's size
  capped.softcap = 30;
  capped.scale = 30 / 4.0;
  capped.head_dim_v = 24;
  c.push_back({"softcap_mla_gqa_shared_window", capped, ""});
  AttentionConfig sparse_mla = sparse;  // block-sparse: the ring's slabs and Ulysses' rows of Dv
  sparse_mla.head_dim_v = 24;
  sparse_mla.softcap = 20;
  c.push_back({"block_sparse_mla_softcap", sparse_mla, "local:window=16+global:blocks=1"});
  return c;
}

// One job's results, every rank's shard scattered back into whole [B, N, ...] tensors.
struct Whole {
  std::vector<float> out, dq, dk, dv;
  std::vector<std::string> failures;
};

Whole run_job(const Case& c, int ranks, int u) {
  JobSpec spec;
  spec.config = c.cfg;
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.timeout_s = 60;
  spec.ulysses = u;
  spec.block_sparse.pattern = c.pattern;
  const Shape4& s = c.cfg.shape;
  const Shape4 skv = c.cfg.kv_shape();
  const int64_t dv_dim = c.cfg.effective_head_dim_v();
  const auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 1);
  const auto k = testing::random_normal(static_cast<std::size_t>(skv.numel()), 2);
  const auto v = testing::random_normal(static_cast<std::size_t>(c.cfg.v_shape().numel()), 3);
  const auto dout =
      testing::random_normal(static_cast<std::size_t>(c.cfg.out_shape().numel()), 4);
  const int64_t inner = s.heads * s.head_dim, inner_kv = skv.heads * s.head_dim;
  const int64_t inner_out = s.heads * dv_dim, inner_v = skv.heads * dv_dim;
  Whole w;
  w.out.assign(dout.size(), 0);
  w.dq.assign(q.size(), 0);
  w.dk.assign(k.size(), 0);
  w.dv.assign(v.size(), 0);
  std::mutex m;
  auto fail = [&](std::string f) {
    std::lock_guard lock(m);
    w.failures.push_back(std::move(f));
  };
  // Rows of a local [B, n, inner] shard into the whole tensor.
  auto place = [&](std::vector<float>& whole, const std::vector<float>& local,
                   const std::vector<int64_t>& rows, int64_t width) {
    const auto n = static_cast<int64_t>(rows.size());
    std::lock_guard lock(m);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(local.data() + (b * n + i) * width, width,
                    whole.data() + (b * s.seq_len + rows[static_cast<std::size_t>(i)]) * width);
  };
  const int code = ring::run_virtual_ranks(ranks, [&](ring::Communicator& rc) {
    Comm comm = CommAccess::borrow(rc);
    Engine e = make_engine(spec, comm);
    const std::vector<int64_t> rows = e.local_rows();
    if (rows != shard_rows(spec, ranks, comm.rank()))
      fail("local_rows differs from shard_rows on rank " + std::to_string(comm.rank()));
    const auto lq = rows_of(q, rows, s.batch, s.seq_len, inner);
    const auto lk = rows_of(k, rows, s.batch, s.seq_len, inner_kv);
    const auto lv = rows_of(v, rows, s.batch, s.seq_len, inner_v);
    const auto ldout = rows_of(dout, rows, s.batch, s.seq_len, inner_out);
    std::vector<float> out(ldout.size()), dq(lq.size()), dk(lk.size()), dv(lv.size());
    std::vector<float> lse(static_cast<std::size_t>(s.batch * s.heads * e.local_len()));
    e.forward(lq.data(), lk.data(), lv.data(), out.data(), lse.data());
    e.backward(lq.data(), lk.data(), lv.data(), out.data(), lse.data(), ldout.data(), dq.data(),
               dk.data(), dv.data());
    const EngineStats st = e.stats();
    if (st.ulysses != u) fail("stats().ulysses is " + std::to_string(st.ulysses));
    if (st.bytes_sent != st.bytes_sent_min || st.bytes_sent_a2a != st.bytes_sent_a2a_min)
      fail("rank " + std::to_string(comm.rank()) + " sent " + std::to_string(st.bytes_sent) +
           " bytes (all-to-all " + std::to_string(st.bytes_sent_a2a) + "), minimum " +
           std::to_string(st.bytes_sent_min) + " (all-to-all " +
           std::to_string(st.bytes_sent_a2a_min) + ")");
    place(w.out, out, rows, inner_out);
    place(w.dq, dq, rows, inner);
    place(w.dk, dk, rows, inner_kv);
    place(w.dv, dv, rows, inner_v);
    return 0;
  });
  if (code != 0) w.failures.push_back("the job's ranks returned " + std::to_string(code));
  return w;
}

class UlyssesOnVirtualRanks
    : public ::testing::TestWithParam<std::tuple<Case, std::pair<int, int>>> {};

TEST_P(UlyssesOnVirtualRanks, MatchesTheFloat64ReferenceAndThePureRing) {
  const auto& [c, split] = GetParam();
  const auto [ranks, u] = split;
  const Whole got = run_job(c, ranks, u);
  for (const std::string& f : got.failures) ADD_FAILURE() << f;
  const Shape4& s = c.cfg.shape;
  const auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 1);
  const auto k = testing::random_normal(static_cast<std::size_t>(c.cfg.kv_shape().numel()), 2);
  const auto v = testing::random_normal(static_cast<std::size_t>(c.cfg.v_shape().numel()), 3);
  const auto dout =
      testing::random_normal(static_cast<std::size_t>(c.cfg.out_shape().numel()), 4);
  if (c.cfg.attention != AttentionKind::block_sparse) {
    const ReferenceForward ref = reference_forward(c.cfg, q.data(), k.data(), v.data());
    const ReferenceGradients g =
        reference_backward(c.cfg, q.data(), k.data(), v.data(), dout.data());
    // Capped scores of the cap's size leave fp32 a few ulps of the cap in each.
    const double tol = c.cfg.softcapped() ? 5e-5 : 2e-6;
    ASSERT_EQ(got.out.size(), ref.out.size());
    ASSERT_EQ(got.dv.size(), g.dv.size());
    EXPECT_LE(relative_error(got.out.data(), ref.out.data(), got.out.size()), tol);
    EXPECT_LE(relative_error(got.dq.data(), g.dq.data(), got.dq.size()), tol);
    EXPECT_LE(relative_error(got.dk.data(), g.dk.data(), got.dk.size()), tol);
    EXPECT_LE(relative_error(got.dv.data(), g.dv.data(), got.dv.size()), tol);
  }
  // The pure ring on the same ranks (block-sparse: the reference the sparse suites check
  // against float64).
  const Whole ring = run_job(c, ranks, 1);
  for (const std::string& f : ring.failures) ADD_FAILURE() << "pure ring: " << f;
  EXPECT_LE(relative_error(got.out.data(), ring.out.data(), got.out.size()), 1e-6);
  EXPECT_LE(relative_error(got.dq.data(), ring.dq.data(), got.dq.size()), 1e-6);
  EXPECT_LE(relative_error(got.dk.data(), ring.dk.data(), got.dk.size()), 1e-6);
  EXPECT_LE(relative_error(got.dv.data(), ring.dv.data(), got.dv.size()), 1e-6);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, std::pair<int, int>>>& info) {
  const auto& [c, split] = info.param;
  return c.name + "_P" + std::to_string(split.first) + "_U" + std::to_string(split.second);
}

INSTANTIATE_TEST_SUITE_P(Jobs, UlyssesOnVirtualRanks,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(std::pair{4, 2}, std::pair{4, 4},
                                                              std::pair{8, 2}, std::pair{8, 4})),
                         case_name);

// make_engine's error on every rank of a P-rank job, as "subject: problem".
std::string setup_error(const JobSpec& spec, int ranks) {
  std::mutex m;
  std::string error;
  ring::run_virtual_ranks(ranks, [&](ring::Communicator& rc) {
    Comm comm = CommAccess::borrow(rc);
    try {
      (void)make_engine(spec, comm);
    } catch (const InputError& e) {
      std::lock_guard lock(m);
      error = e.subject() + ": " + e.problem();
    }
    return 0;
  });
  return error;
}

TEST(UlyssesSetup, RefusesSplitsThatCannotWorkNamingUlysses) {
  JobSpec spec;
  spec.config.shape = {1, 128, 8, 16};
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.ulysses = 3;  // does not divide 4 ranks
  EXPECT_NE(setup_error(spec, 4).find("ulysses: 3 does not divide the 4 ranks"), std::string::npos);
  spec.config.shape.heads = 6;  // 4 does not divide 6 heads
  spec.ulysses = 4;
  EXPECT_NE(setup_error(spec, 4).find("ulysses: 4 does not divide the 6 heads"), std::string::npos);
  spec.config.shape.heads = 12;  // 3 ranks would split 4 K/V heads of 12 unevenly
  spec.config.kv_heads = 4;
  spec.ulysses = 3;
  EXPECT_NE(setup_error(spec, 6).find("ulysses: 3 ranks would split the 4 K/V heads"),
            std::string::npos);
  spec.config.kv_heads.reset();
  spec.config.shape = {1, 8, 4, 16};  // 2 groups of 4 rows: a row per rank works
  spec.ulysses = 4;
  EXPECT_EQ(setup_error(spec, 8), "");
  spec.config.shape = {1, 12, 4, 16};  // 2 groups of 6 rows cannot split over 4 ranks
  EXPECT_NE(setup_error(spec, 8).find("ulysses: each of the 2 groups holds 6 rows"),
            std::string::npos);
}

TEST(UlyssesSetup, AutoPicksASplitTheJobCanRun) {
  JobSpec spec;
  spec.config.shape = {1, 256, 8, 16};
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.ulysses = 0;
  std::atomic<int> seen{-1};
  ring::run_virtual_ranks(4, [&](ring::Communicator& rc) {
    Comm comm = CommAccess::borrow(rc);
    Engine e = make_engine(spec, comm);
    seen = e.stats().ulysses;
    return 0;
  });
  EXPECT_TRUE(seen == 1 || seen == 2 || seen == 4) << seen;
}

}  // namespace
}  // namespace ringattn

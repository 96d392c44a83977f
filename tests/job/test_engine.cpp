// The library API (ringattn/ringattn.hpp) as a C++ user drives it: JobSpec -> make_engine ->
// Engine on P = 1..4 virtual ranks, each rank's shard against the float64 reference of the
// whole problem (forward and gradients); local_rows against shard_rows; bytes against their
// minimum; setup errors raised on every rank, naming the failing rank; bad tensor references
// refused naming the tensor.
#include <gtest/gtest.h>

#include <algorithm>
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
  dense.shape = {2, 96, 4, 16};
  c.push_back({"dense", dense, ""});
  AttentionConfig causal = dense;
  causal.causal = true;
  c.push_back({"causal", causal, ""});
  AttentionConfig dilated = dense;
  dilated.shape = {1, 96, 6, 16};
  dilated.attention = AttentionKind::dilated;
  dilated.segments = {24, 48, 96};
  dilated.dilations = {1, 2, 4};
  c.push_back({"dilated_grouped", dilated, ""});
  AttentionConfig mixture = dilated;
  mixture.combine = Combine::mixture;
  mixture.causal = true;
  c.push_back({"dilated_mixture_causal", mixture, ""});
  AttentionConfig gqa = causal;
  gqa.kv_heads = 2;
  gqa.window_left = 20;
  c.push_back({"gqa_window_causal", gqa, ""});
  return c;
}

Case sparse_case() {
  AttentionConfig sparse;
  sparse.shape = {2, 96, 4, 16};
  sparse.attention = AttentionKind::block_sparse;
  sparse.block_size = 8;
  sparse.causal = true;
  return {"block_sparse_local_global", sparse, "local:window=16+global:blocks=1"};
}

class EngineOnVirtualRanks : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(EngineOnVirtualRanks, EveryRanksShardMatchesTheFloat64Reference) {
  const auto& [c, ranks] = GetParam();
  JobSpec spec;
  spec.config = c.cfg;
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.timeout_s = 60;
  spec.block_sparse.pattern = c.pattern;
  const Shape4& s = c.cfg.shape;
  const Shape4 skv = c.cfg.kv_shape();
  const auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 1);
  const auto k = testing::random_normal(static_cast<std::size_t>(skv.numel()), 2);
  const auto v = testing::random_normal(static_cast<std::size_t>(skv.numel()), 3);
  const auto dout = testing::random_normal(static_cast<std::size_t>(s.numel()), 4);

  std::mutex m;
  std::vector<std::string> failures;
  std::vector<std::vector<float>> outs(static_cast<std::size_t>(ranks)),
      lses(static_cast<std::size_t>(ranks)), dqs(static_cast<std::size_t>(ranks)),
      dks(static_cast<std::size_t>(ranks)), dvs(static_cast<std::size_t>(ranks));
  std::vector<std::vector<int64_t>> rows(static_cast<std::size_t>(ranks));
  std::atomic<int64_t> bytes{0}, minimum{0};
  const int code = ring::run_virtual_ranks(ranks, [&](ring::Communicator& rc) {
    Comm comm = CommAccess::borrow(rc);
    Engine e = make_engine(spec, comm);
    const auto r = static_cast<std::size_t>(comm.rank());
    rows[r] = e.local_rows();
    if (rows[r] != shard_rows(spec, ranks, comm.rank())) {
      std::lock_guard lock(m);
      failures.push_back("local_rows differs from shard_rows on rank " + std::to_string(r));
    }
    const int64_t inner = s.heads * s.head_dim, inner_kv = skv.heads * s.head_dim;
    const auto lq = rows_of(q, rows[r], s.batch, s.seq_len, inner);
    const auto lk = rows_of(k, rows[r], s.batch, s.seq_len, inner_kv);
    const auto lv = rows_of(v, rows[r], s.batch, s.seq_len, inner_kv);
    const auto ldout = rows_of(dout, rows[r], s.batch, s.seq_len, inner);
    outs[r].resize(lq.size());
    lses[r].resize(static_cast<std::size_t>(s.batch * s.heads * e.local_len()));
    dqs[r].resize(lq.size());
    dks[r].resize(lk.size());
    dvs[r].resize(lk.size());
    e.forward(lq.data(), lk.data(), lv.data(), outs[r].data(), lses[r].data());
    e.backward(lq.data(), lk.data(), lv.data(), outs[r].data(), lses[r].data(), ldout.data(),
               dqs[r].data(), dks[r].data(), dvs[r].data());
    const EngineStats st = e.stats();
    bytes += st.bytes_sent;
    minimum += st.bytes_sent_min;
    return 0;
  });
  ASSERT_EQ(code, 0);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(bytes.load(), minimum.load()) << "forward bytes against their minimum";

  const ReferenceForward ref = reference_forward(c.cfg, q.data(), k.data(), v.data());
  const ReferenceGradients g = reference_backward(c.cfg, q.data(), k.data(), v.data(), dout.data());
  const int64_t inner = s.heads * s.head_dim, inner_kv = skv.heads * s.head_dim;
  for (int r = 0; r < ranks; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const auto want_out = rows_of(ref.out, rows[ur], s.batch, s.seq_len, inner);
    const auto want_dq = rows_of(g.dq, rows[ur], s.batch, s.seq_len, inner);
    const auto want_dk = rows_of(g.dk, rows[ur], s.batch, s.seq_len, inner_kv);
    const auto want_dv = rows_of(g.dv, rows[ur], s.batch, s.seq_len, inner_kv);
    EXPECT_LE(relative_error(outs[ur].data(), want_out.data(), want_out.size()), 2e-6) << r;
    EXPECT_LE(relative_error(dqs[ur].data(), want_dq.data(), want_dq.size()), 2e-6) << r;
    EXPECT_LE(relative_error(dks[ur].data(), want_dk.data(), want_dk.size()), 2e-6) << r;
    EXPECT_LE(relative_error(dvs[ur].data(), want_dv.data(), want_dv.size()), 2e-6) << r;
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, int>>& info) {
  return std::get<0>(info.param).name + "_P" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineOnVirtualRanks,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(1, 2, 3, 4)),
                         case_name);

// Block-sparse across ranks against the same job on one rank (whose kernels the sparse
// suite checks against float64): the library routes both through the same resolution.
TEST(EngineBlockSparse, EveryRankCountGivesTheOneRankResult) {
  const Case c = sparse_case();
  JobSpec spec;
  spec.config = c.cfg;
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.block_sparse.pattern = c.pattern;
  const Shape4& s = c.cfg.shape;
  const auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 5);
  const auto k = testing::random_normal(static_cast<std::size_t>(s.numel()), 6);
  const auto v = testing::random_normal(static_cast<std::size_t>(s.numel()), 7);
  std::vector<float> one(q.size()),
      one_lse(static_cast<std::size_t>(s.batch * s.heads * s.seq_len));
  {
    Comm single = Comm::single();
    Engine e = make_engine(spec, single);
    e.forward(q.data(), k.data(), v.data(), one.data(), one_lse.data());
    EXPECT_EQ(e.stats().engine, "SparsePlan");
  }
  for (int ranks = 2; ranks <= 4; ++ranks) {
    std::vector<float> got(q.size());
    ASSERT_EQ(ring::run_virtual_ranks(
                  ranks,
                  [&](ring::Communicator& rc) {
                    Comm comm = CommAccess::borrow(rc);
                    Engine e = make_engine(spec, comm);
                    const auto rows = e.local_rows();
                    const int64_t inner = s.heads * s.head_dim;
                    const auto lq = rows_of(q, rows, s.batch, s.seq_len, inner);
                    const auto lk = rows_of(k, rows, s.batch, s.seq_len, inner);
                    const auto lv = rows_of(v, rows, s.batch, s.seq_len, inner);
                    std::vector<float> out(lq.size()),
                        lse(static_cast<std::size_t>(s.batch * s.heads * e.local_len()));
                    e.forward(lq.data(), lk.data(), lv.data(), out.data(), lse.data());
                    for (int64_t b = 0; b < s.batch; ++b)
                      for (std::size_t i = 0; i < rows.size(); ++i)
                        std::copy_n(out.data() + (b * static_cast<int64_t>(rows.size()) +
                                                  static_cast<int64_t>(i)) *
                                                     inner,
                                    inner, got.data() + (b * s.seq_len + rows[i]) * inner);
                    return 0;
                  }),
              0);
    EXPECT_LE(relative_error(got.data(), one.data(), got.size()), 1e-6) << ranks << " ranks";
  }
}

// Each tensor its own layout (config.kv_layout): token-major q, out and dq beside head-major
// k, v, dk and dv (a KV cache), and the reverse, on 1..3 ranks, against float64.
class EngineMixedLayouts : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(EngineMixedLayouts, QAndKvInTheirOwnLayoutsMatchTheFloat64Reference) {
  const auto [case_index, kv_head_major] = GetParam();
  const Case c = case_index < 2 ? cases()[case_index == 0 ? 4 : 2] : sparse_case();
  JobSpec spec;
  spec.config = c.cfg;
  spec.config.layout = kv_head_major ? TensorLayout::bnhd : TensorLayout::bhnd;
  spec.config.kv_layout = kv_head_major ? TensorLayout::bhnd : TensorLayout::bnhd;
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.block_sparse.pattern = c.pattern;
  const Shape4& s = c.cfg.shape;
  const Shape4 skv = c.cfg.kv_shape();
  const auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 11);
  const auto k = testing::random_normal(static_cast<std::size_t>(skv.numel()), 12);
  const auto v = testing::random_normal(static_cast<std::size_t>(skv.numel()), 13);
  const auto dout = testing::random_normal(static_cast<std::size_t>(s.numel()), 14);
  const bool sparse = c.cfg.attention == AttentionKind::block_sparse;
  // The float64 reference, or for block-sparse the one-rank engine on contiguous tensors.
  std::vector<double> want_out;
  if (!sparse) want_out = reference_forward(c.cfg, q.data(), k.data(), v.data()).out;
  const ReferenceGradients g =
      sparse ? ReferenceGradients{}
             : reference_backward(c.cfg, q.data(), k.data(), v.data(), dout.data());
  for (int ranks = 1; ranks <= 3; ++ranks) {
    if (s.seq_len % (2 * ranks) != 0) continue;
    std::mutex m;
    std::vector<std::string> failures;
    ASSERT_EQ(
        ring::run_virtual_ranks(
            ranks,
            [&](ring::Communicator& rc) {
              Comm comm = CommAccess::borrow(rc);
              Engine e = make_engine(spec, comm);
              const auto rows = e.local_rows();
              const Shape4 ls = e.local_shape(), lkv = e.local_kv_shape();
              // This rank's rows, then each tensor in its own layout.
              auto local = [&](const std::vector<float>& full, const Shape4& sh, TensorLayout l) {
                std::vector<float> r =
                    rows_of(full, rows, sh.batch, s.seq_len, sh.heads * sh.head_dim);
                if (l == TensorLayout::bnhd) return r;
                std::vector<float> hm(r.size());
                to_head_major(r.data(), sh, hm.data());
                return hm;
              };
              auto back = [&](const std::vector<float>& x, const Shape4& sh, TensorLayout l) {
                if (l == TensorLayout::bnhd) return x;
                std::vector<float> r(x.size());
                from_head_major(x.data(), sh, r.data());
                return r;
              };
              const TensorLayout lq = spec.config.layout, lk = *spec.config.kv_layout;
              const auto lq_ = local(q, ls, lq), ldout = local(dout, ls, lq);
              const auto lk_ = local(k, lkv, lk), lv_ = local(v, lkv, lk);
              std::vector<float> out(lq_.size()),
                  lse(static_cast<std::size_t>(s.batch * s.heads) * rows.size()), dq(lq_.size()),
                  dk(lk_.size()), dv(lk_.size());
              e.forward(lq_.data(), lk_.data(), lv_.data(), out.data(), lse.data());
              e.backward(lq_.data(), lk_.data(), lv_.data(), out.data(), lse.data(), ldout.data(),
                         dq.data(), dk.data(), dv.data());
              // Against the same job on contiguous tensors (the suite above checks it against
              // float64).
              JobSpec plain = spec;
              plain.config.layout = TensorLayout::bnhd;
              plain.config.kv_layout.reset();
              Engine p = make_engine(plain, comm);
              const auto pq = local(q, ls, TensorLayout::bnhd),
                         pk = local(k, lkv, TensorLayout::bnhd),
                         pv = local(v, lkv, TensorLayout::bnhd),
                         pd = local(dout, ls, TensorLayout::bnhd);
              std::vector<float> pout(pq.size()), plse(lse.size()), pdq(pq.size()), pdk(pk.size()),
                  pdv(pk.size());
              p.forward(pq.data(), pk.data(), pv.data(), pout.data(), plse.data());
              p.backward(pq.data(), pk.data(), pv.data(), pout.data(), plse.data(), pd.data(),
                         pdq.data(), pdk.data(), pdv.data());
              const std::pair<std::vector<float>, const std::vector<float>*> pairs[] = {
                  {back(out, ls, lq), &pout},
                  {lse, &plse},
                  {back(dq, ls, lq), &pdq},
                  {back(dk, lkv, lk), &pdk},
                  {back(dv, lkv, lk), &pdv}};
              std::lock_guard lock(m);
              for (const auto& [got, ref] : pairs)
                if (relative_error(got.data(), ref->data(), got.size()) > 1e-6)
                  failures.push_back("rank " + std::to_string(comm.rank()) + " of " +
                                     std::to_string(ranks) + " differs from the contiguous run");
              if (!sparse) {
                const auto w = rows_of(want_out, rows, s.batch, s.seq_len, s.heads * s.head_dim);
                const auto wdk = rows_of(g.dk, rows, s.batch, s.seq_len, skv.heads * s.head_dim);
                if (relative_error(pairs[0].first.data(), w.data(), w.size()) > 2e-6 ||
                    relative_error(pairs[3].first.data(), wdk.data(), wdk.size()) > 2e-6)
                  failures.push_back("rank " + std::to_string(comm.rank()) + " against float64");
              }
              return 0;
            }),
        0);
    for (const std::string& f : failures) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineMixedLayouts,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Bool()));

TEST(EngineErrors, ABadFieldOnOneRankIsRaisedOnEveryRankNamingIt) {
  std::atomic<int> raised{0};
  const int ranks = 3;
  ASSERT_EQ(ring::run_virtual_ranks(ranks,
                                    [&](ring::Communicator& rc) {
                                      JobSpec spec;
                                      spec.config.shape = {1, 96, 4, 16};
                                      spec.config.attention = AttentionKind::dilated;
                                      spec.config.dilations = {1};
                                      // Only the last rank asks for a segment that does not divide
                                      // N.
                                      spec.config.segments = {rc.rank() == ranks - 1 ? 40 : 96};
                                      spec.device = Device::cpu;
                                      Comm comm = CommAccess::borrow(rc);
                                      try {
                                        (void)make_engine(spec, comm);
                                      } catch (const InputError& e) {
                                        if (e.subject() == "config.segments" &&
                                            e.rank() == ranks - 1)
                                          ++raised;
                                      }
                                      return 0;
                                    }),
            0);
  EXPECT_EQ(raised.load(), ranks);
}

TEST(EngineErrors, CpuJobsRefuseGpuFieldsAndDeviceTensorsByName) {
  JobSpec spec;
  spec.config.shape = {1, 32, 2, 16};
  spec.device = Device::cpu;
  spec.dtype = DeviceDType::bf16;
  Comm comm = Comm::single();
  try {
    (void)make_engine(spec, comm);
    ADD_FAILURE() << "bf16 on the CPU was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.subject(), "dtype");
  }
  spec.dtype.reset();
  Engine e = make_engine(spec, comm);
  EXPECT_EQ(e.device(), Device::cpu);
  EXPECT_EQ(e.stats().engine, "Plan");
  std::vector<float> x(static_cast<std::size_t>(spec.config.shape.numel())), lse(64);
  TensorRef host{x.data(), DeviceDType::fp32, Memory::host, nullptr};
  TensorRef device = host;
  device.memory = Memory::device;
  TensorRef half = host;
  half.dtype = DeviceDType::bf16;
  TensorRef l{lse.data(), DeviceDType::fp32, Memory::host, nullptr};
  try {
    e.forward(host, device, host, host, l);
    ADD_FAILURE() << "a device tensor on a CPU engine was accepted";
  } catch (const InputError& err) {
    EXPECT_EQ(err.subject(), "k");
  }
  try {
    e.forward(host, host, half, host, l);
    ADD_FAILURE() << "bf16 on a CPU engine was accepted";
  } catch (const InputError& err) {
    EXPECT_EQ(err.subject(), "v");
  }
}

}  // namespace
}  // namespace ringattn

// The distributed engine under mpiexec (P = 1..4, label `mpi`): every golden case and
// randomized configs give the single-process result within 1e-5, forward and gradients,
// with segments straddling shard boundaries and causal runs in the zigzag layout, and each
// rank's traffic equals the computed minimum. Every rank checks its own shard.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>

#include "golden.hpp"
#include "random.hpp"
#include "ring/communicator.hpp"
#include "ring/ring_engine.hpp"
#include "ringattn/plan.hpp"
#include "ringattn/reference.hpp"

namespace ringattn::ring {
namespace {

Communicator* g_comm = nullptr;
constexpr double kTol = 1e-5;

struct Tensors {
  std::vector<float> q, k, v, dout;
};

// Runs the single-process Plan and the ring on the same inputs; compares this rank's shard.
void compare_with_single_process(const AttentionConfig& cfg, const Tensors& in,
                                 const std::string& what) {
  const Shape4 s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  std::vector<float> out(n), lse(rows), dq(n), dk(n), dv(n);
  Plan single(cfg, PlanOptions{1});
  single.forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  single.backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), in.dout.data(),
                  dq.data(), dk.data(), dv.data());

  RingPlan ring(cfg, *g_comm, PlanOptions{2, 16, 32});
  const ShardLayout& l = ring.layout();
  const int rank = g_comm->rank();
  const int64_t inner = s.heads * s.head_dim;
  const auto ln = static_cast<std::size_t>(s.batch * l.local_len * inner);
  const auto lrows = static_cast<std::size_t>(s.batch * s.heads * l.local_len);
  auto shard = [&](const std::vector<float>& full) {
    std::vector<float> local(ln);
    extract_rows(l, rank, s.batch, inner, full.data(), local.data());
    return local;
  };
  const auto q = shard(in.q), k = shard(in.k), v = shard(in.v), dout = shard(in.dout);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lo(ln, nan), llse(lrows, nan), ldq(ln, nan), ldk(ln, nan), ldv(ln, nan);
  ring.forward(q.data(), k.data(), v.data(), lo.data(), llse.data());
  ring.backward(q.data(), k.data(), v.data(), lo.data(), llse.data(), dout.data(), ldq.data(),
                ldk.data(), ldv.data());

  // The single-process lse, sharded: lse is [B, H, N], positions last.
  std::vector<float> want_lse(lrows);
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(lse.data() + bh * s.seq_len + c.begin, c.length,
                  want_lse.data() + bh * l.local_len + c.local_begin);
  const auto want_out = shard(out), want_dq = shard(dq), want_dk = shard(dk), want_dv = shard(dv);
  const double e_out = relative_error(lo.data(), want_out.data(), ln);
  const double e_lse = relative_error(llse.data(), want_lse.data(), lrows);
  const double e_dq = relative_error(ldq.data(), want_dq.data(), ln);
  const double e_dk = relative_error(ldk.data(), want_dk.data(), ln);
  const double e_dv = relative_error(ldv.data(), want_dv.data(), ln);
  EXPECT_LE(e_out, kTol) << what << " rank " << rank;
  EXPECT_LE(e_lse, kTol) << what << " rank " << rank;
  EXPECT_LE(e_dq, kTol) << what << " rank " << rank;
  EXPECT_LE(e_dk, kTol) << what << " rank " << rank;
  EXPECT_LE(e_dv, kTol) << what << " rank " << rank;
  if (rank == 0)
    std::printf("  %s P=%d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e, sent %lld bytes\n",
                what.c_str(), g_comm->size(), e_out, e_lse, e_dq, e_dk, e_dv,
                static_cast<long long>(ring.last_forward().bytes_sent));
  // Forward traffic equals the independent minimum; the backward moves K/V again and
  // returns as many gradient bytes.
  const int64_t minimum = minimum_bytes_sent(cfg, l, rank);
  EXPECT_EQ(ring.last_forward().bytes_sent, minimum) << what << " rank " << rank;
  EXPECT_EQ(ring.schedule().bytes_sent, minimum);
}

class RingGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(RingGolden, EqualsSingleProcess) {
  const auto c = testing::load_golden(GetParam());
  if (c.cfg.shape.seq_len % ((c.cfg.causal ? 2 : 1) * g_comm->size()) != 0)
    GTEST_SKIP() << "N=" << c.cfg.shape.seq_len << " does not split over P=" << g_comm->size();
  compare_with_single_process(c.cfg, {c.q, c.k, c.v, c.dout}, c.name);
  // And the golden answer itself, gathered: covered by comparing with the single process,
  // which the kernel tests check against the golden files.
}

std::vector<std::string> dilated_cases() {
  auto g = testing::golden_case_names("grouped");
  auto m = testing::golden_case_names("mixture");
  g.insert(g.end(), m.begin(), m.end());
  return g;
}

INSTANTIATE_TEST_SUITE_P(Golden, RingGolden, ::testing::ValuesIn(dilated_cases()),
                         [](const auto& p) { return p.param; });

struct RandomCase {
  const char* name;
  Shape4 shape;
  AttentionKind attention;
  Combine combine;
  std::vector<int64_t> segments, dilations;
};

class RingRandom : public ::testing::TestWithParam<std::tuple<RandomCase, bool>> {};

TEST_P(RingRandom, EqualsSingleProcess) {
  const auto& [rc, causal] = GetParam();
  AttentionConfig cfg;
  cfg.shape = rc.shape;
  cfg.attention = rc.attention;
  cfg.combine = rc.combine;
  cfg.segments = rc.segments;
  cfg.dilations = rc.dilations;
  cfg.causal = causal;
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  Tensors in{testing::random_normal(n, 1), testing::random_normal(n, 2),
             testing::random_normal(n, 3), testing::random_normal(n, 4)};
  compare_with_single_process(cfg, in, std::string(rc.name) + (causal ? "_causal" : ""));
}

// N = 240 splits over 1..4 ranks (and 2P for zigzag: 2, 4, 6, 8).
INSTANTIATE_TEST_SUITE_P(Configs, RingRandom,
                         ::testing::Combine(::testing::Values(RandomCase{"dense_D64",
                                                                         {2, 240, 3, 64},
                                                                         AttentionKind::dense,
                                                                         Combine::grouped,
                                                                         {},
                                                                         {}},
                                                              RandomCase{"grouped_straddling",
                                                                         {1, 240, 5, 16},
                                                                         AttentionKind::dilated,
                                                                         Combine::grouped,
                                                                         {16, 48, 240},
                                                                         {1, 3, 7}},
                                                              RandomCase{"mixture_straddling",
                                                                         {1, 240, 4, 24},
                                                                         AttentionKind::dilated,
                                                                         Combine::mixture,
                                                                         {40, 80, 240},
                                                                         {2, 3, 5}},
                                                              RandomCase{"grouped_D128_bigdil",
                                                                         {1, 240, 2, 128},
                                                                         AttentionKind::dilated,
                                                                         Combine::grouped,
                                                                         {120, 240},
                                                                         {1, 300}}),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

}  // namespace
}  // namespace ringattn::ring

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<ringattn::ring::Communicator> comm =
      ringattn::ring::launched_by_mpi() ? ringattn::ring::make_mpi_communicator(&argc, &argv)
                                        : ringattn::ring::make_local_communicator();
  ringattn::ring::g_comm = comm.get();
  // Only rank 0 prints gtest's report; every rank's result decides the exit code.
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  const int64_t worst = comm->max(static_cast<int64_t>(rc));
  if (comm->rank() == 0 && worst != rc)
    std::printf("another rank reported failures (its assertions are printed above)\n");
  comm.reset();
  return static_cast<int>(worst);
}

#include "ring_compare.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>

#include "golden.hpp"
#include "random.hpp"
#include "ring/ring_engine.hpp"
#include "ring/sharding.hpp"
#include "ringattn/plan.hpp"
#include "ringattn/reference.hpp"

namespace ringattn::testing {

FullResult single_process(const AttentionConfig& cfg, const RingInputs& in) {
  const Shape4 s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  FullResult r{std::vector<float>(n), std::vector<float>(rows), std::vector<float>(n),
               std::vector<float>(n), std::vector<float>(n)};
  Plan single(cfg, PlanOptions{1});
  single.forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  single.backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                  r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

void expect_ring_matches(const AttentionConfig& cfg, const RingInputs& in, const FullResult& want,
                         ring::Communicator& comm, const std::string& what, int threads) {
  using ring::Chunk;
  const Shape4 s = cfg.shape;
  ring::RingPlan ring(cfg, comm, PlanOptions{threads, 16, 32});
  const ring::ShardLayout& l = ring.layout();
  const int rank = comm.rank();
  const int64_t inner = s.heads * s.head_dim;
  const auto ln = static_cast<std::size_t>(s.batch * l.local_len * inner);
  const auto lrows = static_cast<std::size_t>(s.batch * s.heads * l.local_len);
  auto shard = [&](const std::vector<float>& full) {
    std::vector<float> local(ln);
    ring::extract_rows(l, rank, s.batch, inner, full.data(), local.data());
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
      std::copy_n(want.lse.data() + bh * s.seq_len + c.begin, c.length,
                  want_lse.data() + bh * l.local_len + c.local_begin);
  const double e_out = relative_error(lo.data(), shard(want.out).data(), ln);
  const double e_lse = relative_error(llse.data(), want_lse.data(), lrows);
  const double e_dq = relative_error(ldq.data(), shard(want.dq).data(), ln);
  const double e_dk = relative_error(ldk.data(), shard(want.dk).data(), ln);
  const double e_dv = relative_error(ldv.data(), shard(want.dv).data(), ln);
  EXPECT_LE(e_out, kRingTolerance) << what << " rank " << rank;
  EXPECT_LE(e_lse, kRingTolerance) << what << " rank " << rank;
  EXPECT_LE(e_dq, kRingTolerance) << what << " rank " << rank;
  EXPECT_LE(e_dk, kRingTolerance) << what << " rank " << rank;
  EXPECT_LE(e_dv, kRingTolerance) << what << " rank " << rank;
  if (rank == 0)
    std::printf("  %s P=%d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e, sent %lld bytes\n",
                what.c_str(), comm.size(), e_out, e_lse, e_dq, e_dk, e_dv,
                static_cast<long long>(ring.last_forward().bytes_sent));
  // Forward traffic equals the independent minimum; the backward moves K/V again and
  // returns as many gradient bytes.
  const int64_t minimum = ring::minimum_bytes_sent(cfg, l, rank);
  EXPECT_EQ(ring.last_forward().bytes_sent, minimum) << what << " rank " << rank;
  EXPECT_EQ(ring.schedule().bytes_sent, minimum) << what << " rank " << rank;
}

std::vector<std::string> ring_golden_cases() {
  auto g = golden_case_names("grouped");
  auto m = golden_case_names("mixture");
  g.insert(g.end(), m.begin(), m.end());
  return g;
}

std::vector<RandomRingCase> random_ring_cases() {
  return {
      {"dense_D64", {2, 240, 3, 64}, AttentionKind::dense, Combine::grouped, {}, {}},
      {"grouped_straddling",
       {1, 240, 5, 16},
       AttentionKind::dilated,
       Combine::grouped,
       {16, 48, 240},
       {1, 3, 7}},
      {"mixture_straddling",
       {1, 240, 4, 24},
       AttentionKind::dilated,
       Combine::mixture,
       {40, 80, 240},
       {2, 3, 5}},
      {"grouped_D128_bigdil",
       {1, 240, 2, 128},
       AttentionKind::dilated,
       Combine::grouped,
       {120, 240},
       {1, 300}},
  };
}

AttentionConfig config_of(const RandomRingCase& c, bool causal) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  cfg.attention = c.attention;
  cfg.combine = c.combine;
  cfg.segments = c.segments;
  cfg.dilations = c.dilations;
  cfg.causal = causal;
  return cfg;
}

RingInputs random_inputs(const AttentionConfig& cfg) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  return {random_normal(n, 1), random_normal(n, 2), random_normal(n, 3), random_normal(n, 4)};
}

}  // namespace ringattn::testing

// The distributed engine under mpiexec (P = 1..4, label `mpi`): every golden case and
// randomized configs give the single-process result within 1e-5, forward and gradients,
// with segments straddling shard boundaries and causal runs in the zigzag layout, and each
// rank's traffic equals the computed minimum. Every rank checks its own shard.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "golden.hpp"
#include "mpi_gtest_main.hpp"
#include "ring/communicator.hpp"
#include "ring_compare.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

using testing::expect_ring_matches;
using testing::single_process;

Communicator* g_comm = nullptr;
constexpr int kThreads = 2;  // per rank

class RingGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(RingGolden, EqualsSingleProcess) {
  const auto c = testing::load_golden(GetParam());
  if (c.cfg.shape.seq_len % g_comm->size() != 0)
    GTEST_SKIP() << "N=" << c.cfg.shape.seq_len << " does not split over P=" << g_comm->size();
  const testing::RingInputs in{c.q, c.k, c.v, c.dout};
  // The single-process result is checked against the golden files by the kernel tests.
  expect_ring_matches(c.cfg, in, single_process(c.cfg, in), *g_comm, c.name, kThreads);
}

INSTANTIATE_TEST_SUITE_P(Golden, RingGolden, ::testing::ValuesIn(testing::ring_golden_cases()),
                         [](const auto& p) { return p.param; });

class RingRandom : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(RingRandom, EqualsSingleProcess) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_ring_matches(cfg, in, single_process(cfg, in), *g_comm,
                      std::string(rc.name) + (causal ? "_causal" : ""), kThreads);
}

INSTANTIATE_TEST_SUITE_P(Configs, RingRandom,
                         ::testing::Combine(::testing::ValuesIn(testing::random_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Grouped-query attention: forward and gradients against float64, bytes equal the minimum.
class RingGqa : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(RingGqa, MatchesFloat64Reference) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_ring_matches(cfg, in, testing::float64_reference(cfg, in), *g_comm,
                      std::string(rc.name) + (causal ? "_causal" : ""), kThreads);
}

INSTANTIATE_TEST_SUITE_P(Configs, RingGqa,
                         ::testing::Combine(::testing::ValuesIn(testing::gqa_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Sliding window: forward and gradients against float64, bytes equal the minimum.
class RingWindow : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(RingWindow, MatchesFloat64Reference) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_ring_matches(cfg, in, testing::float64_reference(cfg, in), *g_comm,
                      std::string(rc.name) + (causal ? "_causal" : ""), kThreads);
}

INSTANTIATE_TEST_SUITE_P(Configs, RingWindow,
                         ::testing::Combine(::testing::ValuesIn(testing::window_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Values of their own head dim and soft-capped logits: forward and gradients against
// float64, bytes (K rows of D, V rows of Dv) equal the minimum.
class RingMlaSoftcap
    : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(RingMlaSoftcap, MatchesFloat64Reference) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_ring_matches(cfg, in, testing::float64_reference(cfg, in), *g_comm,
                      std::string(rc.name) + (causal ? "_causal" : ""), kThreads);
}

INSTANTIATE_TEST_SUITE_P(Configs, RingMlaSoftcap,
                         ::testing::Combine(::testing::ValuesIn(testing::mla_softcap_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Packed sequences: forward and gradients against float64, bytes equal the minimum.
class RingPacked : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(RingPacked, MatchesFloat64Reference) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  if (cfg.shape.seq_len % g_comm->size() != 0) GTEST_SKIP() << "N does not split over P ranks";
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_ring_matches(cfg, in, testing::float64_reference(cfg, in), *g_comm,
                      std::string(rc.name) + (causal ? "_causal" : ""), kThreads);
}

INSTANTIATE_TEST_SUITE_P(Configs, RingPacked,
                         ::testing::Combine(::testing::ValuesIn(testing::packed_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// A rank that is late to a collective (as one behind a dead link would be) makes the others
// give up after the collective timeout with a RuntimeFailure, not wait forever; once the
// late rank arrives the pending collective completes and the job goes on.
TEST(RingCollectives, BarrierGivesUpAfterTheTimeout) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  g_comm->set_collective_timeout(0.3);
  if (g_comm->rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      g_comm->barrier();
      ADD_FAILURE() << "the barrier returned while rank 1 was away";
    } catch (const RuntimeFailure& e) {
      EXPECT_NE(std::string(e.what()).find("barrier did not complete within 0.3 s (timeout_s)"),
                std::string::npos)
          << e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 0.3);
    EXPECT_LT(s, 2.0);  // generous: CI cores are shared
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    g_comm->barrier();  // matches rank 0's abandoned barrier
  }
  g_comm->set_collective_timeout(60);
  EXPECT_EQ(g_comm->max(int64_t{g_comm->rank()}), g_comm->size() - 1);
}

}  // namespace
}  // namespace ringattn::ring

int main(int argc, char** argv) {
  return ringattn::testing::run_gtests_on_ranks(argc, argv, ringattn::ring::g_comm);
}

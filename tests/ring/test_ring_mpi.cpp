// The distributed engine under mpiexec (P = 1..4, label `mpi`): every golden case and
// randomized configs give the single-process result within 1e-5, forward and gradients,
// with segments straddling shard boundaries and causal runs in the zigzag layout, and each
// rank's traffic equals the computed minimum. Every rank checks its own shard.
#include <gtest/gtest.h>

#include <cstdio>

#include "golden.hpp"
#include "mpi_gtest_main.hpp"
#include "ring/communicator.hpp"
#include "ring_compare.hpp"

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

}  // namespace
}  // namespace ringattn::ring

int main(int argc, char** argv) {
  return ringattn::testing::run_gtests_on_ranks(argc, argv, ringattn::ring::g_comm);
}

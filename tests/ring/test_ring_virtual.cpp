// Virtual ranks (label `ring`): the real RingPlan on P = 1..4 in-process ranks gives the
// single-process result within 1e-5 for every golden case and the randomized configs,
// forward and gradients, with forward bytes equal to the minimum on every rank; and the
// abort semantics: a failing or stalled virtual rank ends all of them promptly, with the
// reason, and never hangs. And the ring protocol alone, over a backend that checks when each
// buffer half is reused (P = 1..6).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "golden.hpp"
#include "ring/inproc_communicator.hpp"
#include "ring/ring_engine.hpp"
#include "ring/ring_protocol.hpp"
#include "ring_compare.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

using testing::expect_ring_matches;

// The reference once (the single-process plan unless given), then the ring on P = 1..4
// virtual ranks (one thread each).
void expect_all_ring_sizes_match(const AttentionConfig& cfg, const testing::RingInputs& in,
                                 const std::string& what,
                                 std::optional<testing::FullResult> reference = {}) {
  const testing::FullResult want = reference ? *reference : testing::single_process(cfg, in);
  for (int p = 1; p <= 4; ++p) {
    if (cfg.shape.seq_len % p != 0) continue;  // N % 2P need not be 0: balanced layout
    const int code = run_virtual_ranks(p, [&](Communicator& comm) {
      expect_ring_matches(cfg, in, want, comm, what, 1);
      return 0;
    });
    EXPECT_EQ(code, 0) << what << " P=" << p;
  }
}

class VirtualRingGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(VirtualRingGolden, EqualsSingleProcessForRingSizes1To4) {
  const auto c = testing::load_golden(GetParam());
  expect_all_ring_sizes_match(c.cfg, {c.q, c.k, c.v, c.dout}, c.name);
}

INSTANTIATE_TEST_SUITE_P(Golden, VirtualRingGolden,
                         ::testing::ValuesIn(testing::ring_golden_cases()),
                         [](const auto& p) { return p.param; });

class VirtualRingRandom
    : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(VirtualRingRandom, EqualsSingleProcessForRingSizes1To4) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  expect_all_ring_sizes_match(cfg, testing::random_inputs(cfg),
                              std::string(rc.name) + (causal ? "_causal" : ""));
}

INSTANTIATE_TEST_SUITE_P(Configs, VirtualRingRandom,
                         ::testing::Combine(::testing::ValuesIn(testing::random_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Grouped-query attention: only K/V heads travel (bytes equal the minimum, which counts K/V
// heads), dK/dV partials return per K/V head; forward and gradients against float64.
class VirtualRingGqa : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {
};

TEST_P(VirtualRingGqa, MatchesFloat64ReferenceForRingSizes1To4) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_all_ring_sizes_match(cfg, in, std::string(rc.name) + (causal ? "_causal" : ""),
                              testing::float64_reference(cfg, in));
}

INSTANTIATE_TEST_SUITE_P(Configs, VirtualRingGqa,
                         ::testing::Combine(::testing::ValuesIn(testing::gqa_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Sliding window: a rank exchanges only with the ranks within reach (bytes equal the
// minimum, which counts only positions within the window of another rank's queries);
// forward and gradients against float64.
class VirtualRingWindow
    : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(VirtualRingWindow, MatchesFloat64ReferenceForRingSizes1To4) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_all_ring_sizes_match(cfg, in, std::string(rc.name) + (causal ? "_causal" : ""),
                              testing::float64_reference(cfg, in));
}

INSTANTIATE_TEST_SUITE_P(Configs, VirtualRingWindow,
                         ::testing::Combine(::testing::ValuesIn(testing::window_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// [B, H, N, D] tensors (TensorLayout::bhnd): each rank's shard head-major, every feature the
// ring has (dilated grouped and mixture, GQA, windows, packed documents), against float64.
class VirtualRingHeadMajor
    : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(VirtualRingHeadMajor, MatchesFloat64ReferenceForRingSizes1To4) {
  const auto& [rc, causal] = GetParam();
  AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  const testing::FullResult want = testing::float64_reference(cfg, in);
  cfg.layout = TensorLayout::bhnd;
  expect_all_ring_sizes_match(cfg, in, std::string(rc.name) + (causal ? "_causal" : "") + "_bhnd",
                              want);
}

std::vector<testing::RandomRingCase> head_major_cases() {
  // Grouped and mixture dilation with segments straddling shards, GQA under mixture (whose
  // returned partials share rows), a window across shards with GQA, packed documents with a
  // window and MQA, and N = 252 (the balanced layout at P = 4 when causal).
  const std::vector<std::string> names{"grouped_straddling", "mixture_straddling",
                                       "gqa_mixture_half",   "window_70_gqa",
                                       "packed_window_mqa",  "packed_n252"};
  std::vector<testing::RandomRingCase> v;
  for (const auto& list : {testing::random_ring_cases(), testing::gqa_ring_cases(),
                           testing::window_ring_cases(), testing::packed_ring_cases()})
    for (const auto& c : list)
      if (std::find(names.begin(), names.end(), c.name) != names.end()) v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Configs, VirtualRingHeadMajor,
                         ::testing::Combine(::testing::ValuesIn(head_major_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Packed sequences: only documents that span ranks cause traffic (bytes equal the
// minimum); causal runs take the balanced layout where the usual one is out of balance.
class VirtualRingPacked
    : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(VirtualRingPacked, MatchesFloat64ReferenceForRingSizes1To4) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_all_ring_sizes_match(cfg, in, std::string(rc.name) + (causal ? "_causal" : ""),
                              testing::float64_reference(cfg, in));
}

INSTANTIATE_TEST_SUITE_P(Configs, VirtualRingPacked,
                         ::testing::Combine(::testing::ValuesIn(testing::packed_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// Values of their own head dim (K and V rows of different widths on the wire; bytes still
// the minimum) and soft-capped logits, against float64.
class VirtualRingMlaSoftcap
    : public ::testing::TestWithParam<std::tuple<testing::RandomRingCase, bool>> {};

TEST_P(VirtualRingMlaSoftcap, MatchesFloat64ReferenceForRingSizes1To4) {
  const auto& [rc, causal] = GetParam();
  const AttentionConfig cfg = testing::config_of(rc, causal);
  const testing::RingInputs in = testing::random_inputs(cfg);
  expect_all_ring_sizes_match(cfg, in, std::string(rc.name) + (causal ? "_causal" : ""),
                              testing::float64_reference(cfg, in));
}

INSTANTIATE_TEST_SUITE_P(Configs, VirtualRingMlaSoftcap,
                         ::testing::Combine(::testing::ValuesIn(testing::mla_softcap_ring_cases()),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  (std::get<1>(p.param) ? "_causal" : "");
                         });

// ---- the communicator itself ------------------------------------------------------------

TEST(VirtualRanks, CollectivesAndPointToPointFollowTheCommunicatorContract) {
  const int code = run_virtual_ranks(3, [](Communicator& comm) {
    const int r = comm.rank(), p = comm.size();
    EXPECT_EQ(p, 3);
    EXPECT_EQ(comm.max(int64_t{10 * r}), 20);
    EXPECT_EQ(comm.max(-1.5 * r), 0.0);
    const int64_t mine = 100 + r;
    std::vector<int64_t> all(r == 0 ? 3 : 0);
    comm.gather(&mine, sizeof mine, all.data());
    if (r == 0) {
      EXPECT_EQ(all, (std::vector<int64_t>{100, 101, 102}));
    }
    const auto infos = comm.gather_info({"host", 1, r, "dev" + std::to_string(r)});
    if (r == 0) {
      EXPECT_EQ(infos.size(), 3u);
      EXPECT_EQ(infos[2].device, "dev2");
    }
    // Two messages with the same tag from the same peer match in posting order.
    std::vector<float> out1(4, float(r)), out2(4, float(10 + r)), in1(4), in2(4);
    const Transfer s1{(r + 1) % p, out1.data(), 16}, s2{(r + 1) % p, out2.data(), 16};
    const Transfer r1{(r + p - 1) % p, in1.data(), 16}, r2{(r + p - 1) % p, in2.data(), 16};
    auto a = comm.start(std::span(&s1, 1), std::span(&r1, 1), 5);
    auto b = comm.start(std::span(&s2, 1), std::span(&r2, 1), 5);
    while (!a->test() || !b->test()) std::this_thread::yield();
    EXPECT_EQ(in1[0], float((r + p - 1) % p));
    EXPECT_EQ(in2[3], float(10 + (r + p - 1) % p));
    int64_t token = r == 2 ? 4242 : 0;
    comm.broadcast(&token, sizeof token, 2);
    EXPECT_EQ(token, 4242);
    comm.barrier();
    return r;  // the job's code is the largest
  });
  EXPECT_EQ(code, 2);
}

// Two same-sized messages (K then V) to one peer in one exchange: the receiver tests in a
// tight loop while the sender posts, so a send can land between its two match attempts. A
// later receive must never take the earlier send (it did, 1 run in ~10 of the block-sparse
// virtual-rank tests with 2 threads per rank, swapping K and V silently).
TEST(VirtualRanks, ReceivesFromOneSourceNeverOvertakeEachOther) {
  for (int round = 0; round < 60; ++round) {
    const int code = run_virtual_ranks(2, [round](Communicator& comm) {
      std::vector<float> k(8, 1.0f + static_cast<float>(round)), v(8, -1.0f), in_k(8), in_v(8);
      if (comm.rank() == 0) {
        for (int spin = 0; spin < round % 64; ++spin) std::this_thread::yield();
        const Transfer sends[] = {{1, k.data(), 32}, {1, v.data(), 32}};
        auto ex = comm.start(sends, {}, 3);
        while (!ex->test()) std::this_thread::yield();
      } else {
        const Transfer recvs[] = {{0, in_k.data(), 32}, {0, in_v.data(), 32}};
        auto ex = comm.start({}, recvs, 3);
        while (!ex->test()) {
        }
        EXPECT_EQ(in_k[0], 1.0f + static_cast<float>(round)) << "round " << round;
        EXPECT_EQ(in_v[0], -1.0f) << "round " << round;
        if (in_v[0] != -1.0f) return 1;
      }
      return 0;
    });
    ASSERT_EQ(code, 0) << "round " << round;
  }
}

TEST(VirtualRanks, OneFailingRankEndsAllOfThemPromptlyWithItsCode) {
  // Rank 1 aborts while the others wait in a collective and in an exchange that can never
  // complete: all of them must return.
  const auto t0 = std::chrono::steady_clock::now();
  const int code = run_virtual_ranks(3, [](Communicator& comm) {
    if (comm.rank() == 1) comm.abort(7);
    if (comm.rank() == 0) comm.barrier();
    float x = 0;
    const Transfer never{1, &x, sizeof x};
    auto ex = comm.start({}, std::span(&never, 1), 9);
    for (;;) ex->test();
    return 0;
  });
  EXPECT_EQ(code, 7);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST(VirtualRanks, AnExceptionEscapingARankAbortsTheJobWithExit3) {
  const int code = run_virtual_ranks(2, [](Communicator& comm) -> int {
    if (comm.rank() == 0) throw RuntimeFailure("boom");
    comm.barrier();
    return 0;
  });
  EXPECT_EQ(code, 3);
}

TEST(VirtualRanks, StalledRankIsCaughtByTheWatchdogAndReleasedByTheAbort) {
  AttentionConfig cfg;
  cfg.shape = {1, 64, 2, 16};
  const testing::RingInputs in = testing::random_inputs(cfg);
  std::string reason;
  const auto t0 = std::chrono::steady_clock::now();
  const int code = run_virtual_ranks(2, [&](Communicator& comm) {
    RingOptions opts;
    opts.timeout_s = 0.5;
    opts.fault = FaultInjection::parse("rank=1,step=1,mode=stall");
    RingPlan ring(cfg, comm, PlanOptions{1}, opts);
    std::vector<float> out(in.q.size() / 2), lse(64);
    try {
      ring.forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
    } catch (const RuntimeFailure& e) {
      reason = e.what();  // rank 0's watchdog
      comm.abort(3);
    }
    return 0;
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(code, 3);
  EXPECT_NE(reason.find("ring step 1 (forward K/V) did not complete within 0.5 s"),
            std::string::npos)
      << reason;
  EXPECT_LT(s, 2.0);
}

// The ring protocol alone (ring_protocol.hpp), over a backend that only checks what the
// protocol asks of it: no buffer half is packed, cleared, computed from or exchanged while
// an exchange that uses it may still be in flight; every exchange is waited for by the end
// of the call; returned partials are added in step order; progress runs 0..P.
class CheckingRingBackend {
 public:
  CheckingRingBackend() {
    for (auto& b : mem_)
      for (auto& h : b) h.resize(kBytes);
  }

  int64_t head_dim() const { return 4; }
  int64_t head_dim_v() const { return 4; }
  std::size_t kv_elem_bytes() const { return 2; }
  void* buffer(RingBuffer which, int t) {
    return mem_[static_cast<int>(which)][static_cast<std::size_t>(t % 2)].data();
  }

  void pack(int t, const void*, const void*) { use(buffer(RingBuffer::send, t), "pack", t); }
  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int, int step, const char*) {
    if (sends.empty() && recvs.empty()) return -1;
    std::vector<Half> uses;
    for (const auto* list : {&sends, &recvs})
      for (const Transfer& x : *list) {
        use(x.data, "post", step);
        uses.push_back(half_of(x.data));
      }
    open_[next_ticket_] = uses;
    return next_ticket_++;
  }
  void wait(int ticket) {
    if (ticket < 0) return;
    EXPECT_EQ(open_.erase(ticket), 1u) << "ticket " << ticket;
  }
  void compute_forward(int t, const void* k, const void*) {
    if (t > 0) use(k, "forward compute", t);
  }
  void compute_backward(int t, const void* k, const void*, float* dk, float*) {
    if (t > 0) use(k, "backward compute", t), use(dk, "backward compute", t);
  }
  void clear(float* p, int64_t) { use(p, "clear", -1); }
  void add_returned(int t, float*, float*) {
    use(buffer(RingBuffer::returned, t), "add", t);
    added.push_back(t);
  }

  std::size_t open_exchanges() const { return open_.size(); }
  std::vector<int> added;

 private:
  static constexpr std::size_t kBytes = 1024;
  using Half = std::pair<int, int>;  // (buffer, half)

  Half half_of(const void* p) const {
    const auto* c = static_cast<const char*>(p);
    for (int b = 0; b < 4; ++b)
      for (int h = 0; h < 2; ++h) {
        const char* base = mem_[b][h].data();
        if (c >= base && c < base + kBytes) return {b, h};
      }
    ADD_FAILURE() << "a pointer outside the plan's buffers";
    return {-1, -1};
  }
  void use(const void* p, const char* what, int step) {
    const Half h = half_of(p);
    for (const auto& [ticket, uses] : open_)
      for (const Half& u : uses)
        EXPECT_NE(u, h) << what << (step >= 0 ? " at step " + std::to_string(step) : "")
                        << " used half " << h.second << " of buffer " << h.first
                        << " while exchange " << ticket << " may be using it";
  }

  std::vector<char> mem_[4][2];
  std::map<int, std::vector<Half>> open_;
  int next_ticket_ = 0;
};

// A schedule with every shape of step: sends and receives, only one of them, or neither.
RingSchedule checking_schedule(int rank, int world) {
  RingSchedule s;
  s.steps.resize(static_cast<std::size_t>(world));
  for (int t = 1; t < world; ++t) {
    RingStep& st = s.steps[static_cast<std::size_t>(t)];
    if ((rank + t) % 3 != 2) st.send_to = (rank + t) % world, st.send_rows = 3;
    if ((rank + 2 * t) % 4 != 3) st.recv_from = (rank - t + world) % world, st.recv_rows = 5;
  }
  return s;
}

TEST(RingProtocol, NoBufferHalfIsReusedBeforeItsExchangeIsWaitedFor) {
  for (int world = 1; world <= 6; ++world) {
    const int code = run_virtual_ranks(world, [&](Communicator& comm) {
      const RingSchedule sched = checking_schedule(comm.rank(), world);
      std::vector<std::pair<int, int>> progress;
      RingOptions opts;
      opts.fault = {};
      opts.on_step = [&](int done, int steps) { progress.emplace_back(done, steps); };
      const RingProtocol protocol(sched, comm, opts);
      const float local[4] = {};
      float grad[4] = {};
      for (const bool backward : {false, true}) {
        CheckingRingBackend b;
        RingTimings tm;
        progress.clear();
        if (backward)
          protocol.backward(b, local, local, grad, grad, tm);
        else
          protocol.forward(b, local, local, tm);
        const std::string what = std::string(backward ? "backward" : "forward") + " on rank " +
                                 std::to_string(comm.rank()) + " of " + std::to_string(world);
        EXPECT_EQ(b.open_exchanges(), 0u) << what << ": exchanges never waited for";
        std::vector<int> want_added;
        std::vector<std::pair<int, int>> want_progress;
        for (int t = 0; t <= world; ++t) want_progress.emplace_back(t, world);
        for (int t = 1; backward && t < world; ++t)
          if (sched.steps[static_cast<std::size_t>(t)].send_to >= 0) want_added.push_back(t);
        EXPECT_EQ(b.added, want_added) << what;
        EXPECT_EQ(progress, want_progress) << what;
      }
      return 0;
    });
    EXPECT_EQ(code, 0) << "P=" << world;
  }
}

}  // namespace
}  // namespace ringattn::ring

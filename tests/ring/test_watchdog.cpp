// The watchdog and fault injection without any launcher: an exchange that never completes
// makes ProgressThread::wait throw after the timeout (not before, not never), naming the
// step, the peers and the backend's own reason, after asking the backend to cancel; and the
// RINGATTN_FAULT_INJECT grammar, which must reject what it does not understand.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ring/fault_injection.hpp"
#include "ring/progress_thread.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {
namespace {

// A backend whose exchanges complete only when told to.
class StuckCommunicator final : public Communicator {
 public:
  std::atomic<bool> release{false};
  std::atomic<int> cancels{0};
  class Pending final : public PendingExchange {
   public:
    explicit Pending(const std::atomic<bool>& r) : release_(r) {}
    bool test() override { return release_.load(); }

   private:
    const std::atomic<bool>& release_;
  };
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  std::string library_version() const override { return "stuck"; }
  std::unique_ptr<PendingExchange> start(std::span<const Transfer>, std::span<const Transfer>,
                                         int) override {
    return std::make_unique<Pending>(release);
  }
  void barrier() override {}
  int64_t max(int64_t v) override { return v; }
  double max(double v) override { return v; }
  void gather(const void*, std::size_t, void*) override {}
  std::vector<RankInfo> gather_info(const RankInfo& mine) override { return {mine}; }
  void broadcast(void*, std::size_t, int) override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  std::string cancel_in_flight() override {
    ++cancels;
    return "stuck backend: cancelled";
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Watchdog, ExchangeThatNeverCompletesThrowsAfterTheTimeoutNamingStepAndPeers) {
  StuckCommunicator comm;
  ProgressThread progress(comm, 0.3);
  float buf[4] = {};
  const int ticket =
      progress.post({{1, buf, sizeof buf}}, {{1, buf, sizeof buf}}, 7, 3, "forward K/V");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    progress.wait(ticket);
    FAIL() << "wait returned for an exchange that never completed";
  } catch (const RuntimeFailure& e) {
    const double s = seconds_since(t0);
    const std::string msg = e.what();
    EXPECT_GE(s, 0.3);
    EXPECT_LT(s, 1.0) << msg;
    EXPECT_NE(msg.find("ring step 3 (forward K/V) did not complete within 0.3 s"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("receiving 16 bytes from rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stuck backend: cancelled"), std::string::npos) << msg;
    EXPECT_EQ(comm.cancels.load(), 1);
  }
}

TEST(Watchdog, DeadlineCountsFromTheWaitNotFromThePost) {
  // A step posted early stays in flight while the previous step computes; only the time a
  // compute thread actually waits counts.
  StuckCommunicator comm;
  ProgressThread progress(comm, 0.3);
  float buf[4] = {};
  const int ticket = progress.post({{1, buf, sizeof buf}}, {}, 0, 1, "forward K/V");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // "compute"
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comm.release = true;
  });
  EXPECT_NO_THROW(progress.wait(ticket));
  releaser.join();
  EXPECT_EQ(comm.cancels.load(), 0);
}

TEST(FaultInjection, ParsesFailAndStallModes) {
  const FaultInjection a = FaultInjection::parse("rank=1,step=2");
  EXPECT_EQ(a.rank, 1);
  EXPECT_EQ(a.step, 2);
  EXPECT_EQ(a.mode, FaultInjection::Mode::fail);
  const FaultInjection b = FaultInjection::parse("rank=0,step=3,mode=stall");
  EXPECT_EQ(b.rank, 0);
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(b.mode, FaultInjection::Mode::stall);
  EXPECT_EQ(FaultInjection::parse("rank=2,step=1,mode=fail").mode, FaultInjection::Mode::fail);
  EXPECT_EQ(FaultInjection::parse("").rank, -1);
}

TEST(FaultInjection, RejectsWhatItDoesNotUnderstand) {
  for (const char* bad : {"rank=1", "rank=1,step=x", "rank=1,step=2,mode=hang",
                          "rank=1,step=2,mode=stall,extra", "rank=-1,step=0", "step=1,rank=1"}) {
    try {
      FaultInjection::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_EQ(e.subject(), "RINGATTN_FAULT_INJECT") << bad;
    }
  }
}

TEST(FaultInjection, FailModeThrowsOnlyAtItsRankAndStep) {
  const FaultInjection f = FaultInjection::parse("rank=1,step=2");
  EXPECT_NO_THROW(f.fail_if_due(0, 2));
  EXPECT_NO_THROW(f.fail_if_due(1, 1));
  EXPECT_THROW(f.fail_if_due(1, 2), RuntimeFailure);
  const FaultInjection s = FaultInjection::parse("rank=1,step=2,mode=stall");
  EXPECT_NO_THROW(s.fail_if_due(1, 2));
}

}  // namespace
}  // namespace ringattn::ring

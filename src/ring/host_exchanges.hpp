// Exchanges of a host communicator for the CPU backends of the ring and block-sparse
// protocols (ring_engine.cpp, sparse/sparse_plan.cpp): posted to the communication thread,
// waited for on the host, and timed; the device counterpart is stream_exchanges.hpp.
#pragma once

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/progress_thread.hpp"
#include "ring/ring_engine.hpp"

namespace ringattn::ring {

// Adds the time from its construction to its end to `ms`.
class ScopedMs {
 public:
  explicit ScopedMs(double& ms) : ms_(ms), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedMs() {
    ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }
  ScopedMs(const ScopedMs&) = delete;
  ScopedMs& operator=(const ScopedMs&) = delete;

 private:
  double& ms_;
  std::chrono::steady_clock::time_point t0_;
};

class HostExchanges {
 public:
  HostExchanges() = default;
  // With one rank there is no communication thread and post() must not be called.
  HostExchanges(Communicator& comm, double timeout_s)
      : progress_(comm.size() > 1 ? std::make_unique<ProgressThread>(comm, timeout_s) : nullptr) {}

  // Returns a ticket for wait() (-1 when both lists are empty).
  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag, int step,
           const char* what) {
    return progress_->post(std::move(sends), std::move(recvs), tag, step, what);
  }

  // Blocks until exchange `ticket` completed (-1: returns at once). Its time in flight adds
  // to tm.comm_ms, the time this call blocked (the exposed communication) to tm.exposed_ms.
  void wait(int ticket, RingTimings& tm) {
    const ScopedMs exposed(tm.exposed_ms);
    tm.comm_ms += progress_->wait(ticket);
  }

 private:
  std::unique_ptr<ProgressThread> progress_;
};

}  // namespace ringattn::ring

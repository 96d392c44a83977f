// The communication thread: it posts each step's grouped sends and receives and keeps
// polling them while the compute threads work, so transfers make progress during compute
// (MPI does not progress a nonblocking transfer that nobody tests). During the ring loop it
// is the only thread that calls the communicator, which needs MPI_THREAD_SERIALIZED only.
// It is also the watchdog: an exchange that a compute thread has waited on for longer than
// the timeout is cancelled and reported (rank, step, peers, library error), never waited on
// forever.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ring/communicator.hpp"

namespace ringattn::ring {

inline constexpr double kDefaultTimeoutSeconds = 300;

class ProgressThread {
 public:
  // `timeout_s`: how long wait() may block on one exchange before the watchdog fires.
  ProgressThread(Communicator& comm, double timeout_s = kDefaultTimeoutSeconds);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Queues one step's exchange; returns a ticket for wait(). Empty exchanges get ticket -1.
  // `step` and `what` (a string literal, e.g. "forward K/V") only label error messages.
  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag, int step = -1,
           const char* what = "exchange");
  // Device backends: as post(), and the exchange starts (on the communication stream) only
  // after `device_event` (a cudaEventRecord of the caller's compute stream: send buffers
  // written, receive buffers no longer read).
  int post_after(void* device_event, std::vector<Transfer> sends, std::vector<Transfer> recvs,
                 int tag, int step, const char* what);
  // Device backends: blocks only until the exchange is enqueued on the communication stream,
  // then calls `use(event)` with its completion event (a cudaEvent_t), or with null if it
  // has completed already; `use` makes the compute stream wait for it. The watchdog's
  // deadline starts here, and the exchange must still be wait()ed for later (its failures
  // surface there).
  void when_enqueued(int ticket, const std::function<void(void*)>& use);
  // Blocks until the exchange completed; returns the milliseconds it was in flight.
  // Rethrows an error the communication thread met; throws RuntimeFailure naming the step
  // and peers when the exchange did not complete within the timeout.
  double wait(int ticket);

 private:
  struct Job {
    std::vector<Transfer> sends, recvs;
    int tag = 0;
    int step = -1;
    const char* what = "";
    void* device_wait = nullptr;  // stream_wait() before start()
    std::unique_ptr<PendingExchange> pending;
    double posted_at = 0, done_at = 0;
    double deadline = std::numeric_limits<double>::infinity();  // set when waited on
    bool done = false;
    bool waited = false;
  };
  void loop();
  std::string timeout_message(const Job& j) const;

  Communicator& comm_;
  double timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // indexed by ticket - first_ticket_
  int first_ticket_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ringattn::ring

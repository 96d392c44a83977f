// The communication thread: it posts each step's grouped sends and receives and keeps
// polling them while the compute threads work, so transfers make progress during compute
// (MPI does not progress a nonblocking transfer that nobody tests). During the ring loop it
// is the only thread that calls the communicator, which needs MPI_THREAD_SERIALIZED only.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "ring/communicator.hpp"

namespace ringattn::ring {

class ProgressThread {
 public:
  explicit ProgressThread(Communicator& comm);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Queues one step's exchange; returns a ticket for wait(). Empty exchanges get ticket -1.
  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag);
  // Blocks until the exchange completed; returns the milliseconds it was in flight.
  // Rethrows an error the communication thread met.
  double wait(int ticket);

 private:
  struct Job {
    std::vector<Transfer> sends, recvs;
    int tag = 0;
    std::unique_ptr<PendingExchange> pending;
    double posted_at = 0, done_at = 0;
    bool done = false;
    bool waited = false;
  };
  void loop();

  Communicator& comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // indexed by ticket - first_ticket_
  int first_ticket_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ringattn::ring

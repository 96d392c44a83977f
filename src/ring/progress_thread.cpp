// Polling communication thread: starts queued exchanges, tests active ones every ~20 µs
// (cheap enough not to steal a core from compute), sleeps when idle.
#include "ring/progress_thread.hpp"

#include <chrono>

namespace ringattn::ring {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ProgressThread::ProgressThread(Communicator& comm) : comm_(comm), thread_([this] { loop(); }) {}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int ProgressThread::post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag) {
  if (sends.empty() && recvs.empty()) return -1;
  std::lock_guard lock(mu_);
  Job j;
  j.sends = std::move(sends);
  j.recvs = std::move(recvs);
  j.tag = tag;
  j.posted_at = now_ms();
  jobs_.push_back(std::move(j));
  cv_.notify_all();
  return first_ticket_ + static_cast<int>(jobs_.size()) - 1;
}

double ProgressThread::wait(int ticket) {
  if (ticket < 0) return 0.0;
  std::unique_lock lock(mu_);
  auto idx = [&] { return static_cast<std::size_t>(ticket - first_ticket_); };
  cv_.wait(lock, [&] { return error_ || jobs_[idx()].done; });
  if (error_) std::rethrow_exception(error_);
  const double ms = jobs_[idx()].done_at - jobs_[idx()].posted_at;
  jobs_[idx()].waited = true;
  // Drop waited-for jobs from the front so the queue stays short.
  while (!jobs_.empty() && jobs_.front().waited) {
    jobs_.pop_front();
    ++first_ticket_;
  }
  return ms;
}

void ProgressThread::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    bool active = false;
    try {
      for (Job& j : jobs_) {
        if (j.done) continue;
        if (!j.pending) j.pending = comm_.start(j.sends, j.recvs, j.tag);
        if (j.pending->test()) {
          j.done = true;
          j.done_at = now_ms();
          j.pending.reset();
          cv_.notify_all();
        } else {
          active = true;
        }
      }
    } catch (...) {
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    if (stop_) return;
    if (active) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    } else {
      cv_.wait(lock, [&] {
        if (stop_) return true;
        for (const Job& j : jobs_)
          if (!j.done) return true;
        return false;
      });
    }
  }
}

}  // namespace ringattn::ring

// Polling communication thread: starts queued exchanges, tests active ones every ~20 µs
// (cheap enough not to steal a core from compute), sleeps when idle. The deadline of an
// exchange starts when a compute thread begins to wait for it (not when it was posted: a
// step posted early legitimately stays in flight while the previous step computes).
#include "ring/progress_thread.hpp"

#include <chrono>
#include <sstream>
#include <utility>

#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// How long wait() gives the communication thread to report a missed deadline itself (it may
// be inside a library call) before wait() reports it alone.
constexpr double kGraceMs = 1000;
}  // namespace

ProgressThread::ProgressThread(Communicator& comm, double timeout_s)
    : comm_(comm), timeout_ms_(timeout_s * 1000.0), thread_([this] { loop(); }) {}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int ProgressThread::post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag,
                         int step, const char* what) {
  return post_after(nullptr, std::move(sends), std::move(recvs), tag, step, what);
}

int ProgressThread::post_after(void* device_event, std::vector<Transfer> sends,
                               std::vector<Transfer> recvs, int tag, int step, const char* what) {
  if (sends.empty() && recvs.empty()) return -1;
  std::lock_guard lock(mu_);
  Job j;
  j.device_wait = device_event;
  j.sends = std::move(sends);
  j.recvs = std::move(recvs);
  j.tag = tag;
  j.step = step;
  j.what = what;
  j.posted_at = now_ms();
  jobs_.push_back(std::move(j));
  cv_.notify_all();
  return first_ticket_ + static_cast<int>(jobs_.size()) - 1;
}

std::string ProgressThread::timeout_message(const Job& j) const {
  std::ostringstream os;
  os << "ring step " << j.step << " (" << j.what << ") did not complete within "
     << timeout_ms_ / 1000.0 << " s (timeout_s): ";
  const char* sep = "";
  for (const Transfer& t : j.recvs)
    os << std::exchange(sep, ", ") << "receiving " << t.bytes << " bytes from rank "
       << comm_.job_rank(t.peer);
  for (const Transfer& t : j.sends)
    os << std::exchange(sep, ", ") << "sending " << t.bytes << " bytes to rank "
       << comm_.job_rank(t.peer);
  os << "; a peer has stalled or died";
  return os.str();
}

void ProgressThread::when_enqueued(int ticket, const std::function<void(void*)>& use) {
  if (ticket < 0) return;
  std::unique_lock lock(mu_);
  auto job = [&]() -> Job& { return jobs_[static_cast<std::size_t>(ticket - first_ticket_)]; };
  job().deadline = now_ms() + timeout_ms_;
  cv_.notify_all();
  const auto backstop = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double, std::milli>(timeout_ms_ + kGraceMs));
  // Under the lock the communication thread cannot finish the job and recycle its event.
  const auto ready = [&] {
    return error_ || job().done || (job().pending && job().pending->device_event());
  };
  if (!cv_.wait_until(lock, backstop, ready))
    throw RuntimeFailure(timeout_message(job()) +
                         " (it was never enqueued, and the communication thread did not respond)");
  if (error_) std::rethrow_exception(error_);
  use(job().done ? nullptr : job().pending->device_event());
}

double ProgressThread::wait(int ticket) {
  if (ticket < 0) return 0.0;
  std::unique_lock lock(mu_);
  auto job = [&]() -> Job& { return jobs_[static_cast<std::size_t>(ticket - first_ticket_)]; };
  const double deadline = now_ms() + timeout_ms_;
  job().deadline = deadline;
  cv_.notify_all();
  const auto backstop = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double, std::milli>(timeout_ms_ + kGraceMs));
  if (!cv_.wait_until(lock, backstop, [&] { return error_ || job().done; }))
    throw RuntimeFailure(timeout_message(job()) +
                         " (the communication thread did not respond either)");
  if (error_) std::rethrow_exception(error_);
  const double ms = job().done_at - job().posted_at;
  job().waited = true;
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
        if (!j.pending) {
          if (j.device_wait) comm_.stream_wait(j.device_wait);
          j.pending = comm_.start(j.sends, j.recvs, j.tag);
          if (j.pending->device_event()) cv_.notify_all();  // enqueued: when_enqueued may go on
        }
        if (j.pending->test()) {
          j.done = true;
          j.done_at = now_ms();
          j.pending.reset();
          cv_.notify_all();
        } else if (now_ms() > j.deadline) {
          std::string msg = timeout_message(j);
          if (std::string lib = comm_.cancel_in_flight(); !lib.empty()) msg += "; " + lib;
          throw RuntimeFailure(msg);
        } else {
          if (j.pending->device_event()) cv_.notify_all();  // enqueued by test()
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

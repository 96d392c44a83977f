// Communicators for the Python package: the single-rank one and the process-wide MPI one.
#include "comm_handle.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#ifdef RINGATTN_HAVE_MPI
#include <mpi.h>
#endif

#include "ringattn/errors.hpp"

namespace ringattn::python {

namespace {

std::mutex g_mpi_mutex;
// Null until from_mpi(). Never deleted: the last copy of an MPI Comm calls MPI_Finalize when it
// goes (perhaps never, if Python keeps an autograd graph alive), so shutdown() ends MPI itself
// at a known point instead.
Comm* g_mpi = nullptr;
bool g_mpi_ended = false;
std::atomic<bool> g_failed{false};
std::atomic<double> g_failed_timeout_s{0};

}  // namespace

void check_timeout(double timeout_s) {
  // The range the library's JobSpec takes (make_engine checks it again); checked here so
  // that a bad Comm fails where it is made.
  if (!(timeout_s > 0) || timeout_s > 1e6) {
    std::ostringstream got;
    got << timeout_s;
    throw InputError("timeout", "must be a number of seconds in (0, 1e6], got " + got.str());
  }
}

CommHandle::CommHandle(double timeout_s) : CommHandle(Comm::single(), timeout_s, false) {}

CommHandle::CommHandle(Comm comm, double timeout_s, bool is_mpi)
    : comm_(std::move(comm)), timeout_s_(timeout_s), is_mpi_(is_mpi) {
  check_timeout(timeout_s);
}

CommHandle CommHandle::from_mpi(double timeout_s) {
  check_timeout(timeout_s);
  std::lock_guard lock(g_mpi_mutex);
  if (g_mpi_ended)
    throw RuntimeFailure("MPI was already finalised in this process; it cannot start again");
  if (!g_mpi) g_mpi = new Comm(mpi_world());
  return CommHandle(*g_mpi, timeout_s, true);
}

void CommHandle::allgather(const void* data, std::size_t bytes, void* out) const {
  comm_.gather(data, bytes, out);
  comm_.broadcast(out, bytes * static_cast<std::size_t>(comm_.size()), 0);
}

void CommHandle::mark_failed() const {
  if (!is_mpi_) return;
  g_failed = true;
  g_failed_timeout_s = std::max(g_failed_timeout_s.load(), timeout_s_);
}

bool mpi_ended() {
  std::lock_guard lock(g_mpi_mutex);
  return g_mpi_ended;
}

void shutdown() {
  Comm* mpi = nullptr;
  {
    std::lock_guard lock(g_mpi_mutex);
    if (!g_mpi || g_mpi_ended) return;
    g_mpi_ended = true;
    mpi = g_mpi;
  }
  // A broken ring may leave a peer waiting forever inside MPI_Finalize; end the job the way
  // the CLI does after a failure. First give the peers one watchdog period, so that a rank
  // still waiting on this one raises its own RuntimeError (and can report it) before the
  // abort ends it.
  if (g_failed) {
    std::this_thread::sleep_for(std::chrono::duration<double>(g_failed_timeout_s.load() + 1.0));
    mpi->abort(static_cast<int>(ExitCode::runtime_failure));
  }
#ifdef RINGATTN_HAVE_MPI
  MPI_Finalize();
#endif
}

}  // namespace ringattn::python

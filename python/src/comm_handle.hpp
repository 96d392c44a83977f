// The communicator a Python caller holds (ringattn.Comm): one rank alone, or MPI_COMM_WORLD
// under mpirun/srun, with the watchdog's timeout. MPI is started once per process and ended
// by shutdown() (Python's atexit), after the plans that use it are gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ringattn/ringattn.hpp"

namespace ringattn::python {

class CommHandle {
 public:
  // One rank, no MPI.
  explicit CommHandle(double timeout_s);
  // MPI_COMM_WORLD (MPI initialised on the first call). `timeout_s` is checked as --timeout.
  static CommHandle from_mpi(double timeout_s);
  // Any Comm (Comm.from_torch: over a torch.distributed group's transport).
  CommHandle(Comm comm, double timeout_s, bool is_mpi);

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  double timeout_s() const { return timeout_s_; }
  bool is_mpi() const { return is_mpi_; }
  // A handle on the same communicator (engines are made on it).
  Comm comm() const { return comm_; }

  // `bytes` from every rank into `out` (rank-major, size() * bytes) on every rank.
  void allgather(const void* data, std::size_t bytes, void* out) const;
  void barrier() const { comm_.barrier(); }

  // An engine on this communicator failed after setup (watchdog, peer error): the ring may
  // hold abandoned transfers, so shutdown() aborts the job instead of finalising.
  void mark_failed() const;

 private:
  Comm comm_;
  double timeout_s_;
  bool is_mpi_;
};

// Ends MPI if this process started it: MPI_Finalize, or MPI_Abort (exit 3) after a failure.
void shutdown();
// True once shutdown() ended MPI: plans on it can no longer run.
bool mpi_ended();

// Checks `timeout_s` as the CLI checks --timeout (InputError with its message).
void check_timeout(double timeout_s);

}  // namespace ringattn::python

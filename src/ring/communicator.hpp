// The communicator interface the ring engine talks to: one step's point-to-point sends and
// receives are posted together (so no pairing can deadlock), plus the few collectives the
// CLI needs. Backends: a single-rank one (no MPI at all), MPI over host memory, in-process
// virtual ranks (inproc_communicator.hpp) and NCCL over device memory
// (nccl_communicator.hpp).
//
// Device memory (NCCL): memory_space() says where Transfer::data must point. A device
// backend runs transfers on its own communication stream; stream_wait() orders the next
// start() after an event of the caller's compute stream (send buffers written, receive
// buffers free), and PendingExchange::device_event() lets a compute stream wait for the
// transfer without the host. Host backends ignore both. Collectives always take host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringattn/transport.hpp"

namespace ringattn::ring {

enum class MemorySpace { host, device };

// One message of an exchange (the public transport's type: a caller's transport takes the
// ring's exchanges as they are).
using Transfer = ringattn::Transfer;

// A posted group of sends and receives.
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual bool test() = 0;  // true once every send and receive has completed
  // Device backends: a cudaEvent_t recorded on the communication stream after the exchange,
  // or null while the exchange is not yet enqueued (NCCL's nonblocking group end; test()
  // enqueues it). Host backends: always null.
  virtual void* device_event() const { return nullptr; }
};

struct RankInfo {
  std::string host;
  int pid = 0;
  int local_rank = 0;
  std::string device;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  virtual std::string library_version() const = 0;

  // Posts every send and receive of one step together; `tag` separates message kinds.
  virtual std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                                 std::span<const Transfer> recvs, int tag) = 0;

  // How messages name rank `r` of this communicator: "rank r", or for a sub-communicator
  // the job's rank it stands for.
  virtual int job_rank(int r) const { return r; }

  virtual MemorySpace memory_space() const { return MemorySpace::host; }
  // True for virtual ranks (threads of one process sharing its memory and its GPUs).
  virtual bool in_process() const { return false; }
  // Device backends: the next start() waits (on the device) for this cudaEvent_t.
  virtual void stream_wait(void* cuda_event) { (void)cuda_event; }

  // The collectives below give up after this long (the CLI passes --timeout), throwing a
  // RuntimeFailure, so that a rank cut off between ring steps (a link down, a dead peer)
  // ends the job instead of waiting forever. Backends whose collectives cannot hang ignore it.
  virtual void set_collective_timeout(double seconds) { (void)seconds; }
  virtual void barrier() = 0;
  virtual int64_t max(int64_t v) = 0;
  virtual double max(double v) = 0;
  // Gathers `bytes` from every rank to rank 0 (rank-major into `out`, which only rank 0 needs).
  virtual void gather(const void* data, std::size_t bytes, void* out) = 0;
  virtual std::vector<RankInfo> gather_info(const RankInfo& mine) = 0;
  // Copies `bytes` at `data` on rank `root` to `data` on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Ends every rank of the job now (a failing rank must not leave the others waiting).
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // The watchdog's hooks (see ProgressThread). cancel_in_flight() is called by the
  // communication thread when an exchange missed its deadline, before the job is aborted:
  // a backend that can, stops its in-flight transfers (NCCL: ncclCommAbort) and returns the
  // library's own account of the failure (NCCL: ncclGetLastError), else "".
  virtual std::string cancel_in_flight() { return {}; }
  // Throws if another rank has aborted the job. Only in-process ranks need it (an MPI abort
  // ends the process); a rank that loops outside the communicator (an injected stall) calls
  // it so that it, too, ends.
  virtual void check_aborted() {}
};

// The single-rank backend: no peers, collectives are identities.
std::unique_ptr<Communicator> make_local_communicator();

// True when this process was started by an MPI launcher (mpirun/mpiexec or srun with PMI).
bool launched_by_mpi();

// The MPI backend. Initialises MPI (thread level MULTIPLE) and finalises it on destruction.
// Throws RuntimeFailure when this build has no MPI.
std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv);

}  // namespace ringattn::ring

// A transport a caller brings: how the ranks of a job reach each other when neither MPI nor a
// single process fits (a framework's process group, a test harness). Implement HostTransport
// and make a Comm of it with Comm::from_transport (ringattn.hpp); ringattn then runs a CPU
// job's ring over its point-to-point exchanges and every job's setup over its collectives (a
// GPU job bootstraps NCCL through broadcast; its K/V then travel over NCCL). All memory is
// host memory. ringattn calls it from one thread at a time per rank, but not always from the
// thread that made it (the ring's communication thread posts and tests exchanges).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace ringattn {

// One message of an exchange: `bytes` at `data`, to or from rank `peer`.
struct Transfer {
  int peer = -1;
  void* data = nullptr;
  std::size_t bytes = 0;
};

// A posted group of sends and receives.
class PendingTransfers {
 public:
  virtual ~PendingTransfers() = default;
  // True once every send and receive has completed; may block until then.
  virtual bool test() = 0;
};

class HostTransport {
 public:
  virtual ~HostTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;           // rank among the processes of this node
  virtual std::string description() const = 0;  // what it runs on, for reports

  // Posts every send and receive of one step together (so that no pairing can deadlock);
  // `tag` separates message kinds: a receive matches only a send with its peer and tag.
  virtual std::unique_ptr<PendingTransfers> start(std::span<const Transfer> sends,
                                                  std::span<const Transfer> recvs, int tag) = 0;

  // Collectives: every rank calls them together, in the same order.
  virtual void barrier() = 0;
  virtual int64_t max(int64_t v) = 0;
  virtual double max(double v) = 0;
  // `bytes` from every rank to rank 0, rank-major into `out` (which only rank 0 needs).
  virtual void gather(const void* data, std::size_t bytes, void* out) = 0;
  // `bytes` at `data` on rank `root` to `data` on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Ends this rank (and, where the transport can, every rank of the job) with `exit_code`.
  [[noreturn]] virtual void abort(int exit_code) = 0;
  // The longest a collective may wait before it throws RuntimeFailure (JobSpec::timeout_s);
  // a transport whose collectives cannot hang may ignore it.
  virtual void set_timeout(double seconds) { (void)seconds; }
};

}  // namespace ringattn

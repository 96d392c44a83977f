// Virtual ranks: P ranks of one job as P threads of one process, running the real RingPlan
// and schedules, with the network replaced by copies between the ranks' buffers. This is how
// multi-rank logic is developed and tested on one machine without a launcher (and, on one
// GPU, where NCCL refuses two ranks per device).
#pragma once

#include <functional>

#include "ring/communicator.hpp"

namespace ringattn::ring {

// Thrown inside every virtual rank once the job was aborted (Communicator::abort on any
// rank, e.g. after a watchdog timeout): from collectives, exchanges and check_aborted(). Not
// a std::exception on purpose: error handlers that print and abort must let it pass, since
// the rank that aborted has already said why.
struct VirtualRankAborted {
  int exit_code = 0;
};

// Runs `body` on `ranks` virtual ranks, one std::thread each, each with its own in-process
// communicator (rank r of `ranks`; local_rank() = rank). Returns the job's exit code: the
// first abort's code if any rank aborted, else the largest code a rank returned. A
// std::exception escaping `body` is printed naming the rank and aborts the job with exit 3.
// OpenMP settings are per thread: `body` chooses its own thread count.
int run_virtual_ranks(int ranks, const std::function<int(Communicator&)>& body);

}  // namespace ringattn::ring

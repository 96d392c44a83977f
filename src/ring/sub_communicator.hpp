// A communicator over some ranks of another (Ulysses x ring: the U consecutive ranks of a
// group exchange all-to-all; the R ranks that hold the same heads form the ring). Point-to-
// point exchanges go through the parent with ranks translated, so every backend (MPI,
// NCCL, virtual ranks) serves both dimensions without a second bootstrap. It offers no
// collectives: the engines exchange point to point only, and a job's collectives run on the
// whole communicator. The caller keeps the parent alive and never lets two threads start()
// exchanges on it at once (the Ulysses engine posts its all-to-alls only while the ring is
// idle).
#pragma once

#include <memory>
#include <vector>

#include "ring/communicator.hpp"

namespace ringattn::ring {

// `members`: the parent's ranks, in this communicator's rank order; the calling rank must
// be one of them.
std::unique_ptr<Communicator> make_sub_communicator(Communicator& parent, std::vector<int> members);

}  // namespace ringattn::ring

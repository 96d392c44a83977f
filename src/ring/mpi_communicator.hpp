// The MPI backend over a communicator the caller owns (a build with MPI only): ringattn works
// on a duplicate of `comm`; MPI must be initialised with at least MPI_THREAD_SERIALIZED.
#pragma once

#include <mpi.h>

#include <memory>

#include "ring/communicator.hpp"

namespace ringattn::ring {

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace ringattn::ring

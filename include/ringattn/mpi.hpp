// A Comm over an MPI communicator the caller owns (in a build with MPI). MPI must be
// initialised with at least MPI_THREAD_SERIALIZED (ringattn's communication thread calls
// MPI while the caller's thread computes) and stay initialised while engines on the Comm
// live. ringattn works on a duplicate of `comm`, so its messages never match the caller's.
#pragma once

#include <mpi.h>

#include "ringattn/ringattn.hpp"

namespace ringattn {

Comm mpi_comm(MPI_Comm comm);

}  // namespace ringattn

// mpi_comm (ringattn/mpi.hpp), in a build with MPI.
#include "job/comm_access.hpp"
#include "ring/mpi_communicator.hpp"
#include "ringattn/mpi.hpp"

namespace ringattn {

Comm mpi_comm(MPI_Comm comm) { return CommAccess::make(ring::make_mpi_communicator(comm)); }

}  // namespace ringattn

// The main() of GoogleTest programs that run under mpiexec (and alone): MPI when a launcher
// started the process, else the single-rank communicator; only rank 0 prints gtest's report,
// and the exit code is the worst over ranks.
#pragma once

#include "ring/communicator.hpp"

namespace ringattn::testing {

// `comm` is set to the communicator before the tests run and reset afterwards.
int run_gtests_on_ranks(int argc, char** argv, ring::Communicator*& comm);

}  // namespace ringattn::testing

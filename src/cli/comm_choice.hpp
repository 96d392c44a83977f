// The control communicator the CLI starts (--comm auto|nccl|mpi|local), from what the user
// asked for, the device, what this build has and how the process was started; the engine
// then chooses a GPU job's device transport (ring/device_transport.hpp). Pure functions, so
// every combination is testable without GPUs, NCCL or a launcher.
#pragma once

#include <string>

namespace ringattn::cli {

enum class CommKind {
  local,  // one process: ring size 1, or P virtual ranks (threads) with --ring-size P
  mpi,    // one process per rank, host memory over MPI
  nccl,   // one process per GPU, device memory over NCCL (MPI or nothing to bootstrap)
};

struct CommContext {
  std::string requested = "auto";  // --comm
  std::string device = "cpu";      // resolved --device: "cpu" or "cuda"
  bool have_cuda_kernels = false;  // this build can run --device cuda
  bool have_nccl = false;          // this build has the NCCL communicator
  bool have_mpi = false;           // this build has the MPI communicator
  bool launched_by_mpi = false;    // started by mpirun/mpiexec/srun
  int world_size = 1;              // ranks the launcher started (1 without one)
  int ring_size = 0;               // --ring-size (0: not given)
};

// have_cuda_kernels, have_nccl and have_mpi as this build has them; the rest defaulted.
CommContext this_build();

// auto: nccl when the device is cuda and NCCL is built (and there is one process per GPU),
// else mpi when launched by MPI, else local (virtual ranks when --ring-size > 1).
// Throws InputError naming --comm (or --device) for a combination that cannot run.
CommKind choose_comm(const CommContext& c);

const char* to_string(CommKind k);

}  // namespace ringattn::cli

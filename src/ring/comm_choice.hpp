// Which communicators a job uses, decided in one place: the control communicator the
// front end starts (--comm auto|nccl|mpi|local, from what the user asked for, the device,
// what this build has and how the process was started), and the device transport a GPU
// job's engine exchanges over (NCCL, or device copies between virtual ranks sharing GPUs).
// Pure functions, so every combination is testable without GPUs, NCCL or a launcher.
#pragma once

#include <string>

namespace ringattn::ring {

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

// How a GPU job's ranks exchange device memory.
enum class DeviceTransport {
  none,          // one rank: nothing to exchange
  nccl,          // one GPU per rank (NCCL refuses two ranks on one GPU)
  device_copies  // virtual ranks: cudaMemcpyAsync between the ranks' streams
};

struct DeviceTransportContext {
  std::string requested = "auto";  // --comm
  int world_size = 1;
  bool in_process = false;  // virtual ranks (threads of this process)
  int gpus = 1;             // devices this process sees
};

// auto: device copies for virtual ranks on fewer GPUs than ranks, else NCCL; local: device
// copies (virtual ranks only); nccl: NCCL (one GPU per rank); mpi: refused, naming --comm
// (the GPU engines do not stage device memory through the host).
DeviceTransport choose_device_transport(const DeviceTransportContext& c);

// The GPU rank `rank` computes on: shared round-robin under device copies; else its
// node-local rank's (the only one when the launcher gave each rank one visible GPU).
int device_of_rank(DeviceTransport t, int rank, int local_rank, int gpus);

}  // namespace ringattn::ring

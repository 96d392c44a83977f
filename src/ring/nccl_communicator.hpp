// The NCCL backend: K/V and gradient transfers between GPUs with grouped ncclSend/ncclRecv
// on a communication stream; collectives, the unique id's broadcast and abort go through a
// host "control" communicator (MPI, or the single-rank one). Built only with NCCL
// (RINGATTN_HAVE_NCCL); without it, make_nccl_communicator throws.
#pragma once

#include <memory>
#include <string>

#include "ring/communicator.hpp"
#include "ring/progress_thread.hpp"

namespace ringattn::ring {

struct NcclOptions {
  double timeout_s = kDefaultTimeoutSeconds;  // bounds the nonblocking init and finalize
};

// Chooses this rank's GPU from its node-local rank (cudaSetDevice, before NCCL sees it),
// makes the unique id on rank 0 and broadcasts it over `control`, and initialises NCCL
// nonblocking (ncclCommInitRankConfig, config.blocking = 0), polling for at most
// opts.timeout_s. `control` must outlive the result. Throws RuntimeFailure naming the rank
// and NCCL's own message (ncclGetErrorString and ncclGetLastError), or, when NCCL cannot be
// opened or is too old, what was tried (nccl_library.hpp: the first call opens NCCL).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& control,
                                                     const NcclOptions& opts = {});

// Virtual ranks on fewer GPUs than ranks (NCCL refuses two ranks of one communicator on one
// device): device buffers move with cudaMemcpyAsync between the ranks' communication
// streams, ordered by events as NCCL's would be. `control` must be the in-process
// communicator of the virtual ranks (in_process()); every rank calls this together.
// Built with CUDA; without it, throws.
std::unique_ptr<Communicator> make_device_inproc_communicator(Communicator& control, int device);

// For the device report: "NCCL 2.28.9 (/path/libnccl.so.2)" (ncclGetVersion, and the file
// in use; opens NCCL if it is not open, and says so instead of throwing if it cannot), and one
// GPU's name, PCI bus id, compute capability and memory.
std::string nccl_version_string();
std::string describe_cuda_device(int device);

}  // namespace ringattn::ring

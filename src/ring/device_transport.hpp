// The device transport a GPU job's engine exchanges over (NCCL, or device copies between
// virtual ranks sharing GPUs), and the GPU each rank computes on. Pure functions, so every
// combination is testable without GPUs, NCCL or a launcher.
#pragma once

#include <string>

namespace ringattn::ring {

// How a GPU job's ranks exchange device memory.
enum class DeviceTransport {
  none,          // one rank: nothing to exchange
  nccl,          // one GPU per rank (NCCL refuses two ranks on one GPU)
  device_copies  // virtual ranks: cudaMemcpyAsync between the ranks' streams
};

struct DeviceTransportContext {
  std::string requested = "auto";  // JobSpec::transport
  int world_size = 1;
  bool in_process = false;  // virtual ranks (threads of this process)
  int gpus = 1;             // devices this process sees
};

// auto: device copies for virtual ranks on fewer GPUs than ranks, else NCCL; local: device
// copies (virtual ranks only); nccl: NCCL (one GPU per rank); mpi: refused, naming `transport`
// (the GPU engines do not stage device memory through the host).
DeviceTransport choose_device_transport(const DeviceTransportContext& c);

// The GPU rank `rank` computes on: shared round-robin under device copies; else its
// node-local rank's (the only one when the launcher gave each rank one visible GPU).
int device_of_rank(DeviceTransport t, int rank, int local_rank, int gpus);

}  // namespace ringattn::ring

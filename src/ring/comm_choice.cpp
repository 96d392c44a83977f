#include "ring/comm_choice.hpp"

#include "ringattn/errors.hpp"

namespace ringattn::ring {

CommContext this_build() {
  CommContext c;
#ifdef RINGATTN_HAVE_CUDA_TOOLKIT
  c.have_cuda_kernels = true;  // src/kernels/cuda/ is built (whether a device exists is
                               // checked when the run resolves --device)
#endif
#ifdef RINGATTN_HAVE_NCCL
  c.have_nccl = true;
#endif
#ifdef RINGATTN_HAVE_MPI
  c.have_mpi = true;
#endif
  return c;
}

const char* to_string(CommKind k) {
  switch (k) {
    case CommKind::local:
      return "local";
    case CommKind::mpi:
      return "mpi";
    case CommKind::nccl:
      return "nccl";
  }
  return "?";
}

CommKind choose_comm(const CommContext& c) {
  if (c.device == "cuda" && !c.have_cuda_kernels)
    throw InputError("--device",
                     "'cuda' is not available: this build of ringattn has CPU kernels only (use "
                     "--device cpu or auto)");
  const bool virtual_ranks = !c.launched_by_mpi && c.ring_size > 1;
  const std::string w = std::to_string(c.world_size);
  if (c.requested == "nccl") {
    if (!c.have_nccl)
      throw InputError("--comm",
                       "'nccl' is not available: this build of ringattn has no NCCL (install "
                       "NCCL and the CUDA toolkit and rebuild, or use --comm mpi or local)");
    if (c.device != "cuda")
      throw InputError("--comm", "'nccl' moves GPU memory and needs --device cuda (with --device " +
                                     c.device + " use --comm mpi or local)");
    if (virtual_ranks)
      throw InputError("--comm",
                       "'nccl' needs one process per GPU (NCCL refuses two ranks on one GPU); "
                       "for " +
                           std::to_string(c.ring_size) +
                           " virtual ranks in this process use --comm local, or start " +
                           std::to_string(c.ring_size) + " processes with mpirun");
    return CommKind::nccl;
  }
  if (c.requested == "mpi") {
    if (!c.have_mpi)
      throw InputError("--comm",
                       "'mpi' is not available: this build of ringattn has no MPI (install "
                       "libopenmpi-dev and rebuild, or use --comm local)");
    if (!c.launched_by_mpi)
      throw InputError("--comm",
                       "'mpi' needs an MPI launcher (mpirun -np P ringattn run ..., or srun "
                       "--mpi=pmix); in one process use --comm local (--ring-size P for virtual "
                       "ranks)");
    return CommKind::mpi;
  }
  if (c.requested == "local") {
    if (c.launched_by_mpi && c.world_size > 1)
      throw InputError("--comm", "'local' runs the whole ring in one process, but this job has " +
                                     w +
                                     " MPI ranks (each would compute the whole problem); use "
                                     "--comm mpi or auto");
    return CommKind::local;
  }
  if (c.requested != "auto")
    throw InputError("--comm",
                     "unknown value '" + c.requested + "' (choose one of: auto, nccl, mpi, local)");
  if (c.device == "cuda" && c.have_nccl && !virtual_ranks) return CommKind::nccl;
  if (c.launched_by_mpi) return CommKind::mpi;
  return CommKind::local;
}

DeviceTransport choose_device_transport(const DeviceTransportContext& c) {
  if (c.world_size <= 1) return DeviceTransport::none;
  const bool sharing = c.in_process && c.gpus < c.world_size;
  if (c.requested == "mpi")
    throw InputError("--comm",
                     "'mpi' moves host memory, and the GPU engines exchange device memory (NCCL, "
                     "or device copies between virtual ranks); use --comm nccl or auto, or "
                     "--device cpu");
  if (c.requested == "local") {
    if (!c.in_process)
      throw InputError("--comm",
                       "'local' moves device memory only between virtual ranks of one "
                       "process (--ring-size P); use --comm nccl or auto");
    return DeviceTransport::device_copies;
  }
  if (c.requested == "nccl") {
    if (sharing)
      throw InputError("--comm", "'nccl' needs one GPU per rank, and " +
                                     std::to_string(c.world_size) + " ranks share " +
                                     std::to_string(c.gpus) +
                                     " GPU(s); use --comm local or auto (device copies)");
    return DeviceTransport::nccl;
  }
  return sharing ? DeviceTransport::device_copies : DeviceTransport::nccl;
}

int device_of_rank(DeviceTransport t, int rank, int local_rank, int gpus) {
  gpus = gpus < 1 ? 1 : gpus;
  if (t == DeviceTransport::device_copies) return rank % gpus;
  return gpus == 1 ? 0 : local_rank;
}

}  // namespace ringattn::ring

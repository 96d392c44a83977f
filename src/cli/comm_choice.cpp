#include "cli/comm_choice.hpp"

#include "ringattn/errors.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn::cli {

CommContext this_build() {
  const BuildFeatures f = build_features();
  CommContext c;
  c.have_cuda_kernels = f.cuda;  // whether a device exists is checked when the run resolves
                                 // --device
  c.have_nccl = f.nccl;
  c.have_mpi = f.mpi;
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

}  // namespace ringattn::cli

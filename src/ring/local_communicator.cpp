// The single-rank communicator (ring_size = 1, no MPI needed), and launcher detection.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/environment.hpp"
#include "ring/communicator.hpp"
#include "ring/nccl_communicator.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace {

class DoneExchange final : public PendingExchange {
 public:
  bool test() override { return true; }
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string library_version() const override { return "none (single process)"; }
  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int) override {
    if (!sends.empty() || !recvs.empty())
      throw RuntimeFailure("internal error: point-to-point transfer on a single-rank run");
    return std::make_unique<DoneExchange>();
  }
  void barrier() override {}
  int64_t max(int64_t v) override { return v; }
  double max(double v) override { return v; }
  void gather(const void* data, std::size_t bytes, void* out) override {
    if (bytes) std::memcpy(out, data, bytes);
  }
  std::vector<RankInfo> gather_info(const RankInfo& mine) override { return {mine}; }
  void broadcast(void*, std::size_t, int) override {}
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

bool launched_by_mpi() {
  for (Env var : {Env::ompi_comm_world_size, Env::pmi_size, Env::pmix_rank, Env::pmi_rank,
                  Env::mpi_localnranks, Env::mv2_comm_world_size})
    if (environment_value(var)) return true;
  return false;
}

#ifndef RINGATTN_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator(int*, char***) {
  throw RuntimeFailure(
      "this process was started by an MPI launcher, but this build of ringattn has no MPI "
      "support (install libopenmpi-dev and rebuild)");
}
#endif

#ifndef RINGATTN_HAVE_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, const NcclOptions&) {
  throw RuntimeFailure("this build of ringattn has no NCCL (install NCCL and rebuild)");
}
std::string nccl_version_string() { return "none (built without NCCL)"; }
std::string describe_cuda_device(int device) {
  return "CUDA device " + std::to_string(device) + " (built without CUDA)";
}
#endif

}  // namespace ringattn::ring

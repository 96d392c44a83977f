// Comm (ringattn.hpp): a handle on one of the ring's communicators, its collectives for the
// front ends, and the ways to make one: one process, MPI, a caller's transport, virtual ranks.
#include <cstdlib>
#include <utility>

#include "job/agree.hpp"
#include "job/comm_access.hpp"
#include "ring/inproc_communicator.hpp"
#include "ring/nccl_communicator.hpp"
#ifdef RINGATTN_HAVE_NCCL
#include "ring/nccl_library.hpp"
#endif
#include "ring/transport_communicator.hpp"
#include "ringattn/errors.hpp"

namespace ringattn {

struct Comm::Impl {
  std::shared_ptr<ring::Communicator> comm;
};

Comm CommAccess::make(std::shared_ptr<ring::Communicator> comm) {
  if (!comm) throw RuntimeFailure("ringattn::Comm: no communicator");
  Comm c;
  c.impl_ = std::make_shared<Comm::Impl>(Comm::Impl{std::move(comm)});
  return c;
}
Comm CommAccess::borrow(ring::Communicator& comm) {
  return make(std::shared_ptr<ring::Communicator>(&comm, [](ring::Communicator*) {}));
}
ring::Communicator& CommAccess::communicator(const Comm& c) { return *c.impl_->comm; }

Comm Comm::single() { return CommAccess::make(ring::make_local_communicator()); }
Comm Comm::from_transport(std::shared_ptr<HostTransport> transport) {
  return CommAccess::make(ring::make_transport_communicator(std::move(transport)));
}

int Comm::rank() const { return impl_->comm->rank(); }
int Comm::size() const { return impl_->comm->size(); }
int Comm::local_rank() const { return impl_->comm->local_rank(); }
std::string Comm::description() const { return impl_->comm->library_version(); }

void Comm::set_timeout(double seconds) const { impl_->comm->set_collective_timeout(seconds); }
void Comm::barrier() const { impl_->comm->barrier(); }
int64_t Comm::max(int64_t v) const { return impl_->comm->max(v); }
double Comm::max(double v) const { return impl_->comm->max(v); }
void Comm::gather(const void* data, std::size_t bytes, void* out) const {
  impl_->comm->gather(data, bytes, out);
}
std::vector<std::string> Comm::gather(const std::string& mine) const {
  return ring::gather_strings(*impl_->comm, mine);
}
void Comm::broadcast(void* data, std::size_t bytes, int root) const {
  impl_->comm->broadcast(data, bytes, root);
}
void Comm::agree(const std::function<void()>& f) const { job::agree_on_errors(*impl_->comm, f); }
void Comm::abort(int exit_code) const {
  impl_->comm->abort(exit_code);
  std::_Exit(exit_code);  // every backend's abort ends the job; this only tells the compiler
}
void Comm::check_aborted() const { impl_->comm->check_aborted(); }

int run_virtual_ranks(int ranks, const std::function<int(Comm&)>& body) {
  return ring::run_virtual_ranks(ranks, [&](ring::Communicator& rc) {
    Comm c = CommAccess::borrow(rc);
    return body(c);
  });
}

bool launched_by_mpi() { return ring::launched_by_mpi(); }

Comm mpi_world(int* argc, char*** argv) {
  return CommAccess::make(ring::make_mpi_communicator(argc, argv));
}

BuildFeatures build_features() noexcept {
  BuildFeatures f;
#ifdef RINGATTN_HAVE_CUDA_TOOLKIT
  f.cuda = true;
#endif
#ifdef RINGATTN_HAVE_NCCL
  f.nccl = true;
#endif
#ifdef RINGATTN_HAVE_MPI
  f.mpi = true;
#endif
  return f;
}

void set_nccl_library(const std::string& path) {
#ifdef RINGATTN_HAVE_NCCL
  ring::set_nccl_library_path(path);
#else
  (void)path;
#endif
}

std::string nccl_version() { return ring::nccl_version_string(); }

}  // namespace ringattn

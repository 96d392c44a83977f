// A transport (ringattn/transport.hpp) over a torch.distributed process group
// (ringattn.Comm.from_torch): every collective and point-to-point exchange calls back into Python
// (ringattn._comm._TorchGroup, which drives torch.distributed on the group), taking the GIL for it.
// So a gloo group carries a CPU job's ring (isend/irecv with tags) and any group carries a GPU
// job's setup: the collectives, and the NCCL unique id the engine's NCCL communicator is
// bootstrapped with (its K/V then travel over NCCL, not through Python). The engines call it with
// the GIL released.
#include "group_comm.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "ringattn/errors.hpp"

namespace nb = nanobind;

namespace ringattn::python {
namespace {

// Runs `f` holding the GIL; a Python exception becomes a RuntimeFailure naming `what`.
template <typename F>
auto with_gil(const char* what, F&& f) {
  nb::gil_scoped_acquire gil;
  try {
    return f();
  } catch (const nb::python_error& e) {
    throw RuntimeFailure(std::string("torch.distributed ") + what + " failed: " + e.what());
  }
}

class GroupExchange final : public PendingTransfers {
 public:
  explicit GroupExchange(std::vector<nb::object> works) : works_(std::move(works)) {}
  ~GroupExchange() override {
    nb::gil_scoped_acquire gil;
    works_.clear();
  }
  // gloo completes a point-to-point Work only inside wait() (is_completed() stays false until
  // then), so the communication thread waits here; torch releases the GIL while it does. A
  // peer that never answers keeps it waiting, and the compute thread's own deadline then ends
  // the call (ProgressThread: the waiter gives up one second after --timeout).
  bool test() override {
    if (done_) return true;
    with_gil("isend/irecv", [&] {
      for (const nb::object& w : works_) w.attr("wait")();  // raises a failed transfer's error
    });
    return done_ = true;
  }

 private:
  std::vector<nb::object> works_;
  bool done_ = false;
};

class GroupTransport final : public HostTransport {
 public:
  explicit GroupTransport(nb::object group) : group_(std::move(group)) {
    rank_ = nb::cast<int>(group_.attr("rank"));
    size_ = nb::cast<int>(group_.attr("size"));
    local_rank_ = nb::cast<int>(group_.attr("local_rank"));
    version_ = nb::cast<std::string>(group_.attr("describe")());
  }
  ~GroupTransport() override {
    nb::gil_scoped_acquire gil;
    group_ = nb::object();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string description() const override { return version_; }

  std::unique_ptr<PendingTransfers> start(std::span<const Transfer> sends,
                                          std::span<const Transfer> recvs, int tag) override {
    return with_gil("isend/irecv", [&] {
      std::vector<nb::object> works;
      for (const Transfer& t : recvs)
        if (t.bytes)
          works.push_back(
              group_.attr("irecv")(t.peer, reinterpret_cast<uintptr_t>(t.data), t.bytes, tag));
      for (const Transfer& t : sends)
        if (t.bytes)
          works.push_back(
              group_.attr("isend")(t.peer, reinterpret_cast<uintptr_t>(t.data), t.bytes, tag));
      return std::make_unique<GroupExchange>(std::move(works));
    });
  }

  void barrier() override {
    with_gil("barrier", [&] { group_.attr("barrier")(); });
  }
  int64_t max(int64_t v) override { return max_of(v); }
  double max(double v) override { return max_of(v); }
  void gather(const void* data, std::size_t bytes, void* out) override {
    const std::vector<std::string> all = allgather(data, bytes);
    if (rank_ != 0) return;
    for (std::size_t r = 0; r < all.size(); ++r)
      std::memcpy(static_cast<char*>(out) + r * bytes, all[r].data(), bytes);
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    with_gil("broadcast", [&] {
      nb::bytes mine(static_cast<const char*>(data), rank_ == root ? bytes : 0);
      const nb::bytes got = nb::cast<nb::bytes>(group_.attr("broadcast")(mine, root));
      if (got.size() != bytes)
        throw RuntimeFailure("torch.distributed broadcast: " + std::to_string(got.size()) +
                             " bytes from rank " + std::to_string(root) + ", expected " +
                             std::to_string(bytes));
      std::memcpy(data, got.c_str(), bytes);
    });
  }
  [[noreturn]] void abort(int exit_code) override {
    // torch.distributed cannot end the other processes: they stop at their watchdog.
    std::cerr << "ringattn: rank " << rank_ << ": ending this process (exit " << exit_code
              << "); the group's other ranks stop at their timeout" << std::endl;
    std::_Exit(exit_code);
  }

 private:
  std::vector<std::string> allgather(const void* data, std::size_t bytes) {
    return with_gil("all_gather_object", [&] {
      nb::bytes mine(static_cast<const char*>(data), bytes);
      std::vector<std::string> all;
      for (nb::handle b : nb::cast<nb::list>(group_.attr("allgather")(mine)))
        all.emplace_back(nb::cast<nb::bytes>(b).c_str(), nb::len(b));
      return all;
    });
  }
  template <typename T>
  T max_of(T v) {
    T best = v;
    for (const std::string& s : allgather(&v, sizeof v)) {
      T x;
      std::memcpy(&x, s.data(), sizeof x);
      best = std::max(best, x);
    }
    return best;
  }

  nb::object group_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::string version_;
};

}  // namespace

std::shared_ptr<HostTransport> make_group_transport(nb::object group) {
  return std::make_shared<GroupTransport>(std::move(group));
}

}  // namespace ringattn::python

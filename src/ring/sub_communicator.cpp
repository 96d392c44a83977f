// SubCommunicator (see sub_communicator.hpp).
#include "ring/sub_communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace {

class SubCommunicator final : public Communicator {
 public:
  SubCommunicator(Communicator& parent, std::vector<int> members)
      : parent_(parent), members_(std::move(members)) {
    const auto it = std::find(members_.begin(), members_.end(), parent_.rank());
    if (it == members_.end())
      throw std::logic_error("make_sub_communicator: the calling rank is not a member");
    rank_ = static_cast<int>(it - members_.begin());
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int local_rank() const override { return parent_.local_rank(); }
  std::string library_version() const override { return parent_.library_version(); }

  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int tag) override {
    std::vector<Transfer> s(sends.begin(), sends.end()), r(recvs.begin(), recvs.end());
    for (Transfer& t : s) t.peer = parent_rank(t.peer);
    for (Transfer& t : r) t.peer = parent_rank(t.peer);
    return parent_.start(s, r, tag);
  }

  int job_rank(int r) const override { return parent_.job_rank(parent_rank(r)); }
  MemorySpace memory_space() const override { return parent_.memory_space(); }
  bool in_process() const override { return parent_.in_process(); }
  void stream_wait(void* cuda_event) override { parent_.stream_wait(cuda_event); }
  std::string cancel_in_flight() override { return parent_.cancel_in_flight(); }
  void check_aborted() override { parent_.check_aborted(); }
  [[noreturn]] void abort(int exit_code) override {
    parent_.abort(exit_code);
    std::abort();  // not reached: the parent's abort does not return
  }

  void barrier() override { no_collectives("barrier"); }
  int64_t max(int64_t) override { no_collectives("max"); }
  double max(double) override { no_collectives("max"); }
  void gather(const void*, std::size_t, void*) override { no_collectives("gather"); }
  std::vector<RankInfo> gather_info(const RankInfo&) override { no_collectives("gather_info"); }
  void broadcast(void*, std::size_t, int) override { no_collectives("broadcast"); }

 private:
  int parent_rank(int peer) const {
    if (peer < 0 || peer >= size())
      throw std::logic_error("sub-communicator: peer " + std::to_string(peer) + " of " +
                             std::to_string(size()));
    return members_[static_cast<std::size_t>(peer)];
  }
  [[noreturn]] static void no_collectives(const char* what) {
    throw std::logic_error(std::string("sub-communicator: no collectives (") + what +
                           "); run it on the whole communicator");
  }

  Communicator& parent_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_sub_communicator(Communicator& parent,
                                                    std::vector<int> members) {
  return std::make_unique<SubCommunicator>(parent, std::move(members));
}

}  // namespace ringattn::ring

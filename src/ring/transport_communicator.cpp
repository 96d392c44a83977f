// The ring's Communicator over a caller's HostTransport (transport_communicator.hpp).
#include "ring/transport_communicator.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace {

class TransportExchange final : public PendingExchange {
 public:
  explicit TransportExchange(std::unique_ptr<PendingTransfers> p) : p_(std::move(p)) {}
  bool test() override { return !p_ || p_->test(); }

 private:
  std::unique_ptr<PendingTransfers> p_;
};

class TransportCommunicator final : public Communicator {
 public:
  explicit TransportCommunicator(std::shared_ptr<HostTransport> t) : t_(std::move(t)) {
    if (!t_) throw RuntimeFailure("ringattn::Comm::from_transport: no transport");
  }
  int rank() const override { return t_->rank(); }
  int size() const override { return t_->size(); }
  int local_rank() const override { return t_->local_rank(); }
  std::string library_version() const override { return t_->description(); }
  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int tag) override {
    return std::make_unique<TransportExchange>(t_->start(sends, recvs, tag));
  }
  void set_collective_timeout(double seconds) override { t_->set_timeout(seconds); }
  void barrier() override { t_->barrier(); }
  int64_t max(int64_t v) override { return t_->max(v); }
  double max(double v) override { return t_->max(v); }
  void gather(const void* data, std::size_t bytes, void* out) override {
    t_->gather(data, bytes, out);
  }
  std::vector<RankInfo> gather_info(const RankInfo& mine) override {
    const std::string text = mine.host + '\n' + std::to_string(mine.pid) + '\n' +
                             std::to_string(mine.local_rank) + '\n' + mine.device;
    std::vector<RankInfo> infos;
    for (const std::string& t : gather_strings(*this, text)) {
      std::vector<std::string> f;
      for (std::size_t b = 0, e; b <= t.size(); b = e + 1) {
        e = std::min(t.find('\n', b), t.size());
        f.push_back(t.substr(b, e - b));
      }
      f.resize(4);
      infos.push_back({f[0], std::atoi(f[1].c_str()), std::atoi(f[2].c_str()), f[3]});
    }
    return infos;
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    t_->broadcast(data, bytes, root);
  }
  [[noreturn]] void abort(int exit_code) override {
    t_->abort(exit_code);
    std::_Exit(exit_code);  // a transport's abort must not return; this one ends the process
  }

 private:
  std::shared_ptr<HostTransport> t_;
};

}  // namespace

std::unique_ptr<Communicator> make_transport_communicator(std::shared_ptr<HostTransport> t) {
  return std::make_unique<TransportCommunicator>(std::move(t));
}

std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine) {
  const auto longest = static_cast<std::size_t>(comm.max(static_cast<int64_t>(mine.size())));
  const std::size_t slot = sizeof(uint64_t) + longest;
  std::vector<char> buffer(slot, 0);
  const uint64_t length = mine.size();
  std::memcpy(buffer.data(), &length, sizeof length);
  std::memcpy(buffer.data() + sizeof length, mine.data(), mine.size());
  const auto ranks = static_cast<std::size_t>(comm.size());
  std::vector<char> all(comm.rank() == 0 ? slot * ranks : 0);
  comm.gather(buffer.data(), slot, all.data());
  std::vector<std::string> out;
  if (comm.rank() != 0) return out;
  for (std::size_t r = 0; r < ranks; ++r) {
    uint64_t n = 0;
    std::memcpy(&n, all.data() + r * slot, sizeof n);
    out.emplace_back(all.data() + r * slot + sizeof n, static_cast<std::size_t>(n));
  }
  return out;
}

}  // namespace ringattn::ring

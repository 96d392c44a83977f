// The in-process communicator behind virtual ranks. Point-to-point follows MPI's contract:
// a receive matches the oldest unmatched send with the same (source, tag); a send completes
// once its data was copied, so the sender may then reuse its buffer. The receiver's side
// does the copy (from its communication thread, during its test()), through a CopyEngine:
// memcpy for host buffers; for device buffers it becomes cudaMemcpyAsync (device to device)
// on the receiving rank's communication stream plus an event, which is the only part of this
// file a GPU build changes. Collectives are two-phase rendezvous on one mutex.
#include "ring/inproc_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace {

// Copies one matched message. Host memory: memcpy, complete at once.
class CopyEngine {
 public:
  void start(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  bool complete() const { return true; }
  void finish() const {}  // blocks until complete (used when an exchange is abandoned)
};

struct SendSlot {
  int src = 0, tag = 0;
  const void* data = nullptr;
  std::size_t bytes = 0;
  bool matched = false;           // guarded by the world's mutex
  std::atomic<bool> done{false};  // the receiver finished copying
};

struct RecvSlot {
  int src = 0, tag = 0;
  void* data = nullptr;
  std::size_t bytes = 0;
  std::shared_ptr<SendSlot> send;  // once matched
  CopyEngine copy;
  bool done = false;
};

class World {
 public:
  explicit World(int size)
      : size_(size),
        inbox_(static_cast<std::size_t>(size)),
        slots_(static_cast<std::size_t>(size)) {}
  int size() const { return size_; }

  // --- abort -----------------------------------------------------------------------------
  void check_aborted() const {
    if (aborted_.load(std::memory_order_acquire)) throw VirtualRankAborted{abort_code_.load()};
  }
  [[noreturn]] void abort(int code) {
    {
      std::lock_guard lock(mu_);
      if (!aborted_.load()) {
        abort_code_ = code;
        aborted_.store(true, std::memory_order_release);
      }
    }
    cv_.notify_all();
    throw VirtualRankAborted{abort_code_.load()};
  }
  bool aborted() const { return aborted_.load(); }
  int abort_code() const { return abort_code_.load(); }

  // --- point-to-point ----------------------------------------------------------------------
  void post_send(int dst, const std::shared_ptr<SendSlot>& s) {
    std::lock_guard lock(mu_);
    inbox_[static_cast<std::size_t>(dst)].push_back(s);
  }
  // The oldest unmatched send to `me` from (src, tag), or null.
  std::shared_ptr<SendSlot> match(int me, int src, int tag) {
    std::lock_guard lock(mu_);
    auto& box = inbox_[static_cast<std::size_t>(me)];
    for (auto it = box.begin(); it != box.end(); ++it)
      if ((*it)->src == src && (*it)->tag == tag) {
        auto s = *it;
        box.erase(it);
        s->matched = true;
        return s;
      }
    return nullptr;
  }
  void complete(SendSlot& s) {
    {
      std::lock_guard lock(mu_);
      s.done = true;
    }
    cv_.notify_all();
  }
  // Withdraws an unmatched send, or waits until its receiver has finished copying from it.
  void withdraw(int dst, const std::shared_ptr<SendSlot>& s) {
    std::unique_lock lock(mu_);
    if (!s->matched) {
      auto& box = inbox_[static_cast<std::size_t>(dst)];
      box.erase(std::remove(box.begin(), box.end(), s), box.end());
      return;
    }
    cv_.wait(lock, [&] { return s->done.load(); });
  }

  // --- collectives -------------------------------------------------------------------------
  // Every rank deposits `mine`; once all have, `read` sees all deposits (indexed by rank);
  // nobody leaves before everyone has read, so deposits may live on the callers' stacks.
  template <typename F>
  void rendezvous(int rank, const void* mine, F&& read) {
    std::unique_lock lock(mu_);
    slots_[static_cast<std::size_t>(rank)] = mine;
    arrive(lock);
    read(slots_);
    arrive(lock);
  }

 private:
  void arrive(std::unique_lock<std::mutex>& lock) {
    check_aborted();
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_.load(); });
    check_aborted();
  }

  const int size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> aborted_{false};
  std::atomic<int> abort_code_{0};
  std::vector<std::deque<std::shared_ptr<SendSlot>>> inbox_;  // unmatched sends, by receiver
  std::vector<const void*> slots_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class InprocExchange final : public PendingExchange {
 public:
  InprocExchange(World& w, int me) : world_(w), me_(me) {}
  std::vector<std::pair<int, std::shared_ptr<SendSlot>>> sends;  // (destination, slot)
  std::vector<RecvSlot> recvs;

  bool test() override {
    world_.check_aborted();
    bool all = true;
    // Receives from one source match its sends in issue order (MPI's non-overtaking rule):
    // once one finds nothing, the later ones from that source wait for the next test(). The
    // sender may post between them, and a later receive must not take the earlier send (two
    // same-sized messages, K then V, would swap silently).
    std::vector<int> unmatched_sources;
    for (RecvSlot& r : recvs) {
      if (r.done) continue;
      if (!r.send) {
        if (std::find(unmatched_sources.begin(), unmatched_sources.end(), r.src) !=
            unmatched_sources.end()) {
          all = false;
          continue;
        }
        r.send = world_.match(me_, r.src, r.tag);
        if (!r.send) {
          all = false;
          unmatched_sources.push_back(r.src);
          continue;
        }
        if (r.send->bytes != r.bytes)
          throw RuntimeFailure("rank " + std::to_string(me_) + ": message from rank " +
                               std::to_string(r.src) + " with tag " + std::to_string(r.tag) +
                               " has " + std::to_string(r.send->bytes) + " bytes, expected " +
                               std::to_string(r.bytes));
        r.copy.start(r.data, r.send->data, r.bytes);
      }
      if (!r.copy.complete()) {
        all = false;
        continue;
      }
      r.done = true;
      world_.complete(*r.send);
    }
    for (const auto& [dst, s] : sends) all = all && s->done.load();
    return all;
  }

  ~InprocExchange() override {
    // Abandoned (an error unwound the rank): no other rank may touch our buffers afterwards.
    for (RecvSlot& r : recvs)
      if (r.send && !r.done) {
        r.copy.finish();
        world_.complete(*r.send);
      }
    for (const auto& [dst, s] : sends)
      if (!s->done.load()) world_.withdraw(dst, s);
  }

 private:
  World& world_;
  int me_;
};

class InprocCommunicator final : public Communicator {
 public:
  InprocCommunicator(World& w, int rank) : world_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  int local_rank() const override { return rank_; }
  bool in_process() const override { return true; }
  std::string library_version() const override {
    return "in-process (" + std::to_string(world_.size()) + " virtual ranks, memcpy)";
  }

  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int tag) override {
    world_.check_aborted();
    auto ex = std::make_unique<InprocExchange>(world_, rank_);
    for (const Transfer& t : recvs) {
      check_peer(t.peer);
      RecvSlot r;
      r.src = t.peer;
      r.tag = tag;
      r.data = t.data;
      r.bytes = t.bytes;
      ex->recvs.push_back(std::move(r));
    }
    for (const Transfer& t : sends) {
      check_peer(t.peer);
      auto s = std::make_shared<SendSlot>();
      s->src = rank_;
      s->tag = tag;
      s->data = t.data;
      s->bytes = t.bytes;
      ex->sends.emplace_back(t.peer, s);
      world_.post_send(t.peer, s);
    }
    return ex;
  }

  void barrier() override {
    world_.rendezvous(rank_, nullptr, [](const auto&) {});
  }
  int64_t max(int64_t v) override { return reduce_max(v); }
  double max(double v) override { return reduce_max(v); }
  void gather(const void* data, std::size_t bytes, void* out) override {
    world_.rendezvous(rank_, data, [&](const std::vector<const void*>& all) {
      if (rank_ != 0 || bytes == 0) return;
      for (std::size_t r = 0; r < all.size(); ++r)
        std::memcpy(static_cast<char*>(out) + r * bytes, all[r], bytes);
    });
  }
  std::vector<RankInfo> gather_info(const RankInfo& mine) override {
    std::vector<RankInfo> out;
    world_.rendezvous(rank_, &mine, [&](const std::vector<const void*>& all) {
      if (rank_ != 0) return;
      for (const void* p : all) out.push_back(*static_cast<const RankInfo*>(p));
    });
    return out;
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    world_.rendezvous(rank_, data, [&](const std::vector<const void*>& all) {
      if (rank_ != root && bytes) std::memcpy(data, all[static_cast<std::size_t>(root)], bytes);
    });
  }
  [[noreturn]] void abort(int exit_code) override { world_.abort(exit_code); }
  void check_aborted() override { world_.check_aborted(); }

 private:
  template <typename T>
  T reduce_max(T v) {
    T out = v;
    world_.rendezvous(rank_, &v, [&](const std::vector<const void*>& all) {
      for (const void* p : all) out = std::max(out, *static_cast<const T*>(p));
    });
    return out;
  }
  void check_peer(int peer) const {
    if (peer < 0 || peer >= world_.size())
      throw RuntimeFailure("rank " + std::to_string(rank_) + ": peer " + std::to_string(peer) +
                           " outside the ring of " + std::to_string(world_.size()));
  }

  World& world_;
  int rank_;
};

}  // namespace

int run_virtual_ranks(int ranks, const std::function<int(Communicator&)>& body) {
  if (ranks < 1) throw RuntimeFailure("run_virtual_ranks: ranks must be >= 1");
  World world(ranks);
  std::vector<int> codes(static_cast<std::size_t>(ranks), 0);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      InprocCommunicator comm(world, r);
      int& code = codes[static_cast<std::size_t>(r)];
      auto fail = [&](const std::string& what) {
        std::cerr << ("ringattn: rank " + std::to_string(r) + ": error: " + what + "\n")
                  << std::flush;
        try {
          comm.abort(static_cast<int>(ExitCode::runtime_failure));
        } catch (const VirtualRankAborted& a) {
          code = a.exit_code;
        }
      };
      try {
        code = body(comm);
      } catch (const VirtualRankAborted& a) {
        code = a.exit_code;
      } catch (const std::exception& e) {
        fail(e.what());
      } catch (...) {
        fail("unknown exception");
      }
    });
  for (std::thread& t : threads) t.join();
  if (world.aborted()) return world.abort_code();
  return *std::max_element(codes.begin(), codes.end());
}

}  // namespace ringattn::ring

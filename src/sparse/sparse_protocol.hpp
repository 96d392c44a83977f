// The block-sparse exchange, written once for the CPU SparsePlan and the GPU CudaSparsePlan:
// one grouped K/V exchange posted before the local blocks compute, the remote blocks after
// it lands, and (backward) their dK/dV partials returned to the owners and added; with the
// fault-injection and progress hooks at fixed points. A backend supplies slabs and work.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/fault_injection.hpp"
#include "ring/ring_engine.hpp"
#include "sparse/rank_work.hpp"

namespace ringattn::sparse {

// The exchange's slabs (rank_work.hpp): entry e, batch b at rows (e·B + b)·bs, K and V (or dK
// and dV) in separate halves, K rows of head_dim elements and V rows of head_dim_v (so each
// travels at its own width). Send and receive slabs hold kv_elem_bytes() per element, partial
// and returned slabs fp32.
enum class SparseSlab { send, receive, partial, returned };
struct SlabHalves {
  void* k = nullptr;
  void* v = nullptr;
};
// Which lists a compute runs: the local blocks over the shard, or the received ones over the
// receive slab (merged into out/lse; dK/dV into the partial slab).
enum class SparseBlocks { local, remote };

// What a backend supplies, for one call whose tensors it holds:
//   entry_elems()          elements of one entry's K (B·bs·D)
//   value_entry_elems()    elements of one entry's V (B·bs·Dv)
//   slab(which)            the K and V halves of a slab
//   pack()                 writes the send entries of the local K/V into the send slab
//   post(sends, recvs, tag, step, what)  starts an exchange, after the work so far
//   wait(ticket)           what follows may read the exchange's slabs
//   compute_forward(which), compute_backward(which)
//   start_backward()       zeroes dq, dk, dv and takes the row sums D = rowsum(dO ∘ O)
//   clear_partials()       zeroes the partial slab
//   add_returned()         adds the returned slab into dk, dv in the plan's fixed order
template <typename B>
concept SparseBackend = requires(B& b, int ticket, std::vector<ring::Transfer> xs,
                                 const char* what) {
  { b.entry_elems() } -> std::convertible_to<int64_t>;
  { b.value_entry_elems() } -> std::convertible_to<int64_t>;
  { b.kv_elem_bytes() } -> std::convertible_to<std::size_t>;
  { b.slab(SparseSlab::send) } -> std::same_as<SlabHalves>;
  b.pack();
  { b.post(std::move(xs), std::move(xs), ticket, ticket, what) } -> std::same_as<int>;
  b.wait(ticket);
  b.compute_forward(SparseBlocks::local);
  b.start_backward();
  b.compute_backward(SparseBlocks::local);
  b.clear_partials();
  b.add_returned();
};

class SparseProtocol {
 public:
  SparseProtocol() = default;
  // `work` must outlive the protocol (the plan owns both); `comm` null on one rank without a
  // communicator.
  SparseProtocol(const RankSparseWork& work, ring::Communicator* comm,
                 const ring::RingOptions& opts)
      : work_(&work), comm_(comm), fault_(opts.fault), on_step_(opts.on_step) {}

  // Whether calls exchange anything (several ranks, and some entry travels).
  bool exchanging() const { return comm_ && comm_->size() > 1 && work_->exchanges(); }

  // Step 0 is the local compute, step 1 the remote one after the exchange.
  template <SparseBackend B>
  void forward(B& b, ring::RingTimings& tm) const {
    const bool ex = exchanging();
    step_done(0, ex);
    const int ticket = ex ? post_kv(b, kFwdKv, tm, "block-sparse forward K/V") : -1;
    fault_.fail_if_due(rank(), 0);
    b.compute_forward(SparseBlocks::local);
    step_done(1, ex);
    if (!ex) return;
    b.wait(ticket);
    fault_.fail_if_due(rank(), 1);
    b.compute_forward(SparseBlocks::remote);
    step_done(2, ex);
  }

  // The forward's K/V exchange; the remote blocks' dK/dV partials then go back to their
  // owners (the reverse of the K/V exchange) and are added there.
  template <SparseBackend B>
  void backward(B& b, ring::RingTimings& tm) const {
    const bool ex = exchanging();
    step_done(0, ex);
    const int ticket = ex ? post_kv(b, kBwdKv, tm, "block-sparse backward K/V") : -1;
    b.start_backward();
    fault_.fail_if_due(rank(), 0);
    b.compute_backward(SparseBlocks::local);
    step_done(1, ex);
    if (!ex) return;
    b.wait(ticket);
    fault_.fail_if_due(rank(), 1);
    b.clear_partials();
    b.compute_backward(SparseBlocks::remote);
    std::vector<ring::Transfer> sends, recvs;
    tm.bytes_sent += add_transfers(b, work_->recv_ranges, SparseSlab::partial, sends);
    add_transfers(b, work_->send_ranges, SparseSlab::returned, recvs);
    b.wait(b.post(std::move(sends), std::move(recvs), kGradReturn, 1, "block-sparse dK/dV return"));
    b.add_returned();
    step_done(2, ex);
  }

 private:
  // Tags above the ring's (step * 4 + kind).
  enum Tag { kFwdKv = 1 << 20, kBwdKv, kGradReturn };

  int rank() const { return comm_ ? comm_->rank() : 0; }

  // One K and one V transfer per peer range of `which`; returns their bytes.
  template <SparseBackend B>
  static int64_t add_transfers(B& b, const std::vector<PeerRange>& ranges, SparseSlab which,
                               std::vector<ring::Transfer>& out) {
    const bool kv = which == SparseSlab::send || which == SparseSlab::receive;
    const std::size_t elem = kv ? static_cast<std::size_t>(b.kv_elem_bytes()) : sizeof(float);
    const auto k_bytes = static_cast<std::size_t>(b.entry_elems()) * elem;
    const auto v_bytes = static_cast<std::size_t>(b.value_entry_elems()) * elem;
    const SlabHalves s = b.slab(which);
    int64_t total = 0;
    for (const PeerRange& r : ranges) {
      const auto first = static_cast<std::size_t>(r.first);
      const auto count = static_cast<std::size_t>(r.count);
      out.push_back({r.peer, static_cast<char*>(s.k) + first * k_bytes, count * k_bytes});
      out.push_back({r.peer, static_cast<char*>(s.v) + first * v_bytes, count * v_bytes});
      total += static_cast<int64_t>(count * (k_bytes + v_bytes));
    }
    return total;
  }

  // Packs and posts the K/V exchange. A stalled rank stops here, before its rows leave.
  template <SparseBackend B>
  int post_kv(B& b, Tag tag, ring::RingTimings& tm, const char* what) const {
    fault_.stall_if_due(rank(), 1, *comm_);
    b.pack();
    std::vector<ring::Transfer> sends, recvs;
    tm.bytes_sent += add_transfers(b, work_->send_ranges, SparseSlab::send, sends);
    add_transfers(b, work_->recv_ranges, SparseSlab::receive, recvs);
    return b.post(std::move(sends), std::move(recvs), tag, 1, what);
  }

  // Steps as the progress hook counts them: the local compute, then (with an exchange) the
  // remote one.
  void step_done(int done, bool exchanging) const {
    if (on_step_) on_step_(done, exchanging ? 2 : 1);
  }

  const RankSparseWork* work_ = nullptr;
  ring::Communicator* comm_ = nullptr;
  ring::FaultInjection fault_;
  std::function<void(int done, int steps)> on_step_;
};

}  // namespace ringattn::sparse

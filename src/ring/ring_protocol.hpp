// The ring protocol, written once for the CPU RingPlan and the GPU CudaRingPlan: which
// exchange is posted when, into which half of each double buffer, what is waited for before
// it is read or overwritten, and where the fault-injection and progress hooks sit. A backend
// supplies the buffers and the work (pack, post, wait, compute, add); the order is here.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/fault_injection.hpp"
#include "ring/ring_engine.hpp"
#include "ring/ring_schedule.hpp"

namespace ringattn::ring {

// The plan's double buffers; step t uses the halves t % 2. K/V buffers hold K rows then V
// rows ([rows, D] each, kv_elem_bytes() per element); partial and returned buffers the same
// in fp32 (dK then dV).
enum class RingBuffer { send, receive, partial, returned };

// A plan's double buffers, held by whatever owns memory on its backend.
template <typename Owner>
struct RingBuffers {
  Owner send[2], receive[2], partial[2], returned[2];

  const Owner& at(RingBuffer which, int t) const {
    const auto i = static_cast<std::size_t>(t % 2);
    switch (which) {
      case RingBuffer::send:
        return send[i];
      case RingBuffer::receive:
        return receive[i];
      case RingBuffer::partial:
        return partial[i];
      case RingBuffer::returned:
        break;
    }
    return returned[i];
  }
};

// What a backend supplies. Pointers to K/V are void: the element type (fp32 on the CPU, the
// device dtype on a GPU) is the backend's business; gradients are always fp32.
//   pack(t, k, v)          writes step t's send rows of the local k, v into buffer(send, t)
//   post(sends, recvs, tag, step, what)  starts an exchange, after the work so far; returns
//                          a ticket (-1 for an empty exchange)
//   wait(ticket)           what follows may read the exchange's buffers (-1: no-op)
//   compute_forward(t, k, v)  step t's waves against these K/V rows, merged into out/lse
//   compute_backward(t, k, v, dk, dv)  step t's waves, dK/dV added into dk, dv
//   clear(p, floats)       zeroes fp32 scratch
//   add_returned(t, dk, dv)  adds buffer(returned, t), packed like step t's send rows
template <typename B>
concept RingBackend = requires(B& b, int t, const void* kv, float* grad, std::vector<Transfer> xs,
                               const char* what) {
  { b.head_dim() } -> std::convertible_to<int64_t>;    // K (and dK) row width
  { b.head_dim_v() } -> std::convertible_to<int64_t>;  // V (and dV) row width
  { b.kv_elem_bytes() } -> std::convertible_to<std::size_t>;
  { b.buffer(RingBuffer::send, t) } -> std::same_as<void*>;
  b.pack(t, kv, kv);
  { b.post(std::move(xs), std::move(xs), t, t, what) } -> std::same_as<int>;
  b.wait(t);
  b.compute_forward(t, kv, kv);
  b.compute_backward(t, kv, kv, grad, grad);
  b.clear(grad, int64_t{});
  b.add_returned(t, grad, grad);
};

class RingProtocol {
 public:
  RingProtocol() = default;
  // `sched` must outlive the protocol (the plan owns both).
  RingProtocol(const RingSchedule& sched, Communicator& comm, const RingOptions& opts)
      : sched_(&sched), comm_(&comm), fault_(opts.fault), on_step_(opts.on_step) {}

  // Step 0 computes the local k, v while step 1's rows travel; step t waits for its rows,
  // posts step t+1's into the other buffer half (whose rows step t-1 has finished reading),
  // then computes.
  template <RingBackend B>
  void forward(B& b, const void* k, const void* v, RingTimings& tm) const {
    const int rank = comm_->rank(), world = comm_->size();
    step_done(0, world);
    int ticket = world > 1 ? post_kv(b, 1, kKvForward, k, v, tm) : -1;
    fault_.fail_if_due(rank, 0);
    b.compute_forward(0, k, v);
    step_done(1, world);
    for (int t = 1; t < world; ++t) {
      b.wait(ticket);
      ticket = t + 1 < world ? post_kv(b, t + 1, kKvForward, k, v, tm) : -1;
      fault_.fail_if_due(rank, t);
      if (step(t).recv_from >= 0) {
        const auto [rk, rv] = received(b, t);
        b.compute_forward(t, rk, rv);
      }
      step_done(t + 1, world);
    }
  }

  // The forward's K/V traffic, plus: the dK/dV of step t's received rows go back to their
  // owner from buffer(partial, t), into its buffer(returned, t). Step t reuses both halves of
  // step t-2, so that return is finished (waited for and added) first; returns are added in
  // step order, which makes dk, dv the same bits every run.
  template <RingBackend B>
  void backward(B& b, const void* k, const void* v, float* dk, float* dv, RingTimings& tm) const {
    const int rank = comm_->rank(), world = comm_->size();
    const int64_t d = b.head_dim(), d_v = b.head_dim_v();
    std::vector<int> ret_ticket(static_cast<std::size_t>(world), -1);
    auto finish_return = [&](int t) {
      if (t < 1 || ret_ticket[static_cast<std::size_t>(t)] < 0) return;
      b.wait(ret_ticket[static_cast<std::size_t>(t)]);
      ret_ticket[static_cast<std::size_t>(t)] = -1;
      if (step(t).send_to >= 0) b.add_returned(t, dk, dv);
    };

    step_done(0, world);
    int ticket = world > 1 ? post_kv(b, 1, kKvBackward, k, v, tm) : -1;
    fault_.fail_if_due(rank, 0);
    b.compute_backward(0, k, v, dk, dv);
    step_done(1, world);
    for (int t = 1; t < world; ++t) {
      b.wait(ticket);
      ticket = t + 1 < world ? post_kv(b, t + 1, kKvBackward, k, v, tm) : -1;
      finish_return(t - 2);
      fault_.fail_if_due(rank, t);
      const RingStep& st = step(t);
      auto* part = static_cast<float*>(b.buffer(RingBuffer::partial, t));
      std::vector<Transfer> sends, recvs;
      if (st.recv_from >= 0) {
        b.clear(part, st.recv_rows * (d + d_v));
        const auto [rk, rv] = received(b, t);
        b.compute_backward(t, rk, rv, part, part + st.recv_rows * d);
        const std::size_t bytes = grad_bytes(b, st.recv_rows);
        sends.push_back({st.recv_from, part, bytes});
        tm.bytes_sent += static_cast<int64_t>(bytes);
      }
      if (st.send_to >= 0)
        recvs.push_back(
            {st.send_to, b.buffer(RingBuffer::returned, t), grad_bytes(b, st.send_rows)});
      ret_ticket[static_cast<std::size_t>(t)] =
          b.post(std::move(sends), std::move(recvs), tag_of(t, kGradReturn), t, "dK/dV return");
      step_done(t + 1, world);
    }
    for (int t = std::max(1, world - 2); t < world; ++t) finish_return(t);
  }

 private:
  // Tags are unique per step and kind; the block-sparse exchange's lie above them.
  enum Tag { kKvForward = 0, kKvBackward = 1, kGradReturn = 2 };
  static int tag_of(int step, Tag kind) { return step * 4 + kind; }

  // A step's rows travel as K rows (head_dim each) then V rows (head_dim_v each), no padding.
  template <RingBackend B>
  static std::size_t kv_bytes(const B& b, int64_t rows) {
    return static_cast<std::size_t>(rows * (b.head_dim() + b.head_dim_v())) * b.kv_elem_bytes();
  }
  template <RingBackend B>
  static std::size_t grad_bytes(const B& b, int64_t rows) {
    return static_cast<std::size_t>(rows * (b.head_dim() + b.head_dim_v())) * sizeof(float);
  }

  const RingStep& step(int t) const { return sched_->steps[static_cast<std::size_t>(t)]; }

  // Step t's received K and V rows.
  template <RingBackend B>
  std::pair<const void*, const void*> received(B& b, int t) const {
    const auto* buf = static_cast<const char*>(b.buffer(RingBuffer::receive, t));
    return {buf, buf + static_cast<std::size_t>(step(t).recv_rows * b.head_dim()) *
                           b.kv_elem_bytes()};
  }

  // Packs and posts step t's K/V exchange. A stalled rank stops here, before its rows leave.
  template <RingBackend B>
  int post_kv(B& b, int t, Tag tag, const void* k, const void* v, RingTimings& tm) const {
    fault_.stall_if_due(comm_->rank(), t, *comm_);
    const RingStep& st = step(t);
    std::vector<Transfer> sends, recvs;
    if (st.send_to >= 0) {
      b.pack(t, k, v);
      sends.push_back({st.send_to, b.buffer(RingBuffer::send, t), kv_bytes(b, st.send_rows)});
      tm.bytes_sent += static_cast<int64_t>(kv_bytes(b, st.send_rows));
    }
    if (st.recv_from >= 0)
      recvs.push_back({st.recv_from, b.buffer(RingBuffer::receive, t), kv_bytes(b, st.recv_rows)});
    return b.post(std::move(sends), std::move(recvs), tag_of(t, tag), t,
                  tag == kKvForward ? "forward K/V" : "backward K/V");
  }

  void step_done(int done, int steps) const {
    if (on_step_) on_step_(done, steps);
  }

  const RingSchedule* sched_ = nullptr;
  Communicator* comm_ = nullptr;
  FaultInjection fault_;
  std::function<void(int done, int steps)> on_step_;
};

}  // namespace ringattn::ring

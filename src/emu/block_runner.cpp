// The fiber scheduler of one block: barrier intervals, warp order, warp-collective matching,
// and the faults for what real hardware would hang on or leave undefined.
#include "emu/block_runner.hpp"

#include <bit>
#include <cstdio>
#include <utility>

#include "emu/builtin_indices.hpp"
#include "emu/fault.hpp"
#include "emu/global_writes.hpp"

namespace ringattn::emu {
namespace {

thread_local BlockRunner* tl_block = nullptr;
thread_local ThreadState* tl_thread = nullptr;

std::string hex(std::uint32_t mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

// Where lane `u` is instead of at the collective `op` that another lane waits at.
std::string whereabouts(const ThreadState& u, const WarpOp& op, std::uint32_t mask) {
  switch (u.at) {
    case ThreadAt::barrier:
      return "waits at __syncthreads() at " + describe(u.where);
    case ThreadAt::exited:
      return "has exited";
    case ThreadAt::mbarrier:
      return "waits on the mbarrier at shared offset " + std::to_string(u.wait_bar) + " at " +
             describe(u.where);
    case ThreadAt::named_barrier:
      return "waits at named barrier " + std::to_string(u.named_id) + " at " + describe(u.where);
    case ThreadAt::yielded:
      return "stepped aside after an mbarrier.arrive or bar.arrive at " + describe(u.where);
    case ThreadAt::warp_op:
      if (!u.op->matches(op))
        return "waits at " + std::string(u.op->name()) + " at " + describe(u.where);
      return "waits at the same collective with mask " + hex(u.op_mask) + " instead of " +
             hex(mask) + " at " + describe(u.where);
    case ThreadAt::ready:
      break;
  }
  return "is still running";
}

}  // namespace

std::string describe(std::source_location where) {
  return std::string(where.file_name()) + ":" + std::to_string(where.line());
}

BlockRunner::BlockRunner(const LaunchConfig& config, const ExecutionMode& mode, StackPool& stacks)
    : config_(config),
      mode_(mode),
      stacks_(stacks),
      n_threads_(static_cast<unsigned>(volume(config.block))),
      n_warps_((n_threads_ + kWarpSize - 1) / kWarpSize) {}

unsigned BlockRunner::lanes_in(unsigned w) const {
  return w + 1 < n_warps_ ? kWarpSize : n_threads_ - w * kWarpSize;
}

std::uint32_t BlockRunner::warp_lanes_mask(unsigned w) const {
  const unsigned lanes = lanes_in(w);
  return lanes == kWarpSize ? 0xffffffffu : (1u << lanes) - 1u;
}

std::uint64_t BlockRunner::salt(std::uint64_t a, std::uint64_t b, std::uint64_t c) const {
  std::uint64_t h = block_linear_ * 0x9e3779b97f4a7c15ull;
  for (const std::uint64_t x : {a, b, c})
    h = (h ^ x) * 0xff51afd7ed558ccdull + 0x632be59bd9b4e019ull;
  return h;
}

void BlockRunner::run(Dim3 block_index, std::uint64_t block_linear,
                      const std::function<void()>& body) {
  block_index_ = block_index;
  block_linear_ = block_linear;
  arena_.reset(config_.shared_bytes);
  mbarriers_.clear();
  named_ = {};
  unit_swizzle_.assign((config_.shared_bytes + 15) / 16, 0);
  unit_generic_.assign((config_.shared_bytes + 15) / 16, GenericAccess{});
  bulk_reduces_.clear();
  LaunchWrites* const writes = current_launch_writes();
  if (writes) writes->reduces_in_flight = 0;
  threads_ = std::vector<ThreadState>(n_warps_ * kWarpSize);
  BlockRunner* const outer = std::exchange(tl_block, this);
  std::exception_ptr failure;
  try {
    schedule(body);
    // What a store or load callback saw and could not throw (global_writes.hpp).
    if (writes && writes->has_deferred()) {
      throw EmuFault(config_.kernel, block_index_,
                     unlinear(writes->deferred_thread(), config_.block), writes->deferred());
    }
  } catch (...) {
    failure = std::current_exception();
  }
  bulk_reduces_.clear();
  if (writes) writes->reduces_in_flight = 0;
  // Threads still suspended (after a fault) unwind here, outside any handler.
  for (ThreadState& t : threads_) t.fiber = boost::context::fiber();
  threads_.clear();
  mbarriers_.clear();
  tl_block = outer;
  if (failure) std::rethrow_exception(failure);
}

void BlockRunner::schedule(const std::function<void()>& body) {
  for (unsigned i = 0; i < n_threads_; ++i) {
    ThreadState& t = threads_[i];
    t.index = unlinear(i, config_.block);
    t.warp = i / kWarpSize;
    t.lane = i % kWarpSize;
    t.fiber = boost::context::fiber(
        std::allocator_arg, PooledStack{&stacks_}, [this, &t, &body](boost::context::fiber&& back) {
          t.back = std::move(back);
          try {
            body();
          } catch (const boost::context::detail::forced_unwind&) {
            throw;  // the fiber is being destroyed: let Boost.Context unwind it
          } catch (...) {
            t.failure = std::current_exception();
          }
          t.at = ThreadAt::exited;
          t.copies.land_all(arena_);
          if (!t.failure && (!t.wgmma_open.empty() || !t.wgmma_groups.empty())) {
            try {
              fault_at(t, "exited with wgmma.mma_async in flight (no wgmma.commit_group and "
                          "wgmma.wait_group for it)");
            } catch (...) {
              t.failure = std::current_exception();
            }
          }
          if (!t.failure) {
            const unsigned me = t.warp * kWarpSize + t.lane;
            for (const BulkReduce& r : bulk_reduces_) {
              if (r.issuer != me) continue;
              try {
                fault_at(t, "exited with a cp.reduce.async.bulk from " + describe(r.where) +
                                " not completed (no cp.async.bulk.commit_group and "
                                "cp.async.bulk.wait_group for it): the block's shared memory "
                                "it reads may be reassigned");
              } catch (...) {
                t.failure = std::current_exception();
              }
              break;
            }
          }
          return std::move(t.back);
        });
  }
  for (std::uint64_t interval = 0;; ++interval) {
    // Warps run in the interval's order until each thread waits at the barrier, waits on an
    // mbarrier or has exited; threads whose mbarrier phase has completed then run again
    // (in a new order), until no one can.
    for (std::uint64_t pass = 0;; ++pass) {
      for (const unsigned w : run_order(mode_, n_warps_, salt(1, interval, pass)))
        run_warp(w, pass == 0 ? interval : interval ^ (pass << 40));
      if (!wake_mbarrier_waiters()) break;
    }
    for (unsigned i = 0; i < n_threads_; ++i) {
      const ThreadState& t = threads_[i];
      if (t.at == ThreadAt::named_barrier) {
        const NamedBarrier& b = named_[t.named_id];
        fault_at(t, "waits at named barrier " + std::to_string(t.named_id) + " for " +
                        std::to_string(b.expected) + " threads, of which " +
                        std::to_string(b.arrived) +
                        " arrived; every other thread waits or has exited (at " +
                        describe(t.where) + ")");
      }
      if (t.at != ThreadAt::mbarrier) continue;
      const Mbarrier& bar = mbarriers_.at(t.wait_bar);
      fault_at(t, "waits on the mbarrier at shared offset " + std::to_string(t.wait_bar) +
                      " for the phase of parity " + std::to_string(t.wait_parity) +
                      ", which can never complete: its phase " + std::to_string(bar.phase) +
                      " still waits for " + std::to_string(bar.pending) + " of " +
                      std::to_string(bar.count) + " arrivals and " + std::to_string(bar.tx) +
                      " transaction bytes, and every other thread waits or has exited (at " +
                      describe(t.where) + ")");
    }
    // Every thread now waits at the barrier or has exited.
    const ThreadState* waiting = nullptr;
    const ThreadState* gone = nullptr;
    for (unsigned i = 0; i < n_threads_; ++i) {
      const ThreadState& t = threads_[i];
      if (t.at == ThreadAt::barrier && !waiting) waiting = &t;
      if (t.at == ThreadAt::exited && !gone) gone = &t;
    }
    if (!waiting) return finish_mbarriers();
    if (gone) {
      fault_at(*gone, "exited while other threads of its block wait at __syncthreads() (thread " +
                          to_string(waiting->index) + " at " + describe(waiting->where) + ")");
    }
    for (unsigned i = 0; i < n_threads_; ++i) threads_[i].at = ThreadAt::ready;  // all waited
  }
}

bool BlockRunner::wake_mbarrier_waiters() {
  bool woke = false, yielded = false;
  for (unsigned i = 0; i < n_threads_; ++i) {
    ThreadState& t = threads_[i];
    if (t.at == ThreadAt::named_barrier && named_[t.named_id].generation != t.named_generation) {
      t.at = ThreadAt::ready;
      woke = true;
    }
    yielded = yielded || t.at == ThreadAt::yielded;
    if (t.at != ThreadAt::mbarrier) continue;
    Mbarrier& bar = mbarriers_.at(t.wait_bar);
    land_bulk_copies(bar, t.wait_bar, t);
    if (bar.complete(t.wait_parity)) {
      t.at = ThreadAt::ready;
      woke = true;
    }
  }
  // Threads that stepped aside run again once no waiter is left to go first.
  if (!woke && yielded) {
    for (unsigned i = 0; i < n_threads_; ++i)
      if (threads_[i].at == ThreadAt::yielded) threads_[i].at = ThreadAt::ready;
    woke = true;
  }
  return woke;
}

void BlockRunner::finish_mbarriers() {
  // wgmma is a warpgroup instruction: the four warps of a group issue the same sequence.
  for (unsigned g = 0; g * 4 < n_warps_; ++g) {
    const unsigned first = g * 4 * kWarpSize;
    for (unsigned w = 1; w < 4 && g * 4 + w < n_warps_; ++w) {
      const ThreadState& a = threads_[first];
      const ThreadState& b = threads_[first + w * kWarpSize];
      if (a.wgmma_issued != b.wgmma_issued) {
        fault_at(a.wgmma_issued < b.wgmma_issued ? a : b,
                 "warpgroup " + std::to_string(g) + ": warp " + std::to_string(g * 4) + " issued " +
                     std::to_string(a.wgmma_issued) + " wgmma.mma_async and warp " +
                     std::to_string(g * 4 + w) + " " + std::to_string(b.wgmma_issued) +
                     " (every warp of a warpgroup executes each wgmma)");
      }
    }
  }
  for (auto& [offset, bar] : mbarriers_) {
    if (!bar.in_flight.empty()) {
      fault_at(threads_[bar.in_flight.front().issuer],
               "the block exited with a bulk copy into shared offset " +
                   std::to_string(bar.in_flight.front().dst) + " in flight on the mbarrier at " +
                   std::to_string(offset) + " (no thread waited on it)");
    }
  }
}

void BlockRunner::run_warp(unsigned w, std::uint64_t interval) {
  const unsigned lanes = lanes_in(w);
  for (std::uint64_t round = 0;; ++round) {
    if (mode_.order == RunOrder::shuffled) {
      for (const unsigned l : run_order(mode_, lanes, salt(2, interval, round * 4096 + w)))
        if (thread(w, l).at == ThreadAt::ready) resume(thread(w, l));
    } else {
      for (unsigned i = 0; i < lanes; ++i) {
        const unsigned l = mode_.order == RunOrder::forward ? i : lanes - 1 - i;
        if (thread(w, l).at == ThreadAt::ready) resume(thread(w, l));
      }
    }
    if (!perform_warp_ops(w)) return;
  }
}

bool BlockRunner::perform_warp_ops(unsigned w) {
  const unsigned lanes = lanes_in(w);
  const std::uint32_t existing = warp_lanes_mask(w);
  bool performed = false;
  for (unsigned l = 0; l < lanes; ++l) {
    ThreadState& t = thread(w, l);
    if (t.at != ThreadAt::warp_op) continue;
    const std::string name(t.op->name());
    const std::uint32_t mask = t.op_mask;
    const std::string at = " (at " + describe(t.where) + ")";
    if (t.op_aligned && lanes < kWarpSize) {
      fault_at(t, name + " needs a full warp, but warp " + std::to_string(w) + " has " +
                      std::to_string(lanes) + " threads" + at);
    }
    if ((mask & ~existing) != 0) {
      fault_at(t, name + " with mask " + hex(mask) + " names lanes that warp " + std::to_string(w) +
                      " (" + std::to_string(lanes) + " threads) lacks" + at);
    }
    if ((mask >> l & 1u) == 0) {
      fault_at(t, name + " with mask " + hex(mask) + " leaves out the calling lane " +
                      std::to_string(l) + at);
    }
    WarpLanes group;
    group.mask = mask;
    unsigned arrived = 0;
    const ThreadState* missing = nullptr;
    for (unsigned m = 0; m < lanes; ++m) {
      if ((mask >> m & 1u) == 0) continue;
      ThreadState& u = thread(w, m);
      if (u.at == ThreadAt::warp_op && u.op->matches(*t.op) && u.op_mask == mask) {
        ++arrived;
        group.op[m] = u.op;
        group.thread[m] = &u;
      } else if (!missing) {
        missing = &u;
      }
    }
    // It comes once resumed: a lane that stepped aside, or one still parked at a named
    // barrier whose generation a later lane of this warp has just completed, or at an
    // mbarrier whose phase completed while this lane stepped aside.
    if (missing && (missing->at == ThreadAt::yielded ||
                    (missing->at == ThreadAt::named_barrier &&
                     named_[missing->named_id].generation != missing->named_generation) ||
                    (missing->at == ThreadAt::mbarrier &&
                     mbarriers_.at(missing->wait_bar).complete(missing->wait_parity))))
      continue;
    if (missing) {
      fault_at(t, name + " (mask " + hex(mask) + ") reached by only " + std::to_string(arrived) +
                      " of the " + std::to_string(std::popcount(mask)) + " lanes of warp " +
                      std::to_string(w) + " that must take part" + at + "; lane " +
                      std::to_string(missing->lane) + " (thread " + to_string(missing->index) +
                      ") " + whereabouts(*missing, *t.op, mask));
    }
    t.op->perform(group);
    for (unsigned m = 0; m < lanes; ++m) {
      if (group.thread[m]) {
        ThreadState& u = thread(w, m);
        u.at = ThreadAt::ready;
        u.op = nullptr;
      }
    }
    performed = true;
  }
  return performed;
}

void BlockRunner::resume(ThreadState& t) {
  tl_thread = &t;
  ::threadIdx = t.index;
  ::blockIdx = block_index_;
  ::blockDim = config_.block;
  ::gridDim = config_.grid;
  t.fiber = std::move(t.fiber).resume();
  tl_thread = nullptr;
  if (t.failure) std::rethrow_exception(t.failure);
}

BlockRunner& current_block() {
  if (!tl_block) throw EmuUsageError("an emulated device intrinsic was called outside a kernel");
  return *tl_block;
}

ThreadState& current_thread() {
  if (!tl_thread) throw EmuUsageError("an emulated device intrinsic was called outside a kernel");
  return *tl_thread;
}

namespace {
void suspend(ThreadState& t) { t.back = std::move(t.back).resume(); }
}  // namespace

void arrive_at_barrier(std::source_location where) {
  ThreadState& t = current_thread();
  t.at = ThreadAt::barrier;
  t.where = where;
  suspend(t);
}

void wait_at_named_barrier(unsigned id, std::uint64_t generation, std::source_location where) {
  ThreadState& t = current_thread();
  t.at = ThreadAt::named_barrier;
  t.named_id = id;
  t.named_generation = generation;
  t.where = where;
  suspend(t);
}

void wait_at_mbarrier(std::uint32_t bar, unsigned parity, std::source_location where) {
  ThreadState& t = current_thread();
  t.at = ThreadAt::mbarrier;
  t.wait_bar = bar;
  t.wait_parity = parity;
  t.where = where;
  suspend(t);
}

namespace {
// Under ExecutionMode::arrive_yields, suspends the running thread (it steps aside) when some
// thread of the block is `released` (a waiter the running thread's arrive has just let go).
template <class Released>
void yield_to_released(Released&& released, std::source_location where) {
  BlockRunner& block = current_block();
  if (!block.mode().arrive_yields) return;
  const unsigned threads = block.config().block.x * block.config().block.y * block.config().block.z;
  bool waited_for = false;
  for (unsigned i = 0; i < threads && !waited_for; ++i) waited_for = released(block.thread_at(i));
  if (!waited_for) return;
  ThreadState& t = current_thread();
  t.at = ThreadAt::yielded;
  t.where = where;
  suspend(t);
}
}  // namespace

void yield_after_arrive(std::uint32_t bar, unsigned completed, std::source_location where) {
  yield_to_released(
      [&](const ThreadState& u) {
        return u.at == ThreadAt::mbarrier && u.wait_bar == bar &&
               (u.wait_parity & 1u) == (completed & 1u);
      },
      where);
}

void yield_after_named_arrive(unsigned id, std::uint64_t ended, std::source_location where) {
  yield_to_released(
      [&](const ThreadState& u) {
        return u.at == ThreadAt::named_barrier && u.named_id == id &&
               u.named_generation == ended;
      },
      where);
}

void arrive_at_warp_op(WarpOp& op, std::uint32_t mask, bool aligned, std::source_location where) {
  ThreadState& t = current_thread();
  t.at = ThreadAt::warp_op;
  t.op = &op;
  t.op_mask = aligned ? current_block().warp_lanes_mask(t.warp) : mask;
  t.op_aligned = aligned;
  t.where = where;
  suspend(t);
}

void fault_at(const ThreadState& t, const std::string& problem) {
  const BlockRunner& block = current_block();
  throw EmuFault(block.config().kernel, block.block_index(), t.index, problem);
}

void fault_here(const std::string& problem) { fault_at(current_thread(), problem); }

const ThreadState* BlockRunner::unfenced_generic_access(std::uint32_t offset) const {
  const GenericAccess& g = unit_generic_[offset / 16];
  if (g.thread == 0) return nullptr;
  const ThreadState& t = threads_[g.thread - 1];
  return t.proxy_fences == g.fences ? &t : nullptr;
}

std::string describe_generic_access(const ThreadState& t) {
  return "thread (" + std::to_string(t.index.x) + ", " + std::to_string(t.index.y) + ", " +
         std::to_string(t.index.z) + ") accessed it through the generic proxy with no "
         "fence.proxy.async after that (the async proxy may not see its store)";
}

}  // namespace ringattn::emu

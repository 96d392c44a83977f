// One thread block on the CPU: its threads as fibers (Boost.Context), run warp by warp in
// barrier intervals (the warps of an interval in the execution mode's order, each warp's
// lanes until all wait at a barrier or have exited, resolving warp collectives on the way),
// and the block's shared-memory arena. Intrinsics find the running thread and block here.
#pragma once

#include <array>
#include <boost/context/fiber.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "emu/cp_async.hpp"
#include "emu/dim3.hpp"
#include "emu/execution_mode.hpp"
#include "emu/launch.hpp"
#include "emu/shared_memory.hpp"
#include "emu/stack_pool.hpp"
#include "emu/warp_op.hpp"

namespace ringattn::emu {

// `yielded`: stepped aside at a phase-completing mbarrier.arrive, or a bar.arrive that ends a
// named barrier's generation (ExecutionMode::arrive_yields); it runs again once the threads
// that woke have had their turn.
enum class ThreadAt { ready, barrier, warp_op, mbarrier, named_barrier, yielded, exited };

// An asynchronous warpgroup operation in flight (wgmma.mma_async under the at-wait landing):
// shared by the lanes that issued it, landed once, by the first wait that covers it.
struct PendingAsync {
  virtual ~PendingAsync() = default;
  virtual void land() = 0;
  bool landed = false;
};

struct ThreadState {
  Dim3 index;
  unsigned warp = 0, lane = 0;
  ThreadAt at = ThreadAt::ready;
  WarpOp* op = nullptr;  // the collective it waits at
  std::uint32_t op_mask = 0;
  bool op_aligned = false;
  std::source_location where;  // of the barrier or collective it waits at
  CpAsyncQueue copies;
  std::uint32_t wait_bar = 0;  // at mbarrier: the barrier's offset and the phase parity
  unsigned wait_parity = 0;
  unsigned named_id = 0;  // at named_barrier: its id and the generation it waits to end
  std::uint64_t named_generation = 0;
  // wgmma: issued and not committed, committed groups (oldest first), whether a
  // wgmma.fence came since the last wgmma.wait_group, and how many this warp issued.
  std::vector<std::shared_ptr<PendingAsync>> wgmma_open;
  std::vector<std::vector<std::shared_ptr<PendingAsync>>> wgmma_groups;
  bool wgmma_fenced = false;
  std::uint64_t wgmma_issued = 0;
  // fence.proxy.async instructions it has run: a generic access it made before the latest
  // one is ordered before the async proxy's later accesses (see GenericAccess).
  std::uint32_t proxy_fences = 0;
  // cp.async.bulk.commit_group instructions it has run (its bulk async-groups so far).
  std::uint64_t bulk_groups = 0;
  std::exception_ptr failure;   // what its body threw
  boost::context::fiber fiber;  // resumes this thread (empty while it runs or once done)
  boost::context::fiber back;   // inside the thread: resumes the scheduler
};

inline constexpr std::uint8_t kUnitInFlight = 0xff;

// The last generic-proxy access (through SharedPtr) to a 16-byte unit of the arena: 1 + the
// thread's linear index (0: none since an async copy last landed there) and that thread's
// proxy_fences then. While the thread has run no fence.proxy.async since, a wgmma (the async
// proxy) reading the unit may not see a store there: that read is a fault. The emulator
// cannot tell a load through SharedPtr from a store, so it counts both; a TMA copy over a
// unit the generic proxy read is left alone (the mbarrier that frees a stage orders those
// reads, as CUTLASS's pipelines rely on).
struct GenericAccess {
  std::uint32_t thread = 0;
  std::uint32_t fences = 0;
};

// One mbarrier's state (emu/mbarrier.hpp), kept by the block beside its arena.
struct Mbarrier {
  unsigned count = 0;       // arrivals per phase
  unsigned pending = 0;     // arrivals still to come in the current phase
  std::int64_t tx = 0;      // transaction bytes expected and not yet completed
  std::uint64_t phase = 0;  // the current phase's number (phases before it completed)
  struct Copy {
    std::uint32_t dst = 0;
    std::vector<std::byte> bytes;
    // When not empty: bytes are 16-byte units, unit i landing at units[i] (a swizzled box).
    std::vector<std::uint32_t> units;
    std::uint8_t unit_mode = 0;  // 1 + the tensor map's TmaSwizzle, for units
    unsigned issuer = 0;  // linear thread index
  };
  std::vector<Copy> in_flight;  // bulk copies not landed yet (landing at the wait)
  bool complete(unsigned parity) const { return (phase & 1u) != (parity & 1u); }
};

// A cp.reduce.async.bulk of the block that has not completed (emu/bulk_reduce.hpp).
struct BulkReduce {
  static constexpr std::uint64_t kOpen = ~std::uint64_t{0};
  float* dst = nullptr;
  std::uint32_t src = 0, bytes = 0;
  std::vector<float> values;    // the source, read at the issue
  unsigned issuer = 0;          // linear thread index
  std::uint64_t group = kOpen;  // the issuer's bulk async-group, once committed
  bool source_read = false;     // a wait_group.read covered it: the source may be rewritten
  bool applied = false;         // its adds have landed in global memory
  std::source_location where;
};

// A named barrier (bar.sync / bar.arrive with an id and a thread count).
struct NamedBarrier {
  unsigned expected = 0, arrived = 0;
  std::uint64_t generation = 0;
};

class BlockRunner {
 public:
  BlockRunner(const LaunchConfig& config, const ExecutionMode& mode, StackPool& stacks);
  BlockRunner(const BlockRunner&) = delete;
  BlockRunner& operator=(const BlockRunner&) = delete;

  // Runs block `block_index` to completion; rethrows the first fault.
  void run(Dim3 block_index, std::uint64_t block_linear, const std::function<void()>& body);

  const LaunchConfig& config() const { return config_; }
  const ExecutionMode& mode() const { return mode_; }
  Dim3 block_index() const { return block_index_; }
  SharedArena& arena() { return arena_; }
  // Per 16-byte unit of the arena: 0, 1 + the TmaSwizzle of the tensor copy that last wrote
  // it (what a wgmma descriptor reading it must agree with), or kUnitInFlight while an
  // asynchronous copy to it has not landed.
  std::vector<std::uint8_t>& unit_swizzle() { return unit_swizzle_; }
  std::vector<GenericAccess>& unit_generic() { return unit_generic_; }
  // The thread whose generic access to the unit at `offset` no fence.proxy.async has ordered
  // before the async proxy yet, or nullptr.
  const ThreadState* unfenced_generic_access(std::uint32_t offset) const;
  // The block's mbarriers by shared-memory offset (initialised ones only).
  std::map<std::uint32_t, Mbarrier>& mbarriers() { return mbarriers_; }
  NamedBarrier& named_barrier(unsigned id) { return named_[id]; }
  // The block's bulk reduces that have not completed, in issue order.
  std::vector<BulkReduce>& bulk_reduces() { return bulk_reduces_; }
  ThreadState& thread_at(unsigned linear) { return threads_[linear]; }
  // The lanes that exist in warp `w` (fewer than 32 in a partial last warp), as a mask.
  std::uint32_t warp_lanes_mask(unsigned w) const;

 private:
  void schedule(const std::function<void()>& body);
  void run_warp(unsigned w, std::uint64_t interval);
  bool wake_mbarrier_waiters();  // whether a waiter's phase completed (it is ready again)
  void finish_mbarriers();       // at the block's end: copies still in flight are a fault
  bool perform_warp_ops(unsigned w);
  void resume(ThreadState& t);
  ThreadState& thread(unsigned w, unsigned lane) { return threads_[w * kWarpSize + lane]; }
  unsigned lanes_in(unsigned w) const;
  std::uint64_t salt(std::uint64_t a, std::uint64_t b, std::uint64_t c) const;

  const LaunchConfig& config_;
  const ExecutionMode mode_;
  StackPool& stacks_;
  unsigned n_threads_, n_warps_;
  Dim3 block_index_;
  std::uint64_t block_linear_ = 0;
  SharedArena arena_;
  std::map<std::uint32_t, Mbarrier> mbarriers_;
  std::vector<std::uint8_t> unit_swizzle_;
  std::vector<GenericAccess> unit_generic_;
  std::array<NamedBarrier, 16> named_{};
  std::vector<BulkReduce> bulk_reduces_;
  std::vector<ThreadState> threads_;
};

// The block and thread running on this OS thread; EmuUsageError outside a kernel thread.
BlockRunner& current_block();
ThreadState& current_thread();

// Suspend the running thread at __syncthreads(), or at a warp collective (with `aligned`,
// the whole warp must take part and `mask` is ignored) until the runner releases it.
void arrive_at_barrier(std::source_location where);
void arrive_at_warp_op(WarpOp& op, std::uint32_t mask, bool aligned, std::source_location where);
// Suspend the running thread until named barrier `id` ends its generation `generation`.
void wait_at_named_barrier(unsigned id, std::uint64_t generation, std::source_location where);
// Suspend the running thread until the mbarrier at `bar` completes the phase of `parity`.
void wait_at_mbarrier(std::uint32_t bar, unsigned parity, std::source_location where);
// Under ExecutionMode::arrive_yields, after the running thread's arrive completed the phase
// of the mbarrier at `bar` whose parity `completed` is: if another thread waits for that
// phase, suspend the running thread until the waiters have run.
void yield_after_arrive(std::uint32_t bar, unsigned completed, std::source_location where);
// The same after a bar.arrive that ended generation `ended` of named barrier `id`: the threads
// waiting at it (bar.sync) run before the arriving thread goes on (a producer that signals
// before it has written shows to the consumers it released).
void yield_after_named_arrive(unsigned id, std::uint64_t ended, std::source_location where);
// Lands the barrier's bulk copies still in flight and completes their bytes on it (a wait
// on it, under CpAsyncLanding::at_wait); may complete its phase. Faults name `t`.
void land_bulk_copies(Mbarrier& bar, std::uint32_t offset, const ThreadState& t);

// EmuFault naming the kernel, the running block and thread `t` (or the running thread).
[[noreturn]] void fault_at(const ThreadState& t, const std::string& problem);
[[noreturn]] void fault_here(const std::string& problem);

std::string describe(std::source_location where);  // "file:line"
// "thread (x, y, z) accessed it ... with no fence.proxy.async after that ...": what a
// fault on an unfenced generic access (BlockRunner::unfenced_generic_access) says.
std::string describe_generic_access(const ThreadState& t);

}  // namespace ringattn::emu

// One thread block on the CPU: its threads as fibers (Boost.Context), run warp by warp in
// barrier intervals (the warps of an interval in the execution mode's order, each warp's
// lanes until all wait at a barrier or have exited, resolving warp collectives on the way),
// and the block's shared-memory arena. Intrinsics find the running thread and block here.
#pragma once

#include <boost/context/fiber.hpp>
#include <cstdint>
#include <exception>
#include <functional>
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

enum class ThreadAt { ready, barrier, warp_op, exited };

struct ThreadState {
  Dim3 index;
  unsigned warp = 0, lane = 0;
  ThreadAt at = ThreadAt::ready;
  WarpOp* op = nullptr;  // the collective it waits at
  std::uint32_t op_mask = 0;
  bool op_aligned = false;
  std::source_location where;  // of the barrier or collective it waits at
  CpAsyncQueue copies;
  std::exception_ptr failure;   // what its body threw
  boost::context::fiber fiber;  // resumes this thread (empty while it runs or once done)
  boost::context::fiber back;   // inside the thread: resumes the scheduler
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
  // The lanes that exist in warp `w` (fewer than 32 in a partial last warp), as a mask.
  std::uint32_t warp_lanes_mask(unsigned w) const;

 private:
  void schedule(const std::function<void()>& body);
  void run_warp(unsigned w, std::uint64_t interval);
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
  std::vector<ThreadState> threads_;
};

// The block and thread running on this OS thread; EmuUsageError outside a kernel thread.
BlockRunner& current_block();
ThreadState& current_thread();

// Suspend the running thread at __syncthreads(), or at a warp collective (with `aligned`,
// the whole warp must take part and `mask` is ignored) until the runner releases it.
void arrive_at_barrier(std::source_location where);
void arrive_at_warp_op(WarpOp& op, std::uint32_t mask, bool aligned, std::source_location where);

// EmuFault naming the kernel, the running block and thread `t` (or the running thread).
[[noreturn]] void fault_at(const ThreadState& t, const std::string& problem);
[[noreturn]] void fault_here(const std::string& problem);

std::string describe(std::source_location where);  // "file:line"

}  // namespace ringattn::emu

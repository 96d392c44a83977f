// Fiber stacks for emulated threads: guard-paged (an overflow faults instead of corrupting
// a neighbour) and reused from block to block, so a launch maps each stack once.
#pragma once

#include <boost/context/stack_context.hpp>
#include <cstddef>
#include <vector>

namespace ringattn::emu {

class StackPool {
 public:
  // 256 KiB: far above what a kernel's registers and locals take, and only touched pages
  // cost memory.
  static constexpr std::size_t kStackBytes = 256 * 1024;

  StackPool() = default;
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  boost::context::stack_context take();
  void give_back(boost::context::stack_context& stack) noexcept;

 private:
  std::vector<boost::context::stack_context> free_;
};

// The StackAllocator that boost::context::fiber copies into each fiber: a handle to a pool.
struct PooledStack {
  StackPool* pool;
  boost::context::stack_context allocate() { return pool->take(); }
  void deallocate(boost::context::stack_context& stack) noexcept { pool->give_back(stack); }
};

}  // namespace ringattn::emu

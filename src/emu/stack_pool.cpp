// Guard-paged fiber stacks, kept for reuse until the pool goes.
#include "emu/stack_pool.hpp"

#include <boost/context/protected_fixedsize_stack.hpp>

namespace ringattn::emu {

StackPool::~StackPool() {
  boost::context::protected_fixedsize_stack allocator(kStackBytes);
  for (auto& stack : free_) allocator.deallocate(stack);
}

boost::context::stack_context StackPool::take() {
  if (free_.empty()) return boost::context::protected_fixedsize_stack(kStackBytes).allocate();
  const boost::context::stack_context stack = free_.back();
  free_.pop_back();
  return stack;
}

void StackPool::give_back(boost::context::stack_context& stack) noexcept {
  try {
    free_.push_back(stack);
  } catch (...) {  // no memory to remember it: unmap it instead
    boost::context::protected_fixedsize_stack(kStackBytes).deallocate(stack);
  }
}

}  // namespace ringattn::emu

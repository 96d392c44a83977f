// cp.async.cg.shared.global (16 bytes, zero-fill past src-size), commit_group and
// wait_group as in the PTX ISA, with the landing moment chosen by the execution mode: at
// the copy, or at the wait_group that covers it. Under at-wait a read of the destination
// before its wait sees the arena's old bytes, so a missing wait changes the result.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <source_location>
#include <vector>

#include "emu/shared_memory.hpp"

namespace ringattn::emu {

// One thread's copies in flight (used under at-wait): its uncommitted copies and its
// committed groups, oldest first.
class CpAsyncQueue {
 public:
  struct Copy {
    std::uint32_t dst;
    std::array<std::byte, 16> bytes;
  };
  void issue(const Copy& copy) { open_.push_back(copy); }
  void commit();
  // Lands every committed group but the newest `pending` ones.
  void wait(unsigned pending, SharedArena& arena);
  // At thread exit: whatever is still in flight lands (the hardware would write it).
  void land_all(SharedArena& arena);

 private:
  std::vector<Copy> open_;
  std::deque<std::vector<Copy>> groups_;
};

// cp.async.cg.shared.global [dst], [src], 16, src_size: copies src_size bytes (0..16) from
// global memory and zero-fills the rest. dst must be 16-byte aligned inside the arena and,
// when src_size > 0, src 16-byte aligned; otherwise a fault naming the thread.
void cp_async_cg_16(SharedAddress dst, const void* src, unsigned src_size = 16,
                    std::source_location where = std::source_location::current());
void cp_async_commit_group();
void cp_async_wait_group(unsigned pending);

}  // namespace ringattn::emu

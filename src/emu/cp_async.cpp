// cp.async under the two landing modes, and each thread's queue of copies in flight.
#include "emu/cp_async.hpp"

#include <cstring>
#include <string>

#include "emu/block_runner.hpp"
#include "emu/bulk_reduce.hpp"

namespace ringattn::emu {

void CpAsyncQueue::commit() {
  groups_.push_back(std::move(open_));
  open_.clear();
}

void CpAsyncQueue::wait(unsigned pending, SharedArena& arena) {
  while (groups_.size() > pending) {
    for (const Copy& c : groups_.front()) std::memcpy(arena.at(c.dst), c.bytes.data(), 16);
    groups_.pop_front();
  }
}

void CpAsyncQueue::land_all(SharedArena& arena) {
  commit();
  wait(0, arena);
}

void cp_async_cg_16(SharedAddress dst, const void* src, unsigned src_size,
                    std::source_location where) {
  const std::string at = " (at " + describe(where) + ")";
  if (src_size > 16) {
    fault_here("cp.async.cg 16 with src-size " + std::to_string(src_size) + " (at most 16)" + at);
  }
  if (src_size > 0 && reinterpret_cast<std::uintptr_t>(src) % 16 != 0) {
    fault_here("cp.async.cg 16 source address is not 16-byte aligned" + at);
  }
  ThreadState& t = current_thread();
  SharedArena& arena = current_block().arena();
  if (dst.offset % 16 != 0 || !arena.contains(dst.offset, 16)) {
    fault_here("cp.async.cg 16 destination offset " + std::to_string(dst.offset) +
               (dst.offset % 16 != 0
                    ? " is not 16-byte aligned"
                    : " is outside the block's " + std::to_string(arena.size()) + "-byte arena") +
               at);
  }
  if (src_size > 0) detail::check_reduce_read(src, src_size, "cp.async.cg 16", where);
  CpAsyncQueue::Copy copy{dst.offset, {}};
  if (src_size > 0) std::memcpy(copy.bytes.data(), src, src_size);
  if (current_block().mode().landing == CpAsyncLanding::at_copy) {
    std::memcpy(arena.at(dst.offset), copy.bytes.data(), 16);
  } else {
    t.copies.issue(copy);
  }
}

void cp_async_commit_group() { current_thread().copies.commit(); }

void cp_async_wait_group(unsigned pending) {
  current_thread().copies.wait(pending, current_block().arena());
}

}  // namespace ringattn::emu

// The shared-memory arena and the bounds and alignment check every access goes through.
#include "emu/shared_memory.hpp"

#include <cstring>
#include <new>
#include <string>

#include "emu/block_runner.hpp"
#include "emu/bulk_reduce.hpp"

namespace ringattn::emu {
namespace {
constexpr std::align_val_t kArenaAlignment{128};
}

void SharedArena::FreeAligned::operator()(std::byte* p) const {
  ::operator delete[](p, kArenaAlignment);
}

void SharedArena::reset(std::uint32_t bytes) {
  if (bytes > capacity_) {
    storage_.reset(static_cast<std::byte*>(::operator new[](bytes, kArenaAlignment)));
    capacity_ = bytes;
  }
  size_ = bytes;
  if (bytes > 0) std::memset(storage_.get(), std::to_integer<int>(kSharedPoison), bytes);
}

std::byte* checked_shared_bytes(SharedAddress at, std::uint32_t bytes, std::uint32_t align,
                                std::string_view what) {
  SharedArena& arena = current_block().arena();
  if (!arena.contains(at.offset, bytes)) {
    fault_here("shared-memory " + std::string(what) + " of " + std::to_string(bytes) +
               " bytes at offset " + std::to_string(at.offset) + " is outside the block's " +
               std::to_string(arena.size()) + "-byte arena");
  }
  if (at.offset % align != 0) {
    fault_here("shared-memory " + std::string(what) + " at offset " + std::to_string(at.offset) +
               " is not " + std::to_string(align) + "-byte aligned");
  }
  return arena.at(at.offset);
}

std::byte* generic_shared_bytes(SharedAddress at, std::uint32_t bytes, std::uint32_t align) {
  std::byte* const p = checked_shared_bytes(at, bytes, align, "access");
  if (!current_block().bulk_reduces().empty()) detail::check_reduce_source(at.offset, bytes);
  const ThreadState& t = current_thread();
  const GenericAccess mark{t.warp * kWarpSize + t.lane + 1, t.proxy_fences};
  std::vector<GenericAccess>& units = current_block().unit_generic();
  for (std::uint32_t u = at.offset / 16; u <= (at.offset + bytes - 1) / 16; ++u) units[u] = mark;
  return p;
}

void fence_proxy_async_shared() { ++current_thread().proxy_fences; }

}  // namespace ringattn::emu

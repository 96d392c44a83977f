// mbarrier state changes, the waits as scheduling points, and bulk copies (see mbarrier.hpp).
#include "emu/mbarrier.hpp"

#include <cstring>
#include <string>

#include "emu/block_runner.hpp"
#include "emu/bulk_reduce.hpp"

namespace ringattn::emu {
namespace {

std::string at(std::source_location where) { return " (at " + describe(where) + ")"; }

// The initialised barrier at `bar`, or a fault naming the call.
Mbarrier& barrier(SharedAddress bar, const char* call, std::source_location where) {
  BlockRunner& block = current_block();
  if (bar.offset % 8 != 0 || !block.arena().contains(bar.offset, 8)) {
    fault_here(std::string(call) + " on shared offset " + std::to_string(bar.offset) +
               (bar.offset % 8 != 0 ? ", which is not 8-byte aligned"
                                    : ", outside the block's " +
                                          std::to_string(block.arena().size()) + "-byte arena") +
               at(where));
  }
  const auto it = block.mbarriers().find(bar.offset);
  if (it == block.mbarriers().end()) {
    fault_here(std::string(call) + " on shared offset " + std::to_string(bar.offset) +
               ", where no mbarrier was initialised (mbarrier.init)" + at(where));
  }
  return it->second;
}

// After a change of counts: a phase whose arrivals and bytes are all in completes; bytes
// completed beyond those expected with every arrival in is a fault naming `t`.
void settle(Mbarrier& bar, std::uint32_t offset, const ThreadState& t) {
  if (bar.pending != 0) return;
  if (bar.tx < 0) {
    fault_at(t, "the mbarrier at shared offset " + std::to_string(offset) + " completed " +
                    std::to_string(-bar.tx) +
                    " transaction bytes more than expect-tx announced in phase " +
                    std::to_string(bar.phase));
  }
  if (bar.tx == 0) {
    ++bar.phase;
    bar.pending = bar.count;
  }
}

std::uint64_t arrive(SharedAddress bar, unsigned tx_bytes, const char* call,
                     std::source_location where) {
  Mbarrier& b = barrier(bar, call, where);
  const ThreadState& t = current_thread();
  if (b.pending == 0) {
    fault_here(std::string(call) + ": more arrivals than the mbarrier's count of " +
               std::to_string(b.count) + " in phase " + std::to_string(b.phase) + " (shared offset " +
               std::to_string(bar.offset) + ")" + at(where));
  }
  const std::uint64_t state = b.phase;
  b.tx += tx_bytes;
  --b.pending;
  settle(b, bar.offset, t);
  if (b.phase != state) yield_after_arrive(bar.offset, static_cast<unsigned>(state & 1u), where);
  return state;
}

}  // namespace

void land_bulk_copies(Mbarrier& bar, std::uint32_t offset, const ThreadState& t) {
  if (bar.in_flight.empty()) return;
  SharedArena& arena = current_block().arena();
  for (const Mbarrier::Copy& c : bar.in_flight) {
    std::vector<std::uint8_t>& modes = current_block().unit_swizzle();
    std::vector<GenericAccess>& generic = current_block().unit_generic();
    if (c.units.empty()) {
      std::memcpy(arena.at(c.dst), c.bytes.data(), c.bytes.size());
      for (std::size_t u = 0; u < c.bytes.size() / 16; ++u) {
        modes[c.dst / 16 + u] = 0;
        generic[c.dst / 16 + u] = {};
      }
    } else {
      for (std::size_t u = 0; u < c.units.size(); ++u) {
        std::memcpy(arena.at(c.units[u]), c.bytes.data() + 16 * u, 16);
        modes[c.units[u] / 16] = c.unit_mode;
        generic[c.units[u] / 16] = {};
      }
    }
    bar.tx -= static_cast<std::int64_t>(c.bytes.size());
  }
  bar.in_flight.clear();
  settle(bar, offset, t);
}

void mbarrier_init(SharedAddress bar, unsigned count, std::source_location where) {
  BlockRunner& block = current_block();
  if (bar.offset % 8 != 0 || !block.arena().contains(bar.offset, 8)) {
    fault_here("mbarrier.init on shared offset " + std::to_string(bar.offset) +
               (bar.offset % 8 != 0 ? ", which is not 8-byte aligned" : ", outside the arena") +
               at(where));
  }
  if (count == 0 || count >= (1u << 20)) {
    fault_here("mbarrier.init with count " + std::to_string(count) + " (1 to 2^20 - 1)" +
               at(where));
  }
  const auto it = block.mbarriers().find(bar.offset);
  if (it != block.mbarriers().end() && !it->second.in_flight.empty()) {
    fault_here("mbarrier.init on shared offset " + std::to_string(bar.offset) +
               ", whose barrier has bulk copies in flight" + at(where));
  }
  Mbarrier b;
  b.count = count;
  b.pending = count;
  block.mbarriers()[bar.offset] = b;
  // The 8 bytes are the barrier's: poisoned, as the hardware's opaque state would read.
  std::memset(block.arena().at(bar.offset), 0xff, 8);
}

std::uint64_t mbarrier_arrive(SharedAddress bar, std::source_location where) {
  return arrive(bar, 0, "mbarrier.arrive", where);
}

std::uint64_t mbarrier_arrive_expect_tx(SharedAddress bar, unsigned tx_bytes,
                                        std::source_location where) {
  return arrive(bar, tx_bytes, "mbarrier.arrive.expect_tx", where);
}

void mbarrier_expect_tx(SharedAddress bar, unsigned tx_bytes, std::source_location where) {
  Mbarrier& b = barrier(bar, "mbarrier.expect_tx", where);
  if (b.pending == 0) {
    fault_here("mbarrier.expect_tx on shared offset " + std::to_string(bar.offset) +
               " after its phase's arrivals are all in" + at(where));
  }
  b.tx += tx_bytes;
}

bool mbarrier_try_wait_parity(SharedAddress bar, unsigned parity, std::source_location where) {
  Mbarrier& b = barrier(bar, "mbarrier.try_wait.parity", where);
  land_bulk_copies(b, bar.offset, current_thread());
  if (!b.complete(parity)) wait_at_mbarrier(bar.offset, parity, where);
  return true;
}

bool mbarrier_test_wait_parity(SharedAddress bar, unsigned parity, std::source_location where) {
  Mbarrier& b = barrier(bar, "mbarrier.test_wait.parity", where);
  land_bulk_copies(b, bar.offset, current_thread());
  if (b.complete(parity)) return true;
  wait_at_mbarrier(bar.offset, parity, where);
  return false;
}

void cp_async_bulk_global_to_shared(SharedAddress dst, const void* src, unsigned bytes,
                                    SharedAddress bar, std::source_location where) {
  const char* call = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes";
  BlockRunner& block = current_block();
  if (bytes == 0 || bytes % 16 != 0) {
    fault_here(std::string(call) + " of " + std::to_string(bytes) +
               " bytes (a positive multiple of 16)" + at(where));
  }
  if (dst.offset % 16 != 0 || !block.arena().contains(dst.offset, bytes)) {
    fault_here(std::string(call) + " into shared offset " + std::to_string(dst.offset) +
               (dst.offset % 16 != 0 ? ", which is not 16-byte aligned"
                                     : ": " + std::to_string(bytes) + " bytes leave the " +
                                           std::to_string(block.arena().size()) +
                                           "-byte arena") +
               at(where));
  }
  if (reinterpret_cast<std::uintptr_t>(src) % 16 != 0) {
    fault_here(std::string(call) + " from a global address that is not 16-byte aligned" +
               at(where));
  }
  detail::check_reduce_read(src, bytes, call, where);
  detail::AsyncCopy copy;
  copy.dst = dst.offset;
  copy.bytes.resize(bytes);
  std::memcpy(copy.bytes.data(), src, bytes);  // the source is read at the copy
  detail::issue_async_copy(bar, std::move(copy), call, where);
}

void detail::issue_async_copy(SharedAddress bar, AsyncCopy copy, const char* call,
                              std::source_location where) {
  Mbarrier& b = barrier(bar, call, where);
  const ThreadState& t = current_thread();
  // Until it lands, its destination is in flight: a wgmma reading it is a fault.
  std::vector<std::uint8_t>& modes = current_block().unit_swizzle();
  if (copy.units.empty()) {
    for (std::size_t u = 0; u < copy.bytes.size() / 16; ++u) modes[copy.dst / 16 + u] = kUnitInFlight;
  } else {
    for (const std::uint32_t u : copy.units) modes[u / 16] = kUnitInFlight;
  }
  Mbarrier::Copy c;
  c.dst = copy.dst;
  c.bytes = std::move(copy.bytes);
  c.units = std::move(copy.units);
  c.unit_mode = copy.unit_mode;
  c.issuer = t.warp * kWarpSize + t.lane;
  b.in_flight.push_back(std::move(c));
  if (current_block().mode().landing == CpAsyncLanding::at_copy)
    land_bulk_copies(b, bar.offset, t);
}

}  // namespace ringattn::emu

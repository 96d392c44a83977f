// Bulk reduce-adds, their bulk async-groups, and the checks on them (see bulk_reduce.hpp).
#include "emu/bulk_reduce.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "emu/block_runner.hpp"
#include "emu/global_writes.hpp"

namespace ringattn::emu {
namespace {

constexpr const char* kCall = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32";

std::string at(std::source_location where) { return " (at " + describe(where) + ")"; }

std::string address(std::uintptr_t p) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(p));
  return text;
}

std::string thread_name(const BlockRunner& block, unsigned linear) {
  return "thread " + to_string(unlinear(linear, block.config().block));
}

void sync_count(BlockRunner& block) {
  if (LaunchWrites* w = current_launch_writes())
    w->reduces_in_flight = static_cast<unsigned>(block.bulk_reduces().size());
}

void apply(BulkReduce& r) {
  if (r.applied) return;
  for (std::size_t i = 0; i < r.values.size(); ++i) r.dst[i] += r.values[i];
  r.applied = true;
}

}  // namespace

void cp_reduce_async_bulk_add_f32(float* dst, SharedAddress src, unsigned bytes,
                                  std::source_location where) {
  BlockRunner& block = current_block();
  ThreadState& t = current_thread();
  const auto p = reinterpret_cast<std::uintptr_t>(dst);
  if (bytes == 0 || bytes % 16 != 0) {
    fault_here(std::string(kCall) + " of " + std::to_string(bytes) +
               " bytes (a positive multiple of 16)" + at(where));
  }
  if (src.offset % 16 != 0 || !block.arena().contains(src.offset, bytes)) {
    fault_here(std::string(kCall) + " from shared offset " + std::to_string(src.offset) +
               (src.offset % 16 != 0 ? ", which is not 16-byte aligned"
                                     : ": " + std::to_string(bytes) + " bytes leave the " +
                                           std::to_string(block.arena().size()) + "-byte arena") +
               at(where));
  }
  if (p % 16 != 0) {
    fault_here(std::string(kCall) + " into global address " + address(p) +
               ", which is not 16-byte aligned" + at(where));
  }
  LaunchWrites* writes = current_launch_writes();
  if (writes && !writes->is_global(p, bytes)) {
    fault_here(std::string(kCall) + " of " + std::to_string(bytes) + " bytes into " + address(p) +
               ", which is not inside one device allocation" + at(where));
  }
  // The source, as the async proxy reads it: every unit landed and fenced.
  for (std::uint32_t u = src.offset / 16; u < (src.offset + bytes) / 16; ++u) {
    if (block.unit_swizzle()[u] == kUnitInFlight) {
      fault_here(std::string(kCall) + " reads shared offset " + std::to_string(16 * u) +
                 ", where an asynchronous copy has not landed (wait on its mbarrier first)" +
                 at(where));
    }
    if (const ThreadState* g = block.unfenced_generic_access(16 * u)) {
      fault_here(std::string(kCall) + " reads shared offset " + std::to_string(16 * u) +
                 ", where " + describe_generic_access(*g) + at(where));
    }
  }
  // Two slices in flight may not overlap.
  for (const BulkReduce& r : block.bulk_reduces()) {
    const auto q = reinterpret_cast<std::uintptr_t>(r.dst);
    if (p < q + r.bytes && q < p + bytes) {
      fault_here(std::string(kCall) + " into [" + address(p) + ", +" + std::to_string(bytes) +
                 ") overlaps the slice [" + address(q) + ", +" + std::to_string(r.bytes) +
                 ") that " + thread_name(block, r.issuer) + " reduces into at " +
                 describe(r.where) +
                 ", which has not completed (cp.async.bulk.wait_group for it first)" + at(where));
    }
  }
  BulkReduce r;
  r.dst = dst;
  r.src = src.offset;
  r.bytes = bytes;
  r.values.resize(bytes / 4);
  std::memcpy(r.values.data(), block.arena().at(src.offset), bytes);
  r.issuer = t.warp * kWarpSize + t.lane;
  r.where = where;
  if (writes) writes->write(p, bytes, true);
  if (block.mode().landing == CpAsyncLanding::at_copy) apply(r);
  block.bulk_reduces().push_back(std::move(r));
  sync_count(block);
}

void cp_async_bulk_commit_group(std::source_location) {
  BlockRunner& block = current_block();
  ThreadState& t = current_thread();
  const unsigned me = t.warp * kWarpSize + t.lane;
  for (BulkReduce& r : block.bulk_reduces())
    if (r.issuer == me && r.group == BulkReduce::kOpen) r.group = t.bulk_groups;
  ++t.bulk_groups;
}

void cp_async_bulk_wait_group(unsigned pending, bool read, std::source_location) {
  BlockRunner& block = current_block();
  ThreadState& t = current_thread();
  const unsigned me = t.warp * kWarpSize + t.lane;
  // Groups older than the newest `pending` ones complete (or finish reading).
  const std::uint64_t done = t.bulk_groups > pending ? t.bulk_groups - pending : 0;
  std::vector<BulkReduce>& list = block.bulk_reduces();
  for (BulkReduce& r : list) {
    if (r.issuer != me || r.group == BulkReduce::kOpen || r.group >= done) continue;
    r.source_read = true;
    if (!read) apply(r);
  }
  if (!read) {
    std::erase_if(list, [&](const BulkReduce& r) {
      return r.issuer == me && r.group != BulkReduce::kOpen && r.group < done;
    });
  }
  sync_count(block);
}

std::string detail::reduce_conflict(std::uintptr_t p, std::size_t bytes, bool store) {
  BlockRunner& block = current_block();
  for (const BulkReduce& r : block.bulk_reduces()) {
    const auto q = reinterpret_cast<std::uintptr_t>(r.dst);
    if (p >= q + r.bytes || q >= p + bytes) continue;
    return std::string(store ? "a store to" : "a read of") + " global address " + address(p) +
           ", which " + thread_name(block, r.issuer) + " of this block reduces into at " +
           describe(r.where) +
           " and which has not completed: the accumulator may be touched only after "
           "cp.async.bulk.wait_group (without .read) for it";
  }
  return "";
}

void detail::check_reduce_read(const void* p, std::size_t bytes, const char* call,
                               std::source_location where) {
  if (current_block().bulk_reduces().empty()) return;
  const std::string problem = reduce_conflict(reinterpret_cast<std::uintptr_t>(p), bytes, false);
  if (!problem.empty()) fault_here(std::string(call) + ": " + problem + at(where));
}

void detail::check_reduce_source(std::uint32_t offset, std::uint32_t bytes) {
  BlockRunner& block = current_block();
  for (const BulkReduce& r : block.bulk_reduces()) {
    if (r.source_read || offset >= r.src + r.bytes || r.src >= offset + bytes) continue;
    fault_here("shared offset " + std::to_string(std::max(offset, r.src)) +
               " accessed through the generic proxy while " + thread_name(block, r.issuer) + "'s " +
               kCall + " at " + describe(r.where) +
               " may still read it (cp.async.bulk.wait_group.read for it first)");
  }
}

}  // namespace ringattn::emu

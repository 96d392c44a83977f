// The bulk reduce-add from shared to global memory and its bulk async-groups (PTX ISA:
// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32, cp.async.bulk.commit_group,
// cp.async.bulk.wait_group and cp.async.bulk.wait_group.read): how a backward kernel drains
// fp32 dQ slices from shared memory into a global accumulator that several blocks add to.
//
// A reduce reads `bytes` (a positive multiple of 16) of fp32 from shared memory at `src` and
// adds them element by element to global memory at `dst` (both 16-byte aligned), in the
// async proxy. The issuing thread's reduces since its last commit_group form a bulk
// async-group; wait_group N waits until at most the newest N committed groups are pending
// (their adds complete and visible to the thread), wait_group.read N only until their
// source reads are done (the shared source may be rewritten; the adds may still be pending).
//
// Timing: under CpAsyncLanding::at_copy the adds land at the issue; under at_wait at the
// wait_group that completes them. The source is read at the issue (a rewrite before it may
// be rewritten is a fault, below, so the moment does not show).
//
// Faults, naming the thread:
//   - size, alignment, a source outside the arena, a destination outside the launch's device
//     allocations (when the launch names them);
//   - a missing fence: a source unit that a thread accessed through the generic proxy with no
//     fence.proxy.async since (the async proxy may not see its stores), or one an
//     asynchronous copy has not landed in yet;
//   - two slices in flight overlapping: a reduce whose destination overlaps a reduce of the
//     same block that has not completed (a slice added twice, or a buffer drained into the
//     wrong rows);
//   - the shared source accessed through the generic proxy (a rewrite) before a wait_group
//     or wait_group.read covering its reduce;
//   - the accumulator touched by the block before the reduce completed (wait_group without
//     .read): read by cp.async, TMA and bulk copies, or written by plain stores of the sources
//     compiled with the store instrumentation (global_writes.hpp); a plain load is not seen,
//     but shows in the mode sweep (under at_wait the adds land at the completing wait);
//   - a thread that exits with reduces not completed (uncommitted, or not waited for without
//     .read): the block's shared memory they read may be reassigned.
// A reduce also counts as a write of the block in the check of races between blocks
// (global_writes.hpp): reduces of several blocks to one address are fine, a plain store of
// another block there is a race.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>

#include "emu/shared_memory.hpp"

namespace ringattn::emu {

void cp_reduce_async_bulk_add_f32(float* dst, SharedAddress src, unsigned bytes,
                                  std::source_location where = std::source_location::current());
void cp_async_bulk_commit_group(std::source_location where = std::source_location::current());
// wait_group (read false) or wait_group.read (read true) with `pending` groups left.
void cp_async_bulk_wait_group(unsigned pending, bool read = false,
                              std::source_location where = std::source_location::current());

namespace detail {
// What is wrong with the running thread touching [p, p + bytes) of global memory (a store,
// or a read) while a reduce of its block into it has not completed; "" when nothing is.
std::string reduce_conflict(std::uintptr_t p, std::size_t bytes, bool store);
// For the emulator's own reads of global memory (cp.async, bulk and tensor copies): a fault
// naming `call` on such a conflict.
void check_reduce_read(const void* p, std::size_t bytes, const char* call,
                       std::source_location where);
// A thread's generic access to shared units [offset, offset + bytes): faults when a reduce
// in flight has not read them yet.
void check_reduce_source(std::uint32_t offset, std::uint32_t bytes);
}  // namespace detail

}  // namespace ringattn::emu

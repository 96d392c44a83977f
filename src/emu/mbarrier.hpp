// mbarrier objects in shared memory and the bulk asynchronous copies that complete on them
// (PTX ISA: mbarrier.*, cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes),
// the synchronisation of Hopper's producer/consumer kernels.
//
// A barrier has an expected arrival count, the arrivals still pending in its current phase,
// a transaction count (bytes announced by expect-tx and not yet completed by copies) and a
// phase number. The phase completes when both pending counts reach zero; the next phase then
// expects the same count. Waits name the phase by its parity, as in PTX.
//
// Waiting is a scheduling point: mbarrier.try_wait (potentially blocking in PTX) suspends the
// thread until the phase completes, so a warp waiting on another warp's barrier lets that
// warp run; mbarrier.test_wait that finds the phase incomplete suspends likewise and then
// returns false (time has passed), so a spin loop on it makes progress too. A wait that can
// never complete (every other thread waits or has exited) is a fault naming the barrier and
// its counts, not a hang.
//
// Bulk copies land by the execution mode's landing choice: at the copy (their bytes complete
// on the barrier at once), or at the first wait on their barrier (CpAsyncLanding::at_wait),
// so a read of the destination before the wait sees the arena's old bytes and the result
// depends on the mode.
//
// Strict where the hardware is undefined: a barrier used before mbarrier.init or misaligned,
// more arrivals than its count in one phase, more transaction bytes completed than were
// expected, a block that exits with copies in flight or with a phase half done by copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <vector>

#include "emu/shared_memory.hpp"

namespace ringattn::emu {

// mbarrier.init.shared.b64 [bar], count (1 <= count < 2^20); bar 8-byte aligned.
void mbarrier_init(SharedAddress bar, unsigned count,
                   std::source_location where = std::source_location::current());
// mbarrier.arrive.shared.b64: one arrival; returns the state (the phase number arrived in).
std::uint64_t mbarrier_arrive(SharedAddress bar,
                              std::source_location where = std::source_location::current());
// mbarrier.arrive.expect_tx.shared.b64 [bar], tx: expect-tx(tx), then one arrival.
std::uint64_t mbarrier_arrive_expect_tx(
    SharedAddress bar, unsigned tx_bytes,
    std::source_location where = std::source_location::current());
// mbarrier.expect_tx.shared.b64 [bar], tx: the current phase also waits for tx bytes.
void mbarrier_expect_tx(SharedAddress bar, unsigned tx_bytes,
                        std::source_location where = std::source_location::current());
// mbarrier.try_wait.parity.shared.b64: returns once the phase of this parity has completed
// (true), suspending the thread until then.
bool mbarrier_try_wait_parity(SharedAddress bar, unsigned parity,
                              std::source_location where = std::source_location::current());
// mbarrier.test_wait.parity.shared.b64: true if the phase of this parity has completed;
// otherwise the thread is suspended until it has, and false is returned.
bool mbarrier_test_wait_parity(SharedAddress bar, unsigned parity,
                               std::source_location where = std::source_location::current());

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar]:
// bytes (a multiple of 16) from global memory to shared memory, both 16-byte aligned, their
// count completed on `bar` as transaction bytes when they land.
void cp_async_bulk_global_to_shared(SharedAddress dst, const void* src, unsigned bytes,
                                    SharedAddress bar,
                                    std::source_location where = std::source_location::current());

namespace detail {
// An asynchronous copy of the running thread completing on `bar` (bulk or tensor): checked
// against the barrier, then landed now or at the first wait, by the execution mode.
struct AsyncCopy {
  std::uint32_t dst = 0;
  std::vector<std::byte> bytes;
  std::vector<std::uint32_t> units;
  std::uint8_t unit_mode = 0;  // 1 + the tensor map's TmaSwizzle, for units
};
void issue_async_copy(SharedAddress bar, AsyncCopy copy, const char* call,
                      std::source_location where);
}  // namespace detail

}  // namespace ringattn::emu

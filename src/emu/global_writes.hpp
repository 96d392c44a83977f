// Races between the blocks of one launch on global memory: two blocks writing the same
// address with plain stores (or one with a plain store and one with a reduce) is a fault
// naming both blocks and the address, as the hardware, running blocks concurrently, would
// leave the result to timing. Reduces (cp.reduce.async.bulk) from several blocks to one
// address are what they are for and never fault.
//
// How the emulator sees plain stores: the kernels store to global memory through raw C++
// pointers, which no emulator function sees. The sources that hold kernels (the emulated
// kernel wrappers, and tests that plant races) are therefore compiled with the compiler's
// kernel-address-sanitizer instrumentation in its outline form, stores only (CMake:
// ringattn_emu_instrument_stores), which calls __asan_storeN_noabort(address) before every
// store the optimiser leaves in memory; this file defines those callbacks. Outside a launch
// they return at once; inside one they look the address up among the device allocations live
// at the launch (LaunchConfig::global) and, when it is one, record the running block in a
// shadow of that allocation (one entry per 2 bytes, allocated at its first write in the
// launch and freed at the launch's end). A store to a granule another block wrote is the
// race; since a callback may not throw (the compiler takes it for nothrow), the first one is
// kept and becomes the fault at the end of the racing block.
//
// Coverage, honestly: stores the compiler emits as instructions in instrumented sources,
// including the kernels' inline helpers instantiated there. Not covered: memcpy/memset calls
// (the emulator's own copies: cudaMemcpy, NCCL, TMA), stores in sources compiled without the
// instrumentation, races of reads against writes (loads are not instrumented: the compiler
// would then take a load's check for the store to the same address, and `p[i] += x`, the
// read-modify-write that races, would call the load's callback only). Two blocks storing the
// same value still fault, and single-byte stores of two blocks into the two bytes of one
// 2-byte granule would be a false fault (no kernel stores single bytes to global memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "emu/dim3.hpp"

namespace ringattn::emu {

// [begin, end) of one device allocation a launch may write.
struct GlobalRange {
  std::uintptr_t begin = 0, end = 0;
};

class LaunchWrites {
 public:
  LaunchWrites(std::vector<GlobalRange> ranges, Dim3 grid);
  LaunchWrites(const LaunchWrites&) = delete;
  LaunchWrites& operator=(const LaunchWrites&) = delete;

  // The block now running (its linear index in the grid).
  void begin_block(std::uint64_t linear) { block_ = static_cast<std::uint32_t>(linear + 1); }
  // A plain store (reduce false) or a reduce of `bytes` at `p` by the running block.
  void write(std::uintptr_t p, std::size_t bytes, bool reduce);
  // Whether [p, p + bytes) lies in one of the launch's device allocations (always true when
  // the launch named none).
  bool is_global(std::uintptr_t p, std::size_t bytes) const;
  bool tracks() const { return !ranges_.empty(); }

  // A problem seen where no fault could be thrown (inside a store callback): the first one
  // of the running block, with the linear index of the thread that caused it.
  void defer(unsigned thread, std::string problem);
  bool has_deferred() const { return !deferred_.empty(); }
  unsigned deferred_thread() const { return deferred_thread_; }
  const std::string& deferred() const { return deferred_; }

  // Bulk reduces in flight in the running block (bulk_reduce.cpp keeps the count), so that
  // the store callbacks check them only then.
  unsigned reduces_in_flight = 0;

 private:
  struct Range {
    GlobalRange span;
    std::unique_ptr<std::uint32_t, void (*)(std::uint32_t*)> shadow{nullptr, nullptr};
  };
  Range* find(std::uintptr_t p);
  std::vector<Range> ranges_;  // sorted by begin
  std::uintptr_t lo_ = 0, hi_ = 0;
  Dim3 grid_;
  std::uint32_t block_ = 0;  // 1 + the running block's linear index
  bool enabled_ = true;      // false for grids of 2^31 blocks or more
  std::string deferred_;
  unsigned deferred_thread_ = 0;
};

// atomicAdd(float*, float) on the emulator: the add, and a write of the reduce kind (never a
// race with other blocks' atomics or reduces). Out of line, in a source without the store
// instrumentation, so that its store is not taken for a plain one.
float atomic_add_f32(float* p, float value);

// The running launch's log on this OS thread (set by launch() for its duration), or null.
LaunchWrites* current_launch_writes();

namespace detail {
// Installs `w` as this OS thread's log for a scope.
class ScopedLaunchWrites {
 public:
  explicit ScopedLaunchWrites(LaunchWrites* w);
  ~ScopedLaunchWrites();
  ScopedLaunchWrites(const ScopedLaunchWrites&) = delete;
  ScopedLaunchWrites& operator=(const ScopedLaunchWrites&) = delete;

 private:
  LaunchWrites* saved_;
};
}  // namespace detail

}  // namespace ringattn::emu

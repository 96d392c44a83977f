// The bulk reduce-add: blocks that fill an fp32 slice in shared memory, fence it
// for the async proxy and drain it with cp.reduce.async.bulk into one accumulator give the
// sum over the blocks in every execution mode; the source may be rewritten after
// wait_group.read. Each misuse is a fault naming kernel, block and thread: a missing
// fence.proxy.async, the source rewritten before wait_group.read, two slices in flight
// overlapping, the accumulator read (by cp.async) before the reduce completed, or only after
// wait_group.read, and a thread exiting with its reduce not waited for; a plain load before
// the wait shows as landing dependence. Plain stores to the accumulator, and races between
// blocks, are in test_global_races.cpp.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "emu/bulk_reduce.hpp"
#include "emu/cp_async.hpp"
#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/mode_sweep.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::bytes_of;
using testing::faults;

constexpr unsigned kBlocks = 3, kSlice = 64;  // floats per slice (256 bytes)

struct alignas(16) Accumulator {
  float values[2 * kSlice] = {};
};

enum class Flaw {
  none,
  no_fence,
  rewrite_before_read,
  rewrite_after_read,
  overlapping_slices,
  read_before_wait,
  read_after_wait_read,
  load_before_wait,
  no_wait
};

// Block b's threads write slice value b + i / 8 for element i, fence, and thread 0 adds the
// slice to acc.values[0..64) (all blocks the same rows), commits and waits.
Accumulator drain(Flaw flaw = Flaw::none) {
  Accumulator acc;
  launch(LaunchConfig{"drain", Dim3{kBlocks}, Dim3{kSlice}, kSlice * 4 + 16}, [&] {
    const SharedPtr<float> slice = dynamic_shared_memory<float>();
    slice[threadIdx.x] = static_cast<float>(blockIdx.x) + static_cast<float>(threadIdx.x) / 8;
    if (flaw != Flaw::no_fence) fence_proxy_async_shared();
    __syncthreads();
    if (threadIdx.x != 0) return;
    cp_reduce_async_bulk_add_f32(acc.values, slice.address(), kSlice * 4);
    if (flaw == Flaw::overlapping_slices)
      cp_reduce_async_bulk_add_f32(acc.values + kSlice / 2, slice.address(), kSlice * 4);
    cp_async_bulk_commit_group();
    if (flaw == Flaw::no_wait) return;
    if (flaw == Flaw::rewrite_before_read) slice[0] = 0.0f;
    if (flaw == Flaw::read_before_wait) cp_async_cg_16((slice + kSlice).address(), acc.values);
    cp_async_bulk_wait_group(0, /*read=*/true);
    if (flaw == Flaw::rewrite_after_read) slice[0] = -1.0f;  // allowed: the reads are done
    if (flaw == Flaw::read_after_wait_read)
      cp_async_cg_16((slice + kSlice).address(), acc.values + 4);
    // A plain load (not instrumented in this file): what it sees depends on the landing.
    if (flaw == Flaw::load_before_wait) acc.values[kSlice] = acc.values[0];
    cp_async_bulk_wait_group(0);
  });
  return acc;
}

std::vector<float> expected() {
  std::vector<float> want(2 * kSlice, 0.0f);
  for (unsigned i = 0; i < kSlice; ++i)
    for (unsigned b = 0; b < kBlocks; ++b)
      want[i] += static_cast<float>(b) + static_cast<float>(i) / 8;
  return want;
}

std::vector<float> values(const Accumulator& a) {
  return std::vector<float>(a.values, a.values + 2 * kSlice);
}

TEST(BulkReduce, SlicesOfEveryBlockSumIntoTheAccumulatorInEveryMode) {
  EXPECT_EQ(values(drain()), expected());
  EXPECT_EQ(values(drain(Flaw::rewrite_after_read)), expected());
  const std::vector<ExecutionMode> modes = standard_modes();
  EXPECT_EQ(find_mode_dependence([] { return bytes_of(values(drain())); }, modes), std::nullopt);
  EXPECT_EQ(
      find_mode_dependence([] { return bytes_of(values(drain(Flaw::rewrite_after_read))); }, modes),
      std::nullopt);
}

// A plain load of the accumulator before the wait is no fault (the emulator does not see
// plain loads), but it shows in the mode sweep: under at-wait the adds land at the wait.
TEST(BulkReduce, APlainLoadOfTheAccumulatorBeforeTheWaitShowsAsLandingDependence) {
  const std::vector<ExecutionMode> modes = standard_modes();
  EXPECT_NE(
      find_mode_dependence([] { return bytes_of(values(drain(Flaw::load_before_wait))); }, modes),
      std::nullopt);
}

TEST(BulkReduce, AMissingFenceBeforeTheReduceIsAFault) {
  EXPECT_TRUE(faults([] { drain(Flaw::no_fence); }, "drain", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "no fence.proxy.async"));
}

TEST(BulkReduce, RewritingTheSourceBeforeWaitGroupReadIsAFault) {
  EXPECT_TRUE(faults([] { drain(Flaw::rewrite_before_read); }, "drain", Dim3{0, 0, 0},
                     Dim3{0, 0, 0}, "cp.async.bulk.wait_group.read for it first"));
}

TEST(BulkReduce, TwoSlicesInFlightOverlappingIsAFault) {
  EXPECT_TRUE(faults([] { drain(Flaw::overlapping_slices); }, "drain", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "overlaps the slice"));
}

TEST(BulkReduce, ReadingTheAccumulatorBeforeTheReduceCompletedIsAFault) {
  EXPECT_TRUE(faults([] { drain(Flaw::read_before_wait); }, "drain", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "has not completed"));
  // wait_group.read frees the source only: the adds may still be pending.
  EXPECT_TRUE(faults([] { drain(Flaw::read_after_wait_read); }, "drain", Dim3{0, 0, 0},
                     Dim3{0, 0, 0}, "has not completed"));
}

TEST(BulkReduce, ExitingWithTheReduceNotWaitedForIsAFault) {
  EXPECT_TRUE(faults([] { drain(Flaw::no_wait); }, "drain", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "exited with a cp.reduce.async.bulk"));
}

TEST(BulkReduce, SizeAndAlignmentAreChecked) {
  Accumulator acc;
  const auto run = [&](unsigned src, unsigned bytes, unsigned dst_float) {
    launch(LaunchConfig{"misaligned", Dim3{1}, Dim3{1}, 512}, [&] {
      cp_reduce_async_bulk_add_f32(acc.values + dst_float, SharedAddress{src}, bytes);
      cp_async_bulk_commit_group();
      cp_async_bulk_wait_group(0);
    });
  };
  EXPECT_TRUE(
      faults([&] { run(0, 24, 0); }, "misaligned", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "multiple of 16"));
  EXPECT_TRUE(faults([&] { run(8, 16, 0); }, "misaligned", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "16-byte aligned"));
  EXPECT_TRUE(faults([&] { run(0, 16, 1); }, "misaligned", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "16-byte aligned"));
  EXPECT_TRUE(
      faults([&] { run(496, 32, 0); }, "misaligned", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "arena"));
}

}  // namespace
}  // namespace ringattn::emu

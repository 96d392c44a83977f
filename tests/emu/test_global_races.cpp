// Races between blocks: two blocks of one launch storing to the same global
// address with plain stores is a fault naming both blocks and the address; blocks storing to
// their own addresses, and atomics or bulk reduces of several blocks to one address, are not.
// A block's own plain store to an accumulator it reduces into, before the reduce has
// completed, is a fault too. This file is compiled with the store instrumentation the
// emulated kernels get (CMake: ringattn_emu_instrument_stores), which is how the emulator
// sees plain stores at all (emu/global_writes.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "emu/bulk_reduce.hpp"
#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::faults;

struct alignas(16) Buffer {
  float values[64] = {};
};

std::vector<GlobalRange> ranges_of(const Buffer& b) {
  const auto p = reinterpret_cast<std::uintptr_t>(b.values);
  return {GlobalRange{p, p + sizeof b.values}};
}

LaunchConfig config(const char* name, unsigned blocks, unsigned threads, const Buffer& b,
                    std::uint32_t shared = 0) {
  LaunchConfig c{name, Dim3{blocks}, Dim3{threads}, shared};
  c.global = ranges_of(b);
  return c;
}

// The kernels' common part: the block's 16 threads write 1.0 into a 64-byte slice of shared
// memory and fence it; thread 0 (only, returning true) then adds it to acc[0..16) with a bulk
// reduce, committed and not waited for.
bool reduce_ones(Buffer& acc) {
  const SharedPtr<float> slice = dynamic_shared_memory<float>();
  slice[threadIdx.x] = 1.0f;
  fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x != 0) return false;
  cp_reduce_async_bulk_add_f32(acc.values, slice.address(), 64);
  cp_async_bulk_commit_group();
  return true;
}

TEST(GlobalRaces, TwoBlocksStoringToOneAddressIsAFaultNamingBothAndTheAddress) {
  Buffer out;
  const auto run = [&] {
    launch(config("race", 2, 32, out), [&] {
      out.values[threadIdx.x] = static_cast<float>(threadIdx.x);  // every block, the same rows
    });
  };
  const auto at = reinterpret_cast<std::uintptr_t>(out.values);
  char address[32];
  std::snprintf(address, sizeof address, "0x%llx", static_cast<unsigned long long>(at));
  EXPECT_TRUE(
      faults(run, "race", Dim3{1, 0, 0}, Dim3{0, 0, 0}, "which block (0,0,0) of this launch"));
  EXPECT_TRUE(
      faults(run, "race", Dim3{1, 0, 0}, Dim3{0, 0, 0}, std::string("global address ") + address));
}

TEST(GlobalRaces, BlocksStoringToTheirOwnAddressesIsNoFault) {
  Buffer out;
  launch(config("own_rows", 2, 32, out),
         [&] { out.values[32 * blockIdx.x + threadIdx.x] = static_cast<float>(blockIdx.x); });
  EXPECT_EQ(out.values[0], 0.0f);
  EXPECT_EQ(out.values[63], 1.0f);
  // Two threads of one block storing to one address is not a race between blocks.
  launch(config("one_block", 1, 32, out), [&] { out.values[0] = 2.0f; });
  EXPECT_EQ(out.values[0], 2.0f);
}

TEST(GlobalRaces, AtomicsAndReducesOfSeveralBlocksToOneAddressAreNoFault) {
  Buffer acc;
  launch(config("atomics", 4, 32, acc), [&] { atomicAdd(&acc.values[threadIdx.x], 1.0f); });
  EXPECT_EQ(acc.values[0], 4.0f);
  EXPECT_EQ(acc.values[31], 4.0f);
  launch(config("reduces", 4, 16, acc, 64), [&] {
    if (reduce_ones(acc)) cp_async_bulk_wait_group(0);
  });
  EXPECT_EQ(acc.values[0], 8.0f);
  EXPECT_EQ(acc.values[15], 8.0f);
}

TEST(GlobalRaces, APlainStoreWhereAnotherBlockReducesIsAFault) {
  Buffer acc;
  const auto run = [&] {
    launch(config("store_over_reduce", 2, 16, acc, 64), [&] {
      if (blockIdx.x == 1) {
        if (threadIdx.x == 0) acc.values[3] = 0.0f;
        return;
      }
      if (reduce_ones(acc)) cp_async_bulk_wait_group(0);
    });
  };
  EXPECT_TRUE(faults(run, "store_over_reduce", Dim3{1, 0, 0}, Dim3{0, 0, 0}, "also reduces"));
}

// The block's own plain store to the accumulator before its reduce completed (after
// wait_group.read only, which frees the source but leaves the adds pending).
TEST(GlobalRaces, StoringToTheAccumulatorBeforeTheReduceCompletedIsAFault) {
  Buffer acc;
  const auto run = [&] {
    launch(config("store_to_accumulator", 1, 16, acc, 64), [&] {
      if (!reduce_ones(acc)) return;
      cp_async_bulk_wait_group(0, /*read=*/true);
      acc.values[5] = 0.0f;
      cp_async_bulk_wait_group(0);
    });
  };
  EXPECT_TRUE(faults(run, "store_to_accumulator", Dim3{0, 0, 0}, Dim3{0, 0, 0},
                     "a plain store to global address"));
}

}  // namespace
}  // namespace ringattn::emu

// Shared memory: one poisoned arena per block, reached through checked 32-bit offsets; an
// access outside the arena (or misaligned for its type) faults naming the thread.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::faults;

TEST(SharedMemory, EachBlockHasItsOwnPoisonedArena) {
  std::vector<std::uint32_t> before(4), after(4);
  launch(LaunchConfig{"arena", Dim3{4}, Dim3{32}, 64}, [&] {
    const SharedPtr<std::uint32_t> s = dynamic_shared_memory<std::uint32_t>();
    if (threadIdx.x == 0) before[blockIdx.x] = s[15];
    __syncthreads();
    if (threadIdx.x == 0) s[15] = blockIdx.x + 100;
    __syncthreads();
    if (threadIdx.x == 31) after[blockIdx.x] = s[15];
  });
  for (unsigned b = 0; b < 4; ++b) {
    EXPECT_EQ(before[b], 0xffffffffu) << "a block starts from the poison, not the last block";
    EXPECT_EQ(after[b], b + 100);
  }
}

TEST(SharedMemory, PointerArithmeticKeepsTheOffset) {
  std::vector<std::uint32_t> offsets;
  launch(LaunchConfig{"arith", Dim3{1}, Dim3{1}, 256}, [&] {
    const SharedPtr<float> base = dynamic_shared_memory<float>();
    const SharedPtr<float> p = base + 10;
    offsets = {p.address().offset, (p - 3).address().offset, p.as<std::uint16_t>().address().offset,
               (base.as<unsigned char>() + 7).address().offset};
    *p = 2.5f;
    offsets.push_back(base[10] == 2.5f ? 1u : 0u);
  });
  EXPECT_EQ(offsets, (std::vector<std::uint32_t>{40, 28, 40, 7, 1}));
}

TEST(SharedMemory, AccessPastTheArenaFaultsNamingTheThread) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"past_the_end", Dim3{2}, Dim3{64}, 256}, [] {
          const SharedPtr<float> s = dynamic_shared_memory<float>();
          const unsigned i = blockIdx.x == 1 && threadIdx.x == 3 ? 64 : threadIdx.x;
          s[i] = 1.0f;
        });
      },
      "past_the_end", Dim3{1, 0, 0}, Dim3{3, 0, 0}, "outside the block's 256-byte arena"));
}

TEST(SharedMemory, AccessBeforeTheArenaFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"before_start", Dim3{1}, Dim3{32}, 128}, [] {
          const SharedPtr<float> s = dynamic_shared_memory<float>();
          (void)s[static_cast<std::ptrdiff_t>(threadIdx.x) - 1];
        });
      },
      "before_start", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "outside the block's 128-byte arena"));
}

TEST(SharedMemory, MisalignedAccessFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"misaligned", Dim3{1}, Dim3{4}, 64}, [] {
          const SharedPtr<unsigned char> bytes = dynamic_shared_memory<unsigned char>();
          *(bytes + threadIdx.x * 4 + (threadIdx.x == 2 ? 2 : 0)).as<float>() = 1.0f;
        });
      },
      "misaligned", Dim3{0, 0, 0}, Dim3{2, 0, 0}, "offset 10 is not 4-byte aligned"));
}

TEST(SharedMemory, KernelWithoutSharedMemoryHasAnEmptyArena) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"no_smem", Dim3{1}, Dim3{1}, 0},
               [] { (void)dynamic_shared_memory<int>()[0]; });
      },
      "no_smem", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "0-byte arena"));
}

}  // namespace
}  // namespace ringattn::emu

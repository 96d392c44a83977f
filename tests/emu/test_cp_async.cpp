// cp.async: 16-byte copies with zero-fill land, and wait_group N leaves the newest N groups
// in flight; a read of a destination before its wait (the fault to catch) reads the old
// bytes when copies land at the wait, so the result depends on the landing mode. Bad
// addresses fault naming the thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

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

const ExecutionMode kAtCopy{RunOrder::forward, 0, CpAsyncLanding::at_copy};
const ExecutionMode kAtWait{RunOrder::forward, 0, CpAsyncLanding::at_wait};

struct alignas(16) Source {
  float values[64];
};

Source counting() {
  Source s;
  for (int i = 0; i < 64; ++i) s.values[i] = static_cast<float>(i + 1);
  return s;
}

// 16 threads each copy 4 floats into shared memory (thread 1: src-size 0, all zeros;
// thread 2: src-size 8, half zeros), then either wait before reading or read first.
std::vector<float> copy_and_read(bool wait_before_read) {
  const Source src = counting();
  std::vector<float> out(64);
  launch(LaunchConfig{"cp_async_read", Dim3{1}, Dim3{64}, 256}, [&] {
    const SharedPtr<float> s = dynamic_shared_memory<float>();
    const unsigned t = threadIdx.x;
    if (t < 16) {
      const unsigned size = t == 1 ? 0 : t == 2 ? 8 : 16;
      cp_async_cg_16((s + 4 * t).address(), src.values + 4 * t, size);
    }
    cp_async_commit_group();
    if (wait_before_read) cp_async_wait_group(0);
    __syncthreads();
    out[t] = s[t];
    cp_async_wait_group(0);
  });
  return out;
}

TEST(CpAsync, CopiesLandWithZeroFillInBothModes) {
  for (const ExecutionMode& mode : {kAtCopy, kAtWait}) {
    const ScopedExecutionMode scoped(mode);
    const std::vector<float> out = copy_and_read(true);
    for (int i = 0; i < 64; ++i) {
      const float expected =
          (i >= 4 && i < 8) || (i >= 10 && i < 12) ? 0.0f : static_cast<float>(i + 1);
      EXPECT_EQ(out[i], expected) << describe(mode) << " element " << i;
    }
  }
  const std::vector<ExecutionMode> modes = standard_modes();
  EXPECT_EQ(find_mode_dependence([] { return bytes_of(copy_and_read(true)); }, modes),
            std::nullopt);
}

TEST(CpAsync, ReadBeforeTheWaitShowsAsLandingDependence) {
  const std::vector<ExecutionMode> modes = {kAtCopy, kAtWait};
  const auto difference =
      find_mode_dependence([] { return bytes_of(copy_and_read(false)); }, modes);
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("cp.async=at-wait"), std::string::npos) << *difference;
  const ScopedExecutionMode at_wait(kAtWait);
  EXPECT_TRUE(std::isnan(copy_and_read(false)[0])) << "the arena's poison, not the copy";
}

TEST(CpAsync, WaitGroupLeavesTheNewestGroupsInFlight) {
  const Source src = counting();
  for (const ExecutionMode& mode : {kAtCopy, kAtWait}) {
    const ScopedExecutionMode scoped(mode);
    std::vector<float> seen(3);
    launch(LaunchConfig{"wait_group", Dim3{1}, Dim3{1}, 48}, [&] {
      const SharedPtr<float> s = dynamic_shared_memory<float>();
      for (unsigned g = 0; g < 3; ++g) {
        cp_async_cg_16((s + 4 * g).address(), src.values + 4 * g);
        cp_async_commit_group();
      }
      cp_async_wait_group(2);  // the oldest group only
      seen = {s[0], s[4], s[8]};
    });
    EXPECT_EQ(seen[0], 1.0f) << describe(mode);
    if (mode.landing == CpAsyncLanding::at_wait) {
      EXPECT_TRUE(std::isnan(seen[1]) && std::isnan(seen[2])) << "groups 1 and 2 still in flight";
    } else {
      EXPECT_EQ(seen[1], 5.0f);
      EXPECT_EQ(seen[2], 9.0f);
    }
  }
}

TEST(CpAsync, UncommittedCopiesAreNotCoveredByWaitGroup) {
  const Source src = counting();
  const ScopedExecutionMode scoped(kAtWait);
  float before = 0, after = 0;
  launch(LaunchConfig{"uncommitted", Dim3{1}, Dim3{1}, 16}, [&] {
    const SharedPtr<float> s = dynamic_shared_memory<float>();
    cp_async_cg_16(s.address(), src.values);
    cp_async_wait_group(0);
    before = s[0];
    cp_async_commit_group();
    cp_async_wait_group(0);
    after = s[0];
  });
  EXPECT_TRUE(std::isnan(before));
  EXPECT_EQ(after, 1.0f);
}

TEST(CpAsync, BadAddressesFaultNamingTheThread) {
  const Source src = counting();
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"cp_async_misaligned", Dim3{1}, Dim3{32}, 512}, [&] {
          const SharedPtr<float> s = dynamic_shared_memory<float>();
          cp_async_cg_16((s + 4 * threadIdx.x + (threadIdx.x == 9 ? 1 : 0)).address(), src.values);
        });
      },
      "cp_async_misaligned", Dim3{0, 0, 0}, Dim3{9, 0, 0},
      "destination offset 148 is not 16-byte aligned"));
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"cp_async_past_end", Dim3{1}, Dim3{32}, 256},
               [&] { cp_async_cg_16(SharedAddress{threadIdx.x == 16 ? 256u : 0u}, src.values); });
      },
      "cp_async_past_end", Dim3{0, 0, 0}, Dim3{16, 0, 0}, "outside the block's 256-byte arena"));
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"cp_async_source", Dim3{1}, Dim3{1}, 16},
               [&] { cp_async_cg_16(SharedAddress{0}, src.values + 1); });
      },
      "cp_async_source", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "source address is not 16-byte aligned"));
}

}  // namespace
}  // namespace ringattn::emu

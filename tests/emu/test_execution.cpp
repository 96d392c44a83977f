// The block runner: per-thread indices, barriers, the execution modes' orders, and the
// faults for barriers not reached by everyone. Includes the deliberately missing
// __syncthreads, caught because its result depends on the warp order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/fault.hpp"
#include "emu/launch.hpp"
#include "emu/mode_sweep.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::bytes_of;
using testing::faults;

TEST(Execution, EveryThreadSeesItsOwnIndices) {
  const LaunchConfig config{"indices", Dim3{2, 3, 1}, Dim3{8, 4, 2}, 0};
  const std::size_t threads = 64, blocks = 6;
  std::vector<unsigned> seen(blocks * threads * 12, 0);
  launch(config, [&] {
    const std::size_t b = blockIdx.x + blockIdx.y * gridDim.x;
    const std::size_t t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* out = &seen[(b * threads + t) * 12];
    __syncthreads();  // indices survive fiber switches
    const Dim3 all[4] = {threadIdx, blockIdx, blockDim, gridDim};
    for (int i = 0; i < 4; ++i) {
      out[3 * i] = all[i].x;
      out[3 * i + 1] = all[i].y;
      out[3 * i + 2] = all[i].z;
    }
  });
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t t = 0; t < threads; ++t) {
      const unsigned* got = &seen[(b * threads + t) * 12];
      const std::vector<unsigned> expected = {static_cast<unsigned>(t % 8),
                                              static_cast<unsigned>(t / 8 % 4),
                                              static_cast<unsigned>(t / 32),
                                              static_cast<unsigned>(b % 2),
                                              static_cast<unsigned>(b / 2),
                                              0u,
                                              8u,
                                              4u,
                                              2u,
                                              2u,
                                              3u,
                                              1u};
      EXPECT_EQ(std::vector<unsigned>(got, got + 12), expected) << "block " << b << " thread " << t;
    }
  }
}

// Each thread publishes a value in shared memory and reads another warp's. With the barrier
// between, every mode gives the same answer; without it, the answer depends on which warp
// ran first (the fault a real GPU shows only sometimes).
std::vector<float> exchange(bool with_barrier) {
  std::vector<float> out(128);
  launch(LaunchConfig{"exchange", Dim3{1}, Dim3{128}, 128 * sizeof(float)}, [&] {
    const SharedPtr<float> s = dynamic_shared_memory<float>();
    const unsigned t = threadIdx.x;
    s[t] = static_cast<float>(t) * 3.0f + 1.0f;
    if (with_barrier) __syncthreads();
    out[t] = s[(t + 37) % 128];
  });
  return out;
}

TEST(Execution, BarrierMakesSharedWritesVisibleInEveryMode) {
  const auto modes = standard_modes();
  EXPECT_EQ(find_mode_dependence([] { return bytes_of(exchange(true)); }, modes), std::nullopt);
  const std::vector<float> out = exchange(true);
  for (unsigned t = 0; t < 128; ++t) EXPECT_EQ(out[t], static_cast<float>((t + 37) % 128) * 3 + 1);
}

TEST(Execution, MissingSyncthreadsShowsAsWarpOrderDependence) {
  const auto modes = standard_modes();
  const auto difference = find_mode_dependence([] { return bytes_of(exchange(false)); }, modes);
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("order=forward"), std::string::npos) << *difference;
  // Forward order: warp 0 reads warp 1's slots before warp 1 has run (the poison, a NaN).
  const ScopedExecutionMode forward({RunOrder::forward, 0, CpAsyncLanding::at_copy});
  EXPECT_TRUE(std::isnan(exchange(false)[0]));
}

// The first thread of each warp logs its warp at the start of each of two barrier
// intervals: the log is the order the mode ran the warps in.
std::vector<unsigned> warp_log(const ExecutionMode& mode) {
  const ScopedExecutionMode scoped(mode);
  std::vector<unsigned> log;
  launch(LaunchConfig{"warp_log", Dim3{1}, Dim3{8 * 32}, 0}, [&] {
    if (threadIdx.x % 32 == 0) log.push_back(threadIdx.x / 32);
    __syncthreads();
    if (threadIdx.x % 32 == 0) log.push_back(threadIdx.x / 32);
  });
  return log;
}

TEST(Execution, WarpsRunInTheModesOrderInEachBarrierInterval) {
  EXPECT_EQ(warp_log({RunOrder::forward, 0, CpAsyncLanding::at_copy}),
            (std::vector<unsigned>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(warp_log({RunOrder::reverse, 0, CpAsyncLanding::at_copy}),
            (std::vector<unsigned>{7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4, 3, 2, 1, 0}));
  const ExecutionMode shuffled{RunOrder::shuffled, 5, CpAsyncLanding::at_copy};
  const std::vector<unsigned> log = warp_log(shuffled);
  EXPECT_EQ(warp_log(shuffled), log) << "a seed gives the same order every run";
  ASSERT_EQ(log.size(), 16u);
  for (int interval = 0; interval < 2; ++interval) {
    const std::set<unsigned> warps(log.begin() + 8 * interval, log.begin() + 8 * interval + 8);
    EXPECT_EQ(warps.size(), 8u) << "each interval runs every warp once";
  }
  EXPECT_FALSE(std::equal(log.begin(), log.begin() + 8, log.begin() + 8))
      << "each barrier interval draws its own order";
  std::set<std::vector<unsigned>> orders;
  for (std::uint64_t seed = 0; seed < 4; ++seed)
    orders.insert(warp_log({RunOrder::shuffled, seed, CpAsyncLanding::at_copy}));
  EXPECT_GT(orders.size(), 1u) << "seeds give different orders";
}

TEST(Execution, ThreadExitingWhileOthersWaitAtBarrierFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"early_exit", Dim3{2}, Dim3{64}, 0}, [] {
          if (blockIdx.x == 1 && threadIdx.x == 37) return;
          __syncthreads();
        });
      },
      "early_exit", Dim3{1, 0, 0}, Dim3{37, 0, 0}, "exited while other threads"));
}

TEST(Execution, BarrierCountsEveryThreadOfAPartialWarp) {
  std::vector<int> out(40, 0);
  launch(LaunchConfig{"partial_warp", Dim3{1}, Dim3{40}, 40 * sizeof(int)}, [&] {
    const SharedPtr<int> s = dynamic_shared_memory<int>();
    s[threadIdx.x] = static_cast<int>(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = s[39 - threadIdx.x];
  });
  for (int t = 0; t < 40; ++t) EXPECT_EQ(out[t], 39 - t);
}

void scale_kernel(float* data, float factor, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] *= factor;
}

TEST(Execution, LaunchesAKernelFunctionWithItsArguments) {
  std::vector<float> data(100, 2.0f);
  launch(LaunchConfig{"scale_kernel", Dim3{4}, Dim3{32}, 0}, scale_kernel, data.data(), 1.5f, 100);
  for (float x : data) EXPECT_EQ(x, 3.0f);
}

TEST(Execution, LaunchRefusesWhatCudaRefuses) {
  EXPECT_THROW(launch(LaunchConfig{"k", Dim3{1}, Dim3{1025}, 0}, [] {}), EmuUsageError);
  EXPECT_THROW(launch(LaunchConfig{"k", Dim3{0}, Dim3{32}, 0}, [] {}), EmuUsageError);
  EXPECT_THROW(launch(LaunchConfig{"k", Dim3{1}, Dim3{1, 1, 65}, 0}, [] {}), EmuUsageError);
}

TEST(Execution, IntrinsicsOutsideAKernelAreUsageErrors) {
  EXPECT_THROW(__syncthreads(), EmuUsageError);
  EXPECT_THROW(__shfl_xor_sync(0xffffffffu, 1, 1), EmuUsageError);
}

TEST(Execution, ModesParseFromTheirTextForm) {
  const ExecutionMode m = parse_execution_mode("shuffled:7", "at-wait", "test");
  EXPECT_EQ(m.order, RunOrder::shuffled);
  EXPECT_EQ(m.seed, 7u);
  EXPECT_EQ(m.landing, CpAsyncLanding::at_wait);
  EXPECT_EQ(describe(m), "order=shuffled:7 cp.async=at-wait");
  EXPECT_EQ(parse_execution_mode("reverse", "", "test").order, RunOrder::reverse);
  EXPECT_THROW(parse_execution_mode("sideways", "", "RINGATTN_EMU_ORDER"), EmuUsageError);
  EXPECT_THROW(parse_execution_mode("shuffled:x", "", "RINGATTN_EMU_ORDER"), EmuUsageError);
  EXPECT_THROW(parse_execution_mode("", "later", "RINGATTN_EMU_CP_ASYNC"), EmuUsageError);
  const ExecutionMode y = parse_execution_mode("", "", "test", "yield");
  EXPECT_TRUE(y.arrive_yields);
  EXPECT_EQ(describe(y), "order=forward cp.async=at-copy arrive=yield");
  EXPECT_FALSE(parse_execution_mode("", "", "test", "continue").arrive_yields);
  EXPECT_THROW(parse_execution_mode("", "", "RINGATTN_EMU_ARRIVE", "later"), EmuUsageError);
}

}  // namespace
}  // namespace ringattn::emu

// Named barriers and setmaxnreg: two consumer warpgroups taking turns through a
// pair of named barriers (FA3's ping-pong) produce the same bytes in every execution mode; a
// producer's bar.arrive releases waiting consumers; what would hang or be undefined is a
// fault naming kernel, block and thread.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/mode_sweep.hpp"
#include "emu/named_barrier.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::bytes_of;
using testing::faults;

// Warpgroups 0 and 1 append their index to a log in shared memory in strict alternation,
// 4 rounds each: group g waits on barrier 1 + g, writes, then arrives on the other group's
// barrier (both barriers count 256 threads: one group waiting, the other arriving).
std::vector<int> ping_pong() {
  std::vector<int> log(8, -1);
  launch(LaunchConfig{"ping_pong", Dim3{1}, Dim3{256}, 64}, [&] {
    const SharedPtr<int> s = dynamic_shared_memory<int>();
    const unsigned g = threadIdx.x / 128;
    if (threadIdx.x == 0) s[15] = 0;  // the log's length
    __syncthreads();
    if (g == 1) named_barrier_arrive(1, 256);  // group 0 goes first
    for (int round = 0; round < 4; ++round) {
      named_barrier_sync(1 + g, 256);
      if (threadIdx.x % 128 == 0) {
        s[s[15]] = static_cast<int>(g);
        s[15] = s[15] + 1;
      }
      if (round < 3 || g == 0) named_barrier_arrive(2 - g, 256);
    }
    __syncthreads();
    if (threadIdx.x < 8) log[threadIdx.x] = s[threadIdx.x];
  });
  return log;
}

TEST(NamedBarrier, PingPongBetweenWarpgroupsAlternatesInEveryMode) {
  EXPECT_EQ(ping_pong(), (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(find_mode_dependence([] { return bytes_of(ping_pong()); }, standard_modes()),
            std::nullopt);
}

// A warp collective right after a named barrier: the lane that completes the barrier's
// generation runs on to the collective while its warp's other lanes are still parked at the
// barrier, released; they take part once resumed (the Hopper kernels zero a tile's tail rows
// and meet at a named barrier before the warpgroup's wgmma).
std::vector<int> barrier_then_shuffle() {
  std::vector<int> got(128, -1);
  launch(LaunchConfig{"barrier_then_shuffle", Dim3{1}, Dim3{128}, 0}, [&] {
    named_barrier_sync(1, 128);
    got[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);
  });
  return got;
}

TEST(NamedBarrier, AWarpCollectiveAfterItGathersTheReleasedLanesInEveryMode) {
  std::vector<int> want(128);
  for (int i = 0; i < 128; ++i) want[static_cast<std::size_t>(i)] = i / 32 * 32;
  EXPECT_EQ(barrier_then_shuffle(), want);
  EXPECT_EQ(
      find_mode_dependence([] { return bytes_of(barrier_then_shuffle()); }, standard_modes()),
      std::nullopt);
}

// A producer warpgroup hands a consumer warpgroup a row through shared memory, releasing it
// with bar.arrive (the wide fused backward's kDqPart at D = 64): stored before the arrive,
// the consumer reads it in every mode; stored after it (`signal_first`), on a GPU a race,
// and here a mode dependence: under arrive=yield the arrive that ends the generation lets
// the waiting consumers run before the producer's last lane stores.
std::vector<int> hand_over(bool signal_first) {
  std::vector<int> got(128, -1);
  launch(LaunchConfig{"hand_over", Dim3{1}, Dim3{256}, 512}, [&] {
    const SharedPtr<int> s = dynamic_shared_memory<int>();
    const unsigned lane = threadIdx.x % 128;
    if (threadIdx.x < 128) s[lane] = -1;
    __syncthreads();
    if (threadIdx.x >= 128) {  // the producer
      if (signal_first) named_barrier_arrive(3, 256);
      s[lane] = static_cast<int>(lane) * 3;
      if (!signal_first) named_barrier_arrive(3, 256);
    } else {
      named_barrier_sync(3, 256);
      got[lane] = s[lane];
    }
  });
  return got;
}

TEST(NamedBarrier, AStoreAfterTheArriveShowsAsModeDependence) {
  std::vector<int> want(128);
  for (int i = 0; i < 128; ++i) want[static_cast<std::size_t>(i)] = 3 * i;
  EXPECT_EQ(hand_over(false), want);
  EXPECT_EQ(find_mode_dependence([] { return bytes_of(hand_over(false)); }, standard_modes()),
            std::nullopt);
  const auto difference =
      find_mode_dependence([] { return bytes_of(hand_over(true)); }, standard_modes());
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("arrive=yield"), std::string::npos) << *difference;
}

TEST(NamedBarrier, MisuseIsAFaultNamingTheThread) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"never_released", Dim3{1}, Dim3{128}, 0}, [] {
          if (threadIdx.x >= 64) named_barrier_sync(3, 128);
        });
      },
      "never_released", Dim3{0, 0, 0}, Dim3{64, 0, 0},
      "waits at named barrier 3 for 128 threads, of which 64 arrived"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"barrier_zero", Dim3{1}, Dim3{32}, 0},
               [] { named_barrier_sync(0, 32); });
      },
      "barrier_zero", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "0 is __syncthreads()"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"odd_count", Dim3{1}, Dim3{64}, 0},
               [] { named_barrier_sync(2, 48); });
      },
      "odd_count", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "a positive multiple of 32"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"two_counts", Dim3{1}, Dim3{128}, 0}, [] {
          named_barrier_arrive(4, threadIdx.x < 32 ? 128u : 64u);
        });
      },
      "two_counts", Dim3{0, 0, 0}, Dim3{32, 0, 0}, "expecting 128"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"setmaxnreg_odd", Dim3{1}, Dim3{128}, 0},
               [] { setmaxnreg(false, 20); });
      },
      "setmaxnreg_odd", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "a multiple of 8 in 24..256"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"setmaxnreg_lanes", Dim3{1}, Dim3{128}, 0},
               [] { setmaxnreg(true, threadIdx.x == 5 ? 232u : 240u); });
      },
      "setmaxnreg_lanes", Dim3{0, 0, 0}, Dim3{5, 0, 0}, "ask for 240 and 232"));
}

}  // namespace
}  // namespace ringattn::emu

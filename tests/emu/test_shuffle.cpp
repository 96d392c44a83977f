// Warp shuffles and __syncwarp: CUDA's results for xor and indexed shuffles with widths,
// and faults for collectives reached by part of a warp (naming the thread and the lane
// that is missing), reads from lanes outside the mask, and lanes at different collectives.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::faults;

constexpr unsigned kFull = 0xffffffffu;

std::vector<int> run_warp(unsigned threads, const std::function<int(int lane)>& per_lane) {
  std::vector<int> out(threads);
  launch(LaunchConfig{"shuffle", Dim3{1}, Dim3{threads}, 0},
         [&] { out[threadIdx.x] = per_lane(static_cast<int>(threadIdx.x % 32)); });
  return out;
}

TEST(Shuffle, XorExchangesWithTheLaneAtThatDistance) {
  for (int distance : {1, 2, 4, 8, 16}) {
    const auto out =
        run_warp(64, [&](int lane) { return __shfl_xor_sync(kFull, lane * 10, distance); });
    for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], ((t % 32) ^ distance) * 10) << distance;
  }
}

TEST(Shuffle, XorBeyondTheWidthReturnsTheOwnValue) {
  // width 8: lanes may reach earlier groups, but not later ones.
  const auto out = run_warp(32, [](int lane) { return __shfl_xor_sync(kFull, lane, 8, 8); });
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[l], (l ^ 8) < l ? (l ^ 8) : l) << l;
}

TEST(Shuffle, IndexedReadsTheSourceLaneWithinItsGroup) {
  const auto bcast = run_warp(32, [](int lane) { return __shfl_sync(kFull, lane + 100, 5); });
  for (int l = 0; l < 32; ++l) EXPECT_EQ(bcast[l], 105);
  const auto grouped = run_warp(32, [](int lane) { return __shfl_sync(kFull, lane, 19, 16); });
  for (int l = 0; l < 32; ++l) EXPECT_EQ(grouped[l], l / 16 * 16 + 3) << "19 mod 16 = 3";
}

TEST(Shuffle, QuadReductionAsTheForwardKernelDoesIt) {
  std::vector<float> out(32);
  launch(LaunchConfig{"quad_sum", Dim3{1}, Dim3{32}, 0}, [&] {
    float x = static_cast<float>(threadIdx.x);
    x += __shfl_xor_sync(kFull, x, 1);
    x += __shfl_xor_sync(kFull, x, 2);
    out[threadIdx.x] = x;
  });
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[l], static_cast<float>(4 * (l / 4 * 4) + 6));
}

TEST(Shuffle, MovesEightByteValues) {
  std::vector<double> out(32);
  launch(LaunchConfig{"double", Dim3{1}, Dim3{32}, 0},
         [&] { out[threadIdx.x] = __shfl_xor_sync(kFull, 1e300 * (threadIdx.x + 1), 31); });
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[l], 1e300 * ((l ^ 31) + 1));
}

TEST(Shuffle, PartialMaskAndPartialWarp) {
  // 48 threads: warp 1 has 16 lanes, and the halves of warp 0 shuffle separately.
  const auto out = run_warp(48, [](int lane) {
    const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    return __shfl_xor_sync(mask, lane, 1);
  });
  for (int t = 0; t < 48; ++t) EXPECT_EQ(out[t], (t % 32) ^ 1);
}

TEST(Shuffle, HalfAWarpAtACollectiveFaultsNamingTheMissingLane) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"half_warp", Dim3{3}, Dim3{64}, 0}, [] {
          int x = static_cast<int>(threadIdx.x);
          if (blockIdx.x != 2 || threadIdx.x < 16) x = __shfl_xor_sync(kFull, x, 1);
          __syncthreads();
        });
      },
      "half_warp", Dim3{2, 0, 0}, Dim3{0, 0, 0},
      "__shfl_xor_sync (mask 0xffffffff) reached by only 16 of the 32 lanes of warp 0"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"half_warp", Dim3{1}, Dim3{32}, 0}, [] {
          if (threadIdx.x < 16) __syncwarp();
        });
      },
      "half_warp", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "lane 16 (thread (16,0,0)) has exited"));
}

TEST(Shuffle, LanesAtDifferentCollectivesFault) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"mixed", Dim3{1}, Dim3{32}, 0}, [] {
          if (threadIdx.x == 7)
            __syncwarp();
          else
            (void)__shfl_sync(kFull, 1, 0);
        });
      },
      "mixed", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "lane 7 (thread (7,0,0)) waits at __syncwarp"));
}

TEST(Shuffle, ReadingALaneOutsideTheMaskFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"outside_mask", Dim3{1}, Dim3{32}, 0}, [] {
          if (threadIdx.x < 8) (void)__shfl_sync(0xffu, 1, 9);
        });
      },
      "outside_mask", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "reads lane 9, which is not in the mask"));
}

TEST(Shuffle, MaskWithoutTheCallerFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"not_me", Dim3{1}, Dim3{32}, 0}, [] {
          if (threadIdx.x == 3) __syncwarp(0x1u);
        });
      },
      "not_me", Dim3{0, 0, 0}, Dim3{3, 0, 0}, "leaves out the calling lane 3"));
}

TEST(Shuffle, BadWidthFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"width", Dim3{1}, Dim3{32}, 0},
               [] { (void)__shfl_sync(kFull, 1, 0, threadIdx.x == 4 ? 12 : 32); });
      },
      "width", Dim3{0, 0, 0}, Dim3{4, 0, 0}, "width 12 is not a power of two"));
}

}  // namespace
}  // namespace ringattn::emu

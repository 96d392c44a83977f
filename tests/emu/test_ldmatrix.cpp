// ldmatrix x4 and x4.trans: four 8×8 b16 matrices loaded into a warp's registers and
// written back by the PTX ISA's fragment layout (lane l, register j: matrix j, row l/4,
// columns 2(l%4), 2(l%4)+1) come back unchanged, or transposed with .trans; stmatrix x4 and
// x4.trans write registers in that layout back as the matrices, or their transposes.
// Misaligned and out-of-arena row addresses, and ldmatrix in a partial warp, fault naming the
// thread.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/ldmatrix.hpp"
#include "emu/numeric_formats.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::faults;

// Four matrices side by side with a padded row pitch (like the kernels' tiles): matrix j,
// row r, column c at element r·kPitch + 8j + c (+ the pitch's padding).
constexpr int kPitch = 40;  // 80-byte rows: 16-byte aligned, not a power of two
constexpr std::uint32_t kBytes = 8 * kPitch * 2;

std::uint16_t value(int j, int r, int c) {
  return static_cast<std::uint16_t>(0x1000 * (j + 1) + 16 * r + c);
}

// Loads the four matrices with ldmatrix and stores each lane's registers back at the
// positions the PTX layout assigns them; returns what was stored, matrix by matrix.
std::vector<std::uint16_t> round_trip(bool trans) {
  std::vector<std::uint16_t> back(4 * 64, 0);
  launch(LaunchConfig{"ldmatrix_round_trip", Dim3{1}, Dim3{32}, kBytes}, [&] {
    const SharedPtr<std::uint16_t> s = dynamic_shared_memory<std::uint16_t>();
    const int lane = static_cast<int>(threadIdx.x);
    for (int i = lane; i < 4 * 64; i += 32)
      s[i / 64 * 8 + i % 64 / 8 * kPitch + i % 8] = value(i / 64, i % 64 / 8, i % 8);
    __syncwarp();
    const int matrix = lane / 8, row = lane % 8;
    std::uint32_t r[4];
    const SharedAddress at = (s + row * kPitch + matrix * 8).address();
    if (trans)
      ldmatrix_x4_trans(r, at);
    else
      ldmatrix_x4(r, at);
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h)
        back[j * 64 + lane / 4 * 8 + 2 * (lane % 4) + h] = half_of(r[j], h);
  });
  return back;
}

// What came back equals each matrix, or its transpose.
void expect_matrices(const std::vector<std::uint16_t>& back, bool transposed) {
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c)
        ASSERT_EQ(back[j * 64 + r * 8 + c], transposed ? value(j, c, r) : value(j, r, c))
            << "matrix " << j << " row " << r << " column " << c;
}

TEST(Ldmatrix, X4RoundTripsUnchanged) { expect_matrices(round_trip(false), false); }
TEST(Ldmatrix, X4TransRoundTripsTransposed) { expect_matrices(round_trip(true), true); }

// Each lane's registers hold the four matrices by the PTX layout; stmatrix stores them at
// the padded pitch; returns what is in shared memory, matrix by matrix.
std::vector<std::uint16_t> stored(bool trans) {
  std::vector<std::uint16_t> back(4 * 64, 0);
  launch(LaunchConfig{"stmatrix_layout", Dim3{1}, Dim3{32}, kBytes}, [&] {
    const SharedPtr<std::uint16_t> s = dynamic_shared_memory<std::uint16_t>();
    const int lane = static_cast<int>(threadIdx.x);
    std::uint32_t r[4];
    for (int j = 0; j < 4; ++j)
      r[j] = pack_halves(value(j, lane / 4, 2 * (lane % 4)),
                         value(j, lane / 4, 2 * (lane % 4) + 1));
    const SharedAddress at = (s + lane % 8 * kPitch + lane / 8 * 8).address();
    if (trans)
      stmatrix_x4_trans(r, at);
    else
      stmatrix_x4(r, at);
    __syncwarp();
    for (int i = lane; i < 4 * 64; i += 32) back[i] = s[i / 64 * 8 + i % 64 / 8 * kPitch + i % 8];
  });
  return back;
}

TEST(Stmatrix, X4StoresTheMatrices) { expect_matrices(stored(false), false); }
TEST(Stmatrix, X4TransStoresTheTransposes) { expect_matrices(stored(true), true); }

TEST(Stmatrix, MisalignedRowAddressFaultsNamingTheThread) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"misaddressed_stmatrix", Dim3{1}, Dim3{32}, kBytes}, [] {
          const unsigned lane = threadIdx.x % 32;
          std::uint32_t offset = (lane % 8) * kPitch * 2 + lane / 8 * 16;
          if (threadIdx.x == 9) offset += 4;
          const std::uint32_t r[4] = {};
          stmatrix_x4_trans(r, SharedAddress{offset});
        });
      },
      "misaddressed_stmatrix", Dim3{0, 0, 0}, Dim3{9, 0, 0},
      "lane 9's row address (offset 100) is not 16-byte aligned"));
}

TEST(Ldmatrix, MisalignedRowAddressFaultsNamingTheThread) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"misaddressed_ldmatrix", Dim3{2}, Dim3{64}, kBytes}, [] {
          const unsigned lane = threadIdx.x % 32;
          std::uint32_t offset = (lane % 8) * kPitch * 2 + lane / 8 * 16;
          if (blockIdx.x == 1 && threadIdx.x == 37) offset += 2;  // one element off
          std::uint32_t r[4];
          ldmatrix_x4(r, SharedAddress{offset});
        });
      },
      "misaddressed_ldmatrix", Dim3{1, 0, 0}, Dim3{37, 0, 0},
      "lane 5's row address (offset 402) is not 16-byte aligned"));
}

TEST(Ldmatrix, RowOutsideTheArenaFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"ldmatrix_past_end", Dim3{1}, Dim3{32}, kBytes}, [] {
          std::uint32_t r[4];
          ldmatrix_x4_trans(r, SharedAddress{threadIdx.x == 31 ? kBytes : 0u});
        });
      },
      "ldmatrix_past_end", Dim3{0, 0, 0}, Dim3{31, 0, 0}, "is outside the block's 640-byte arena"));
}

TEST(Ldmatrix, NeedsAFullWarp) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"ldmatrix_partial_warp", Dim3{1}, Dim3{16}, kBytes}, [] {
          std::uint32_t r[4];
          ldmatrix_x4(r, SharedAddress{0});
        });
      },
      "ldmatrix_partial_warp", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "needs a full warp"));
}

TEST(Ldmatrix, ReachedByPartOfTheWarpFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"ldmatrix_diverged", Dim3{1}, Dim3{32}, kBytes}, [] {
          std::uint32_t r[4];
          if (threadIdx.x != 12) ldmatrix_x4(r, SharedAddress{0});
        });
      },
      "ldmatrix_diverged", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "lane 12 (thread (12,0,0)) has exited"));
}

}  // namespace
}  // namespace ringattn::emu

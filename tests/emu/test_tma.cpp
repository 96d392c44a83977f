// Tensor maps and box copies: encoding refused where the driver refuses it; a box
// lands swizzled (none, 32, 64, 128 bytes) with out-of-bounds elements filled, its bytes
// completing on an mbarrier, the same in every execution mode; a box read before its
// barrier's wait shows as landing dependence; misuse faults name kernel, block and thread.
// (CuTe's Swizzle<B,4,3> checks the swizzle independently in test_cute_layouts.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/mbarrier.hpp"
#include "emu/mode_sweep.hpp"
#include "emu/shared_memory.hpp"
#include "emu/tma.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::bytes_of;
using testing::faults;

const ExecutionMode kAtCopy{RunOrder::forward, 0, CpAsyncLanding::at_copy};
const ExecutionMode kAtWait{RunOrder::forward, 0, CpAsyncLanding::at_wait};

// A 2-D tensor of 16-bit values, value = 1000·row + column + 1, rows of `cols` elements at a
// pitch of `pitch` elements (so the stride is not just the row).
struct Tensor2d {
  std::uint64_t rows, cols, pitch;
  std::vector<std::uint16_t> data;
  Tensor2d(std::uint64_t r, std::uint64_t c, std::uint64_t p) : rows(r), cols(c), pitch(p) {
    data.assign(r * p, 0xdead);
    for (std::uint64_t i = 0; i < r; ++i)
      for (std::uint64_t j = 0; j < c; ++j)
        data[i * p + j] = static_cast<std::uint16_t>(1000 * i + j + 1);
  }
  std::uint16_t at(std::int64_t i, std::int64_t j) const {
    if (i < 0 || j < 0 || i >= static_cast<std::int64_t>(rows) ||
        j >= static_cast<std::int64_t>(cols))
      return 0;  // out of bounds: zeros
    return data[static_cast<std::size_t>(i) * pitch + static_cast<std::size_t>(j)];
  }
};

TensorMap map_of(const Tensor2d& t, std::uint32_t box_cols, std::uint32_t box_rows,
                 TmaSwizzle swizzle) {
  TensorMap map;
  const std::uint64_t dims[] = {t.cols, t.rows};
  const std::uint64_t strides[] = {t.pitch * 2};
  const std::uint32_t box[] = {box_cols, box_rows};
  const std::string why =
      encode_tensor_map_tiled(map, 2, 2, t.data.data(), dims, strides, box, swizzle,
                              TmaOobFill::zeros);
  EXPECT_EQ(why, "");
  return map;
}

// One thread copies the box at (col0, row0) to shared offset 1024 and waits; all threads
// then read the arena back, unswizzled by the test's own reading of the rule.
std::vector<std::uint16_t> copy_box(const TensorMap& map, std::int32_t col0, std::int32_t row0,
                                    bool wait = true) {
  const std::uint32_t bytes = tma_box_bytes(map);
  std::vector<std::uint16_t> arena(bytes / 2);
  launch(LaunchConfig{"tma_box", Dim3{1}, Dim3{64}, 1024 + bytes}, [&] {
    const SharedAddress bar{0};
    if (threadIdx.x == 0) {
      mbarrier_init(bar, 1);
      mbarrier_arrive_expect_tx(bar, bytes);
      const std::int32_t coords[] = {col0, row0};
      cp_async_bulk_tensor(SharedAddress{1024}, map, coords, bar);
    }
    __syncthreads();
    if (wait) mbarrier_try_wait_parity(bar, 0);
    const SharedPtr<std::uint16_t> s(SharedAddress{1024});
    for (std::uint32_t i = threadIdx.x; i < bytes / 2; i += 64) arena[i] = s[i];
    if (!wait) mbarrier_try_wait_parity(bar, 0);
  });
  return arena;
}

TEST(Tma, BoxesLandSwizzledWithOutOfBoundsZerosInEveryMode) {
  const Tensor2d t(40, 100, 104);
  struct Case {
    TmaSwizzle swizzle;
    std::uint32_t box_cols, box_rows;
    std::int32_t col0, row0;
  };
  const Case cases[] = {
      {TmaSwizzle::none, 24, 5, 3, 7},        {TmaSwizzle::bytes32, 16, 16, 90, 30},
      {TmaSwizzle::bytes64, 32, 12, -8, -3},  {TmaSwizzle::bytes128, 64, 16, 40, 8},
      {TmaSwizzle::bytes128, 64, 8, 70, 36},  {TmaSwizzle::bytes128, 32, 16, 0, 0},
  };
  for (const Case& c : cases) {
    const TensorMap map = map_of(t, c.box_cols, c.box_rows, c.swizzle);
    const std::vector<std::uint16_t> got = copy_box(map, c.col0, c.row0);
    for (std::uint32_t r = 0; r < c.box_rows; ++r)
      for (std::uint32_t e = 0; e < c.box_cols; ++e) {
        const std::uint32_t offset = (r * c.box_cols + e) * 2;
        const std::uint32_t at = tma_swizzled_offset(c.swizzle, offset) / 2;
        ASSERT_EQ(got[at], t.at(c.row0 + r, c.col0 + e))
            << "swizzle " << static_cast<int>(c.swizzle) << " box row " << r << " element " << e;
      }
    const std::vector<ExecutionMode> modes = standard_modes();
    EXPECT_EQ(find_mode_dependence([&] { return bytes_of(copy_box(map, c.col0, c.row0)); }, modes),
              std::nullopt);
  }
}

// The 128-byte swizzle in the units a wgmma descriptor reads: 16-byte unit u of row r of an
// 8-row atom lands at unit u XOR (r mod 8).
TEST(Tma, The128ByteSwizzleXorsTheUnitWithTheRow) {
  for (std::uint32_t r = 0; r < 16; ++r)
    for (std::uint32_t u = 0; u < 8; ++u)
      for (std::uint32_t b = 0; b < 16; b += 5)
        EXPECT_EQ(tma_swizzled_offset(TmaSwizzle::bytes128, r * 128 + u * 16 + b),
                  r * 128 + ((u ^ (r % 8)) * 16) + b);
  EXPECT_EQ(tma_swizzled_offset(TmaSwizzle::bytes64, 3 * 128 + 1 * 16), 3 * 128 + 2 * 16);
  EXPECT_EQ(tma_swizzled_offset(TmaSwizzle::bytes32, 128 + 16), 128);
  EXPECT_EQ(tma_swizzled_offset(TmaSwizzle::none, 12345), 12345u);
}

TEST(Tma, AReadBeforeTheBarriersWaitShowsAsLandingDependence) {
  const Tensor2d t(16, 64, 64);
  const TensorMap map = map_of(t, 64, 8, TmaSwizzle::bytes128);
  const std::vector<ExecutionMode> modes = {kAtCopy, kAtWait};
  const auto difference =
      find_mode_dependence([&] { return bytes_of(copy_box(map, 0, 0, false)); }, modes);
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("cp.async=at-wait"), std::string::npos) << *difference;
}

TEST(Tma, EncodingIsRefusedWhereTheDriverRefusesIt) {
  const Tensor2d t(8, 64, 72);
  TensorMap map;
  const std::uint64_t dims[] = {64, 8}, bad_stride[] = {100}, short_stride[] = {64};
  const std::uint64_t stride[] = {144};
  const std::uint32_t box[] = {64, 8}, wide[] = {128, 2}, big[] = {8, 300}, odd[] = {4, 2};
  auto refusal = [&](const void* base, std::span<const std::uint64_t> s,
                     std::span<const std::uint32_t> b, TmaSwizzle sw) {
    return encode_tensor_map_tiled(map, 2, 2, base, dims, s, b, sw, TmaOobFill::zeros);
  };
  EXPECT_EQ(refusal(t.data.data(), stride, box, TmaSwizzle::bytes128), "");
  EXPECT_NE(refusal(reinterpret_cast<const char*>(t.data.data()) + 2, stride, box,
                    TmaSwizzle::none)
                .find("not 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(refusal(t.data.data(), bad_stride, box, TmaSwizzle::none).find("a multiple of 16"),
            std::string::npos);
  EXPECT_NE(refusal(t.data.data(), short_stride, box, TmaSwizzle::none).find("smaller than"),
            std::string::npos);
  EXPECT_NE(refusal(t.data.data(), stride, wide, TmaSwizzle::bytes128).find("swizzle span"),
            std::string::npos);
  EXPECT_NE(refusal(t.data.data(), stride, big, TmaSwizzle::none).find("1 to 256"),
            std::string::npos);
  EXPECT_NE(refusal(t.data.data(), stride, odd, TmaSwizzle::none).find("a multiple of 16"),
            std::string::npos);
}

TEST(Tma, MisuseIsAFaultNamingTheThread) {
  const Tensor2d t(16, 64, 64);
  const TensorMap map = map_of(t, 64, 8, TmaSwizzle::bytes128);
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"tma_misaligned", Dim3{1}, Dim3{32}, 4096}, [&] {
          if (threadIdx.x != 6) return;
          mbarrier_init(SharedAddress{0}, 1);
          const std::int32_t coords[] = {0, 0};
          cp_async_bulk_tensor(SharedAddress{512}, map, coords, SharedAddress{0});
        });
      },
      "tma_misaligned", Dim3{0, 0, 0}, Dim3{6, 0, 0}, "not 1024-byte aligned"));
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"tma_wrong_tx", Dim3{1}, Dim3{1}, 4096}, [&] {
          mbarrier_init(SharedAddress{0}, 1);
          mbarrier_arrive_expect_tx(SharedAddress{0}, 512);  // the box is 1024 bytes
          const std::int32_t coords[] = {0, 0};
          cp_async_bulk_tensor(SharedAddress{1024}, map, coords, SharedAddress{0});
          mbarrier_try_wait_parity(SharedAddress{0}, 0);
        });
      },
      "tma_wrong_tx", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "512 transaction bytes more"));
  const TensorMap never{};
  EXPECT_TRUE(faults(
      [&] {
        launch(LaunchConfig{"tma_unencoded", Dim3{1}, Dim3{1}, 4096}, [&] {
          mbarrier_init(SharedAddress{0}, 1);
          const std::int32_t coords[] = {0, 0};
          cp_async_bulk_tensor(SharedAddress{1024}, never, coords, SharedAddress{0});
        });
      },
      "tma_unencoded", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "never encoded"));
}

}  // namespace
}  // namespace ringattn::emu

// wgmma: one warpgroup's 64 × 64 × 64 product from tiles that a TMA copy wrote
// with the 128-byte swizzle, read through matching descriptors, equals the host's product
// summed in the same order, in every execution mode; A from registers with B in the
// unswizzled core-matrix layout too; reading D before wgmma.wait_group shows as landing
// dependence; a missing wgmma.fence, a missing fence.proxy.async between the threads' own
// stores and wgmma's reads, a descriptor whose swizzle differs from the tensor copy's, a
// warp outside a full warpgroup and wgmma in flight at exit are faults naming kernel, block
// and thread. (The layouts are checked against CuTe in test_cute_layouts.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/fragment_layouts.hpp"
#include "emu/launch.hpp"
#include "emu/mbarrier.hpp"
#include "emu/mode_sweep.hpp"
#include "emu/numeric_formats.hpp"
#include "emu/shared_memory.hpp"
#include "emu/tma.hpp"
#include "emu/wgmma.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::bytes_of;
using testing::faults;

const ExecutionMode kAtCopy{RunOrder::forward, 0, CpAsyncLanding::at_copy};
const ExecutionMode kAtWait{RunOrder::forward, 0, CpAsyncLanding::at_wait};

constexpr unsigned kM = 64, kN = 64, kK = 64;

// Row-major bf16 matrices (rows × 64), small integers over 8 so every product and partial
// sum is exact, plus the host product summed in k order.
struct Problem {
  std::vector<std::uint16_t> a, b;  // A: M × K, B: N × K (both K-major)
  std::vector<float> want;          // M × N
  Problem() : a(kM * kK), b(kN * kK), want(kM * kN) {
    for (unsigned i = 0; i < kM * kK; ++i)
      a[i] = float_to_bf16(static_cast<float>(static_cast<int>((i * 7) % 13) - 6) / 8.0f);
    for (unsigned i = 0; i < kN * kK; ++i)
      b[i] = float_to_bf16(static_cast<float>(static_cast<int>((i * 5) % 11) - 5) / 4.0f);
    for (unsigned m = 0; m < kM; ++m)
      for (unsigned n = 0; n < kN; ++n) {
        float s = 0;
        for (unsigned k = 0; k < kK; ++k)
          s += bf16_to_float(a[m * kK + k]) * bf16_to_float(b[n * kK + k]);
        want[m * kN + n] = s;
      }
  }
};

TensorMap map_of(const std::vector<std::uint16_t>& t, std::uint64_t rows, TmaSwizzle swizzle) {
  TensorMap map;
  const std::uint64_t dims[] = {kK, rows}, strides[] = {kK * 2};
  const std::uint32_t box[] = {kK, static_cast<std::uint32_t>(rows)};
  EXPECT_EQ(encode_tensor_map_tiled(map, 2, 2, t.data(), dims, strides, box, swizzle,
                                    TmaOobFill::zeros),
            "");
  return map;
}

enum class Flaw { none, no_fence, read_before_wait, wrong_swizzle, no_wait };

// One warpgroup: thread 0 copies A and B with the 128-byte swizzle (A at 1024, B at 9216),
// everyone waits, then four k-steps of wgmma with descriptors advanced by 32 bytes.
std::vector<float> product(const Problem& p, Flaw flaw = Flaw::none) {
  const TensorMap ma = map_of(p.a, kM, TmaSwizzle::bytes128);
  const TensorMap mb = map_of(p.b, kN, TmaSwizzle::bytes128);
  std::vector<float> out(kM * kN, -1.0f);
  launch(LaunchConfig{"wgmma_ss", Dim3{1}, Dim3{128}, 1024 + 2 * 8192}, [&] {
    const SharedAddress bar{0};
    if (threadIdx.x == 0) {
      mbarrier_init(bar, 1);
      mbarrier_arrive_expect_tx(bar, 2 * 8192);
      const std::int32_t origin[] = {0, 0};
      cp_async_bulk_tensor(SharedAddress{1024}, ma, origin, bar);
      cp_async_bulk_tensor(SharedAddress{1024 + 8192}, mb, origin, bar);
    }
    __syncthreads();
    mbarrier_try_wait_parity(bar, 0);
    const GmmaSwizzle sw = flaw == Flaw::wrong_swizzle ? GmmaSwizzle::bytes64 : GmmaSwizzle::bytes128;
    float d[kN / 2] = {};
    if (flaw != Flaw::no_fence) wgmma_fence();
    for (unsigned kb = 0; kb < kK / 16; ++kb) {
      const std::uint64_t da = make_gmma_descriptor(SharedAddress{1024 + 32 * kb}, 16, 1024, sw);
      const std::uint64_t db =
          make_gmma_descriptor(SharedAddress{1024 + 8192 + 32 * kb}, 16, 1024, sw);
      wgmma_m64k16_ss(MmaInput::bf16, kN, d, da, db, kb > 0);
    }
    wgmma_commit_group();
    if (flaw == Flaw::no_wait) return;
    if (flaw != Flaw::read_before_wait) wgmma_wait_group(0);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = 0; i < static_cast<int>(kN / 2); ++i) {
      const MatrixCoord y = wgmma_d_coord(static_cast<int>(lane), i);
      out[(16 * warp + static_cast<unsigned>(y.row)) * kN + static_cast<unsigned>(y.col)] = d[i];
    }
    if (flaw == Flaw::read_before_wait) wgmma_wait_group(0);
  });
  return out;
}

TEST(Wgmma, SwizzledTmaTilesThroughDescriptorsGiveTheProductInEveryMode) {
  const Problem p;
  for (const ExecutionMode& mode : {kAtCopy, kAtWait}) {
    const ScopedExecutionMode scoped(mode);
    EXPECT_EQ(product(p), p.want) << describe(mode);
  }
  const std::vector<ExecutionMode> modes = standard_modes();
  EXPECT_EQ(find_mode_dependence([&] { return bytes_of(product(p)); }, modes), std::nullopt);
}

// A from registers (mma.m16n8k16's A fragment for the warp's 16 rows), B written by the
// threads themselves in the unswizzled layout: 8 × 16-byte core matrices, SBO 128 bytes
// between 8-row groups, LBO 1024 bytes between the two k halves of a 16-wide k-step.
TEST(Wgmma, RegisterAAndUnswizzledCoreMatricesGiveTheProduct) {
  const Problem p;
  std::vector<float> out(kM * kN, -1.0f);
  launch(LaunchConfig{"wgmma_rs", Dim3{1}, Dim3{128}, 4 * 2048}, [&] {
    const SharedPtr<std::uint16_t> s = dynamic_shared_memory<std::uint16_t>();
    // k-step kb's B at 2048·kb: element (n, k) at (n/8)·128 + (k/8)·1024 + (n%8)·16 + (k%8)·2.
    for (unsigned i = threadIdx.x; i < kN * kK; i += 128) {
      const unsigned n = i / kK, k = i % kK, kb = k / 16, kk = k % 16;
      s[(2048 * kb + (n / 8) * 128 + (kk / 8) * 1024 + (n % 8) * 16 + (kk % 8) * 2) / 2] = p.b[i];
    }
    fence_proxy_async_shared();  // the stores, before wgmma's (the async proxy's) reads
    __syncthreads();
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float d[kN / 2] = {};
    wgmma_fence();
    for (unsigned kb = 0; kb < kK / 16; ++kb) {
      std::uint32_t a[4];
      for (int reg = 0; reg < 4; ++reg) {
        std::uint16_t h[2];
        for (int half = 0; half < 2; ++half) {
          const MatrixCoord x = mma_a_coord(static_cast<int>(lane), reg, half);
          h[half] = p.a[(16 * warp + static_cast<unsigned>(x.row)) * kK + 16 * kb +
                        static_cast<unsigned>(x.col)];
        }
        a[reg] = static_cast<std::uint32_t>(h[0]) | static_cast<std::uint32_t>(h[1]) << 16;
      }
      wgmma_m64k16_rs(MmaInput::bf16, kN, d, a,
                      make_gmma_descriptor(SharedAddress{2048 * kb}, 1024, 128, GmmaSwizzle::none),
                      kb > 0);
    }
    wgmma_commit_group();
    wgmma_wait_group(0);
    for (int i = 0; i < static_cast<int>(kN / 2); ++i) {
      const MatrixCoord y = wgmma_d_coord(static_cast<int>(lane), i);
      out[(16 * warp + static_cast<unsigned>(y.row)) * kN + static_cast<unsigned>(y.col)] = d[i];
    }
  });
  EXPECT_EQ(out, p.want);
}

// O = P·V's shape: B is V, stored [k][n] (n contiguous) and copied by TMA with the 128-byte
// swizzle, read N-major (imm-trans-b): 8-k groups 1024 bytes apart, a k-step two of them.
TEST(Wgmma, NMajorBFromASwizzledTmaTileGivesTheProduct) {
  const Problem p;
  std::vector<std::uint16_t> v(kK * kN);  // v[k][n] = b[n][k]
  for (unsigned n = 0; n < kN; ++n)
    for (unsigned k = 0; k < kK; ++k) v[k * kN + n] = p.b[n * kK + k];
  const TensorMap mv = map_of(v, kK, TmaSwizzle::bytes128);
  const TensorMap ma = map_of(p.a, kM, TmaSwizzle::bytes128);
  for (const ExecutionMode& mode : {kAtCopy, kAtWait}) {
    const ScopedExecutionMode scoped(mode);
    std::vector<float> out(kM * kN, -1.0f);
    launch(LaunchConfig{"wgmma_nmajor", Dim3{1}, Dim3{128}, 1024 + 2 * 8192}, [&] {
      const SharedAddress bar{0};
      if (threadIdx.x == 0) {
        mbarrier_init(bar, 1);
        mbarrier_arrive_expect_tx(bar, 2 * 8192);
        const std::int32_t origin[] = {0, 0};
        cp_async_bulk_tensor(SharedAddress{1024}, ma, origin, bar);
        cp_async_bulk_tensor(SharedAddress{1024 + 8192}, mv, origin, bar);
      }
      __syncthreads();
      mbarrier_try_wait_parity(bar, 0);
      float d[kN / 2] = {};
      wgmma_fence();
      for (unsigned kb = 0; kb < kK / 16; ++kb) {
        const std::uint64_t da =
            make_gmma_descriptor(SharedAddress{1024 + 32 * kb}, 16, 1024, GmmaSwizzle::bytes128);
        const std::uint64_t db = make_gmma_descriptor(SharedAddress{1024 + 8192 + 2048 * kb}, 0,
                                                      1024, GmmaSwizzle::bytes128);
        wgmma_m64k16_ss(MmaInput::bf16, kN, d, da, db, kb > 0, false, true);
      }
      wgmma_commit_group();
      wgmma_wait_group(0);
      const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      for (int i = 0; i < static_cast<int>(kN / 2); ++i) {
        const MatrixCoord y = wgmma_d_coord(static_cast<int>(lane), i);
        out[(16 * warp + static_cast<unsigned>(y.row)) * kN + static_cast<unsigned>(y.col)] = d[i];
      }
    });
    EXPECT_EQ(out, p.want) << describe(mode);
  }
}

TEST(Wgmma, ReadingDBeforeTheWaitShowsAsLandingDependence) {
  const Problem p;
  const std::vector<ExecutionMode> modes = {kAtCopy, kAtWait};
  const auto difference =
      find_mode_dependence([&] { return bytes_of(product(p, Flaw::read_before_wait)); }, modes);
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("cp.async=at-wait"), std::string::npos) << *difference;
}

// A 64 × 8 × 16 product into `d` from unswizzled core matrices: A at shared offset 0, B at 2048.
void core_matrix_product(float (&d)[4]) {
  wgmma_m64k16_ss(MmaInput::bf16, 8, d,
                  make_gmma_descriptor(SharedAddress{0}, 128, 256, GmmaSwizzle::none),
                  make_gmma_descriptor(SharedAddress{2048}, 128, 256, GmmaSwizzle::none), false);
}

TEST(Wgmma, MisuseIsAFaultNamingTheThread) {
  const Problem p;
  // Issued before waiting on the TMA's barrier: under the at-wait landing the wgmma reads
  // bytes still in flight, which is a fault (under at-copy they have landed already).
  {
    const ScopedExecutionMode at_wait(kAtWait);
    const TensorMap ma = map_of(p.a, kM, TmaSwizzle::bytes128);
    EXPECT_TRUE(faults(
        [&] {
          launch(LaunchConfig{"wgmma_before_tma", Dim3{1}, Dim3{128}, 1024 + 8192}, [&] {
            if (threadIdx.x == 0) {
              mbarrier_init(SharedAddress{0}, 1);
              mbarrier_arrive_expect_tx(SharedAddress{0}, 8192);
              const std::int32_t origin[] = {0, 0};
              cp_async_bulk_tensor(SharedAddress{1024}, ma, origin, SharedAddress{0});
            }
            __syncthreads();
            float d[8] = {};
            wgmma_fence();
            const std::uint64_t desc =
                make_gmma_descriptor(SharedAddress{1024}, 16, 1024, GmmaSwizzle::bytes128);
            wgmma_m64k16_ss(MmaInput::bf16, 16, d, desc, desc, false);
            wgmma_commit_group();
            wgmma_wait_group(0);
            mbarrier_try_wait_parity(SharedAddress{0}, 0);
          });
        },
        "wgmma_before_tma", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "has not landed"));
  }
  // One warp of the warpgroup skips a wgmma.
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"wgmma_one_warp_skips", Dim3{1}, Dim3{128}, 4096}, [] {
          float d[4] = {};
          wgmma_fence();
          if (threadIdx.x / 32 != 2) core_matrix_product(d);
          wgmma_commit_group();
          wgmma_wait_group(0);
        });
      },
      "wgmma_one_warp_skips", Dim3{0, 0, 0}, Dim3{64, 0, 0}, "warp 2 0"));
  // Tiles the threads stored themselves, read by wgmma with no fence.proxy.async between:
  // the async proxy may not see the stores. The same kernel with the fence runs clean.
  auto stores_then_wgmma = [](bool proxy_fence) {
    launch(LaunchConfig{"wgmma_after_stores", Dim3{1}, Dim3{128}, 4096}, [proxy_fence] {
      const SharedPtr<std::uint32_t> s = dynamic_shared_memory<std::uint32_t>();
      for (unsigned i = threadIdx.x; i < 1024; i += 128) s[i] = 0x3f803f80u;  // bf16 ones
      if (proxy_fence) fence_proxy_async_shared();
      __syncthreads();
      float d[4] = {};
      wgmma_fence();
      core_matrix_product(d);
      wgmma_commit_group();
      wgmma_wait_group(0);
      if (d[0] != 16.0f) fault_here("wrong product");
    });
  };
  EXPECT_TRUE(faults([&] { stores_then_wgmma(false); }, "wgmma_after_stores", Dim3{0, 0, 0},
                     Dim3{0, 0, 0}, "with no fence.proxy.async after that"));
  EXPECT_NO_THROW(stores_then_wgmma(true));
  EXPECT_TRUE(faults([&] { product(p, Flaw::no_fence); }, "wgmma_ss", Dim3{0, 0, 0},
                     Dim3{0, 0, 0}, "without a wgmma.fence"));
  EXPECT_TRUE(faults([&] { product(p, Flaw::wrong_swizzle); }, "wgmma_ss", Dim3{0, 0, 0},
                     Dim3{0, 0, 0}, "which a tensor copy wrote with 128-byte swizzle"));
  EXPECT_TRUE(faults([&] { product(p, Flaw::no_wait); }, "wgmma_ss", Dim3{0, 0, 0},
                     Dim3{0, 0, 0}, "exited with wgmma.mma_async in flight"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"wgmma_two_warps", Dim3{1}, Dim3{64}, 4096}, [] {
          float d[4] = {};
          wgmma_fence();
          wgmma_m64k16_ss(MmaInput::bf16, 8, d, 0, 0, false);
        });
      },
      "wgmma_two_warps", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "not in a full warpgroup"));
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"wgmma_atom_row", Dim3{1}, Dim3{128}, 4096}, [] {
          float d[4] = {};
          wgmma_fence();
          const std::uint64_t desc =
              make_gmma_descriptor(SharedAddress{128}, 16, 1024, GmmaSwizzle::bytes128);
          wgmma_m64k16_ss(MmaInput::bf16, 8, d, desc, desc, false);
          wgmma_commit_group();
          wgmma_wait_group(0);
        });
      },
      "wgmma_atom_row", Dim3{0, 0, 0}, Dim3{0, 0, 0}, "not on the first row of its 1024-byte atom"));
}

}  // namespace
}  // namespace ringattn::emu

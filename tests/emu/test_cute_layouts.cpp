// The emulator's fragment layouts against an independent source: CuTe's traits for
// SM80_16x8x16_F32BF16BF16F32_TN and SM80_16x8x16_F32F16F16F32_TN (ALayout, BLayout,
// CLayout: (thread, value) → index into the column-major M×K, N×K and M×N tiles) and for
// SM75_U32x4_LDSM_N and SM75_U16x8_LDSM_T ((thread, bit) → bit of the 32 source rows of
// 128 bits). Every lane and register is compared with fragment_layouts.hpp, and ldmatrix
// and mma are run on fragments placed by CuTe's layouts. Only CuTe's headers are used.
#include <gtest/gtest.h>

#include <cstdint>
#include <cute/atom/copy_traits_sm75.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/swizzle.hpp>
#include <cute/tensor.hpp>
#include <cstdlib>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/fragment_layouts.hpp"
#include "emu/launch.hpp"
#include "emu/ldmatrix.hpp"
#include "emu/mma.hpp"
#include "emu/numeric_formats.hpp"
#include "emu/shared_memory.hpp"
#include "emu/tma.hpp"
#include "emu/wgmma.hpp"

namespace ringattn::emu {
namespace {

template <typename Layout>
int at(int thread, int value) {
  return static_cast<int>(Layout{}(thread, value));
}

// CuTe's value v of a 16-bit operand is register v / 2, half v % 2 (registers in order,
// the low half first), which is how the traits pack two elements into each register.
template <typename Op>
void check_mma_traits() {
  using Traits = cute::MMA_Traits<Op>;
  using A = typename Traits::ALayout;
  using B = typename Traits::BLayout;
  using C = typename Traits::CLayout;
  static_assert(cute::size<0>(typename Traits::Shape_MNK{}) == 16 &&
                cute::size<1>(typename Traits::Shape_MNK{}) == 8 &&
                cute::size<2>(typename Traits::Shape_MNK{}) == 16);
  static_assert(cute::size(typename Traits::ThrID{}) == 32);
  for (int t = 0; t < 32; ++t) {
    ASSERT_EQ(static_cast<int>(typename Traits::ThrID{}(t)), t) << "thread t is lane t";
    for (int v = 0; v < 8; ++v) {
      const int i = at<A>(t, v);  // m + 16·k
      EXPECT_EQ(mma_a_coord(t, v / 2, v % 2), (MatrixCoord{i % 16, i / 16}))
          << "A lane " << t << " register " << v / 2 << " half " << v % 2;
    }
    for (int v = 0; v < 4; ++v) {
      const int i = at<B>(t, v);  // n + 8·k
      EXPECT_EQ(mma_b_coord(t, v / 2, v % 2), (MatrixCoord{i / 8, i % 8}))
          << "B lane " << t << " register " << v / 2 << " half " << v % 2;
      const int j = at<C>(t, v);  // m + 16·n
      EXPECT_EQ(mma_c_coord(t, v), (MatrixCoord{j % 16, j / 16})) << "C lane " << t << " c" << v;
    }
  }
}

TEST(CuteLayouts, MmaBf16MatchesSm80Traits) {
  check_mma_traits<cute::SM80_16x8x16_F32BF16BF16F32_TN>();
}
TEST(CuteLayouts, MmaF16MatchesSm80Traits) {
  check_mma_traits<cute::SM80_16x8x16_F32F16F16F32_TN>();
}

// For ldmatrix: which source row (the row address of that lane) and which 16-bit element
// of it each (lane, register, half) receives, by CuTe. A 16-bit element of register v,
// half h is bits 32v + 16h .. +15 of the thread's destination values.
template <typename Op>
std::map<std::pair<int, int>, LdmatrixSource> cute_ldmatrix_sources() {
  using Traits = cute::Copy_Traits<Op>;
  using Src = typename Traits::SrcLayout;
  using Dst = typename Traits::DstLayout;
  static_assert(cute::size<1>(Src{}) == 128 && cute::size<1>(Dst{}) == 128);
  std::map<int, std::pair<int, int>> source_bit;  // bit index → (thread, bit of its row)
  for (int t = 0; t < 32; ++t)
    for (int b = 0; b < 128; ++b) source_bit[at<Src>(t, b)] = {t, b};
  std::map<std::pair<int, int>, LdmatrixSource> out;  // (lane, 2·reg + half)
  for (int t = 0; t < 32; ++t) {
    for (int v = 0; v < 8; ++v) {
      const auto [row_thread, bit] = source_bit.at(at<Dst>(t, 16 * v));
      for (int b = 1; b < 16; ++b) {  // the element's 16 bits stay together and in order
        EXPECT_EQ(source_bit.at(at<Dst>(t, 16 * v + b)), std::make_pair(row_thread, bit + b));
      }
      EXPECT_EQ(bit % 16, 0);
      out[{t, v}] = LdmatrixSource{row_thread, bit / 16};
    }
  }
  return out;
}

template <typename Op>
void check_ldmatrix_traits(bool trans) {
  const auto sources = cute_ldmatrix_sources<Op>();
  for (int t = 0; t < 32; ++t)
    for (int v = 0; v < 8; ++v)
      EXPECT_EQ(ldmatrix_source(t, v / 2, v % 2, trans), sources.at({t, v}))
          << (trans ? "trans" : "plain") << " lane " << t << " register " << v / 2 << " half "
          << v % 2;

  // And what the emulator's ldmatrix actually delivers: lane L's row holds the elements
  // 256·L + e (row addresses in a shuffled order, so no lane's row is its neighbour's).
  std::vector<std::uint32_t> regs(32 * 4);
  launch(LaunchConfig{"cute_ldmatrix", Dim3{1}, Dim3{32}, 32 * 16}, [&] {
    const unsigned lane = threadIdx.x;
    const SharedPtr<std::uint16_t> s = dynamic_shared_memory<std::uint16_t>();
    const unsigned slot = (lane * 7 + 3) % 32;
    for (int e = 0; e < 8; ++e)
      s[slot * 8 + static_cast<unsigned>(e)] =
          static_cast<std::uint16_t>(256 * lane + static_cast<unsigned>(e));
    __syncwarp();
    std::uint32_t r[4];
    if (trans)
      ldmatrix_x4_trans(r, (s + slot * 8).address());
    else
      ldmatrix_x4(r, (s + slot * 8).address());
    for (int i = 0; i < 4; ++i) regs[lane * 4 + static_cast<unsigned>(i)] = r[i];
  });
  for (int t = 0; t < 32; ++t) {
    for (int v = 0; v < 8; ++v) {
      const LdmatrixSource s = sources.at({t, v});
      EXPECT_EQ(half_of(regs[static_cast<std::size_t>(t * 4 + v / 2)], v % 2),
                256 * s.lane + s.element)
          << (trans ? "trans" : "plain") << " lane " << t << " register " << v / 2;
    }
  }
}

TEST(CuteLayouts, LdmatrixX4MatchesSm75U32x4LdsmN) {
  check_ldmatrix_traits<cute::SM75_U32x4_LDSM_N>(false);
}
TEST(CuteLayouts, LdmatrixX4TransMatchesSm75U16x8LdsmT) {
  check_ldmatrix_traits<cute::SM75_U16x8_LDSM_T>(true);
}

// mma run on fragments that CuTe's layouts place (small integers: every sum is exact).
template <typename Op>
void check_mma_by_cute_placement(MmaInput input) {
  using Traits = cute::MMA_Traits<Op>;
  using A = typename Traits::ALayout;
  using B = typename Traits::BLayout;
  using C = typename Traits::CLayout;
  const auto encode = input == MmaInput::bf16 ? float_to_bf16 : float_to_f16;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> ints(-9, 9);
  float a[16][16], b[16][8], c[16][8];  // [m][k], [k][n], [m][n]
  for (auto& row : a)
    for (float& x : row) x = static_cast<float>(ints(rng));
  for (auto& row : b)
    for (float& x : row) x = static_cast<float>(ints(rng));
  for (auto& row : c)
    for (float& x : row) x = static_cast<float>(ints(rng));
  std::vector<float> d(32 * 4);
  launch(LaunchConfig{"cute_mma", Dim3{1}, Dim3{32}, 0}, [&] {
    const int t = static_cast<int>(threadIdx.x);
    std::uint16_t ah[8], bh[4];
    for (int v = 0; v < 8; ++v) ah[v] = encode(a[at<A>(t, v) % 16][at<A>(t, v) / 16]);
    for (int v = 0; v < 4; ++v) bh[v] = encode(b[at<B>(t, v) / 8][at<B>(t, v) % 8]);
    const std::uint32_t ar[4] = {pack_halves(ah[0], ah[1]), pack_halves(ah[2], ah[3]),
                                 pack_halves(ah[4], ah[5]), pack_halves(ah[6], ah[7])};
    float acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = c[at<C>(t, v) % 16][at<C>(t, v) / 16];
    mma_m16n8k16(input, acc, ar, pack_halves(bh[0], bh[1]), pack_halves(bh[2], bh[3]));
    for (int v = 0; v < 4; ++v) d[static_cast<std::size_t>(t * 4 + v)] = acc[v];
  });
  for (int t = 0; t < 32; ++t) {
    for (int v = 0; v < 4; ++v) {
      const int m = at<C>(t, v) % 16, n = at<C>(t, v) / 16;
      float expected = c[m][n];
      for (int k = 0; k < 16; ++k) expected += a[m][k] * b[k][n];
      EXPECT_EQ(d[static_cast<std::size_t>(t * 4 + v)], expected) << "lane " << t << " c" << v;
    }
  }
}

TEST(CuteLayouts, MmaBf16OnCutePlacedFragments) {
  check_mma_by_cute_placement<cute::SM80_16x8x16_F32BF16BF16F32_TN>(MmaInput::bf16);
}
TEST(CuteLayouts, MmaF16OnCutePlacedFragments) {
  check_mma_by_cute_placement<cute::SM80_16x8x16_F32F16F16F32_TN>(MmaInput::f16);
}

// The TMA box swizzles (and the wgmma descriptor modes that read them) against CuTe's
// Swizzle<B, 4, 3> functors on byte offsets, which its SM90 TMA and GMMA layouts are built
// from (Swizzle<1,4,3> for 32 bytes, <2,4,3> for 64, <3,4,3> for 128).
TEST(CuteLayouts, TmaSwizzlesMatchCuteSwizzleFunctors) {
  for (std::uint32_t offset = 0; offset < 8192; ++offset) {
    ASSERT_EQ(tma_swizzled_offset(TmaSwizzle::bytes32, offset),
              static_cast<std::uint32_t>(cute::Swizzle<1, 4, 3>{}(offset)))
        << offset;
    ASSERT_EQ(tma_swizzled_offset(TmaSwizzle::bytes64, offset),
              static_cast<std::uint32_t>(cute::Swizzle<2, 4, 3>{}(offset)))
        << offset;
    ASSERT_EQ(tma_swizzled_offset(TmaSwizzle::bytes128, offset),
              static_cast<std::uint32_t>(cute::Swizzle<3, 4, 3>{}(offset)))
        << offset;
  }
}

// wgmma's accumulator (CLayout_64xN) and register-A (ALayout_64x16) layouts: CuTe's
// (thread, value) → m + 64·n (or m + 64·k) against wgmma_d_coord and mma_a_coord on the
// thread's warp rows.
TEST(CuteLayouts, WgmmaFragmentsMatchSm90GmmaLayouts) {
  using C = cute::SM90::GMMA::CLayout_64xN<64>;
  using A = cute::SM90::GMMA::ALayout_64x16;
  for (int t = 0; t < 128; ++t) {
    const int warp = t / 32, lane = t % 32;
    for (int v = 0; v < 32; ++v) {
      const MatrixCoord ours = wgmma_d_coord(lane, v);
      EXPECT_EQ(at<C>(t, v), 16 * warp + ours.row + 64 * ours.col) << "thread " << t << " value " << v;
    }
    for (int v = 0; v < 8; ++v) {
      const MatrixCoord ours = mma_a_coord(lane, v / 2, v % 2);
      EXPECT_EQ(at<A>(t, v), 16 * warp + ours.row + 64 * ours.col) << "thread " << t << " value " << v;
    }
  }
}

// A K-major operand in CuTe's GMMA layout atoms (INTER, SW32, SW64, SW128) tiled to 64 rows,
// at a 1024-byte aligned address: the byte offset of every element against what a wgmma
// descriptor (start advanced by 32 bytes per 16-wide k-step, SBO the atom's 8-row stride,
// LBO the INTER layout's k-half stride) reads.
template <class Atom, int K>
std::vector<std::uint32_t> cute_offsets() {
  using namespace cute;
  auto* base = static_cast<bfloat16_t*>(std::aligned_alloc(1024, 64 * K * 2));
  auto t = make_tensor(make_smem_ptr(base), tile_to_shape(Atom{}, Shape<_64, Int<K>>{}));
  std::vector<std::uint32_t> out;
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < K; ++k)
      out.push_back(static_cast<std::uint32_t>(reinterpret_cast<char*>(&t(m, k)) -
                                               reinterpret_cast<char*>(base)));
  std::free(base);
  return out;
}

std::vector<std::uint32_t> descriptor_offsets(GmmaSwizzle swizzle, int k_extent,
                                              std::uint32_t lbo, std::uint32_t sbo) {
  std::vector<std::uint32_t> out;
  launch(LaunchConfig{"gmma_addresses", Dim3{1}, Dim3{1}, 64 * 64 * 2}, [&] {
    for (std::uint32_t m = 0; m < 64; ++m)
      for (std::uint32_t k = 0; k < static_cast<std::uint32_t>(k_extent); ++k) {
        const std::uint64_t desc =
            make_gmma_descriptor(SharedAddress{32 * (k / 16)}, lbo, sbo, swizzle);
        out.push_back(gmma_element_address(desc, m, k % 16));
      }
  });
  return out;
}

TEST(CuteLayouts, WgmmaDescriptorsReadCutesKMajorGmmaAtoms) {
  using cute::bfloat16_t;
  namespace G = cute::SM90::GMMA;
  EXPECT_EQ((cute_offsets<G::Layout_K_INTER_Atom<bfloat16_t>, 16>()),
            descriptor_offsets(GmmaSwizzle::none, 16, 1024, 128));
  EXPECT_EQ((cute_offsets<G::Layout_K_SW32_Atom<bfloat16_t>, 16>()),
            descriptor_offsets(GmmaSwizzle::bytes32, 16, 16, 256));
  EXPECT_EQ((cute_offsets<G::Layout_K_SW64_Atom<bfloat16_t>, 32>()),
            descriptor_offsets(GmmaSwizzle::bytes64, 32, 16, 512));
  EXPECT_EQ((cute_offsets<G::Layout_K_SW128_Atom<bfloat16_t>, 64>()),
            descriptor_offsets(GmmaSwizzle::bytes128, 64, 16, 1024));
}

// The M|N-major atoms (the transposed operands: V in P·V) tiled to 64 × 16: LBO and SBO read
// off CuTe's tensor (the next M|N repeat, the next 8-k group), then every element compared.
template <class Atom>
void expect_mn_major_matches(GmmaSwizzle swizzle, std::uint32_t mn_unit) {
  using namespace cute;
  auto* base = static_cast<bfloat16_t*>(std::aligned_alloc(1024, 64 * 16 * 2));
  auto t = make_tensor(make_smem_ptr(base), tile_to_shape(Atom{}, Shape<_64, _16>{}));
  auto offset = [&](int mn, int k) {
    return static_cast<std::uint32_t>(reinterpret_cast<char*>(&t(mn, k)) -
                                      reinterpret_cast<char*>(base));
  };
  // Without swizzle, SBO steps over 8 M|N elements and LBO over 8 k; swizzled, LBO steps
  // over one row of M|N (W/2 elements) and SBO over 8 k.
  const std::uint32_t lbo = swizzle == GmmaSwizzle::none ? offset(0, 8) : offset(static_cast<int>(mn_unit) % 64, 0);
  const std::uint32_t sbo = swizzle == GmmaSwizzle::none ? offset(8, 0) : offset(0, 8);
  std::vector<std::uint32_t> want, got;
  for (int mn = 0; mn < 64; ++mn)
    for (int k = 0; k < 16; ++k) want.push_back(offset(mn, k));
  std::free(base);
  launch(LaunchConfig{"gmma_mn_addresses", Dim3{1}, Dim3{1}, 64 * 64 * 2}, [&] {
    const std::uint64_t desc = make_gmma_descriptor(SharedAddress{0}, lbo, sbo, swizzle);
    for (std::uint32_t mn = 0; mn < 64; ++mn)
      for (std::uint32_t k = 0; k < 16; ++k) got.push_back(gmma_element_address(desc, mn, k, true));
  });
  EXPECT_EQ(got, want) << "swizzle " << static_cast<int>(swizzle) << ", LBO " << lbo << ", SBO " << sbo;
}

TEST(CuteLayouts, WgmmaDescriptorsReadCutesMnMajorGmmaAtoms) {
  using cute::bfloat16_t;
  namespace G = cute::SM90::GMMA;
  expect_mn_major_matches<G::Layout_MN_INTER_Atom<bfloat16_t>>(GmmaSwizzle::none, 8);
  expect_mn_major_matches<G::Layout_MN_SW32_Atom<bfloat16_t>>(GmmaSwizzle::bytes32, 16);
  expect_mn_major_matches<G::Layout_MN_SW64_Atom<bfloat16_t>>(GmmaSwizzle::bytes64, 32);
  expect_mn_major_matches<G::Layout_MN_SW128_Atom<bfloat16_t>>(GmmaSwizzle::bytes128, 64);
}

}  // namespace
}  // namespace ringattn::emu

// mma.sync m16n8k16 (bf16 and fp16 inputs, fp32 accumulators) fed by ldmatrix the way the
// flash kernels feed it (A row-major; B either as n rows of k, or as k rows of n through
// .trans), against a float64 matmul of the same rounded inputs: within fp32's summation
// bound, bitwise equal to fp32 sums in the documented order, and exact where every partial
// sum is representable. Also: the faults for a diverged warp and mixed input types.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "emu/cuda_builtins.hpp"
#include "emu/launch.hpp"
#include "emu/ldmatrix.hpp"
#include "emu/mma.hpp"
#include "emu/numeric_formats.hpp"
#include "emu/shared_memory.hpp"
#include "emu_test_support.hpp"

namespace ringattn::emu {
namespace {

using testing::faults;

constexpr int kPitch = 24;  // elements per shared row (16 + 8 padding, as the kernels pad)

struct Problem {
  MmaInput input;
  std::vector<std::uint16_t> a;  // 16 × 16, [m][k]
  std::vector<std::uint16_t> b;  // 16 × 16, [k][n]: two n-tiles of 8
  std::vector<float> c;          // 16 × 16, [m][n]
};

float decode(MmaInput input, std::uint16_t bits) {
  return input == MmaInput::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
}

Problem random_problem(MmaInput input, std::uint32_t seed, bool small_integers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ints(-8, 8);
  const auto draw = [&] { return small_integers ? static_cast<float>(ints(rng)) : normal(rng); };
  const auto encode = input == MmaInput::bf16 ? float_to_bf16 : float_to_f16;
  Problem p{input, std::vector<std::uint16_t>(256), std::vector<std::uint16_t>(256),
            std::vector<float>(256)};
  for (auto& x : p.a) x = encode(draw());
  for (auto& x : p.b) x = encode(draw());
  for (auto& x : p.c) x = small_integers ? draw() * 16 : draw() * 4;
  return p;
}

// One warp: A from shared memory through ldmatrix x4; B stored transposed (rows n, the
// "col" operand as S = Q Kᵀ reads K) through ldmatrix x4, or stored as rows k (as O += P V
// reads V) through ldmatrix x4.trans; C in registers by the fp32 accumulator layout.
std::vector<float> run_mma(const Problem& p, bool b_rows_are_k) {
  std::vector<float> d(256);
  const std::uint32_t bytes = 2 * 16 * kPitch * 2;
  launch(LaunchConfig{"mma_test", Dim3{1}, Dim3{32}, bytes}, [&] {
    const SharedPtr<std::uint16_t> sA = dynamic_shared_memory<std::uint16_t>();
    const SharedPtr<std::uint16_t> sB = sA + 16 * kPitch;
    const int lane = static_cast<int>(threadIdx.x);
    for (int i = lane; i < 256; i += 32) {
      const int row = i / 16, col = i % 16;
      sA[row * kPitch + col] = p.a[i];
      if (b_rows_are_k)
        sB[row * kPitch + col] = p.b[i];  // B[k][n] at row k
      else
        sB[col * kPitch + row] = p.b[i];  // B[k][n] at row n
    }
    __syncwarp();
    // Matrix j = lane / 8 of the x4, row lane % 8. A: matrices (m 0-7, k 0-7), (m 8-15,
    // k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) are a0..a3.
    const int j = lane / 8, r = lane % 8;
    std::uint32_t a[4], b[4];
    ldmatrix_x4(a, (sA + (8 * (j % 2) + r) * kPitch + 8 * (j / 2)).address());
    if (b_rows_are_k) {
      // (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), transposed.
      ldmatrix_x4_trans(b, (sB + (8 * (j % 2) + r) * kPitch + 8 * (j / 2)).address());
    } else {
      // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
      ldmatrix_x4(b, (sB + (8 * (j / 2) + r) * kPitch + 8 * (j % 2)).address());
    }
    for (int tile = 0; tile < 2; ++tile) {
      // Accumulator: c0, c1 at row lane/4, c2, c3 at row lane/4 + 8; columns 2(lane%4) + 0/1.
      float acc[4];
      for (int e = 0; e < 4; ++e)
        acc[e] = p.c[(lane / 4 + 8 * (e / 2)) * 16 + 8 * tile + 2 * (lane % 4) + e % 2];
      mma_m16n8k16(p.input, acc, a, b[2 * tile], b[2 * tile + 1]);
      for (int e = 0; e < 4; ++e)
        d[(lane / 4 + 8 * (e / 2)) * 16 + 8 * tile + 2 * (lane % 4) + e % 2] = acc[e];
    }
  });
  return d;
}

void check_against_float64(MmaInput input, bool b_rows_are_k) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    const Problem p = random_problem(input, seed, false);
    const std::vector<float> d = run_mma(p, b_rows_are_k);
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 16; ++n) {
        double exact = p.c[m * 16 + n], magnitude = std::abs(exact);
        float in_order = p.c[m * 16 + n];
        for (int k = 0; k < 16; ++k) {
          const double term =
              static_cast<double>(decode(input, p.a[m * 16 + k])) * decode(input, p.b[k * 16 + n]);
          exact += term;
          magnitude += std::abs(term);
          in_order += static_cast<float>(term);  // exact in fp32: the product of two halves
        }
        // 16 roundings of at most half an ulp each (γ16 · Σ|terms|).
        const double bound = 16.0 * std::ldexp(1.0, -24) * magnitude * 1.001;
        ASSERT_LE(std::abs(d[m * 16 + n] - exact), bound)
            << "seed " << seed << " m " << m << " n " << n;
        ASSERT_EQ(d[m * 16 + n], in_order) << "the documented order: C, then k = 0..15";
      }
    }
  }
}

TEST(Mma, Bf16MatchesFloat64WithinFp32Summation) { check_against_float64(MmaInput::bf16, false); }
TEST(Mma, Fp16MatchesFloat64WithinFp32Summation) { check_against_float64(MmaInput::f16, false); }
TEST(Mma, Bf16WithTransposedBMatchesFloat64) { check_against_float64(MmaInput::bf16, true); }
TEST(Mma, Fp16WithTransposedBMatchesFloat64) { check_against_float64(MmaInput::f16, true); }

TEST(Mma, ExactWhereEveryPartialSumIsRepresentable) {
  for (const MmaInput input : {MmaInput::bf16, MmaInput::f16}) {
    for (const bool b_rows_are_k : {false, true}) {
      const Problem p = random_problem(input, 99, true);
      const std::vector<float> d = run_mma(p, b_rows_are_k);
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 16; ++n) {
          double exact = p.c[m * 16 + n];
          for (int k = 0; k < 16; ++k)
            exact += static_cast<double>(decode(input, p.a[m * 16 + k])) *
                     decode(input, p.b[k * 16 + n]);
          ASSERT_EQ(static_cast<double>(d[m * 16 + n]), exact) << m << " " << n;
        }
      }
    }
  }
}

TEST(Mma, DivergedWarpFaults) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"mma_diverged", Dim3{1}, Dim3{64}, 0}, [] {
          float acc[4] = {};
          const std::uint32_t a[4] = {};
          if (threadIdx.x != 40) mma_m16n8k16(MmaInput::bf16, acc, a, 0, 0);
        });
      },
      "mma_diverged", Dim3{0, 0, 0}, Dim3{32, 0, 0}, "lane 8 (thread (40,0,0)) has exited"));
}

TEST(Mma, LanesDisagreeingOnTheInputTypeFault) {
  EXPECT_TRUE(faults(
      [] {
        launch(LaunchConfig{"mma_mixed", Dim3{1}, Dim3{32}, 0}, [] {
          float acc[4] = {};
          const std::uint32_t a[4] = {};
          mma_m16n8k16(threadIdx.x == 3 ? MmaInput::f16 : MmaInput::bf16, acc, a, 0, 0);
        });
      },
      "mma_mixed", Dim3{0, 0, 0}, Dim3{0, 0, 0},
      "lane 3 (thread (3,0,0)) waits at mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
}

}  // namespace
}  // namespace ringattn::emu

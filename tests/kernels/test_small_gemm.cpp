// The CPU kernels' building blocks: the small tile products on each backend (libxsmm's
// generated kernels, OpenBLAS) against a float64 product, and the key-major softmax steps'
// AVX2 and AVX-512 forms (each the host executes, forced) against their portable forms. The kernels
// built on them are checked against the float64 reference elsewhere, on the default backend and
// (ctest's *_on_openblas entries) on OpenBLAS.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_keymajor.hpp"
#include "kernels/cpu_peak.hpp"
#include "kernels/cpu_small_gemm.hpp"
#include "random.hpp"

namespace ringattn::kernels {
namespace {

std::vector<SmallGemmBackend> backends() {
  std::vector<SmallGemmBackend> v{SmallGemmBackend::openblas};
  for (SmallGemmBackend b : {SmallGemmBackend::libxsmm, SmallGemmBackend::avx2}) {
    if (small_gemm_backend_available(b))
      v.push_back(b);
    else
      std::printf("NOT TESTED HERE: the %s tile products (not in this build or CPU)\n",
                  to_string(b));
  }
  return v;
}

struct BackendGuard {
  SmallGemmBackend saved = small_gemm_backend();
  ~BackendGuard() { set_small_gemm_backend(saved); }
};

struct IsaGuard {
  CpuIsa saved = cpu_isa();
  ~IsaGuard() { set_cpu_isa(saved); }
};

// Every vector variant this CPU executes; the ones it cannot are named on stdout.
std::vector<CpuIsa> runnable_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_can_run(isa))
      v.push_back(isa);
    else
      std::printf("NOT TESTED HERE: the %s kernels (this CPU cannot execute them)\n",
                  to_string(isa));
  }
  return v;
}

TEST(SmallGemm, EveryBackendMatchesAFloat64ProductOnTileShapes) {
  BackendGuard guard;
  struct Shape {
    int m, n, k;
  };
  // The kernels' shapes (query tile padded to 16, key tiles, head dims) and odd edges.
  const Shape shapes[] = {{128, 256, 64}, {128, 64, 256}, {64, 128, 128}, {16, 7, 40},
                          {48, 100, 13},  {40, 256, 72},  {45, 11, 9},    {1, 1, 1}};
  for (SmallGemmBackend b : backends()) {
    set_small_gemm_backend(b);
    for (const Shape& s : shapes)
      for (bool trans_b : {false, true})
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(std::string(to_string(b)) + " m=" + std::to_string(s.m) +
                       " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                       (trans_b ? " trans_b" : "") + " beta=" + std::to_string(beta));
          // Leading dimensions larger than the matrices, as the kernels' strided views are.
          const int lda = s.m + 3, ldb = (trans_b ? s.n : s.k) + 5, ldc = s.m + 1;
          const auto a = testing::random_normal(static_cast<std::size_t>(lda * s.k), 1);
          const auto bm =
              testing::random_normal(static_cast<std::size_t>(ldb * (trans_b ? s.k : s.n)), 2);
          auto c = testing::random_normal(static_cast<std::size_t>(ldc * s.n), 3);
          std::vector<double> want(c.size());
          for (int j = 0; j < s.n; ++j)
            for (int i = 0; i < s.m; ++i) {
              double acc = beta * c[static_cast<std::size_t>(j * ldc + i)];
              for (int x = 0; x < s.k; ++x) {
                const float bv = trans_b ? bm[static_cast<std::size_t>(x * ldb + j)]
                                         : bm[static_cast<std::size_t>(j * ldb + x)];
                acc += static_cast<double>(a[static_cast<std::size_t>(x * lda + i)]) * bv;
              }
              want[static_cast<std::size_t>(j * ldc + i)] = acc;
            }
          const std::vector<float> before = c;
          small_gemm(trans_b, s.m, s.n, s.k, a.data(), lda, bm.data(), ldb, beta, c.data(), ldc);
          for (int j = 0; j < s.n; ++j)
            for (int i = 0; i < ldc; ++i) {
              const auto x = static_cast<std::size_t>(j * ldc + i);
              if (i >= s.m) {  // padding between columns is never written
                ASSERT_EQ(c[x], before[x]);
                continue;
              }
              ASSERT_NEAR(c[x], want[x], 1e-5 * (1.0 + std::abs(want[x])) * std::sqrt(s.k));
            }
        }
  }
}

TEST(SmallGemm, UnknownBackendInTheEnvironmentIsNamed) {
  const SmallGemmBackend b = small_gemm_backend();
  EXPECT_NE(small_gemm_summary().find(b == SmallGemmBackend::libxsmm ? "libxsmm"
                                      : b == SmallGemmBackend::avx2  ? "AVX2"
                                                                     : "OpenBLAS"),
            std::string::npos);
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// Scores with the cases the kernels produce: masked keys (-inf), a query with nothing
// visible, large and tiny values.
std::vector<float> scores(int64_t ld, int64_t bk, uint64_t seed) {
  auto s = testing::random_normal(static_cast<std::size_t>(ld * bk), seed, 4.0f);
  for (int64_t j = 0; j < bk; ++j) {
    s[static_cast<std::size_t>(j * ld + 3)] = -kInf;                  // query 3 sees nothing
    if (j % 3 == 0) s[static_cast<std::size_t>(j * ld + 5)] = -kInf;  // query 5 sees some
    s[static_cast<std::size_t>(j * ld + 7)] = j == 1 ? 80.0f : -90.0f;
  }
  return s;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i]) || a[i] == 0.0f || b[i] == 0.0f) {
      ASSERT_EQ(a[i], b[i]) << what << " at " << i;  // exact zeros and infinities agree
      continue;
    }
    ASSERT_NEAR(a[i], b[i], 4e-7f * std::abs(b[i]) + 1e-30f) << what << " at " << i;
  }
}

TEST(KeyMajor, TransposeGivesTheGenericBitsForEveryEdge) {
  IsaGuard guard;
  for (CpuIsa isa : runnable_isas()) {
    SCOPED_TRACE(to_string(isa));
    set_cpu_isa(isa);
    for (int64_t rows : {1, 15, 16, 17, 128})
      for (int64_t cols : {1, 8, 16, 40, 64, 100}) {
        const int64_t ld = (rows + 15) / 16 * 16 + (rows == 17 ? 16 : 0), stride = cols + 9;
        const auto src = testing::random_normal(static_cast<std::size_t>(rows * stride), 5);
        std::vector<float> a(static_cast<std::size_t>(cols * ld), 7.0f), b = a;
        km::transpose_rows(src.data(), stride, rows, cols, 0.125f, a.data(), ld);
        km::generic::transpose_rows(src.data(), stride, rows, cols, 0.125f, b.data(), ld);
        ASSERT_EQ(a, b) << rows << "x" << cols;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(b[static_cast<std::size_t>(c * ld + i)],
                      0.125f * src[static_cast<std::size_t>(i * stride + c)]);
      }
  }
}

TEST(KeyMajor, SoftmaxStepsAgreeWithTheirPortableForms) {
  IsaGuard guard;
  for (CpuIsa isa : runnable_isas()) {
    SCOPED_TRACE(std::string(to_string(isa)) + " against portable");
    set_cpu_isa(isa);
    const int64_t ld = 32, d = 24;
    for (int64_t bk : {1, 2, 7, 64}) {
      // Online softmax: two steps, the second raising some maxima.
      auto s1 = scores(ld, bk, 11), s2 = scores(ld, bk, 12);
      std::vector<float> m(ld, -kInf), l(ld, 0.0f);
      auto acc = testing::random_normal(static_cast<std::size_t>(ld * d), 13);
      auto s1b = s1, s2b = s2, mb = m, lb = l, accb = acc;
      km::online_softmax(s1.data(), ld, ld, bk, m.data(), l.data(), acc.data(), ld, d);
      km::online_softmax(s2.data(), ld, ld, bk, m.data(), l.data(), acc.data(), ld, d);
      km::generic::online_softmax(s1b.data(), ld, ld, bk, mb.data(), lb.data(), accb.data(), ld, d);
      km::generic::online_softmax(s2b.data(), ld, ld, bk, mb.data(), lb.data(), accb.data(), ld, d);
      expect_close(s1, s1b, "p1");
      expect_close(s2, s2b, "p2");
      expect_close(m, mb, "m");
      expect_close(l, lb, "l");
      expect_close(acc, accb, "acc");
      EXPECT_EQ(m[3], -kInf);  // nothing visible: max -inf, sum 0, probabilities exactly 0
      EXPECT_EQ(l[3], 0.0f);
      for (int64_t j = 0; j < bk; ++j) EXPECT_EQ(s2[static_cast<std::size_t>(j * ld + 3)], 0.0f);

      // Probabilities from an lse, with an empty row, then dS.
      auto p = scores(ld, bk, 14), pb = p;
      auto lse = testing::random_normal(static_cast<std::size_t>(ld), 15, 2.0f);
      lse[4] = -kInf;
      km::probabilities(p.data(), ld, ld, bk, lse.data());
      km::generic::probabilities(pb.data(), ld, ld, bk, lse.data());
      expect_close(p, pb, "P");
      for (int64_t j = 0; j < bk; ++j) EXPECT_EQ(p[static_cast<std::size_t>(j * ld + 4)], 0.0f);
      auto dp = testing::random_normal(static_cast<std::size_t>(ld * bk), 16), dpb = dp;
      const auto dd = testing::random_normal(static_cast<std::size_t>(ld), 17);
      km::scores_gradient(dp.data(), p.data(), ld, ld, bk, dd.data(), 0.3f);
      km::generic::scores_gradient(dpb.data(), p.data(), ld, ld, bk, dd.data(), 0.3f);
      expect_close(dp, dpb, "dS");
    }
  }
}

// Tasks whose reach cuts tiles in every way: causal with offsets, windows on either side.
std::vector<std::pair<SubseqTask, bool>> reach_cases() {
  std::vector<std::pair<SubseqTask, bool>> cases;
  for (int64_t offset : {0, -37, 50})
    for (int64_t left : {kNoWindow, int64_t{0}, int64_t{23}, int64_t{200}})
      for (int64_t right : {kNoWindow, int64_t{0}, int64_t{9}})
        for (bool causal : {false, true}) {
          SubseqTask t;
          t.n_q = 300;
          t.n_k = 290;
          t.causal_offset = offset;
          t.window_left = left;
          t.window_right = right;
          cases.emplace_back(t, causal);
        }
  return cases;
}

TEST(KeyMajor, PartsCoverEveryVisiblePairExactlyOnce) {
  for (const auto& [t, causal] : reach_cases())
    for (const auto& [q_tile, k_tile] : {std::pair<int64_t, int64_t>{256, 128}, {64, 96}, {48, 16}})
      for (int64_t i0 = 0; i0 < t.n_q; i0 += q_tile)
        for (int64_t j0 = 0; j0 < t.n_k; j0 += k_tile) {
          const int64_t bq = std::min(q_tile, t.n_q - i0), bk = std::min(k_tile, t.n_k - j0);
          const int64_t ld = (q_tile + 15) / 16 * 16;
          std::vector<int> covered(static_cast<std::size_t>(ld * bk), 0);
          km::for_each_part(t, causal, i0, bq, ld, j0, bk, [&](const km::TilePart& b) {
            ASSERT_EQ(b.r0 % 16, 0);
            ASSERT_EQ(b.c0 % 16, 0);
            ASSERT_TRUE(b.c1 % 16 == 0 || b.c1 == bk);
            ASSERT_TRUE(b.r0 < b.r1 && b.r1 <= ld && b.c0 < b.c1 && b.c1 <= bk);
            for (int64_t i = b.r0; i < b.r1; ++i)
              for (int64_t j = b.c0; j < b.c1; ++j) ++covered[static_cast<std::size_t>(j * ld + i)];
          });
          for (int64_t i = 0; i < ld; ++i)
            for (int64_t j = 0; j < bk; ++j) {
              const int n = covered[static_cast<std::size_t>(j * ld + i)];
              ASSERT_LE(n, 1) << "pair computed twice";
              if (i < bq && !outside_reach(t, causal, i0 + i, j0 + j)) {
                ASSERT_EQ(n, 1) << "visible pair (" << i0 + i << ", " << j0 + j << ") skipped";
              }
            }
        }
}

TEST(KeyMajor, PartsOfTheCausalDiagonalSkipWhatIsHidden) {
  SubseqTask t;
  t.n_q = t.n_k = 1024;
  int64_t computed = 0;
  for (int64_t j0 : {256, 384})  // the two key tiles the query tile at 256 crosses
    km::for_each_part(t, true, 256, 256, 256, j0, 128,
                      [&](const km::TilePart& b) { computed += (b.r1 - b.r0) * (b.c1 - b.c0); });
  EXPECT_EQ(computed, 40960);  // of 65 536 in the two tiles; 32 896 are visible
}

TEST(KeyMajor, MaskHidesExactlyThePairsOutsideReach) {
  for (const auto& [t, causal] : reach_cases())
    for (int64_t i0 : {0, 40, 176})
      for (int64_t j0 : {0, 32, 160}) {
        const int64_t bq = 64, ld = 80, bk = std::min<int64_t>(100, t.n_k - j0);
        std::vector<float> s(static_cast<std::size_t>(ld * bk), 1.0f);
        km::mask_outside_reach(s.data(), ld, t, causal, i0, bq, j0, bk);
        for (int64_t i = 0; i < ld; ++i)
          for (int64_t j = 0; j < bk; ++j) {
            const float x = s[static_cast<std::size_t>(j * ld + i)];
            const bool hidden = i < bq && outside_reach(t, causal, i0 + i, j0 + j);
            ASSERT_EQ(x, hidden ? -kInf : 1.0f) << "query " << i0 + i << " key " << j0 + j;
          }
      }
}

// The benchmarks' ceiling: measured at each vector variant the CPU executes, 0 (not a
// made-up figure) for the portable one. Its value is a benchmark figure, not judged here.
TEST(CpuPeak, MeasuresExactlyWhereTheVariantHasFmaVectors) {
  IsaGuard guard;
  for (CpuIsa isa : runnable_isas()) {
    set_cpu_isa(isa);
    const std::string name = fma_peak_isa();
    const double rate = fma_peak_gflops(1);
    if (isa == CpuIsa::portable) {
      EXPECT_EQ(name, "none");
      EXPECT_EQ(rate, 0.0);
    } else {
      EXPECT_EQ(name, isa == CpuIsa::avx512 ? "AVX-512" : "AVX2+FMA");
      EXPECT_GT(rate, 0.0) << name;
    }
  }
}

}  // namespace
}  // namespace ringattn::kernels

// ringattn's AVX2 tile product (see cpu_gemm_avx2.hpp): register blocks of 16 rows (two ymm)
// by 6 columns, twelve accumulators, each k step two loads of A, six broadcasts of B and
// twelve FMAs, so the two FMA ports, not the loads, set the pace. Columns in blocks of 6
// outermost: a block's 6 columns of B (k floats each) stay in L1 while A's rows stream past.
#include "kernels/cpu_gemm_avx2.hpp"

#include <cstdint>

#include "ringattn/errors.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RINGATTN_GEMM_AVX2 1
#include <immintrin.h>
#endif

namespace ringattn::kernels {

#if defined(RINGATTN_GEMM_AVX2)

namespace {

#define GEMM_AVX2 __attribute__((target("avx2,fma")))

// Rows [0, 8·V) of a block (V = 1 or 2 vectors), NB columns; `tail` (when set) masks the
// last vector's lanes, for the rows past a multiple of 8.
template <int V, int NB>
[[gnu::always_inline]] GEMM_AVX2 inline void block(int k, const float* a, int lda, const float* b,
                                                   int ldb, bool beta, float* c, int ldc,
                                                   const __m256i* tail) {
  __m256 acc[NB][V];
  for (int j = 0; j < NB; ++j)
    for (int v = 0; v < V; ++v) {
      const float* cp = c + j * ldc + 8 * v;
      acc[j][v] = !beta                  ? _mm256_setzero_ps()
                  : (tail && v == V - 1) ? _mm256_maskload_ps(cp, *tail)
                                         : _mm256_loadu_ps(cp);
    }
  for (int kk = 0; kk < k; ++kk) {
    __m256 av[V];
    for (int v = 0; v < V; ++v) {
      const float* ap = a + kk * lda + 8 * v;
      av[v] = (tail && v == V - 1) ? _mm256_maskload_ps(ap, *tail) : _mm256_loadu_ps(ap);
    }
#pragma GCC unroll 6
    for (int j = 0; j < NB; ++j) {
      const __m256 bj = _mm256_broadcast_ss(b + kk + j * ldb);
      for (int v = 0; v < V; ++v) acc[j][v] = _mm256_fmadd_ps(av[v], bj, acc[j][v]);
    }
  }
  for (int j = 0; j < NB; ++j)
    for (int v = 0; v < V; ++v) {
      float* cp = c + j * ldc + 8 * v;
      if (tail && v == V - 1)
        _mm256_maskstore_ps(cp, *tail, acc[j][v]);
      else
        _mm256_storeu_ps(cp, acc[j][v]);
    }
}

// One panel of NB columns, every row.
template <int NB>
GEMM_AVX2 void panel(int m, int k, const float* a, int lda, const float* b, int ldb, bool beta,
                     float* c, int ldc) {
  int i = 0;
  for (; i + 16 <= m; i += 16) block<2, NB>(k, a + i, lda, b, ldb, beta, c + i, ldc, nullptr);
  if (i + 8 <= m) {
    block<1, NB>(k, a + i, lda, b, ldb, beta, c + i, ldc, nullptr);
    i += 8;
  }
  if (i < m) {
    alignas(32) int32_t lanes[8];
    for (int x = 0; x < 8; ++x) lanes[x] = x < m - i ? -1 : 0;
    const __m256i tail = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    block<1, NB>(k, a + i, lda, b, ldb, beta, c + i, ldc, &tail);
  }
}

}  // namespace

bool gemm_avx2_built() { return true; }

GEMM_AVX2 void gemm_avx2(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                         float beta, float* c, int ldc) {
  const bool accumulate = beta != 0.0f;
  int j = 0;
  for (; j + 6 <= n; j += 6) panel<6>(m, k, a, lda, b + j * ldb, ldb, accumulate, c + j * ldc, ldc);
  const float* bj = b + j * ldb;
  float* cj = c + j * ldc;
  switch (n - j) {
    case 5:
      panel<5>(m, k, a, lda, bj, ldb, accumulate, cj, ldc);
      break;
    case 4:
      panel<4>(m, k, a, lda, bj, ldb, accumulate, cj, ldc);
      break;
    case 3:
      panel<3>(m, k, a, lda, bj, ldb, accumulate, cj, ldc);
      break;
    case 2:
      panel<2>(m, k, a, lda, bj, ldb, accumulate, cj, ldc);
      break;
    case 1:
      panel<1>(m, k, a, lda, bj, ldb, accumulate, cj, ldc);
      break;
    default:
      break;
  }
}

#undef GEMM_AVX2

#else

bool gemm_avx2_built() { return false; }

void gemm_avx2(int, int, int, const float*, int, const float*, int, float, float*, int) {
  throw RuntimeFailure("gemm_avx2 called in a build without it (not x86-64)");
}

#endif

}  // namespace ringattn::kernels

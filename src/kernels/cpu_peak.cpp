// The FMA ceiling (see cpu_peak.hpp).
#include "kernels/cpu_peak.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

namespace ringattn::kernels {

namespace {

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline float lane0(Vec a) { return _mm512_cvtss_f32(a); }
#elif defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline float lane0(Vec a) { return _mm256_cvtss_f32(a); }
#endif

#if defined(__AVX512F__) || defined(__FMA__)
// Twelve independent chains: at least FMA latency (4-5 cycles) times FMA ports (2) on
// current x86 cores, so the ports, not the chains, are the limit.
constexpr int kChains = 12;
constexpr long kIters = 10'000'000;

// One thread's chains; the result only keeps the work from being optimised away.
float run_chains() {
  Vec acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = splat(1.0f + 1e-3f * static_cast<float>(c));
  const Vec x = splat(0.9999999f), y = splat(1e-7f);
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], x, y);
  }
  Vec total = acc[0];
  for (int c = 1; c < kChains; ++c) total = fma(acc[c], splat(1.0f), total);
  return lane0(total);
}
#endif

}  // namespace

double fma_peak_gflops(int threads) {
#if defined(__AVX512F__) || defined(__FMA__)
  threads = std::max(threads, 1);
  std::array<double, 3> ms{};
  float sink = 0.0f;
  for (int rep = -1; rep < static_cast<int>(ms.size()); ++rep) {  // rep -1: warm-up
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += run_chains();
    const std::chrono::duration<double, std::milli> t = std::chrono::steady_clock::now() - t0;
    if (rep >= 0) ms[static_cast<std::size_t>(rep)] = t.count();
  }
  std::sort(ms.begin(), ms.end());
  if (sink == 0.0f) return 0.0;  // never: the chains stay near 1
  return 2.0 * kLanes * kChains * static_cast<double>(kIters) * threads / (ms[1] * 1e6);
#else
  (void)threads;
  return 0.0;
#endif
}

const char* fma_peak_isa() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__FMA__)
  return "AVX2+FMA";
#else
  return "none";
#endif
}

}  // namespace ringattn::kernels

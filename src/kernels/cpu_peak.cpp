// The FMA ceiling (see cpu_peak.hpp).
#include "kernels/cpu_peak.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "kernels/cpu_isa.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RINGATTN_PEAK_X86 1
#include <immintrin.h>
#endif

namespace ringattn::kernels {

namespace {

#if defined(RINGATTN_PEAK_X86)
// Twelve independent chains: at least FMA latency (4-5 cycles) times FMA ports (2) on
// current x86 cores, so the ports, not the chains, are the limit.
constexpr int kChains = 12;
constexpr long kIters = 10'000'000;

// One thread's chains at one vector width (the variants' own targets, as the kernels'
// softmax steps are compiled); the result only keeps the work from being optimised away.
#define RINGATTN_CHAINS(name, isa, Vec, fma, splat, lane0)                                   \
  __attribute__((target(isa))) float name() {                                                \
    Vec acc[kChains];                                                                        \
    for (int c = 0; c < kChains; ++c) acc[c] = splat(1.0f + 1e-3f * static_cast<float>(c));  \
    const Vec x = splat(0.9999999f), y = splat(1e-7f);                                       \
    for (long it = 0; it < kIters; ++it) {                                                   \
      _Pragma("GCC unroll 12") for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], x, y); \
    }                                                                                        \
    Vec total = acc[0];                                                                      \
    for (int c = 1; c < kChains; ++c) total = fma(acc[c], splat(1.0f), total);               \
    return lane0(total);                                                                     \
  }
RINGATTN_CHAINS(chains_avx512, "avx512f,fma", __m512, _mm512_fmadd_ps, _mm512_set1_ps,
                _mm512_cvtss_f32)
RINGATTN_CHAINS(chains_avx2, "avx2,fma", __m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_cvtss_f32)
#undef RINGATTN_CHAINS
#endif

}  // namespace

double fma_peak_gflops(int threads) {
#if defined(RINGATTN_PEAK_X86)
  const CpuIsa isa = cpu_isa();
  if (isa == CpuIsa::portable) return 0.0;
  const int lanes = isa == CpuIsa::avx512 ? 16 : 8;
  threads = std::max(threads, 1);
  std::array<double, 3> ms{};
  float sink = 0.0f;
  for (int rep = -1; rep < static_cast<int>(ms.size()); ++rep) {  // rep -1: warm-up
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += isa == CpuIsa::avx512 ? chains_avx512() : chains_avx2();
    const std::chrono::duration<double, std::milli> t = std::chrono::steady_clock::now() - t0;
    if (rep >= 0) ms[static_cast<std::size_t>(rep)] = t.count();
  }
  std::sort(ms.begin(), ms.end());
  if (sink == 0.0f) return 0.0;  // never: the chains stay near 1
  return 2.0 * lanes * kChains * static_cast<double>(kIters) * threads / (ms[1] * 1e6);
#else
  (void)threads;
  return 0.0;
#endif
}

const char* fma_peak_isa() {
#if defined(RINGATTN_PEAK_X86)
  switch (cpu_isa()) {
    case CpuIsa::avx512:
      return "AVX-512";
    case CpuIsa::avx2:
      return "AVX2+FMA";
    case CpuIsa::portable:
      break;
  }
#endif
  return "none";
}

}  // namespace ringattn::kernels

// The tile products (see cpu_small_gemm.hpp): libxsmm's generated kernels, ringattn's AVX2
// kernel, or OpenBLAS.
#include "kernels/cpu_small_gemm.hpp"

#include <atomic>
#include <string_view>
#include <vector>

#include "core/environment.hpp"
#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_gemm_avx2.hpp"
#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_keymajor.hpp"
#include "ringattn/errors.hpp"

#if defined(RINGATTN_HAVE_LIBXSMM)
#include <libxsmm.h>
#endif

namespace ringattn::kernels {

namespace {

// The default: libxsmm when built in; else ringattn's AVX2 kernel where the CPU runs AVX2
// (and the variant is not forced to portable); else OpenBLAS.
SmallGemmBackend default_backend() {
  if (small_gemm_libxsmm_built()) return SmallGemmBackend::libxsmm;
  if (gemm_avx2_built() && cpu_can_run(CpuIsa::avx2) && cpu_isa() != CpuIsa::portable)
    return SmallGemmBackend::avx2;
  return SmallGemmBackend::openblas;
}

void check_available(SmallGemmBackend b) {
  if (b == SmallGemmBackend::libxsmm && !small_gemm_libxsmm_built())
    throw InputError("RINGATTN_SMALL_GEMM",
                     "'libxsmm' asked for, but this build has no libxsmm (install "
                     "libxsmm-dev and rebuild, or unset it)");
  if (b == SmallGemmBackend::avx2 && !(gemm_avx2_built() && cpu_can_run(CpuIsa::avx2)))
    throw InputError("RINGATTN_SMALL_GEMM",
                     "'avx2' asked for, but this CPU or build cannot run the AVX2 kernel");
}

SmallGemmBackend backend_from_environment() {
  const char* env = environment_value(Env::small_gemm);
  if (!env || !*env) return default_backend();
  const std::string_view v(env);
  for (SmallGemmBackend b :
       {SmallGemmBackend::openblas, SmallGemmBackend::libxsmm, SmallGemmBackend::avx2})
    if (v == to_string(b)) {
      check_available(b);
      return b;
    }
  throw InputError("RINGATTN_SMALL_GEMM",
                   "'" + std::string(v) + "' is not a backend; use libxsmm, avx2 or openblas");
}

// A forced AVX2 variant (RINGATTN_CPU_KERNELS=avx2, cpu_isa.hpp) makes libxsmm generate
// its Haswell kernels too, unless LIBXSMM_TARGET names a target; otherwise libxsmm picks from
// CPUID, as the variant did.
void settle_libxsmm_target() {
#if defined(RINGATTN_HAVE_LIBXSMM)
  const char* given = environment_value(Env::libxsmm_target);
  if ((!given || !*given) && cpu_isa_forced() && cpu_isa() == CpuIsa::avx2) {
    libxsmm_init();  // which detects the CPU's target: set ours after it
    libxsmm_set_target_arch("hsw");
  }
#endif
}

#if defined(RINGATTN_HAVE_LIBXSMM)
// libxsmm 1.17's AVX2 kernels read a transposed B more slowly than a plain one (its AVX-512
// kernels do not; docs/PERFORMANCE.md), so on AVX2 targets the product transposes B first,
// which costs k·n copies against m·n·k multiply-adds (m >= 64 here).
bool libxsmm_transposes_b_slowly() {
  const int arch = libxsmm_get_target_archid();
  return arch >= LIBXSMM_X86_AVX2 && arch < LIBXSMM_X86_AVX512;
}
#endif

std::atomic<int>& backend_slot() {
  static std::atomic<int> slot{[] {
    const SmallGemmBackend b = backend_from_environment();
    if (b == SmallGemmBackend::libxsmm) settle_libxsmm_target();
    return static_cast<int>(b);
  }()};
  return slot;
}

// Bᵀ for a B stored n×k (leading dimension ldb): k×n column-major in this thread's scratch,
// its leading dimension (k rounded up to 16) in `ldt`. Valid until the thread's next call.
const float* transposed_b(const float* b, int ldb, int k, int n, int& ldt) {
  thread_local std::vector<float> bt;
  ldt = (k + 15) / 16 * 16;
  bt.resize(static_cast<std::size_t>(ldt) * static_cast<std::size_t>(n));
  km::transpose_rows(b, ldb, k, n, 1.0f, bt.data(), ldt);
  return bt.data();
}

// C = A·op(B) + beta·C column-major, as OpenBLAS's row-major sgemm: the row-major view of a
// column-major C is Cᵀ = op(B)ᵀ·Aᵀ, with Aᵀ (k×m) and B (k×n, or n×k) read in place.
void openblas_gemm(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b,
                   int ldb, float beta, float* c, int ldc) {
  sgemm(trans_b ? CblasTrans : CblasNoTrans, CblasNoTrans, n, m, k, 1.0f, b, ldb, a, lda, beta, c,
        ldc);
}

}  // namespace

bool small_gemm_libxsmm_built() {
#if defined(RINGATTN_HAVE_LIBXSMM)
  return true;
#else
  return false;
#endif
}

SmallGemmBackend small_gemm_backend() {
  return static_cast<SmallGemmBackend>(backend_slot().load(std::memory_order_relaxed));
}

void set_small_gemm_backend(SmallGemmBackend b) {
  check_available(b);
  backend_slot().store(static_cast<int>(b), std::memory_order_relaxed);
}

bool small_gemm_backend_available(SmallGemmBackend b) {
  switch (b) {
    case SmallGemmBackend::libxsmm:
      return small_gemm_libxsmm_built();
    case SmallGemmBackend::avx2:
      return gemm_avx2_built() && cpu_can_run(CpuIsa::avx2);
    case SmallGemmBackend::openblas:
      break;
  }
  return true;
}

const char* to_string(SmallGemmBackend b) {
  switch (b) {
    case SmallGemmBackend::libxsmm:
      return "libxsmm";
    case SmallGemmBackend::avx2:
      return "avx2";
    case SmallGemmBackend::openblas:
      break;
  }
  return "openblas";
}

std::string small_gemm_summary() {
  if (small_gemm_backend() == SmallGemmBackend::avx2)
    return "ringattn's AVX2 kernel (16x6 register blocks)";
#if defined(RINGATTN_HAVE_LIBXSMM)
  if (small_gemm_backend() == SmallGemmBackend::libxsmm) {
    libxsmm_init();
    return "libxsmm " + std::to_string(LIBXSMM_VERSION_MAJOR) + "." +
           std::to_string(LIBXSMM_VERSION_MINOR) + " (kernels generated for '" +
           libxsmm_get_target_arch() + "'; OpenBLAS for shapes it declines)";
  }
  return "OpenBLAS sgemm (RINGATTN_SMALL_GEMM=openblas)";
#else
  return "OpenBLAS sgemm (built without libxsmm)";
#endif
}

void small_gemm(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                float beta, float* c, int ldc) {
  if (small_gemm_backend() == SmallGemmBackend::avx2) {
    if (trans_b) {
      int ldt = 0;
      const float* bt = transposed_b(b, ldb, k, n, ldt);
      gemm_avx2(m, n, k, a, lda, bt, ldt, beta, c, ldc);
    } else {
      gemm_avx2(m, n, k, a, lda, b, ldb, beta, c, ldc);
    }
    return;
  }
#if defined(RINGATTN_HAVE_LIBXSMM)
  if (small_gemm_backend() == SmallGemmBackend::libxsmm) {
    // The registry lookup costs ~100 ns against a tile product of ~10^5 cycles; a shape
    // libxsmm declines (none of ours so far) goes to OpenBLAS.
    const float one = 1.0f;
    const int flags = trans_b ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
    const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;  // the kernel takes (a, b, c) only
    const libxsmm_blasint lm = m, ln = n, lk = k, la = lda, lb = ldb, lc = ldc;
    if (trans_b && libxsmm_transposes_b_slowly()) {
      // Bᵀ first, then the kernel without the flag: the same sums, in the same order.
      int ldt = 0;
      const float* bt = transposed_b(b, ldb, k, n, ldt);
      const libxsmm_blasint lt = ldt;
      const int plain = LIBXSMM_GEMM_FLAG_NONE;
      if (const libxsmm_smmfunction fn =
              libxsmm_smmdispatch(lm, ln, lk, &la, &lt, &lc, &one, &beta, &plain, &prefetch)) {
        fn(a, bt, c);
        return;
      }
    }
    const libxsmm_smmfunction fn =
        libxsmm_smmdispatch(lm, ln, lk, &la, &lb, &lc, &one, &beta, &flags, &prefetch);
    if (fn) {
      fn(a, b, c);
      return;
    }
  }
#endif
  openblas_gemm(trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ringattn::kernels

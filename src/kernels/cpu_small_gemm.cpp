// The tile products (see cpu_small_gemm.hpp): libxsmm's generated kernels, or OpenBLAS.
#include "kernels/cpu_small_gemm.hpp"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "kernels/cpu_blas.hpp"
#include "ringattn/errors.hpp"

#if defined(RINGATTN_HAVE_LIBXSMM)
#include <libxsmm.h>
#endif

namespace ringattn::kernels {

namespace {

SmallGemmBackend backend_from_environment() {
  const char* env = std::getenv("RINGATTN_SMALL_GEMM");
  if (!env || !*env) return small_gemm_libxsmm_built() ? SmallGemmBackend::libxsmm
                                                       : SmallGemmBackend::openblas;
  const std::string_view v(env);
  if (v == "openblas") return SmallGemmBackend::openblas;
  if (v == "libxsmm") {
    if (!small_gemm_libxsmm_built())
      throw InputError("RINGATTN_SMALL_GEMM",
                       "'libxsmm' asked for, but this build has no libxsmm (install "
                       "libxsmm-dev and rebuild, or unset it)");
    return SmallGemmBackend::libxsmm;
  }
  throw InputError("RINGATTN_SMALL_GEMM",
                   "'" + std::string(v) + "' is not a backend; use libxsmm or openblas");
}

std::atomic<int>& backend_slot() {
  static std::atomic<int> slot{static_cast<int>(backend_from_environment())};
  return slot;
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
  if (b == SmallGemmBackend::libxsmm && !small_gemm_libxsmm_built())
    throw InputError("RINGATTN_SMALL_GEMM", "this build has no libxsmm");
  backend_slot().store(static_cast<int>(b), std::memory_order_relaxed);
}

std::string small_gemm_summary() {
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
#if defined(RINGATTN_HAVE_LIBXSMM)
  if (small_gemm_backend() == SmallGemmBackend::libxsmm) {
    // The registry lookup costs ~100 ns against a tile product of ~10^5 cycles; a shape
    // libxsmm declines (none of ours so far) goes to OpenBLAS.
    const float one = 1.0f;
    const int flags = trans_b ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
    const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;  // the kernel takes (a, b, c) only
    const libxsmm_blasint lm = m, ln = n, lk = k, la = lda, lb = ldb, lc = ldc;
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

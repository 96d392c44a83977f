// The tile products of the CPU attention kernels: many small GEMMs (a 128-query tile against
// a 256-key tile at head dim 64, and the like), one per call on the calling thread. OpenBLAS
// packs both operands on every call and reaches ~40 % of its large-GEMM rate on them;
// libxsmm (Debian's libxsmm-dev) generates a register-blocked kernel per shape at run time
// and runs them from the operands in place, at or above the large-GEMM rate. So the kernels
// call through here: libxsmm where it was built in and can make a kernel for the shape;
// without libxsmm, ringattn's own AVX2 kernel where the CPU runs AVX2 (cpu_gemm_avx2.hpp);
// OpenBLAS's sgemm otherwise (same contract, any shape). The choice is made once per process
// from RINGATTN_SMALL_GEMM (libxsmm | avx2 | openblas; default as said) and can be set by
// tests.
//
// Column-major, as libxsmm computes: C (m×n) = A (m×k) · op(B) + beta · C, where op(B) is B
// (k×n, leading dimension ldb) or, with trans_b, Bᵀ for B stored n×k. alpha is always 1 and
// beta is 0 or 1 (libxsmm's generated kernels take no other values); the kernels fold their
// scale factors into operands they prepare anyway. A row-major matrix is the column-major
// transpose of itself, which is how the kernels read Q, K, V (token-major rows) in place.
#pragma once

#include <string>

namespace ringattn::kernels {

enum class SmallGemmBackend { libxsmm, openblas, avx2 };

// "libxsmm", "openblas" or "avx2" (RINGATTN_SMALL_GEMM's values).
const char* to_string(SmallGemmBackend b);

// Whether this build and CPU can run the backend.
bool small_gemm_backend_available(SmallGemmBackend b);

// Whether libxsmm was built in (RINGATTN_HAVE_LIBXSMM).
bool small_gemm_libxsmm_built();

// The backend in use: RINGATTN_SMALL_GEMM if set (libxsmm, avx2 or openblas; InputError
// naming it when it is none of them, or names one this build or CPU cannot run), else
// libxsmm when built in, else the AVX2 kernel where the CPU runs AVX2 (and the variant,
// cpu_isa.hpp, is not forced to portable), else OpenBLAS.
SmallGemmBackend small_gemm_backend();
// For tests and benchmarks comparing the two; not thread-safe against running kernels.
void set_small_gemm_backend(SmallGemmBackend b);

// What the tile products run on, for reports: "libxsmm 1.17 (JIT for avx512 'cpx')" or
// "OpenBLAS sgemm (...why)".
std::string small_gemm_summary();

void small_gemm(bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                float beta, float* c, int ldc);

}  // namespace ringattn::kernels

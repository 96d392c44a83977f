// The BLAS under the CPU kernels: which OpenBLAS is loaded, with which CPU kernels, and how
// its calls are threaded. Every sgemm the kernels make runs inside their own OpenMP regions,
// one call per thread on a small tile, so each call must stay on its calling thread; and
// its speed must not depend on what else is installed. Left to the loader it would: Debian's
// alternatives hand out the pthreads build whenever libopenblas0-pthread is also installed
// (a second thread pool inside ours), and OpenBLAS 0.3.21 falls back to its SSE3 "Prescott"
// kernels on CPUs newer than it knows (both several times slower; docs/PERFORMANCE.md). So
// OpenBLAS is opened here, not by the loader: the OpenMP build by its own path, after
// choosing its kernels from the CPU's features.
#pragma once

#include <cblas.h>

#include <string>

#include "ringattn/stats.hpp"

namespace ringattn::kernels {

// BlasInfo: ringattn/stats.hpp (it reaches callers through EngineStats).
using ringattn::BlasInfo;

// Opens OpenBLAS on first use (thread-safe) and says what it is. Which file: the one named by
// RINGATTN_BLAS_LIBRARY if set, else the OpenMP build found at configure time, else
// libopenblas.so.0 through the loader's search. Its kernels: OPENBLAS_CORETYPE if set, else
// those of the vector variant in use (cpu_isa.hpp; from CPUID or RINGATTN_CPU_KERNELS):
// SkylakeX for AVX-512 (F, CD, BW, DQ, VL), Haswell for AVX2 and FMA, else OpenBLAS's own
// choice. A pthreads build's idle pool threads sleep at once
// (OPENBLAS_THREAD_TIMEOUT=4 unless the user set it): ringattn never gives that pool work.
// What ringattn sets for the open is unset after it. Throws RuntimeFailure naming what it
// tried when none opens.
BlasInfo blas_info();

// C = alpha · op(A) · op(B) + beta · C, row-major, on the calling thread (inside a scope).
void sgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha,
           const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

// Held by every CPU kernel entry around its parallel region: while any scope is open,
// OpenBLAS runs each call on its calling thread. The OpenMP build does that by itself only
// inside an *active* region (omp_in_parallel()); a one-thread region (--threads 1, one
// thread per MPI or virtual rank) is inactive, and there it would start a team of its own.
// A pthreads build always uses its pool. So the first scope sets OpenBLAS to one thread and
// the last one to close restores the caller's setting (scopes on concurrent threads, e.g.
// virtual ranks, share one count); the calling thread's OpenMP thread count is kept. Outside
// an active region the OpenMP build still takes the calling thread's OpenMP thread count
// (and resets its own to it), so sgemm inside a scope also runs with that count at 1 for
// the call (tests/kernels/test_blas_threads.cpp). It also
// settles the tile products' backend (RINGATTN_SMALL_GEMM), so that a bad value is an
// InputError here, before any parallel region.
class BlasSingleThreadScope {
 public:
  BlasSingleThreadScope();
  ~BlasSingleThreadScope();
  BlasSingleThreadScope(const BlasSingleThreadScope&) = delete;
  BlasSingleThreadScope& operator=(const BlasSingleThreadScope&) = delete;
};

}  // namespace ringattn::kernels

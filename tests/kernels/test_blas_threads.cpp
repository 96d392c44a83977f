// Every sgemm the kernels make inside a BlasSingleThreadScope runs on its calling thread,
// also in a one-thread OpenMP region: ringattn with --threads 1 (one thread per MPI or
// virtual rank) runs there, and a call that started a team of its own would put two threads
// on a core that another rank owns. OpenBLAS's OpenMP build decides a call's threads from
// the calling thread's OpenMP thread count outside an active region (and resets its own
// count to it), so openblas_set_num_threads(1) alone did not hold there: before the fix,
// `cpu_bench --sgemm-only --threads 1` read 177-183 GFLOP/s on a core whose FMA peak is 113.
// Observed here without timing, by OpenBLAS's own count after the call (the process's OS
// thread count was no witness: it did not change even while the call took two threads).
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "kernels/cpu_blas.hpp"

namespace ringattn::kernels {
namespace {

TEST(BlasThreads, AnSgemmInAOneThreadRegionStaysOnItsThread) {
  constexpr int n = 512;  // far above OpenBLAS's threshold for threading a call
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  const BlasSingleThreadScope scope;
  const int omp_before = omp_get_max_threads();
#pragma omp parallel num_threads(1)
  sgemm(CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  const BlasInfo info = blas_info();
  EXPECT_EQ(info.threads_per_call, 1) << "after the call: " << info.summary();
  EXPECT_EQ(omp_get_max_threads(), omp_before);  // the caller's OpenMP setting is kept
  EXPECT_EQ(c[0], 0.5f * 0.25f * n);
}

}  // namespace
}  // namespace ringattn::kernels

// Every sgemm the kernels make inside a BlasSingleThreadScope runs on its calling thread,
// also in a one-thread OpenMP region: ringattn with --threads 1 (one thread per MPI or
// virtual rank) runs there, and a call that started a team of its own would put two threads
// on a core that another rank owns. OpenBLAS's OpenMP build decides a call's threads from
// the calling thread's OpenMP thread count outside an active region (and resets its own
// count to it), so openblas_set_num_threads(1) alone does not hold there (a second thread
// shows as a one-thread sgemm faster than the core's FMA peak: docs/PERFORMANCE.md).
// Observed here without timing, by OpenBLAS's own count after the call (the process's OS
// thread count is no witness: it does not change even while the call takes two threads).
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
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

// OpenBLAS's pthreads build starts a pool at load whose idle threads spin for ~0.1 s of CPU
// each before they sleep (by default); ringattn gives that pool no work, so the spinning
// only took the kernels' cores (the SGEMM probe read about half). Observed without timing:
// the CPU time the process uses while its one thread sleeps, right after opening the
// library with a pool of 4. It runs in a fresh process (the death-test machinery re-executes
// this binary), since the process opens OpenBLAS once and other tests open the default.
std::string pthreads_openblas() {
  for (const char* arch : {"x86_64-linux-gnu", "aarch64-linux-gnu"}) {
    const std::string p =
        std::string("/usr/lib/") + arch + "/openblas-pthread/libopenblas.so.0";
    if (std::filesystem::exists(p)) return p;
  }
  return {};
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

[[noreturn]] void open_and_idle(const std::string& lib) {
  setenv("RINGATTN_BLAS_LIBRARY", lib.c_str(), 1);
  setenv("OPENBLAS_NUM_THREADS", "4", 1);
  unsetenv("OPENBLAS_THREAD_TIMEOUT");
  const BlasInfo info = blas_info();
  if (info.threading != "pthreads") {
    std::fprintf(stderr, "opened %s\n", info.summary().c_str());
    std::exit(3);
  }
  const bool env_restored = std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr;
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double used = process_cpu_seconds() - before;
  std::fprintf(stderr, "CPU time while idle for 0.3 s after opening: %.3f s\n", used);
  std::exit(!env_restored ? 4 : used < 0.03 ? 0 : 1);
}

TEST(BlasThreads, ThePthreadsBuildsPoolSleepsWhileRingattnRuns) {
  const std::string lib = pthreads_openblas();
  if (lib.empty())
    GTEST_SKIP() << "the pthreads build of OpenBLAS is not installed here "
                    "(scripts/deps.sh installs libopenblas0-pthread)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(open_and_idle(lib), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ringattn::kernels

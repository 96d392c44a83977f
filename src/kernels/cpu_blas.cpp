// Opening OpenBLAS (see cpu_blas.hpp): the file, its CPU kernels, and the one-thread-per-call
// rule while CPU kernels run. Everything else calls through the table loaded here.
#include "kernels/cpu_blas.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/environment.hpp"
#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_small_gemm.hpp"
#include "ringattn/errors.hpp"

#ifndef RINGATTN_OPENBLAS_FILE
#define RINGATTN_OPENBLAS_FILE "libopenblas.so.0"
#endif

namespace ringattn::kernels {

namespace {

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint,
                         float, const float*, blasint, const float*, blasint, float, float*,
                         blasint);

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  char* (*get_config)() = nullptr;
  char* (*get_corename)() = nullptr;
  int (*get_parallel)() = nullptr;
  int (*get_num_threads)() = nullptr;
  void (*set_num_threads)(int) = nullptr;
  std::string file;
  std::string core_from;
};

// The kernels for the vector variant in use (cpu_isa.hpp: the CPU's feature bits, which any
// CPU newer than the OpenBLAS release still reports, or RINGATTN_CPU_KERNELS), or nullptr to
// leave the choice to OpenBLAS.
const char* core_for_cpu_isa() {
#if defined(__x86_64__)
  switch (cpu_isa()) {
    case CpuIsa::avx512:
      return "SkylakeX";
    case CpuIsa::avx2:
      return "Haswell";
    case CpuIsa::portable:
      break;
  }
#endif
  return nullptr;
}

template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn, const std::string& file) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn)
    throw InputError("RINGATTN_BLAS_LIBRARY",
                     file + " has no " + name + ": ringattn needs OpenBLAS (a libopenblas.so.0)");
}

OpenBlas open_blas() {
  OpenBlas b;
  std::vector<std::string> candidates;
  if (const char* env = environment_value(Env::blas_library); env && *env)
    candidates.emplace_back(env);
  else
    candidates = {RINGATTN_OPENBLAS_FILE, "libopenblas.so.0"};
  // OpenBLAS reads its environment in its constructor, which runs inside dlopen. What
  // ringattn sets there is set for the open only, so that another OpenBLAS the process opens
  // later (numpy's, say) sees the user's own environment.
  std::vector<const char*> set_for_open;
  const auto set_unless_given = [&](Env variable, const char* value) {
    if (const char* given = environment_value(variable); given && *given) return false;
    const char* name = environment_name(variable);
    setenv(name, value, 1);
    set_for_open.push_back(name);
    return true;
  };
  if (const char* given = environment_value(Env::openblas_coretype); given && *given) {
    b.core_from = "OPENBLAS_CORETYPE";
  } else if (const char* core = core_for_cpu_isa()) {
    set_unless_given(Env::openblas_coretype, core);
    b.core_from = cpu_isa_forced() ? "ringattn, from RINGATTN_CPU_KERNELS"
                                   : "ringattn, from the CPU's features";
  } else {
    b.core_from = "OpenBLAS's own detection";
  }
  // The pthreads build starts a pool of threads at load, and a pool thread that has nothing
  // to do spins (yielding) for 2^OPENBLAS_THREAD_TIMEOUT cycles (2^28, ~0.1 s, by default)
  // before it sleeps. ringattn never gives that pool work (each sgemm runs on its caller),
  // so the spinning only takes the cores the kernels run on (`cpu_bench --sgemm-only` shows
  // it; docs/PERFORMANCE.md). 4 is OpenBLAS's smallest value: its threads sleep at once.
  // (The OpenMP build has no pool.)
  set_unless_given(Env::openblas_thread_timeout, "4");
  std::string tried;
  void* handle = nullptr;
  for (const std::string& c : candidates) {
    // RTLD_LOCAL: our symbols come from this handle, whatever BLAS the host process has.
    handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      b.file = c;
      break;
    }
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + c + ": " + (why ? why : "not found");
  }
  for (const char* name : set_for_open) unsetenv(name);
  if (!handle && candidates.size() == 1)
    throw InputError("RINGATTN_BLAS_LIBRARY",
                     "cannot open '" + candidates[0] + "' (" + tried +
                         "); name an OpenBLAS libopenblas.so.0, or unset it to use the OpenMP "
                         "build found at build time");
  if (!handle)
    throw RuntimeFailure("cannot open OpenBLAS (" + tried +
                         "); install libopenblas0-openmp, or set RINGATTN_BLAS_LIBRARY to an "
                         "OpenBLAS libopenblas.so.0");
  Dl_info dl{};
  if (dladdr(dlsym(handle, "cblas_sgemm"), &dl) && dl.dli_fname) b.file = dl.dli_fname;
  resolve(handle, "cblas_sgemm", b.sgemm, b.file);
  resolve(handle, "openblas_get_config", b.get_config, b.file);
  resolve(handle, "openblas_get_corename", b.get_corename, b.file);
  resolve(handle, "openblas_get_parallel", b.get_parallel, b.file);
  resolve(handle, "openblas_get_num_threads", b.get_num_threads, b.file);
  resolve(handle, "openblas_set_num_threads", b.set_num_threads, b.file);
  return b;  // the handle stays open for the process's life
}

const OpenBlas& blas() {
  static const OpenBlas b = open_blas();
  return b;
}

std::string threading_name(int parallel) {
  return parallel == 0 ? "sequential" : parallel == 1 ? "pthreads" : "openmp";
}

std::mutex g_mu;
std::atomic<int> g_open_scopes{0};  // changed under g_mu; read by sgemm without it
int g_saved_threads = 0;

// openblas_set_num_threads in the OpenMP build also calls omp_set_num_threads on this
// thread; put the thread's own setting back.
void set_blas_threads_keeping_omp(int n) {
  const int omp_threads = omp_get_max_threads();
  blas().set_num_threads(n);
  omp_set_num_threads(omp_threads);
}

}  // namespace

BlasInfo blas_info() {
  const OpenBlas& b = blas();
  BlasInfo info;
  const char* cfg = b.get_config();
  const char* core = b.get_corename();
  info.config = cfg ? cfg : "OpenBLAS";
  info.core = core ? core : "unknown";
  info.core_from = b.core_from;
  info.file = b.file;
  info.threading = threading_name(b.get_parallel());
  BlasSingleThreadScope scope;
  info.threads_per_call = b.get_num_threads();
  info.small_gemm = small_gemm_summary();
  info.vector_kernels = cpu_isa_summary();
  return info;
}

}  // namespace ringattn::kernels

namespace ringattn {

std::string BlasInfo::summary() const {
  return config + "; kernels " + core + " (chosen by " + core_from + "); " + threading +
         " build, " + std::to_string(threads_per_call) +
         " thread(s) per call inside ringattn's regions; " + file +
         "; tile products: " + small_gemm + "; softmax steps: " + vector_kernels;
}

}  // namespace ringattn

namespace ringattn::kernels {

void sgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha,
           const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const OpenBlas& lib = blas();
  // Outside an active OpenMP region (a one-thread region: --threads 1, one thread per rank)
  // OpenBLAS's OpenMP build takes as many threads as the calling thread's OpenMP thread
  // count says, and resets its own count to that, so the scope's openblas_set_num_threads(1)
  // does not hold there. Inside a scope the call runs with that count at 1 on this thread
  // (an OpenMP setting of the calling task only), restored after the call.
  const int omp_threads = g_open_scopes.load(std::memory_order_relaxed) > 0 && !omp_in_parallel()
                              ? omp_get_max_threads()
                              : 1;
  if (omp_threads != 1) omp_set_num_threads(1);
  lib.sgemm(CblasRowMajor, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (omp_threads != 1) omp_set_num_threads(omp_threads);
}

BlasSingleThreadScope::BlasSingleThreadScope() {
  (void)small_gemm_backend();  // RINGATTN_SMALL_GEMM read (and checked) outside any region
  const OpenBlas& b = blas();  // opened before the region: its threads never race the open
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_open_scopes++ == 0) {
    g_saved_threads = b.get_num_threads();
    if (g_saved_threads != 1) set_blas_threads_keeping_omp(1);
  }
}

BlasSingleThreadScope::~BlasSingleThreadScope() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_open_scopes == 0 && g_saved_threads != 1) set_blas_threads_keeping_omp(g_saved_threads);
}

}  // namespace ringattn::kernels

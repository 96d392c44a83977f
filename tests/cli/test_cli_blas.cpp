// The BLAS under the CPU kernels does not depend on what else is installed: whichever
// OpenBLAS build is selected (the OpenMP one ringattn opens by default, the pthreads one
// Debian's alternatives prefer, named through RINGATTN_BLAS_LIBRARY) and whatever
// OPENBLAS_NUM_THREADS says, a dense forward reports the build it ran on, one thread per
// sgemm inside its regions, CPU kernels chosen from the CPU's features, and the right answer.
// Timing is the benchmark's business (bench/run_cpu.sh), not this test's.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"

using ringattn::testing::CliResult;
using ringattn::testing::run_cli;

namespace {

std::string openblas_build(const std::string& variant) {
  for (const char* arch : {"x86_64-linux-gnu", "aarch64-linux-gnu"}) {
    const std::string p =
        std::string("/usr/lib/") + arch + "/openblas-" + variant + "/libopenblas.so.0";
    if (std::filesystem::exists(p)) return p;
  }
  return {};
}

nlohmann::json run_dense_forward(const std::vector<std::string>& env,
                                 const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"run",     "--seq-len", "256", "--heads",  "2", "--head-dim", "32",
                                "--check", "--iters",   "1",   "--warmup", "0", "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const CliResult r = run_cli(args, env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::string text = r.out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto nl = text.rfind('\n');
  const nlohmann::json j =
      nlohmann::json::parse(nl == std::string::npos ? text : text.substr(nl + 1));
  std::printf("  %s -> %s\n", env.empty() ? "(default)" : env.front().c_str(),
              j["blas"].dump().c_str());
  std::fflush(stdout);  // run_cli forks
  EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
  return j["blas"];
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

void expect_one_thread_per_call_and_vector_kernels(const nlohmann::json& blas) {
  EXPECT_EQ(blas["threads_per_call"].get<int>(), 1) << blas.dump();
  if (cpu_has_avx2()) {
    // OpenBLAS alone picks its SSE3 "Prescott" kernels on CPUs newer than it knows.
    const std::string core = blas["core"].get<std::string>();
    EXPECT_TRUE(core == "SkylakeX" || core == "Haswell") << blas.dump();
  }
}

TEST(CliBlas, DefaultIsTheOpenMpBuildWhateverTheAlternativesSelect) {
  const std::string openmp = openblas_build("openmp");
  if (openmp.empty()) GTEST_SKIP() << "the OpenMP build of OpenBLAS is not installed here";
  std::error_code ec;
  const auto system_default =
      std::filesystem::canonical("/usr/lib/x86_64-linux-gnu/libopenblas.so.0", ec);
  std::printf("  the alternatives' libopenblas.so.0 is %s\n",
              ec ? "(absent)" : system_default.c_str());
  for (const char* threads : {"1", "4"}) {
    const nlohmann::json blas = run_dense_forward({std::string("OPENBLAS_NUM_THREADS=") + threads});
    EXPECT_EQ(blas["threading"], "openmp");
    EXPECT_EQ(std::filesystem::canonical(blas["file"].get<std::string>()),
              std::filesystem::canonical(openmp))
        << blas.dump();
    expect_one_thread_per_call_and_vector_kernels(blas);
  }
  // One thread per region (one thread per rank) is an inactive OpenMP region, where the
  // OpenMP build would otherwise start its own team.
  const nlohmann::json one = run_dense_forward({"OPENBLAS_NUM_THREADS=4"}, {"--threads", "1"});
  EXPECT_EQ(one["threads_per_call"].get<int>(), 1);
}

TEST(CliBlas, ThePthreadsBuildRunsOneThreadPerCall) {
  const std::string pthreads = openblas_build("pthread");
  if (pthreads.empty())
    GTEST_SKIP() << "the pthreads build of OpenBLAS is not installed here "
                    "(scripts/deps.sh installs libopenblas0-pthread)";
  for (const std::string threads : {"", "8"}) {
    std::vector<std::string> env{"RINGATTN_BLAS_LIBRARY=" + pthreads};
    if (!threads.empty()) env.push_back("OPENBLAS_NUM_THREADS=" + threads);
    const nlohmann::json blas = run_dense_forward(env);
    EXPECT_EQ(blas["threading"], "pthreads");
    expect_one_thread_per_call_and_vector_kernels(blas);
  }
}

TEST(CliBlas, OpenBlasCoretypeFromTheUserIsKept) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  const nlohmann::json blas = run_dense_forward({"OPENBLAS_CORETYPE=Haswell"});
  EXPECT_EQ(blas["core"], "Haswell");
  EXPECT_EQ(blas["core_from"], "OPENBLAS_CORETYPE");
}

TEST(CliBlas, ALibraryThatCannotBeOpenedIsBadInputNamingTheVariable) {
  const CliResult r = run_cli({"run", "--seq-len", "64", "--iters", "1"},
                              {"RINGATTN_BLAS_LIBRARY=/nonexistent/libopenblas.so.0"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("RINGATTN_BLAS_LIBRARY"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/libopenblas.so.0"), std::string::npos) << r.err;
}

// The tile products' backend (kernels/cpu_small_gemm.hpp) is reported, can be forced to
// OpenBLAS, and a value that names neither is bad input naming the variable.
TEST(CliBlas, TileProductBackendIsReportedAndCanBeChosen) {
  const nlohmann::json forced = run_dense_forward({"RINGATTN_SMALL_GEMM=openblas"});
  EXPECT_NE(forced["small_gemm"].get<std::string>().find("OpenBLAS"), std::string::npos)
      << forced.dump();
  const nlohmann::json fallback = run_dense_forward({});
  EXPECT_FALSE(fallback["small_gemm"].get<std::string>().empty()) << fallback.dump();
  const CliResult r =
      run_cli({"run", "--seq-len", "64", "--iters", "1"}, {"RINGATTN_SMALL_GEMM=mkl"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("RINGATTN_SMALL_GEMM"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'mkl'"), std::string::npos) << r.err;
}

// The softmax steps' vector variant (kernels/cpu_isa.hpp) is chosen from CPUID and reported;
// RINGATTN_CPU_KERNELS forces one the CPU executes (with libxsmm's and OpenBLAS's Haswell
// kernels for avx2), and a value the CPU cannot run, or that names no variant, is bad input
// naming the variable. Each forced run still passes the float64 check.
TEST(CliBlas, CpuKernelVariantIsChosenFromCpuidReportedAndCanBeForced) {
  const nlohmann::json chosen = run_dense_forward({});
  EXPECT_NE(chosen["vector_kernels"].get<std::string>().find("from the CPU's features"),
            std::string::npos)
      << chosen.dump();
  const nlohmann::json portable = run_dense_forward({"RINGATTN_CPU_KERNELS=portable"});
  EXPECT_EQ(portable["vector_kernels"].get<std::string>().rfind("portable", 0), 0u)
      << portable.dump();
  if (cpu_has_avx2()) {
    const nlohmann::json avx2 = run_dense_forward({"RINGATTN_CPU_KERNELS=avx2"});
    EXPECT_EQ(avx2["vector_kernels"].get<std::string>().rfind("AVX2 (RINGATTN_CPU_KERNELS", 0), 0u)
        << avx2.dump();
    EXPECT_EQ(avx2["core"], "Haswell") << avx2.dump();
    const std::string products = avx2["small_gemm"].get<std::string>();
    if (products.find("libxsmm") != std::string::npos) {
      EXPECT_NE(products.find("'hsw'"), std::string::npos) << avx2.dump();
    }
  } else {
    const CliResult r =
        run_cli({"run", "--seq-len", "64", "--iters", "1"}, {"RINGATTN_CPU_KERNELS=avx2"});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("cannot execute"), std::string::npos) << r.err;
  }
  const CliResult r =
      run_cli({"run", "--seq-len", "64", "--iters", "1"}, {"RINGATTN_CPU_KERNELS=sse9"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("RINGATTN_CPU_KERNELS"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'sse9'"), std::string::npos) << r.err;
}

}  // namespace

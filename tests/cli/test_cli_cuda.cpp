// `ringattn run --device cuda` end to end (label `gpu`): every grouped/mixture golden case
// through files with --check against the float64 reference, in each dtype, with the JSON
// report naming the device, the kernel and the device memory peak. Skipped, with the reason,
// where no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/npy.hpp"
#include "cli_runner.hpp"
#include "golden.hpp"
#include "gpu_skip.hpp"
#include "ringattn/reference.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn {
namespace {

using testing::CliResult;
using testing::TempDir;

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) +
         "\n--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err;
}

nlohmann::json last_line_json(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto nl = text.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? text : text.substr(nl + 1));
}

class CliCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(CliCuda, GoldenCaseRunsOnTheGpuAndPassesCheck) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  const testing::GoldenCase c = testing::load_golden(GetParam());
  for (const char* dtype : {"bf16", "fp16", "fp32"}) {
    TempDir dir;
    auto args = testing::golden_run_args(c);
    args.insert(args.end(),
                {"--device", "cuda", "--dtype", dtype, "--check", "--json", "--iters", "1",
                 "--warmup", "0", "--out", dir.file("out.npy"), "--dq-out", dir.file("dq.npy")});
    const CliResult r = testing::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    EXPECT_EQ(j.value("device", ""), "cuda");
    EXPECT_EQ(j.value("dtype", ""), dtype);
    EXPECT_TRUE(j.contains("kernel"));
    EXPECT_GT(j.value("device_peak_bytes", 0ull), 0ull);
    EXPECT_TRUE(j["check"].value("passed", false)) << describe(r);
    // The file written is the device's result and agrees with the golden output.
    const std::vector<float> out = read_npy_float(dir.file("out.npy"));
    const double tol = std::string(dtype) == "fp32" ? 1e-4 : 1e-2;
    EXPECT_LE(relative_error(out.data(), c.out.data(), out.size()), tol) << dtype;
    const std::vector<float> dq = read_npy_float(dir.file("dq.npy"));
    EXPECT_LE(relative_error(dq.data(), c.dq.data(), dq.size()), tol) << dtype;
  }
}

std::vector<std::string> golden_names() {
  std::vector<std::string> v = testing::golden_case_names("grouped");
  for (const auto& m : testing::golden_case_names("mixture")) v.push_back(m);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Golden, CliCuda, ::testing::ValuesIn(golden_names()),
                         [](const auto& p) { return p.param; });

// --deterministic: two runs of a causal GQA job on the GPU, one rank and a ring of two
// virtual ranks, forward and backward, give the same bits; --json says so.
TEST(CliCudaDeterministic, TwoRunsGiveTheSameBits) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  for (const char* ranks : {"1", "2"}) {
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      TempDir dir;
      const CliResult r = testing::run_cli({"run",
                                            "--device",
                                            "cuda",
                                            "--deterministic",
                                            "--seq-len",
                                            "256",
                                            "--heads",
                                            "4",
                                            "--kv-heads",
                                            "2",
                                            "--head-dim",
                                            "64",
                                            "--causal",
                                            "--backward",
                                            "--ring-size",
                                            ranks,
                                            "--json",
                                            "--iters",
                                            "1",
                                            "--warmup",
                                            "0",
                                            "--out",
                                            dir.file("out.npy"),
                                            "--dq-out",
                                            dir.file("dq.npy")});
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      EXPECT_TRUE(last_line_json(r.out).value("deterministic", false));
      std::vector<float> both = read_npy_float(dir.file("out.npy"));
      const std::vector<float> dq = read_npy_float(dir.file("dq.npy"));
      both.insert(both.end(), dq.begin(), dq.end());
      runs.push_back(both);
    }
    EXPECT_EQ(runs[0], runs[1]) << ranks << " rank(s)";
  }
}

#if RINGATTN_TEST_HAVE_CUDNN
TEST(CliCudaRun, AutoPicksTheGpuAndCudnnFallsBackWithANoteWhereItCannotRun) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  // Causal GQA: cuDNN's graphs, forward and backward, and --json says so.
  CliResult r = testing::run_cli({"run", "--device", "auto", "--seq-len", "512", "--heads", "4",
                                  "--kv-heads", "2", "--causal", "--kernel", "cudnn", "--check",
                                  "--backward", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  nlohmann::json j = last_line_json(r.out);
  EXPECT_EQ(j.value("device", ""), "cuda");
  EXPECT_EQ(j.value("dtype", ""), "bf16");
  EXPECT_EQ(j.value("kernel", ""), "cudnn") << describe(r);
  EXPECT_EQ(j.value("kernel_backward", ""), "cudnn") << describe(r);
  EXPECT_NE(r.out.find("graphs built in"), std::string::npos) << describe(r);
  // A dilated mixture merges its views by lse: cuDNN's forward, and its backward view by view
  // from the merged out and lse (--check holds it to float64).
  r = testing::run_cli({"run", "--device", "cuda", "--seq-len", "512", "--heads", "4",
                        "--attention", "dilated", "--segments", "128,256", "--dilations", "1,2",
                        "--combine", "mixture",
                        "--kernel", "cudnn", "--check", "--backward", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  j = last_line_json(r.out);
  EXPECT_EQ(j.value("kernel", ""), "cudnn") << describe(r);
  EXPECT_EQ(j.value("kernel_backward", ""), "cudnn") << describe(r);
}
#else
// A build without cuDNN (the emulated GPU among them): --kernel cudnn is refused naming
// --kernel, with no output file; auto runs the sm_90a kernels on compute capability 9.0 (the
// emulator's default profile), the native ones elsewhere, and says why.
TEST(CliCudaRun, AutoPicksTheGpuAndCudnnIsRefusedWhereTheBuildHasNone) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  TempDir dir;
  const CliResult refused =
      testing::run_cli({"run", "--device", "cuda", "--seq-len", "128", "--heads", "2", "--kernel",
                        "cudnn", "--out", dir.file("out.npy")});
  EXPECT_EQ(refused.exit_code, 2) << describe(refused);
  EXPECT_NE(refused.err.find("--kernel"), std::string::npos) << describe(refused);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  const CliResult r = testing::run_cli({"run", "--device", "auto", "--seq-len", "256", "--heads",
                                        "2", "--causal", "--check", "--backward", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const nlohmann::json j = last_line_json(r.out);
  EXPECT_EQ(j.value("device", ""), "cuda");
  // (A real GPU's build may lack the sm_90a kernels: then native on any device.)
  const bool sm90 = gpu.cc_major == 9 && gpu.cc_minor == 0;
  const std::string kernel = j.value("kernel", "");
#if RINGATTN_CUDA_EMULATION
  EXPECT_EQ(kernel, sm90 ? "hopper" : "native") << describe(r);
#endif
  EXPECT_EQ(j.value("kernel_backward", ""), kernel) << describe(r);
  if (kernel == "hopper") {
    EXPECT_TRUE(sm90) << describe(r);
  } else {
    EXPECT_EQ(kernel, "native") << describe(r);
  }
  EXPECT_TRUE(j["check"].value("passed", false)) << describe(r);
  EXPECT_NE(r.out.find(kernel == "hopper" ? "note: --kernel auto: the sm_90a kernels (no cuDNN"
                                          : "note: --kernel auto: the native kernels (no cuDNN"),
            std::string::npos)
      << describe(r);
#if RINGATTN_CUDA_EMULATION
  // The report says the device is emulated, and its timings are not GPU timings.
  EXPECT_NE(r.out.find("emulated sm_"), std::string::npos) << describe(r);
  EXPECT_NE(r.out.find("not GPU timings"), std::string::npos) << describe(r);
  EXPECT_TRUE(j.value("emulated_device", false)) << describe(r);
#endif
}
#endif

// The sm_90a kernels' A/B switches take the values they name; any other value is bad input
// (exit 2) naming the variable, the value and what it takes, not a silent default that a
// benchmark would then report as the form it asked for. Where the device is no sm_90 the
// sm_90a kernels never read them.
TEST(CliCudaRun, AMistypedHopperSwitchIsBadInputNamingIt) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  struct Case {
    const char* env;
    const char* value;
    const char* takes;
  };
  for (const Case& c : {Case{"RINGATTN_HOPPER_BWD", "fusedwide", "fused_wide"},
                        Case{"RINGATTN_HOPPER_PINGPONG", "3", "0, 1, 2"}}) {
    const CliResult r = testing::run_cli(
        {"run", "--device", "cuda", "--seq-len", "128", "--heads", "2", "--head-dim", "64",
         "--kernel", "hopper", "--backward", "--json"},
        {std::string(c.env) + "=" + c.value});
    if (gpu.cc_major != 9) {
      EXPECT_EQ(r.exit_code, 0) << describe(r);
      continue;
    }
    EXPECT_EQ(r.exit_code, 2) << c.env << ": " << describe(r);
    EXPECT_NE(r.err.find(c.env), std::string::npos) << describe(r);
    EXPECT_NE(r.err.find(std::string("'") + c.value + "'"), std::string::npos) << describe(r);
    EXPECT_NE(r.err.find(c.takes), std::string::npos) << describe(r);
  }
}

// A kernel that never finishes (RINGATTN_TEST_PLANT_HANG=1 plants the watchdog's probe at
// the first forward) ends the run after --timeout: exit 3, a message naming the kernel, no
// output file, and the process gone although the device (or the emulated GPU's stream
// thread) still runs the kernel.
TEST(CliCudaRun, AKernelThatNeverFinishesEndsTheRunNamingIt) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = testing::run_cli({"run", "--device", "cuda", "--seq-len", "128", "--heads",
                                        "2", "--head-dim", "64", "--kernel", "native",
                                        "--timeout", "2", "--out", dir.file("out.npy")},
                                       {"RINGATTN_TEST_PLANT_HANG=1"});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.err.find("did not finish ringattn_watchdog_probe_kernel within 2 s"),
            std::string::npos)
      << describe(r);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_LT(took, 60.0) << describe(r);
}

// --kernel hopper: the sm_90a forward and backward where the device is an sm_90 (the emulated
// GPU's default profile is one) and the configuration dense or dilated, checked against
// float64; elsewhere the native kernels and a note saying why. On a ring every step's forward
// runs on it.
TEST(CliCudaRun, KernelHopperRunsTheSm90ForwardOrSaysWhyNot) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  CliResult r = testing::run_cli({"run", "--device", "cuda", "--seq-len", "200", "--heads", "4",
                                  "--kv-heads", "2", "--head-dim", "64", "--causal", "--kernel",
                                  "hopper", "--check", "--backward", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const nlohmann::json j = last_line_json(r.out);
  if (j.value("kernel", "") == "hopper") {
    EXPECT_EQ(j.value("kernel_backward", ""), "hopper") << describe(r);
    EXPECT_NE(r.out.find("exact on an H100"), std::string::npos) << describe(r);
  } else {
    EXPECT_EQ(j.value("kernel", ""), "native") << describe(r);
    EXPECT_NE(r.out.find("note: --kernel hopper: "), std::string::npos) << describe(r);
  }
  r = testing::run_cli({"run", "--device", "cuda", "--seq-len", "256", "--heads", "4",
                        "--attention", "dilated", "--segments", "128,256", "--dilations", "1,2",
                        "--kernel", "hopper", "--check", "--backward", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);  // --check passed: hopper's dilated passes or native
  const nlohmann::json dilated = last_line_json(r.out);
  if (dilated.value("kernel", "") == "hopper") {
    EXPECT_EQ(dilated.value("kernel_backward", ""), "hopper") << describe(r);
    EXPECT_NE(r.out.find("forward and backward (TMA + wgmma, over the dilated pattern's strided "
                         "views)"),
              std::string::npos)
        << describe(r);
  } else {
    EXPECT_NE(r.out.find("note: --kernel hopper: "), std::string::npos) << describe(r);
  }
  // On a ring of two ranks every step's forward and backward (--check against float64 on
  // every rank).
  r = testing::run_cli({"run", "--device", "cuda", "--ring-size", "2", "--seq-len", "256",
                        "--heads", "2", "--head-dim", "64", "--causal", "--kernel", "hopper",
                        "--check", "--backward"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(
      r.out.find("every ring step's forward and backward on the sm_90a kernels") !=
          std::string::npos ||
      r.out.find("note: --kernel hopper: ") != std::string::npos)
      << describe(r);
  // --kernel cudnn: every step's views on cuDNN, forward and backward, checked against float64
  // on every rank, where the build has cuDNN; refused naming --kernel where it has none.
  r = testing::run_cli({"run", "--device", "cuda", "--ring-size", "2", "--seq-len", "256",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--causal",
                        "--kernel", "cudnn", "--check", "--backward", "--json"});
#if RINGATTN_TEST_HAVE_CUDNN
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const nlohmann::json jr = last_line_json(r.out);
  EXPECT_EQ(jr.value("kernel", ""), "cudnn") << describe(r);
  EXPECT_EQ(jr.value("kernel_backward", ""), "cudnn") << describe(r);
  EXPECT_NE(r.out.find("every ring step's forward and backward on cuDNN"), std::string::npos)
      << describe(r);
#else
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--kernel"), std::string::npos) << describe(r);
#endif
  // The GPU block-sparse mode has no cuDNN kernels: refused naming --kernel, no output file.
  {
    TempDir dir;
    r = testing::run_cli({"run", "--device", "cuda", "--ring-size", "2", "--seq-len", "256",
                          "--heads", "2", "--attention", "block-sparse", "--block-size", "32",
                          "--pattern", "local:window=64", "--kernel", "cudnn", "--out",
                          dir.file("out.npy")});
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find("--kernel"), std::string::npos) << describe(r);
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  }
#if RINGATTN_CUDA_EMULATION
  // The same run with cuDNN's stand-in (tests only): the CLI's ranks, --check on each and
  // --json carry the ring's cuDNN steps.
  {
    const testing::CudnnStandinScope standin;
    r = testing::run_cli({"run", "--device", "cuda", "--ring-size", "2", "--seq-len", "256",
                          "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--causal",
                          "--kernel", "cudnn", "--check", "--backward", "--json"});
  }
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const nlohmann::json je = last_line_json(r.out);
  EXPECT_EQ(je.value("kernel", ""), "cudnn") << describe(r);
  EXPECT_EQ(je.value("kernel_backward", ""), "cudnn") << describe(r);
  EXPECT_NE(r.out.find("every ring step's forward and backward on cuDNN (emulated cuDNN stand-in"),
            std::string::npos)
      << describe(r);
  // --kernel auto with the stand-in and stubbed timings (cuDNN faster forward, slower
  // backward), cuDNN's ring steps taken as verified on a GPU (RINGATTN_TEST_VERIFIED_FORMS;
  // auto leaves them out until a GPU has passed them): --json reports each pass's choice,
  // the notes their times; --deterministic keeps cuDNN out whatever the timings.
  for (const bool deterministic : {false, true}) {
    const testing::CudnnStandinScope standin;
    std::vector<std::string> args = {"run", "--device", "cuda", "--ring-size", "2", "--seq-len",
                                     "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                                     "--causal", "--kernel", "auto", "--check", "--backward",
                                     "--json"};
    if (deterministic) args.push_back("--deterministic");
    r = testing::run_cli(args, {"RINGATTN_TEST_RING_AUTO_MS=2,1,1,2",
                                "RINGATTN_TEST_VERIFIED_FORMS=cudnn_ring_steps"});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json ja = last_line_json(r.out);
    EXPECT_EQ(ja.value("kernel", ""), deterministic ? "hopper" : "cudnn") << describe(r);
    EXPECT_EQ(ja.value("kernel_backward", ""), "hopper") << describe(r);
    EXPECT_EQ(r.out.find("ring forward hopper 2.000 ms, cudnn 1.000 ms") == std::string::npos,
              deterministic)
        << describe(r);
  }
#endif
}

// --layout bhnd: the GPU engines read [B, N, H, D] only, so --device auto keeps the run on the
// CPU (where it passes its check) and --device cuda refuses it naming --layout, writing
// nothing.
TEST(CliCudaRun, HeadMajorLayoutStaysOnTheCpuUnderAutoAndIsRefusedOnCuda) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  TempDir dir;
  const CliResult refused =
      testing::run_cli({"run", "--device", "cuda", "--layout", "bhnd", "--seq-len", "128",
                        "--heads", "2", "--out", dir.file("out.npy")});
  EXPECT_EQ(refused.exit_code, 2) << describe(refused);
  EXPECT_NE(refused.err.find("--layout"), std::string::npos) << describe(refused);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  const CliResult r =
      testing::run_cli({"run", "--device", "auto", "--layout", "bhnd", "--seq-len", "256",
                        "--heads", "2", "--causal", "--check", "--backward", "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const nlohmann::json j = last_line_json(r.out);
  EXPECT_EQ(j.value("device", ""), "cpu");
  EXPECT_EQ(j.value("tensor_layout", ""), "bhnd");
  EXPECT_TRUE(j["check"].value("passed", false)) << describe(r);
  // A head-major KV cache alone does the same, named by its own option.
  const CliResult kv = testing::run_cli(
      {"run", "--device", "cuda", "--kv-layout", "bhnd", "--seq-len", "128", "--heads", "2"});
  EXPECT_EQ(kv.exit_code, 2) << describe(kv);
  EXPECT_NE(kv.err.find("--kv-layout"), std::string::npos) << describe(kv);
  const CliResult kv_auto = testing::run_cli({"run", "--device", "auto", "--kv-layout", "bhnd",
                                              "--seq-len", "128", "--heads", "2", "--json"});
  ASSERT_EQ(kv_auto.exit_code, 0) << describe(kv_auto);
  EXPECT_EQ(last_line_json(kv_auto.out).value("device", ""), "cpu");
}

// The GPU ring from the command line: virtual ranks, K/V over NCCL where each has its own
// GPU, by device copies where they share one.
std::string ring_skip_reason(int) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  return gpu.usable ? "" : gpu.reason;
}

class CliCudaRing : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(CliCudaRing, RingSize3PassesCheckAndMovesTheMinimum) {
  if (const std::string why = ring_skip_reason(3); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  TempDir dir;
  std::vector<std::string> args = {"run",      "--device", "cuda",       "--ring-size",      "3",
                                   "--check",  "--json",   "--backward", "--iters",          "1",
                                   "--warmup", "0",        "--out",      dir.file("out.npy")};
  args.insert(args.end(), GetParam().begin(), GetParam().end());
  const CliResult r = testing::run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const nlohmann::json j = last_line_json(r.out);
  EXPECT_EQ(j.value("device", ""), "cuda");
  EXPECT_EQ(j.value("world_size", 0), 3);
  EXPECT_TRUE(j["check"].value("passed", false)) << describe(r);
  EXPECT_EQ(j.value("bytes_sent", -1), j.value("bytes_sent_min", -2)) << describe(r);
  EXPECT_TRUE(j.contains("comm_exposed_ms")) << describe(r);
  EXPECT_TRUE(std::filesystem::exists(dir.file("out.npy")));
  const auto& p = GetParam();
  if (std::find(p.begin(), p.end(), "auto") != p.end()) {
    EXPECT_EQ(j.value("attention", ""), "block-sparse") << describe(r);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CliCudaRing,
    ::testing::Values(
        std::vector<std::string>{"--seq-len", "384", "--heads", "2"},
        std::vector<std::string>{"--seq-len", "384", "--heads", "3", "--attention", "dilated",
                                 "--segments", "96,192,384", "--dilations", "1,2,4"},
        std::vector<std::string>{"--seq-len", "384", "--heads", "4", "--attention", "dilated",
                                 "--combine", "mixture", "--segments", "96,384", "--dilations",
                                 "1,3", "--causal", "--dtype", "fp16"},
        // Distributed block-sparse over the device communicator, and
        // --attention auto past the threshold, which runs it.
        std::vector<std::string>{"--seq-len", "384", "--heads", "2", "--attention", "block-sparse",
                                 "--block-size", "32", "--pattern",
                                 "local:window=96+global:blocks=1", "--causal"},
        std::vector<std::string>{"--seq-len", "384", "--heads", "2", "--attention", "auto",
                                 "--sparse-threshold", "256", "--segments", "96,192", "--dilations",
                                 "1,2", "--block-size", "32"}),
    [](const auto& p) { return std::to_string(p.index); });

// Grouped-query attention, sliding windows and packed sequences on the GPU: one rank and
// three, checked against float64, K/V files with --kv-heads heads. --kernel cudnn takes GQA on
// one GPU (cuDNN 9 runs it), and is refused by name on a ring, whose steps run natively.
TEST(CliCudaFeatures, GqaWindowsAndPackingRunCheckedOnTheGpu) {
  const CudaDeviceStatus gpu = probe_cuda_device();
  if (!gpu.usable) GTEST_SKIP() << "SKIPPED: " << gpu.reason;
  TempDir dir;
  const std::vector<int64_t> q_dims{1, 128, 4, 16}, kv_dims{1, 128, 2, 16};
  std::vector<float> q(128 * 4 * 16), kv(128 * 2 * 16);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 37) % 11) / 11.0f;
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 13) % 7) / 7.0f;
  write_npy_float_atomic(dir.file("q.npy"), q_dims, q.data());
  write_npy_float_atomic(dir.file("k.npy"), kv_dims, kv.data());
  write_npy_float_atomic(dir.file("v.npy"), kv_dims, kv.data());
  const std::vector<std::vector<std::string>> runs = {
      {"--seq-len", "128", "--heads", "4", "--kv-heads", "2"},
      {"--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy"), "--kv-heads",
       "2", "--causal", "--window", "9"},
      {"--seq-len", "129", "--heads", "4", "--kv-heads", "1", "--ring-size", "3", "--seqlens",
       "30,1,98", "--causal"},
      {"--seq-len", "126", "--heads", "2", "--window", "5,20", "--ring-size", "3"},
  };
  for (const auto& extra : runs) {
    std::vector<std::string> args = {"run",     "--device", "cuda",    "--dtype", "fp32",
                                     "--check", "--json",   "--iters", "1",       "--backward"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = testing::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    EXPECT_EQ(j.value("device", ""), "cuda") << describe(r);
    EXPECT_TRUE(j["check"].value("passed", false)) << describe(r);
    if (j.value("world_size", 1) > 1) {
      EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]) << describe(r);
    }
  }
  const CliResult r =
      testing::run_cli({"run", "--device", "cuda", "--kernel", "cudnn", "--seq-len", "128",
                        "--heads", "4", "--kv-heads", "2", "--ring-size", "2", "--out",
                        dir.file("out.npy")});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--kernel"), std::string::npos) << describe(r);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
}

// --progress shows the GPU engines' steps too (counted when they are enqueued).
TEST(CliCudaRing, ProgressShowsTheRingAndBlockSparseSteps) {
  if (const std::string why = ring_skip_reason(3); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  for (const auto& [extra, want] :
       {std::pair<std::vector<std::string>, std::string>{{}, "ring step 3/3"},
        {{"--attention", "block-sparse", "--block-size", "32", "--pattern", "global:blocks=1"},
         "ring step 2/2"}}) {
    std::vector<std::string> args = {
        "run",        "--device", "cuda", "--ring-size", "3", "--seq-len", "192", "--heads", "2",
        "--backward", "--iters",  "1",    "--warmup",    "0", "--progress"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = testing::run_cli(args, {"RINGATTN_PROGRESS_INTERVAL=0"});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.err.find(want), std::string::npos) << describe(r);
    EXPECT_NE(r.err.find("ringattn: backward"), std::string::npos) << describe(r);
  }
}

TEST(CliCudaRingWatchdog, AStalledRankEndsTheJobNamingRankAndStepWithNoOutput) {
  if (const std::string why = ring_skip_reason(2); !why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
  // The ring, and distributed block-sparse (its exchange is step 1).
  for (const auto& [extra, what] :
       {std::pair<std::vector<std::string>, std::string>{{}, "forward K/V"},
        {{"--attention", "block-sparse", "--block-size", "32", "--pattern", "local:window=128"},
         "block-sparse forward K/V"}}) {
    TempDir dir;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> args = {
        "run",     "--device", "cuda",      "--ring-size", "2",     "--seq-len",        "256",
        "--heads", "2",        "--timeout", "1",           "--out", dir.file("out.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = testing::run_cli(args, {"RINGATTN_FAULT_INJECT=rank=1,step=1,mode=stall"});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  stalled GPU rank (%s): ended after %.2f s, exit %d\n", what.c_str(), s,
                r.exit_code);
    EXPECT_EQ(r.exit_code, 3) << describe(r);
    EXPECT_NE(r.err.find("step 1 (" + what + ") did not complete within 1 s"), std::string::npos)
        << describe(r);
    // Ranks on distinct GPUs abort NCCL; ranks sharing one GPU use device copies, no NCCL.
    if (r.out.find("communicator: nccl") != std::string::npos)
      EXPECT_NE(r.err.find("ncclCommAbort"), std::string::npos) << describe(r);
    else
      EXPECT_NE(r.out.find("communicator: in-process"), std::string::npos) << describe(r);
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
    EXPECT_LT(s, 15.0);
  }
}

}  // namespace
}  // namespace ringattn

// The CLI under mpiexec (label `mpi`): golden cases through files with outputs gathered to
// rank 0, bad input that fails on every rank with exit 2 and no hang, and a fault injected
// on one rank that ends the whole job promptly, naming the rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/npy.hpp"
#include "cli_runner.hpp"
#include "golden.hpp"
#include "ringattn/reference.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn {
namespace {

using testing::CliResult;
using testing::TempDir;

const std::vector<std::string> kRootEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1",
                                           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};

CliResult mpirun(int ranks, std::vector<std::string> args, const std::string& extra_env = "") {
  std::vector<std::string> full = {"-n", std::to_string(ranks), "--oversubscribe"};
  std::vector<std::string> env = kRootEnv;
  if (!extra_env.empty()) {
    env.push_back(extra_env);
    full.push_back("-x");
    full.push_back(extra_env.substr(0, extra_env.find('=')));
  }
  full.push_back(RINGATTN_CLI_PATH);
  full.insert(full.end(), args.begin(), args.end());
  return testing::run_program(RINGATTN_MPIEXEC, full, env);
}

std::vector<std::string> golden_args(const testing::GoldenCase& c) {
  auto a = testing::golden_run_args(c);
  a.insert(a.end(), {"--iters", "1", "--warmup", "0", "--threads", "1"});
  return a;
}

TEST(CliMpi, GoldenCasesThroughFilesOnTwoRanksMatchGolden) {
  for (const std::string name :
       {"g01_two_groups", "g02_three_groups_causal", "m01_mixture", "m02_mixture_causal"}) {
    const auto c = testing::load_golden(name);
    TempDir dir;
    auto args = golden_args(c);
    for (const char* o : {"out", "dq", "dk", "dv"})
      args.insert(args.end(),
                  {std::string("--") + (std::string(o) == "out" ? "out" : std::string(o) + "-out"),
                   dir.file(std::string(o) + ".npy")});
    args.push_back("--json");
    const CliResult r = mpirun(2, args);
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.err << r.out;
    const auto n = c.out.size();
    EXPECT_LE(relative_error(read_npy_float(dir.file("out.npy")).data(), c.out.data(), n), 1e-5)
        << name;
    EXPECT_LE(relative_error(read_npy_float(dir.file("dq.npy")).data(), c.dq.data(), n), 1e-5)
        << name;
    EXPECT_LE(relative_error(read_npy_float(dir.file("dk.npy")).data(), c.dk.data(), n), 1e-5)
        << name;
    EXPECT_LE(relative_error(read_npy_float(dir.file("dv.npy")).data(), c.dv.data(), n), 1e-5)
        << name;
    const std::string trimmed = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
    const auto last = trimmed.substr(trimmed.rfind('\n') + 1);
    const auto j = nlohmann::json::parse(last);
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]) << name;
    EXPECT_EQ(j["fwd_ranks"].size(), 2u);
  }
}

TEST(CliMpi, UnevenSplitFailsOnEveryRankWithExit2AndNoOutput) {
  const auto c = testing::load_golden("g01_two_groups");  // N = 64
  TempDir dir;
  auto args = golden_args(c);
  args.insert(args.end(), {"--out", dir.file("out.npy")});
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = mpirun(3, args);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // N comes from the golden files, not from --seq-len: the message names --q's file.
  EXPECT_NE(r.err.find("--q (" + c.dir + "/q.npy): sequence length (dim 1): "), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("--seq-len"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot be split evenly over 3 ranks"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_LT(s, 30.0);
}

// Several ranks with --device cuda run the GPU ring (tests/ring/test_cuda_ring.cpp); where
// no GPU is usable every rank refuses, naming --device and why.
TEST(CliMpi, CudaDeviceOnSeveralRanksWithoutAGpuIsRefusedWithExit2) {
  if (probe_cuda_device().usable)
    GTEST_SKIP() << "SKIPPED: this machine has a usable GPU (the GPU ring tests cover it)";
  const CliResult r = mpirun(2, {"run", "--seq-len", "128", "--device", "cuda"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cuda_built() ? "cannot be used" : "is not available"), std::string::npos)
      << r.err;
}

TEST(CliMpi, MissingFileFailsOnEveryRankWithExit2) {
  TempDir dir;
  const CliResult r = mpirun(2, {"run", "--q", dir.file("nope.npy"), "--k", dir.file("nope.npy"),
                                 "--v", dir.file("nope.npy")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("file is missing"), std::string::npos) << r.err;
}

TEST(CliMpi, InjectedFaultEndsTheWholeJobPromptlyNamingTheRank) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = mpirun(3,
                             {"run", "--seq-len", "3072", "--heads", "2", "--head-dim", "32",
                              "--backward", "--threads", "1", "--out", dir.file("out.npy")},
                             "RINGATTN_FAULT_INJECT=rank=1,step=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fault injected at ring step 1"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_LT(s, 30.0);
}

TEST(CliMpi, StalledRankIsDetectedByTheWatchdogWhichEndsTheJobNamingTheStep) {
  // Rank 1 stops participating before posting step 1; rank 0 waits for its rows, and after
  // --timeout 2 s the watchdog aborts the job (MPI_Abort), naming rank, step and peer.
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = mpirun(2,
                             {"run", "--seq-len", "256", "--heads", "2", "--head-dim", "16",
                              "--threads", "1", "--timeout", "2", "--out", dir.file("out.npy")},
                             "RINGATTN_FAULT_INJECT=rank=1,step=1,mode=stall");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  stalled job ended after %.2f s with exit code %d\n", s, r.exit_code);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("rank 0: error: ring step 1 (forward K/V) did not complete within 2 s"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("from rank 1"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_GE(s, 2.0);
  EXPECT_LT(s, 10.0);
}

TEST(CliMpi, BlockSparseStallOrFaultEndsTheJobPromptly) {
  const std::vector<std::string> args = {"run",
                                         "--attention",
                                         "block-sparse",
                                         "--pattern",
                                         "local:window=128",
                                         "--block-size",
                                         "32",
                                         "--seq-len",
                                         "512",
                                         "--heads",
                                         "2",
                                         "--head-dim",
                                         "16",
                                         "--threads",
                                         "1",
                                         "--timeout",
                                         "2"};
  for (const std::string mode : {"stall", "fail"}) {
    TempDir dir;
    auto a = args;
    a.insert(a.end(), {"--out", dir.file("out.npy")});
    const auto t0 = std::chrono::steady_clock::now();
    const CliResult r = mpirun(2, a, "RINGATTN_FAULT_INJECT=rank=1,step=1,mode=" + mode);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  block-sparse %s: job ended after %.2f s with exit code %d\n", mode.c_str(), s,
                r.exit_code);
    EXPECT_NE(r.exit_code, 0) << r.err;
    const std::string want = mode == "stall" ? "did not complete within 2 s"
                                             : "rank 1: error: fault injected at ring step 1";
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
    EXPECT_LT(s, 10.0);
  }
}

TEST(CliMpi, VirtualRanksGiveTheSameAnswerAndReportFieldsAsMpiexec) {
  for (const int p : {2, 3}) {
    SCOPED_TRACE("P=" + std::to_string(p));
    TempDir dir;
    std::vector<std::string> args = {
        "run",      "--seq-len",  "3072",      "--heads", "2",       "--head-dim", "32",
        "--causal", "--backward", "--threads", "1",       "--iters", "1",          "--json"};
    auto mpi_args = args, virt_args = args;
    mpi_args.insert(mpi_args.end(), {"--out", dir.file("mpi.npy")});
    virt_args.insert(virt_args.end(),
                     {"--ring-size", std::to_string(p), "--out", dir.file("virtual.npy")});
    const CliResult m = mpirun(p, mpi_args);
    const CliResult v = testing::run_cli(virt_args);
    ASSERT_EQ(m.exit_code, 0) << m.err;
    ASSERT_EQ(v.exit_code, 0) << v.err;
    auto json = [](const std::string& out) {
      const std::string t = out.substr(0, out.find_last_not_of('\n') + 1);
      return nlohmann::json::parse(t.substr(t.rfind('\n') + 1));
    };
    const auto jm = json(m.out), jv = json(v.out);
    std::vector<std::string> km, kv;
    for (const auto& [k, val] : jm.items()) km.push_back(k);
    for (const auto& [k, val] : jv.items()) kv.push_back(k);
    EXPECT_EQ(km, kv);
    for (const char* k : {"world_size", "bytes_sent", "bytes_sent_min", "attended_pairs"})
      EXPECT_EQ(jm[k], jv[k]) << k;
    for (int r = 0; r < p; ++r)
      EXPECT_EQ(jm["fwd_ranks"][r]["bytes_sent"], jv["fwd_ranks"][r]["bytes_sent"]) << r;
    // The same engine, schedule and thread count: the same bits.
    EXPECT_EQ(read_npy_float(dir.file("mpi.npy")), read_npy_float(dir.file("virtual.npy")));
  }
}

// Grouped-query attention under mpiexec: forward and gradients pass the float64 check, the
// K/V heads alone travel (bytes equal the minimum), and the answer is the virtual ranks' bits.
TEST(CliMpi, GroupedQueryAttentionMatchesFloat64AndVirtualRanks) {
  for (const int p : {2, 4}) {
    SCOPED_TRACE("P=" + std::to_string(p));
    TempDir dir;
    std::vector<std::string> args = {
        "run",       "--seq-len",   "192",     "--heads",     "4",          "--kv-heads",
        "1",         "--head-dim",  "16",      "--attention", "dilated",    "--segments",
        "48,192",    "--dilations", "1,2",     "--causal",    "--backward", "--check",
        "--threads", "1",           "--iters", "1",           "--json"};
    auto mpi_args = args, virt_args = args;
    mpi_args.insert(mpi_args.end(), {"--dk-out", dir.file("mpi.npy")});
    virt_args.insert(virt_args.end(),
                     {"--ring-size", std::to_string(p), "--dk-out", dir.file("virtual.npy")});
    const CliResult m = mpirun(p, mpi_args);
    const CliResult v = testing::run_cli(virt_args);
    ASSERT_EQ(m.exit_code, 0) << m.err;
    ASSERT_EQ(v.exit_code, 0) << v.err;
    const std::string t = m.out.substr(0, m.out.find_last_not_of('\n') + 1);
    const auto j = nlohmann::json::parse(t.substr(t.rfind('\n') + 1));
    EXPECT_EQ(j["kv_heads"], 1);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]);
    EXPECT_EQ(read_npy_float(dir.file("mpi.npy")), read_npy_float(dir.file("virtual.npy")));
  }
}

// Ulysses x ring under mpiexec (the all-to-alls over MPI inside each group, the ring across
// groups): forward and gradients pass the float64 check, the all-to-all's and the ring's
// bytes equal their minima, and the answer is the virtual ranks' bits.
TEST(CliMpi, UlyssesMatchesFloat64AndVirtualRanks) {
  for (const auto& [p, u] : {std::pair{4, 2}, std::pair{4, 4}}) {
    SCOPED_TRACE("P=" + std::to_string(p) + " U=" + std::to_string(u));
    TempDir dir;
    std::vector<std::string> args = {
        "run",        "--seq-len",       "256",       "--heads",    "4",       "--kv-heads",
        "2",          "--batch",         "2",         "--head-dim", "16",      "--causal",
        "--backward", "--check",         "--threads", "1",          "--iters", "1",
        "--ulysses",  std::to_string(u), "--json"};
    auto mpi_args = args, virt_args = args;
    mpi_args.insert(mpi_args.end(), {"--dk-out", dir.file("mpi.npy")});
    virt_args.insert(virt_args.end(),
                     {"--ring-size", std::to_string(p), "--dk-out", dir.file("virtual.npy")});
    const CliResult m = mpirun(p, mpi_args);
    const CliResult v = testing::run_cli(virt_args);
    ASSERT_EQ(m.exit_code, 0) << m.err;
    ASSERT_EQ(v.exit_code, 0) << v.err;
    const std::string t = m.out.substr(0, m.out.find_last_not_of('\n') + 1);
    const auto j = nlohmann::json::parse(t.substr(t.rfind('\n') + 1));
    EXPECT_EQ(j["ulysses"], u);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
    EXPECT_EQ(j["bytes_sent_a2a"], j["bytes_sent_a2a_min"]);
    EXPECT_EQ(j["bytes_sent_ring"], j["bytes_sent_ring_min"]);
    EXPECT_GT(j["bytes_sent_a2a"].get<int64_t>(), 0);
    EXPECT_EQ(read_npy_float(dir.file("mpi.npy")), read_npy_float(dir.file("virtual.npy")));
  }
}

// A rank that fails inside its ring, or stalls there, ends the whole Ulysses job promptly:
// its group waits at the all-to-all, its ring at the exchange, and both give up.
TEST(CliMpi, UlyssesFaultOrStallEndsTheJobPromptly) {
  for (const std::string mode : {"fail", "stall"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    const auto t0 = std::chrono::steady_clock::now();
    const CliResult r =
        mpirun(4,
               {"run", "--seq-len", "256", "--heads", "4", "--head-dim", "16", "--backward",
                "--threads", "1", "--timeout", "2", "--ulysses", "2", "--out", dir.file("out.npy")},
               "RINGATTN_FAULT_INJECT=rank=2,step=1,mode=" + mode);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %s: the job ended after %.2f s with exit code %d\n", mode.c_str(), s,
                r.exit_code);
    EXPECT_NE(r.exit_code, 0);
    if (mode == "fail") {
      EXPECT_NE(r.err.find("rank 2: error: fault injected at ring step 1"), std::string::npos)
          << r.err;
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
    EXPECT_LT(s, 15.0);
  }
}

TEST(CliMpi, RingSizeOtherThanTheWorldSizeIsRefusedOnEveryRank) {
  const CliResult r = mpirun(2, {"run", "--seq-len", "64", "--ring-size", "3"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--ring-size: 3 differs from the 2 ranks"), std::string::npos) << r.err;
}

TEST(CliMpi, CommLocalWithSeveralRanksIsRefusedOnEveryRank) {
  const CliResult r = mpirun(2, {"run", "--seq-len", "64", "--comm", "local"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--comm: 'local' runs the whole ring in one process, but this job has 2"),
            std::string::npos)
      << r.err;
}

TEST(CliMpi, SlurmJobThatSeesOneRankIsRefused) {
  // `ringattn run` started straight from a batch script with several tasks: MPI sees one rank.
  const CliResult r =
      testing::run_program(RINGATTN_CLI_PATH, {"run", "--seq-len", "64"}, {"SLURM_NTASKS=4"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("SLURM_NTASKS=4 but MPI reports 1 rank"), std::string::npos) << r.err;
}

TEST(CliMpi, SyntheticRunIsIdenticalForAnyRankCount) {
  // The same seed gives the same tensors on any number of ranks, so outputs must agree.
  std::vector<std::vector<float>> outs;
  for (int p : {1, 2, 4}) {
    TempDir dir;
    const CliResult r =
        mpirun(p, {"run",        "--seq-len",   "256",         "--heads",  "3",
                   "--head-dim", "16",          "--attention", "dilated",  "--segments",
                   "32,128",     "--dilations", "1,3",         "--causal", "--threads",
                   "1",          "--iters",     "1",           "--out",    dir.file("out.npy")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    outs.push_back(read_npy_float(dir.file("out.npy")));
  }
  for (std::size_t i = 1; i < outs.size(); ++i)
    EXPECT_LE(relative_error(outs[i].data(), outs[0].data(), outs[0].size()), 1e-6);
}

// The million-token run CI keeps: block-sparse local + global over two ranks. It must finish,
// match the float64 reference on rows sampled on every rank, send exactly the computed
// minimum, and keep each rank's memory within a small factor of its inputs (nothing N²).
TEST(CliMpi, MillionTokenBlockSparseOnTwoRanks) {
  const int64_t n = 1 << 20, heads = 2, dim = 32;
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r =
      mpirun(2, {"run", "--attention", "block-sparse", "--pattern",
                 "local:window=512+global:blocks=1", "--seq-len", std::to_string(n), "--heads",
                 std::to_string(heads), "--head-dim", std::to_string(dim), "--check", "--threads",
                 "1", "--iters", "1", "--warmup", "0", "--json"});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
  EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]);
  EXPECT_GT(j["sparsity"].get<double>(), 0.99);
  // Each rank's q, k and v: N/2 rows of H·D floats. The rank also holds out, lse and the
  // K/V blocks its global query block needs from the other rank (all of them, once).
  const double inputs = 3.0 * static_cast<double>(n / 2 * heads * dim) * sizeof(float);
  const double rss = j["peak_rss_bytes"].get<double>();
  EXPECT_LT(rss, 4.0 * inputs) << "peak RSS " << rss / 1048576 << " MiB vs inputs "
                               << inputs / 1048576 << " MiB";
  std::printf(
      "  N=%lld on 2 ranks: %.1f s wall, forward %.0f ms, sparsity %.4f, peak RSS "
      "%.0f MiB (inputs %.0f MiB per rank), sent %lld bytes\n",
      static_cast<long long>(n), seconds, j["fwd_ms"].get<double>(), j["sparsity"].get<double>(),
      rss / 1048576, inputs / 1048576, static_cast<long long>(j["bytes_sent"].get<int64_t>()));
}

}  // namespace
}  // namespace ringattn

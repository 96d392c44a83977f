// The CLI under mpiexec (label `mpi`): golden cases through files with outputs gathered to
// rank 0, bad input that fails on every rank with exit 2 and no hang, and a fault injected
// on one rank that ends the whole job promptly, naming the rank.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "golden.hpp"
#include "ringattn/npy.hpp"
#include "ringattn/reference.hpp"

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
  EXPECT_NE(r.err.find("--seq-len"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot be split evenly over 3 ranks"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_LT(s, 30.0);
}

// The multi-rank GPU path comes with the NCCL ring (issue 5); until then --device cuda on
// several ranks is refused on every rank, before any device is touched.
TEST(CliMpi, CudaDeviceOnSeveralRanksIsRefusedWithExit2) {
  const CliResult r = mpirun(2, {"run", "--seq-len", "128", "--device", "cuda"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("single rank"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NCCL ring"), std::string::npos) << r.err;
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

}  // namespace
}  // namespace ringattn

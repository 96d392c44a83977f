// --layout bhnd: the engine computes on [B, H, N, D] tensors (PyTorch SDPA's convention) and
// gives what it gives on [B, N, H, D]: the float64 check passes, and the files written (which
// stay [B, N, H, D]) hold the same out and dQ bits, for dense and dilated attention on one rank
// and block-sparse on one or more. Paths that read only [B, N, H, D] (the dense ring) refuse it
// as bad input naming --layout, before any output is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"

using ringattn::testing::CliResult;
using ringattn::testing::run_cli;
using ringattn::testing::TempDir;

namespace {

nlohmann::json last_json_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const auto nl = t.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? t : t.substr(nl + 1));
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(CliLayout, HeadMajorRunsCheckAndWriteTheSameResults) {
  TempDir dir;
  const std::vector<std::string> problem{"run",      "--seq-len", "192",     "--heads",
                                         "4",        "--kv-heads", "2",      "--head-dim",
                                         "32",       "--causal",   "--backward", "--check",
                                         "--iters",  "1",          "--warmup", "0",
                                         "--json"};
  for (const std::string& layout : {std::string("bnhd"), std::string("bhnd")}) {
    std::vector<std::string> args = problem;
    args.insert(args.end(), {"--layout", layout, "--out", dir.file("out_" + layout + ".npy"),
                             "--dq-out", dir.file("dq_" + layout + ".npy")});
    const CliResult r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const nlohmann::json j = last_json_line(r.out);
    EXPECT_EQ(j["tensor_layout"], layout);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j["check"].dump();
  }
  EXPECT_EQ(bytes_of(dir.file("out_bhnd.npy")), bytes_of(dir.file("out_bnhd.npy")));
  EXPECT_EQ(bytes_of(dir.file("dq_bhnd.npy")), bytes_of(dir.file("dq_bnhd.npy")));
}

TEST(CliLayout, HeadMajorDilatedMixturePassesTheCheck) {
  const CliResult r = run_cli({"run", "--seq-len", "256", "--heads", "4", "--head-dim", "16",
                               "--attention", "dilated", "--segments", "64,256", "--dilations",
                               "1,4", "--combine", "mixture", "--backward", "--check",
                               "--layout", "bhnd", "--iters", "1", "--warmup", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(last_json_line(r.out)["check"]["passed"].get<bool>()) << r.out;
}

// Block-sparse on one rank and on two virtual ranks (the exchange packs head-major rows).
TEST(CliLayout, HeadMajorBlockSparseRunsCheckAndWriteTheSameResults) {
  for (const std::string ranks : {"1", "2"}) {
    TempDir dir;
    for (const std::string& layout : {std::string("bnhd"), std::string("bhnd")}) {
      const CliResult r = run_cli(
          {"run", "--seq-len", "512", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
           "--attention", "block-sparse", "--block-size", "32", "--pattern",
           "local:window=96+global:blocks=1", "--causal", "--backward", "--check",
           "--ring-size", ranks, "--layout", layout, "--iters", "1", "--warmup", "0", "--json",
           "--out", dir.file("out_" + layout + ".npy"), "--dq-out",
           dir.file("dq_" + layout + ".npy"), "--dk-out", dir.file("dk_" + layout + ".npy")});
      ASSERT_EQ(r.exit_code, 0) << ranks << " ranks, " << layout << ": " << r.out << r.err;
      const nlohmann::json j = last_json_line(r.out);
      EXPECT_EQ(j["tensor_layout"], layout);
      EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j["check"].dump();
    }
    for (const char* what : {"out", "dq", "dk"})
      EXPECT_EQ(bytes_of(dir.file(std::string(what) + "_bhnd.npy")),
                bytes_of(dir.file(std::string(what) + "_bnhd.npy")))
          << what << ", " << ranks << " ranks";
  }
}

TEST(CliLayout, PathsThatReadOnlyTokenMajorTensorsRefuseIt) {
  const std::vector<std::vector<std::string>> refused{
      {"--ring-size", "2"},
  };
  for (const auto& extra : refused) {
    TempDir dir;
    std::vector<std::string> args{"run",      "--seq-len", "256",
                                  "--layout", "bhnd",      "--iters",
                                  "1",        "--out",     dir.file("out.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << extra.front() << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("--layout"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy"))) << "--out written despite the error";
  }
  const CliResult bad = run_cli({"run", "--seq-len", "64", "--layout", "nhbd"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--layout"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("bhnd"), std::string::npos) << bad.err;
}

}  // namespace

// --layout bhnd: the engine computes on [B, H, N, D] tensors (PyTorch SDPA's convention) and
// gives what it gives on [B, N, H, D]: the float64 check passes, and the files written (which
// stay [B, N, H, D]) hold the same out and dQ bits, on one rank and on several (the ring and
// block-sparse). The GPU paths, which read only [B, N, H, D], refuse it naming --layout
// (test_cli_cuda, where a GPU is).
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

// One rank (Plan) and the ring on three virtual ranks, each rank's shard laid out head-major.
TEST(CliLayout, HeadMajorRunsCheckAndWriteTheSameResults) {
  for (const std::string ranks : {"1", "3"}) {
    TempDir dir;
    const std::vector<std::string> problem{
        "run",        "--seq-len", "192",         "--heads",    "4",       "--kv-heads", "2",
        "--head-dim", "32",        "--causal",    "--backward", "--check", "--iters",    "1",
        "--warmup",   "0",         "--ring-size", ranks,        "--json"};
    for (const std::string& layout : {std::string("bnhd"), std::string("bhnd")}) {
      std::vector<std::string> args = problem;
      args.insert(args.end(), {"--layout", layout, "--out", dir.file("out_" + layout + ".npy"),
                               "--dq-out", dir.file("dq_" + layout + ".npy")});
      const CliResult r = run_cli(args);
      ASSERT_EQ(r.exit_code, 0) << ranks << " ranks, " << layout << ": " << r.out << r.err;
      const nlohmann::json j = last_json_line(r.out);
      EXPECT_EQ(j["tensor_layout"], layout);
      EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j["check"].dump();
    }
    EXPECT_EQ(bytes_of(dir.file("out_bhnd.npy")), bytes_of(dir.file("out_bnhd.npy"))) << ranks;
    EXPECT_EQ(bytes_of(dir.file("dq_bhnd.npy")), bytes_of(dir.file("dq_bnhd.npy"))) << ranks;
  }
}

// --kv-layout: k, v and their gradients head-major beside token-major q (a KV cache), and the
// reverse, on one rank, the ring and block-sparse: the check passes and the files hold what a
// plain run writes (to rounding: dK/dV sum strided rows in another order).
TEST(CliLayout, KvLayoutOfItsOwnChecksAndWritesWhatAPlainRunWrites) {
  const std::vector<std::vector<std::string>> problems{
      {"--seq-len", "192", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--causal",
       "--ring-size", "1"},
      {"--seq-len", "192", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--causal",
       "--ring-size", "3"},
      {"--seq-len", "256", "--heads", "2", "--head-dim", "16", "--attention", "block-sparse",
       "--pattern", "local:window=64", "--block-size", "32", "--ring-size", "2"}};
  for (const auto& problem : problems)
    for (const auto& [q_layout, kv_layout] :
         {std::pair{"bnhd", "bhnd"}, std::pair{"bhnd", "bnhd"}}) {
      TempDir dir;
      std::vector<std::string> base{"run", "--backward", "--check", "--iters",
                                    "1",   "--warmup",   "0",       "--json"};
      base.insert(base.end(), problem.begin(), problem.end());
      std::vector<std::string> mixed = base, plain = base;
      mixed.insert(mixed.end(), {"--layout", q_layout, "--kv-layout", kv_layout, "--out",
                                 dir.file("out_mixed.npy")});
      plain.insert(plain.end(), {"--out", dir.file("out_plain.npy")});
      const CliResult m = run_cli(mixed), p = run_cli(plain);
      ASSERT_EQ(m.exit_code, 0) << m.out << m.err;
      ASSERT_EQ(p.exit_code, 0) << p.out << p.err;
      const nlohmann::json j = last_json_line(m.out);
      EXPECT_EQ(j["tensor_layout"], q_layout);
      EXPECT_EQ(j["kv_tensor_layout"], kv_layout);
      EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j["check"].dump();
      EXPECT_EQ(bytes_of(dir.file("out_mixed.npy")), bytes_of(dir.file("out_plain.npy")))
          << problem[1] << " " << q_layout << "/" << kv_layout;
    }
  const CliResult bad = run_cli({"run", "--seq-len", "64", "--kv-layout", "hnbd"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--kv-layout: unknown value"), std::string::npos) << bad.err;
}

TEST(CliLayout, HeadMajorDilatedMixturePassesTheCheck) {
  const CliResult r =
      run_cli({"run",  "--seq-len",   "256",     "--heads",    "4",       "--head-dim",
               "16",   "--attention", "dilated", "--segments", "64,256",  "--dilations",
               "1,4",  "--combine",   "mixture", "--backward", "--check", "--layout",
               "bhnd", "--iters",     "1",       "--warmup",   "0",       "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(last_json_line(r.out)["check"]["passed"].get<bool>()) << r.out;
}

// Block-sparse on one rank and on two virtual ranks (the exchange packs head-major rows).
TEST(CliLayout, HeadMajorBlockSparseRunsCheckAndWriteTheSameResults) {
  for (const std::string ranks : {"1", "2"}) {
    TempDir dir;
    for (const std::string& layout : {std::string("bnhd"), std::string("bhnd")}) {
      const CliResult r = run_cli({"run",
                                   "--seq-len",
                                   "512",
                                   "--heads",
                                   "4",
                                   "--kv-heads",
                                   "2",
                                   "--head-dim",
                                   "16",
                                   "--attention",
                                   "block-sparse",
                                   "--block-size",
                                   "32",
                                   "--pattern",
                                   "local:window=96+global:blocks=1",
                                   "--causal",
                                   "--backward",
                                   "--check",
                                   "--ring-size",
                                   ranks,
                                   "--layout",
                                   layout,
                                   "--iters",
                                   "1",
                                   "--warmup",
                                   "0",
                                   "--json",
                                   "--out",
                                   dir.file("out_" + layout + ".npy"),
                                   "--dq-out",
                                   dir.file("dq_" + layout + ".npy"),
                                   "--dk-out",
                                   dir.file("dk_" + layout + ".npy")});
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

TEST(CliLayout, AnUnknownLayoutIsRefusedNamingTheOption) {
  TempDir dir;
  const CliResult bad =
      run_cli({"run", "--seq-len", "64", "--layout", "nhbd", "--out", dir.file("out.npy")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--layout"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("bhnd"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy"))) << "--out written despite the error";
}

}  // namespace

// `ringattn run --ring-size P` without a launcher (labels `cli`, `ring`): P virtual ranks in
// one process give the golden answers through files, the same output for any P, the same
// report fields as under MPI (bytes sent equal to the minimum, per-rank figures), and the
// failure contract: bad input exits 2 naming the option, an injected fault or a stalled rank
// ends the run promptly with exit 3 naming the rank and step, and no output file appears.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/npy.hpp"
#include "cli_runner.hpp"
#include "golden.hpp"
#include "random.hpp"
#include "ringattn/reference.hpp"

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Callers add --seq-len.
const std::vector<std::string> kSmallRun = {"run", "--heads",   "2", "--head-dim",
                                            "16",  "--threads", "1", "--iters",
                                            "1",   "--warmup",  "0", "--backward"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(CliVirtualRanks, GoldenCasesThroughFilesMatchGoldenOnTwoAndFourRanks) {
  for (const std::string name : {"g01_two_groups", "g02_three_groups_causal", "m02_mixture_causal"})
    for (const char* p : {"2", "4"}) {
      SCOPED_TRACE(name + " --ring-size " + p);
      const auto c = testing::load_golden(name);
      if (c.cfg.shape.seq_len % ((c.cfg.causal ? 2 : 1) * std::stoi(p)) != 0) continue;
      TempDir dir;
      auto args = testing::golden_run_args(c);
      args = with(args, {"--ring-size", p, "--threads", "1", "--iters", "1", "--warmup", "0",
                         "--json", "--out", dir.file("out.npy"), "--dq-out", dir.file("dq.npy"),
                         "--dk-out", dir.file("dk.npy"), "--dv-out", dir.file("dv.npy")});
      const CliResult r = testing::run_cli(args);
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      const auto n = c.out.size();
      for (const auto& [file, want] :
           {std::pair{"out.npy", &c.out}, {"dq.npy", &c.dq}, {"dk.npy", &c.dk}, {"dv.npy", &c.dv}})
        EXPECT_LE(relative_error(read_npy_float(dir.file(file)).data(), want->data(), n), 1e-5)
            << file;
      const auto j = last_line_json(r.out);
      EXPECT_EQ(j["world_size"], std::stoi(p));
      EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]);
      EXPECT_EQ(j["fwd_ranks"].size(), static_cast<std::size_t>(std::stoi(p)));
      EXPECT_EQ(j["bwd_ranks"].size(), static_cast<std::size_t>(std::stoi(p)));
      EXPECT_NE(r.out.find("in-process (" + std::string(p) + " virtual ranks"), std::string::npos)
          << r.out;
    }
}

TEST(CliVirtualRanks, SyntheticRunGivesTheSameOutputForAnyRingSize) {
  std::vector<std::vector<float>> outs;
  for (const char* p : {"1", "2", "3", "4"}) {
    TempDir dir;
    const CliResult r =
        testing::run_cli(with(kSmallRun, {"--seq-len", "384", "--attention", "dilated",
                                          "--segments", "48,384", "--dilations", "1,3", "--causal",
                                          "--ring-size", p, "--out", dir.file("out.npy")}));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    outs.push_back(read_npy_float(dir.file("out.npy")));
  }
  for (std::size_t i = 1; i < outs.size(); ++i)
    EXPECT_LE(relative_error(outs[i].data(), outs[0].data(), outs[0].size()), 1e-6) << i + 1;
}

// Grouped-query attention through files: K/V (and dK/dV) have --kv-heads heads, on one rank
// (the plan) and 2..4 virtual ranks (the ring), checked against float64 by the CLI and here.
TEST(CliVirtualRanks, GroupedQueryAttentionThroughFilesMatchesFloat64OnOneToFourRanks) {
  TempDir dir;
  AttentionConfig cfg;
  cfg.shape = {1, 96, 4, 16};
  cfg.kv_heads = 2;
  cfg.attention = AttentionKind::dilated;
  cfg.combine = Combine::mixture;
  cfg.segments = {24, 96};
  cfg.dilations = {1, 2};
  cfg.causal = true;
  const std::vector<int64_t> q_dims{1, 96, 4, 16}, kv_dims{1, 96, 2, 16};
  const auto q = testing::random_normal(96 * 4 * 16, 1), k = testing::random_normal(96 * 2 * 16, 2),
             v = testing::random_normal(96 * 2 * 16, 3),
             dout = testing::random_normal(96 * 4 * 16, 4);
  write_npy_float_atomic(dir.file("q.npy"), q_dims, q.data());
  write_npy_float_atomic(dir.file("k.npy"), kv_dims, k.data());
  write_npy_float_atomic(dir.file("v.npy"), kv_dims, v.data());
  write_npy_float_atomic(dir.file("dout.npy"), q_dims, dout.data());
  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  const ReferenceGradients g = reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
  for (const char* p : {"1", "2", "3", "4"}) {
    SCOPED_TRACE(std::string("--ring-size ") + p);
    const CliResult r = testing::run_cli({"run",
                                          "--q",
                                          dir.file("q.npy"),
                                          "--k",
                                          dir.file("k.npy"),
                                          "--v",
                                          dir.file("v.npy"),
                                          "--dout",
                                          dir.file("dout.npy"),
                                          "--kv-heads",
                                          "2",
                                          "--attention",
                                          "dilated",
                                          "--combine",
                                          "mixture",
                                          "--segments",
                                          "24,96",
                                          "--dilations",
                                          "1,2",
                                          "--causal",
                                          "--ring-size",
                                          p,
                                          "--threads",
                                          "1",
                                          "--iters",
                                          "1",
                                          "--warmup",
                                          "0",
                                          "--check",
                                          "--json",
                                          "--out",
                                          dir.file("out.npy"),
                                          "--dk-out",
                                          dir.file("dk.npy"),
                                          "--dv-out",
                                          dir.file("dv.npy")});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto j = last_line_json(r.out);
    EXPECT_EQ(j["kv_heads"], 2);
    EXPECT_EQ(j["heads"], 4);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]);
    NpyHeader h;
    const std::vector<float> dk = read_npy_float(dir.file("dk.npy"), &h);
    EXPECT_EQ(h.shape, kv_dims);
    EXPECT_LE(
        relative_error(read_npy_float(dir.file("out.npy")).data(), ref.out.data(), ref.out.size()),
        1e-5);
    EXPECT_LE(relative_error(dk.data(), g.dk.data(), g.dk.size()), 1e-5);
    EXPECT_LE(relative_error(read_npy_float(dir.file("dv.npy")).data(), g.dv.data(), g.dv.size()),
              1e-5);
  }
}

// Values of their own head dim (--head-dim-v, from v.npy's shape) and soft-capped logits
// (--softcap) through files: out and dv of Dv columns, the check passing, the bytes the
// minimum (K rows of D, V rows of Dv), on 1..4 ranks.
TEST(CliVirtualRanks, MlaAndSoftcapThroughFilesMatchFloat64OnOneToFourRanks) {
  TempDir dir;
  AttentionConfig cfg;
  cfg.shape = {1, 96, 4, 24};
  cfg.kv_heads = 2;
  cfg.head_dim_v = 16;
  cfg.causal = true;
  cfg.window_left = 40;
  cfg.softcap = 5;
  const std::vector<int64_t> q_dims{1, 96, 4, 24}, k_dims{1, 96, 2, 24}, v_dims{1, 96, 2, 16},
      o_dims{1, 96, 4, 16};
  const auto q = testing::random_normal(96 * 4 * 24, 1), k = testing::random_normal(96 * 2 * 24, 2),
             v = testing::random_normal(96 * 2 * 16, 3),
             dout = testing::random_normal(96 * 4 * 16, 4);
  write_npy_float_atomic(dir.file("q.npy"), q_dims, q.data());
  write_npy_float_atomic(dir.file("k.npy"), k_dims, k.data());
  write_npy_float_atomic(dir.file("v.npy"), v_dims, v.data());
  write_npy_float_atomic(dir.file("dout.npy"), o_dims, dout.data());
  const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
  const ReferenceGradients g = reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
  for (const char* p : {"1", "2", "3", "4"}) {
    SCOPED_TRACE(std::string("--ring-size ") + p);
    const CliResult r = testing::run_cli(
        {"run", "--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy"),
         "--dout", dir.file("dout.npy"), "--kv-heads", "2", "--head-dim-v", "16", "--causal",
         "--window", "40", "--softcap", "5", "--ring-size", p, "--threads", "1", "--iters", "1",
         "--warmup", "0", "--check", "--json", "--out", dir.file("out.npy"), "--dv-out",
         dir.file("dv.npy"), "--dq-out", dir.file("dq.npy")});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto j = last_line_json(r.out);
    EXPECT_EQ(j["head_dim_v"], 16);
    EXPECT_EQ(j["softcap"], 5.0);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]);
    NpyHeader h;
    const std::vector<float> out = read_npy_float(dir.file("out.npy"), &h);
    EXPECT_EQ(h.shape, o_dims);
    EXPECT_LE(relative_error(out.data(), ref.out.data(), ref.out.size()), 1e-5);
    const std::vector<float> dv = read_npy_float(dir.file("dv.npy"), &h);
    EXPECT_EQ(h.shape, v_dims);
    EXPECT_LE(relative_error(dv.data(), g.dv.data(), g.dv.size()), 1e-5);
    EXPECT_LE(relative_error(read_npy_float(dir.file("dq.npy")).data(), g.dq.data(), g.dq.size()),
              1e-5);
  }
}

// Only K/V heads travel: with H / HKV query heads per K/V head a dense run sends that many
// times fewer bytes than multi-head attention, and the minimum agrees.
TEST(CliVirtualRanks, GroupedQueryAttentionSendsHOverHkvTimesFewerBytes) {
  auto bytes = [](const char* p, const char* kv_heads) {
    std::vector<std::string> args = {
        "run",        "--seq-len",  "256",      "--heads",     "4",
        "--head-dim", "16",         "--causal", "--ring-size", p,
        "--threads",  "1",          "--iters",  "1",           "--warmup",
        "0",          "--backward", "--check",  "--json"};
    if (kv_heads) args.insert(args.end(), {"--kv-heads", kv_heads});
    const CliResult r = testing::run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    const auto j = last_line_json(r.out);
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
    return j["bytes_sent"].get<int64_t>();
  };
  for (const char* p : {"2", "4"}) {
    SCOPED_TRACE(std::string("--ring-size ") + p);
    const int64_t mha = bytes(p, nullptr);
    EXPECT_GT(mha, 0);
    EXPECT_EQ(bytes(p, "2") * 2, mha);
    EXPECT_EQ(bytes(p, "1") * 4, mha);
  }
}

TEST(CliVirtualRanks, UnevenSplitIsBadInputNamingTheOption) {
  TempDir dir;
  const CliResult r = testing::run_cli(
      with(kSmallRun, {"--seq-len", "64", "--ring-size", "3", "--out", dir.file("out.npy")}));
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--seq-len: 64 tokens cannot be split evenly over 3 ranks"),
            std::string::npos)
      << describe(r);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
}

// Ulysses x ring on 8 virtual ranks, with each tensor in its own layout (q head-major, the
// K/V cache token-major, and the reverse), dilated grouped heads across the groups' head
// slices, and block-sparse: the float64 check passes (forward and gradients), and each of
// the all-to-all's and the ring's bytes equals its minimum.
TEST(CliVirtualRanks, UlyssesPassesTheFloat64CheckInEveryLayoutAndKind) {
  const std::vector<std::vector<std::string>> runs = {
      {"--ring-size", "8", "--ulysses", "2", "--heads", "4", "--layout", "bhnd", "--kv-layout",
       "bnhd", "--causal", "--kv-heads", "2"},
      {"--ring-size", "8", "--ulysses", "4", "--heads", "4", "--layout", "bnhd", "--kv-layout",
       "bhnd", "--window", "40,8"},
      {"--ring-size", "6", "--ulysses", "3", "--heads", "6", "--attention", "dilated", "--segments",
       "64,128,384", "--dilations", "1,2,4"},
      {"--ring-size", "8", "--ulysses", "2", "--heads", "4", "--attention", "block-sparse",
       "--block-size", "16", "--pattern", "local:window=32+global:blocks=1", "--causal"},
  };
  for (const auto& extra : runs) {
    std::vector<std::string> args = {"run", "--seq-len",  "384",     "--head-dim", "16", "--batch",
                                     "2",   "--backward", "--check", "--threads",  "1",  "--iters",
                                     "1",   "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = testing::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << j.dump();
    EXPECT_GT(j["ulysses"].get<int>(), 1);
    EXPECT_EQ(j["bytes_sent_a2a"], j["bytes_sent_a2a_min"]);
    EXPECT_EQ(j["bytes_sent_ring"], j["bytes_sent_ring_min"]);
  }
}

TEST(CliVirtualRanks, UlyssesThatCannotSplitIsBadInputNamingTheOption) {
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--ring-size", "4", "--ulysses", "3"}, "--ulysses: 3 does not divide the 4 ranks"},
      {{"--ring-size", "4", "--ulysses", "4"}, "--ulysses: 4 does not divide the 2 heads"},
      {{"--ring-size", "4", "--ulysses", "0"}, "--ulysses: must be a positive integer or auto"},
      {{"--ring-size", "4", "--ulysses", "two"}, "--ulysses: must be a positive integer or auto"},
  };
  for (const auto& [extra, want] : bad) {
    auto args = with(kSmallRun, {"--seq-len", "256", "--out", dir.file("out.npy")});
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = testing::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find(want), std::string::npos) << describe(r);
    EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  }
  const CliResult help = testing::run_cli({"run", "--help"});
  EXPECT_NE(help.out.find("--ulysses"), std::string::npos) << help.out;
}

// --deterministic on the CPU (always bitwise reproducible): the report says so, and two runs
// of a Ulysses x ring job give the same bits.
TEST(CliVirtualRanks, DeterministicRunsGiveTheSameBits) {
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    TempDir dir;
    const CliResult r = testing::run_cli({"run",
                                          "--seq-len",
                                          "256",
                                          "--heads",
                                          "4",
                                          "--head-dim",
                                          "16",
                                          "--causal",
                                          "--backward",
                                          "--ring-size",
                                          "4",
                                          "--ulysses",
                                          "2",
                                          "--threads",
                                          "2",
                                          "--deterministic",
                                          "--json",
                                          "--iters",
                                          "1",
                                          "--warmup",
                                          "0",
                                          "--dq-out",
                                          dir.file("dq.npy")});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_TRUE(last_line_json(r.out).value("deterministic", false));
    runs.push_back(read_npy_float(dir.file("dq.npy")));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(CliVirtualRanks, NegativeRingSizeIsBadInput) {
  const CliResult r = testing::run_cli(with(kSmallRun, {"--seq-len", "256", "--ring-size", "-2"}));
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--ring-size: must be in 0..1024, got -2"), std::string::npos)
      << describe(r);
}

TEST(CliVirtualRanks, InjectedFaultEndsEveryVirtualRankNamingTheRankAndStep) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = testing::run_program(
      RINGATTN_CLI_PATH,
      with(kSmallRun, {"--seq-len", "3072", "--ring-size", "3", "--out", dir.file("out.npy")}),
      {"RINGATTN_FAULT_INJECT=rank=1,step=1"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.err.find("rank 1: error: fault injected at ring step 1"), std::string::npos)
      << describe(r);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(CliVirtualRanks, StalledVirtualRankIsCaughtByTheWatchdogNamingTheStep) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r =
      testing::run_program(RINGATTN_CLI_PATH,
                           with(kSmallRun, {"--seq-len", "256", "--ring-size", "2", "--timeout",
                                            "1", "--out", dir.file("out.npy")}),
                           {"RINGATTN_FAULT_INJECT=rank=1,step=1,mode=stall"});
  const double s = seconds_since(t0);
  std::printf("  stalled virtual rank: run ended after %.2f s, exit %d\n", s, r.exit_code);
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.err.find("rank 0: error: ring step 1 (forward K/V) did not complete within 1 s"),
            std::string::npos)
      << describe(r);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.npy")));
  EXPECT_GE(s, 1.0);
  EXPECT_LT(s, 10.0);
}

}  // namespace
}  // namespace ringattn

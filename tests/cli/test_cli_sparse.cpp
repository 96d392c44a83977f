// `ringattn run --attention block-sparse|auto` through the CLI: golden block masks from files
// (forward and gradients equal the golden answers), generated patterns with --check, the
// written --pattern-out mask, the auto switch, and every kind of bad block-sparse input
// (exit 2, the option or file named, nothing written).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_runner.hpp"
#include "golden.hpp"
#include "random.hpp"
#include "cli/npy.hpp"
#include "ringattn/reference.hpp"

namespace ringattn {
namespace {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;
using testing::CliResult;
using testing::run_cli;
using testing::TempDir;

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout ---\n" + r.out + "--- stderr ---\n" +
         r.err;
}

nlohmann::json last_json(const CliResult& r) {
  const auto pos = r.out.rfind("\n{");
  return nlohmann::json::parse(r.out.substr(pos == std::string::npos ? 0 : pos + 1));
}

void write_mask(const std::string& path, const std::vector<int64_t>& shape,
                const std::vector<uint8_t>& m) {
  AtomicOutputs f;
  f.stage_bool(path, shape, m.data());
  f.commit();
}

TEST(CliSparse, GoldenMasksThroughFilesMatchGolden) {
  for (const std::string& name : testing::golden_case_names("blockmask")) {
    const auto c = testing::load_golden(name);
    TempDir dir;
    Args a = {"run",
              "--q",
              c.dir + "/q.npy",
              "--k",
              c.dir + "/k.npy",
              "--v",
              c.dir + "/v.npy",
              "--dout",
              c.dir + "/dout.npy",
              "--attention",
              "block-sparse",
              "--block-size",
              std::to_string(c.block_size),
              "--block-mask",
              c.dir + "/block_mask.npy",
              "--scale",
              "0.25",
              "--out",
              dir.file("out.npy"),
              "--dq-out",
              dir.file("dq.npy"),
              "--dk-out",
              dir.file("dk.npy"),
              "--dv-out",
              dir.file("dv.npy"),
              "--check",
              "--iters",
              "1",
              "--warmup",
              "0",
              "--json"};
    if (c.cfg.causal) a.push_back("--causal");
    const CliResult r = run_cli(a);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto j = last_json(r);
    EXPECT_TRUE(j["check"]["passed"].get<bool>());
    EXPECT_EQ(j["attention"], "block-sparse");
    const std::pair<const char*, const std::vector<float>*> files[] = {
        {"out.npy", &c.out}, {"dq.npy", &c.dq}, {"dk.npy", &c.dk}, {"dv.npy", &c.dv}};
    for (const auto& [f, want] : files) {
      const auto got = read_npy_float(dir.file(f));
      EXPECT_LE(relative_error(got.data(), want->data(), want->size()), 1e-5) << name << " " << f;
    }
  }
}

TEST(CliSparse, PatternOutWritesTheMaskItRan) {
  TempDir dir;
  const CliResult r = run_cli({"run",
                               "--attention",
                               "block-sparse",
                               "--pattern",
                               "local:window=64+global:blocks=1",
                               "--seq-len",
                               "256",
                               "--heads",
                               "2",
                               "--head-dim",
                               "16",
                               "--block-size",
                               "32",
                               "--pattern-out",
                               dir.file("mask.npy"),
                               "--check",
                               "--backward",
                               "--iters",
                               "1",
                               "--json"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  NpyHeader h;
  const auto m = read_npy_bool(dir.file("mask.npy"), &h);
  ASSERT_EQ(h.shape, (std::vector<int64_t>{2, 8, 8}));
  for (int64_t hh = 0; hh < 2; ++hh)
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 8; ++j)
        EXPECT_EQ(m[static_cast<std::size_t>((hh * 8 + i) * 8 + j)] != 0,
                  std::abs(i - j) <= 1 || i == 0 || j == 0);
  const auto j = last_json(r);
  EXPECT_EQ(j["pattern"], "global:blocks=1+local:window=64");
  EXPECT_NEAR(j["sparsity"].get<double>(), 1.0 - (3 * 8 - 2 + 6 + 6) / 64.0, 1e-12);
  // The written mask run back through --block-mask gives the same answer.
  const CliResult again =
      run_cli({"run", "--attention", "block-sparse", "--block-mask", dir.file("mask.npy"),
               "--seq-len", "256", "--heads", "2", "--head-dim", "16", "--block-size", "32",
               "--check", "--iters", "1", "--json"});
  ASSERT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_EQ(last_json(again)["attended_pairs"], j["attended_pairs"]);
}

TEST(CliSparse, AutoSwitchesPastTheThresholdAndSaysSo) {
  const Args common = {"run",         "--attention", "auto",      "--segments",   "128,256",
                       "--dilations", "1,2",         "--seq-len", "1024",         "--heads",
                       "2",           "--head-dim",  "16",        "--block-size", "64",
                       "--iters",     "1",           "--check",   "--json"};
  Args below = common, above = common;
  below.insert(below.end(), {"--sparse-threshold", "1024"});
  above.insert(above.end(), {"--sparse-threshold", "1023"});
  const CliResult rb = run_cli(below), ra = run_cli(above);
  ASSERT_EQ(rb.exit_code, 0) << describe(rb);
  ASSERT_EQ(ra.exit_code, 0) << describe(ra);
  EXPECT_EQ(last_json(rb)["attention"], "dilated");
  EXPECT_EQ(last_json(ra)["attention"], "block-sparse");
  EXPECT_NE(ra.out.find("> --sparse-threshold 1023: block-sparse"), std::string::npos) << ra.out;
  EXPECT_NE(ra.out.find("sparsity"), std::string::npos);
  EXPECT_EQ(last_json(ra)["pattern"], "dilated-blocks:segments=128/256,dilations=1/2");
}

TEST(CliSparse, VirtualRanksRunTheDistributedPlanExactly) {
  for (const char* p : {"2", "3", "4"}) {
    const CliResult r =
        run_cli({"run",       "--attention",  "block-sparse", "--pattern", "bigbird",
                 "--seq-len", "6144",         "--heads",      "2",         "--head-dim",
                 "32",        "--block-size", "64",           "--causal",  "--ring-size",
                 p,           "--check",      "--backward",   "--iters",   "1",
                 "--json"});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto j = last_json(r);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << "P=" << p;
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]) << "P=" << p;
    EXPECT_GT(j["bytes_sent"].get<int64_t>(), 0) << "P=" << p;
  }
}

// Grouped-query attention, a sliding window and packed sequences together on block-sparse,
// one process and virtual ranks: the float64 check passes (forward and gradients), K/V bytes
// are the minimum, and the JSON reports the layout's imbalance.
TEST(CliSparse, GqaWindowAndPackedSequencesPassTheirCheck) {
  for (const char* p : {"1", "2", "3"}) {
    const CliResult r = run_cli({"run",
                                 "--attention",
                                 "block-sparse",
                                 "--pattern",
                                 "local:window=512+global",
                                 "--seq-len",
                                 "1536",
                                 "--heads",
                                 "4",
                                 "--kv-heads",
                                 "2",
                                 "--head-dim",
                                 "32",
                                 "--block-size",
                                 "64",
                                 "--causal",
                                 "--window",
                                 "200",
                                 "--seqlens",
                                 "1,300,35,900,300",
                                 "--ring-size",
                                 p,
                                 "--check",
                                 "--backward",
                                 "--iters",
                                 "1",
                                 "--json"});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto j = last_json(r);
    EXPECT_TRUE(j["check"]["passed"].get<bool>()) << "P=" << p;
    EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]) << "P=" << p;
    EXPECT_GE(j["imbalance"].get<double>(), 1.0) << "P=" << p;
  }
}

struct Bad {
  Args args;
  std::string subject, problem;
};

TEST(CliSparse, BadInputExits2NamingTheOptionOrFile) {
  TempDir dir;
  const std::vector<int64_t> shape{1, 128, 2, 16};
  std::size_t n = 128 * 2 * 16;
  uint64_t seed = 3;
  for (const char* f : {"q.npy", "k.npy", "v.npy"}) {
    const auto x = testing::random_normal(n, seed++);
    write_npy_float_atomic(dir.file(f), shape, x.data());
  }
  write_mask(dir.file("mask_wrong_nb.npy"), {2, 4, 4}, std::vector<uint8_t>(32, 1));
  write_mask(dir.file("mask_wrong_heads.npy"), {3, 8, 8}, std::vector<uint8_t>(192, 1));
  const std::vector<float> ones(64, 1.0f);
  write_npy_float_atomic(dir.file("mask_float.npy"), {8, 8}, ones.data());
  const Args files = {"run",
                      "--q",
                      dir.file("q.npy"),
                      "--k",
                      dir.file("k.npy"),
                      "--v",
                      dir.file("v.npy"),
                      "--out",
                      dir.file("out.npy"),
                      "--iters",
                      "1"};
  auto with = [&](Args more) {
    Args a = files;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::vector<Bad> cases = {
      {with({"--attention", "block-sparse", "--block-size", "16", "--block-mask",
             dir.file("mask_wrong_nb.npy")}),
       "mask_wrong_nb.npy", "does not match 2 heads and N / block size = 128 / 16 = 8 blocks"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--block-mask",
             dir.file("mask_wrong_heads.npy")}),
       "mask_wrong_heads.npy", "expected [2, 8, 8] or [8, 8]"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--block-mask",
             dir.file("mask_float.npy")}),
       "mask_float.npy", "must be a bool array"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--block-mask",
             dir.file("missing.npy")}),
       "missing.npy", "file is missing"},
      {with({"--attention", "block-sparse", "--block-size", "48", "--pattern", "local"}),
       "--block-size", "does not divide the sequence length 128"},
      {with({"--attention", "block-sparse", "--block-size", "0", "--pattern", "local"}),
       "--block-size", "must be positive"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--pattern", "lokal"}),
       "--pattern", "unknown pattern 'lokal'"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--pattern", "random:blocks=9"}),
       "--pattern", "out of range 1..8"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--pattern", "local:size=3"}),
       "--pattern", "unknown parameter 'size'"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--pattern", "dilated-blocks"}),
       "--pattern", "needs segments and dilations"},
      {with({"--attention", "block-sparse", "--block-size", "16"}), "--pattern", "needs a pattern"},
      {with({"--attention", "block-sparse", "--pattern", "local", "--block-mask",
             dir.file("mask_float.npy")}),
       "--block-mask", "not both"},
      {with({"--attention", "dense", "--pattern", "local"}), "--pattern",
       "only applies to --attention block-sparse"},
      {with({"--attention", "dilated", "--segments", "64", "--dilations", "1", "--block-size",
             "16"}),
       "--block-size", "only applies"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--pattern", "local",
             "--segments", "64", "--dilations", "1"}),
       "--segments", "only used by the dilated-blocks pattern"},
      {with({"--attention", "auto", "--sparse-threshold", "64"}), "--attention",
       "give --segments and --dilations"},
      {with({"--attention", "auto", "--pattern", "local"}), "--pattern", "not used by"},
      {with({"--attention", "dense", "--sparse-threshold", "64"}), "--sparse-threshold",
       "only applies to --attention auto"},
      {with({"--attention", "block-sparse", "--block-size", "16", "--pattern", "local",
             "--pattern-out", dir.file("nodir/mask.npy")}),
       "--pattern-out", ""},
  };
  for (const Bad& b : cases) {
    std::set<std::string> before;
    for (const auto& e : fs::directory_iterator(dir.path())) before.insert(e.path().string());
    const CliResult r = run_cli(b.args);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find(b.subject), std::string::npos) << describe(r);
    EXPECT_NE(r.err.find(b.problem), std::string::npos) << describe(r);
    std::set<std::string> after;
    for (const auto& e : fs::directory_iterator(dir.path())) after.insert(e.path().string());
    EXPECT_EQ(before, after) << "files changed for: " << r.err;
  }
}

}  // namespace
}  // namespace ringattn

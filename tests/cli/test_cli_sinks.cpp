// `ringattn run --sinks FILE`: attention sinks through the CLI, checked against the float64
// reference (--check compares out, lse, the gradients and dsinks) on one process, on virtual
// ranks and in block-sparse mode; --dsinks-out writes the same gradient for any rank count;
// a bad sinks file, or sinks with dilated attention, exits 2 naming the option with no
// output file.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/npy.hpp"
#include "cli_runner.hpp"

namespace {

using ringattn::testing::CliResult;
using ringattn::testing::run_cli;
using ringattn::testing::TempDir;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout ---\n" + r.out + "--- stderr ---\n" +
         r.err;
}

nlohmann::json last_line_json(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto nl = text.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? text : text.substr(nl + 1));
}

void write_sinks(const std::string& path, const std::vector<float>& values,
                 std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  ringattn::write_npy_float_atomic(path, shape, values.data());
}

const std::vector<float> kSinks = {1.5f, -0.5f, -std::numeric_limits<float>::infinity(), 0.25f};

Args base(const TempDir& dir, const std::string& attention = "dense") {
  Args a = {"run",     "--batch",         "1",          "--seq-len",   "96",      "--heads",
            "4",       "--head-dim",      "16",         "--attention", attention, "--causal",
            "--sinks", dir.file("s.npy"), "--backward", "--check",     "--json",  "--iters",
            "1",       "--warmup",        "0"};
  if (attention == "block-sparse")
    a.insert(a.end(), {"--block-size", "8", "--pattern", "local:window=16+global:blocks=1"});
  return a;
}

TEST(CliSinks, ChecksAgainstTheFloat64ReferenceOnOneAndSeveralRanksAndBlockSparse) {
  TempDir dir;
  write_sinks(dir.file("s.npy"), kSinks);
  std::vector<std::vector<float>> dsinks;
  for (const auto& [attention, ranks] : {std::pair<std::string, std::string>{"dense", "1"},
                                         {"dense", "3"},
                                         {"block-sparse", "1"},
                                         {"block-sparse", "2"}}) {
    const std::string out = dir.file("ds_" + attention + ranks + ".npy");
    Args a = base(dir, attention);
    a.insert(a.end(), {"--ring-size", ranks, "--dsinks-out", out});
    const CliResult r = run_cli(a);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    ASSERT_TRUE(j["check"]["passed"].get<bool>()) << r.out;
    ASSERT_TRUE(j["check"].contains("dsinks")) << r.out;
    EXPECT_LE(j["check"]["dsinks"].get<double>(), 1e-5) << attention << " P=" << ranks;
    EXPECT_LE(j["check"]["lse"].get<double>(), 1e-5) << attention << " P=" << ranks;
    if (attention == "dense") dsinks.push_back(ringattn::read_npy_float(out));
  }
  ASSERT_EQ(dsinks.size(), 2u);
  ASSERT_EQ(dsinks[0].size(), kSinks.size());
  for (std::size_t h = 0; h < kSinks.size(); ++h)
    EXPECT_NEAR(dsinks[1][h], dsinks[0][h], 1e-5 * (1 + std::abs(dsinks[0][h]))) << h;
  EXPECT_EQ(dsinks[0][2], 0.0f) << "no sink (-inf), no gradient";
}

// exit 2, the option named with the problem, and nothing written.
void expect_refused(const TempDir& dir, Args args, const std::string& subject,
                    const std::string& problem) {
  args.insert(args.end(), {"--out", dir.file("out.npy")});
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find(subject), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find(problem), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(dir.file("out.npy")));
}

TEST(CliSinks, ABadSinksFileIsRefusedNamingSinks) {
  TempDir dir;
  write_sinks(dir.file("s.npy"), {0.f, 1.f, 2.f});  // three heads of four
  expect_refused(dir, base(dir), "--sinks", "must have shape [4]");
  write_sinks(dir.file("s.npy"), {0.f, 1.f, 2.f, 3.f}, {2, 2});
  expect_refused(dir, base(dir), "--sinks", "must have shape [4]");
  write_sinks(dir.file("s.npy"), {0.f, std::nanf(""), 2.f, 3.f});
  expect_refused(dir, base(dir), "--sinks", "NaN");
  write_sinks(dir.file("s.npy"), {0.f, std::numeric_limits<float>::infinity(), 2.f, 3.f});
  expect_refused(dir, base(dir), "--sinks", "+inf");
  Args missing = base(dir);
  missing[13] = dir.file("missing.npy");
  expect_refused(dir, missing, "--sinks", "missing.npy");
}

TEST(CliSinks, DilatedAttentionAndAGradientWithoutSinksAreRefusedByName) {
  TempDir dir;
  write_sinks(dir.file("s.npy"), kSinks);
  Args dilated = base(dir, "dilated");
  dilated.insert(dilated.end(), {"--segments", "48,96", "--dilations", "1,2"});
  expect_refused(dir, dilated, "--sinks", "--attention");
  expect_refused(dir,
                 {"run", "--seq-len", "64", "--heads", "4", "--head-dim", "16", "--backward",
                  "--dsinks-out", dir.file("ds.npy")},
                 "--dsinks-out", "--sinks");
}

}  // namespace

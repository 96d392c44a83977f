// Progress on stderr (labels `cli`, `ring`): --progress writes whole lines naming the phase
// and the ring step when stderr is not a terminal, --quiet writes nothing, stdout (and its
// --json object) is the same with or without progress, and the two options exclude each
// other. RINGATTN_PROGRESS_INTERVAL=0 asks for a line at every change, so that a run of
// milliseconds shows every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.hpp"

namespace ringattn {
namespace {

using testing::CliResult;

const std::vector<std::string> kRing3 = {
    "run", "--seq-len", "96", "--heads",  "2", "--head-dim", "16",          "--threads",
    "1",   "--iters",   "1",  "--warmup", "1", "--backward", "--ring-size", "3"};
const std::vector<std::string> kEveryChange = {"RINGATTN_PROGRESS_INTERVAL=0"};

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout ---\n" + r.out + "--- stderr ---\n" +
         r.err;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

nlohmann::json last_line_json(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto nl = text.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? text : text.substr(nl + 1));
}

TEST(CliProgress, ProgressIntoAPipeWritesLinesNamingPhaseAndRingStep) {
  const CliResult r = testing::run_cli(with(kRing3, {"--progress"}), kEveryChange);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  for (const char* want : {"ringattn: forward, iteration 1/2 (warmup), ring step 2/3",
                           "ringattn: backward, iteration 2/2, ring step 3/3", "elapsed 0:0"})
    EXPECT_NE(r.err.find(want), std::string::npos) << want << "\n" << r.err;
  // Every line is a progress line; once a call has finished, the time left is estimated.
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);)
    EXPECT_EQ(line.rfind("ringattn: ", 0), 0u) << line;
  EXPECT_NE(r.err.find(" left"), std::string::npos) << r.err;
}

TEST(CliProgress, ProgressNamesTheCheckPhaseAndBlockSparseSteps) {
  const CliResult r = testing::run_cli({"run",
                                        "--attention",
                                        "block-sparse",
                                        "--pattern",
                                        "global:blocks=1",
                                        "--block-size",
                                        "16",
                                        "--seq-len",
                                        "64",
                                        "--heads",
                                        "2",
                                        "--head-dim",
                                        "16",
                                        "--threads",
                                        "1",
                                        "--iters",
                                        "1",
                                        "--warmup",
                                        "0",
                                        "--ring-size",
                                        "2",
                                        "--check",
                                        "--progress"},
                                       kEveryChange);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* want : {"ringattn: forward, iteration 1/1, ring step 1/2", "ringattn: check"})
    EXPECT_NE(r.err.find(want), std::string::npos) << want << "\n" << r.err;
}

TEST(CliProgress, QuietWritesNothingToStderr) {
  const CliResult r = testing::run_cli(with(kRing3, {"--quiet"}), kEveryChange);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.err, "");
}

TEST(CliProgress, WithoutATerminalOrProgressStderrStaysEmpty) {
  const CliResult r = testing::run_cli(kRing3, kEveryChange);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.err, "");
}

TEST(CliProgress, JsonOnStdoutIsTheSameObjectWithOrWithoutProgress) {
  const CliResult plain = testing::run_cli(with(kRing3, {"--json"}), kEveryChange);
  const CliResult prog = testing::run_cli(with(kRing3, {"--json", "--progress"}), kEveryChange);
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  ASSERT_EQ(prog.exit_code, 0) << describe(prog);
  EXPECT_EQ(prog.out.find("iteration"), std::string::npos) << prog.out;
  const auto a = last_line_json(plain.out), b = last_line_json(prog.out);
  ASSERT_TRUE(a.is_object());
  ASSERT_TRUE(b.is_object());
  // Same keys, and the same values wherever they are not timings or memory figures.
  std::vector<std::string> ka, kb;
  for (const auto& [k, v] : a.items()) ka.push_back(k);
  for (const auto& [k, v] : b.items()) kb.push_back(k);
  EXPECT_EQ(ka, kb);
  for (const char* k : {"world_size", "bytes_sent", "bytes_sent_min", "attended_pairs"})
    EXPECT_EQ(a.value(k, nlohmann::json()), b.value(k, nlohmann::json())) << k;
  // The human table above it has as many lines.
  EXPECT_EQ(std::count(plain.out.begin(), plain.out.end(), '\n'),
            std::count(prog.out.begin(), prog.out.end(), '\n'));
}

TEST(CliProgress, ProgressAndQuietTogetherAreBadInputNamingBoth) {
  const CliResult r = testing::run_cli(with(kRing3, {"--progress", "--quiet"}));
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--progress"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--quiet"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace ringattn

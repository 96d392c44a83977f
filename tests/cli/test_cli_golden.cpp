// End-to-end tests of `ringattn run` on good input: every grouped/mixture golden case through
// the CLI (files in, files out, JSON report), plus help/version, --check, --config files and
// float16 inputs. Bad input is covered by test_cli_bad_input.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "golden.hpp"
#include "random.hpp"
#include "cli/npy.hpp"
#include "ringattn/reference.hpp"

using ringattn::testing::CliResult;
using ringattn::testing::GoldenCase;
using ringattn::testing::run_cli;
using ringattn::testing::TempDir;

namespace {

constexpr double kTolerance = 1e-5;  // the golden README's acceptance bound

// Full diagnostics on failure: a CLI test that only says "exit 2 != 0" is useless.
std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) +
         "\n--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err;
}

// The JSON report is promised as the last stdout line; the table comes before it.
nlohmann::json last_line_json(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const auto nl = text.rfind('\n');
  const std::string line = nl == std::string::npos ? text : text.substr(nl + 1);
  return nlohmann::json::parse(line);  // throws (and fails the test) when not JSON
}

// Prints the error so the log shows how close the CLI lands, not just pass/fail.
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = ringattn::relative_error(got.data(), want.data(), got.size());
  std::printf("    %-32s rel err %.3e\n", what.c_str(), err);
  // run_cli forks: anything left in our stdio buffer would be flushed again by the child.
  std::fflush(stdout);
  EXPECT_LE(err, kTolerance) << what;
}

// Runs one golden case through the CLI and compares every written file with the answer.
void check_golden_case(const std::string& name) {
  SCOPED_TRACE(name);
  const GoldenCase c = ringattn::testing::load_golden(name);
  const auto& s = c.cfg.shape;
  TempDir tmp;
  std::vector<std::string> args = ringattn::testing::golden_run_args(c);
  args.insert(args.end(), {"--out", tmp.file("out.npy"), "--dq-out", tmp.file("dq.npy"), "--dk-out",
                           tmp.file("dk.npy"), "--dv-out", tmp.file("dv.npy"), "--lse-out",
                           tmp.file("lse.npy"), "--iters", "1", "--warmup", "0", "--json"});
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  ASSERT_EQ(r.signal, 0);

  const std::vector<int64_t> dims4{s.batch, s.seq_len, s.heads, s.head_dim};
  const std::pair<const char*, const std::vector<float>*> tensors[] = {
      {"out.npy", &c.out}, {"dq.npy", &c.dq}, {"dk.npy", &c.dk}, {"dv.npy", &c.dv}};
  for (const auto& [file, want] : tensors) {
    ringattn::NpyHeader h;
    const std::vector<float> got = ringattn::read_npy_float(tmp.file(file), &h);
    EXPECT_EQ(h.shape, dims4) << file;
    expect_close(name + "/" + file, got, *want);
  }
  ringattn::NpyHeader lse_header;
  const std::vector<float> lse = ringattn::read_npy_float(tmp.file("lse.npy"), &lse_header);
  EXPECT_EQ(lse_header.shape, (std::vector<int64_t>{s.batch, s.heads, s.seq_len}));
  EXPECT_EQ(lse.size(), static_cast<std::size_t>(s.batch * s.heads * s.seq_len));

  const nlohmann::json j = last_line_json(r.out);
  for (const char* key :
       {"seq_len", "batch", "heads", "kv_heads", "head_dim", "attention", "world_size", "device",
        "fwd_ms", "bwd_ms", "fwd_gflops", "peak_bytes", "bytes_sent"})
    EXPECT_TRUE(j.contains(key)) << "JSON lacks '" << key << "': " << j.dump();
  EXPECT_EQ(j.value("seq_len", -1), s.seq_len);
  EXPECT_EQ(j.value("batch", -1), s.batch);
  EXPECT_EQ(j.value("heads", -1), s.heads);
  EXPECT_EQ(j.value("kv_heads", -1), s.heads);  // default: multi-head
  EXPECT_EQ(j.value("head_dim", -1), s.head_dim);
  EXPECT_EQ(j.value("attention", ""), "dilated");
  EXPECT_EQ(j.value("combine", ""), c.mode);
  EXPECT_EQ(j.value("causal", !c.cfg.causal), c.cfg.causal);
  EXPECT_EQ(j.value("world_size", -1), 1);
  EXPECT_EQ(j.value("device", ""), "cpu");
  EXPECT_EQ(j.value("bytes_sent", -1), 0);
  EXPECT_GE(j.value("fwd_ms", -1.0), 0.0);
  EXPECT_GE(j.value("bwd_ms", -1.0), 0.0);
  EXPECT_GE(j.value("fwd_gflops", -1.0), 0.0);
  EXPECT_GT(j.value("peak_bytes", int64_t{0}), 0);
}

// A hand-made float16 .npy (the library only writes float32).
void write_npy_half(const std::string& path, const std::vector<int64_t>& shape,
                    const std::vector<float>& values) {
  std::string dims;
  for (auto d : shape) dims += std::to_string(d) + ", ";
  const std::string dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t padding = (64 - (10 + dict.size() + 1) % 64) % 64;
  const std::size_t header_len = dict.size() + padding + 1;
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header_len & 0xff);
  bytes += static_cast<char>(header_len >> 8);
  bytes += dict + std::string(padding, ' ') + "\n";
  for (float v : values) {
    const uint16_t h = ringattn::float_to_half(v);
    bytes += static_cast<char>(h & 0xff);
    bytes += static_cast<char>(h >> 8);
  }
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// --window on one process: checked against the float64 reference, forward and backward,
// and reported in --json as [L, R] with R in effect (0 under causal), null without.
TEST(CliWindow, RunsCheckedAndReportsTheWindow) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<int64_t>>> cases = {
      {{"--window", "5,3"}, {5, 3}},
      {{"--window", "7"}, {7, 7}},
      {{"--window", "6", "--causal"}, {6, 0}},
      {{"--window", "0", "--kv-heads", "1"}, {0, 0}},
      {{"--window", "500,0", "--kv-heads", "2"}, {500, 0}}};
  for (const auto& [extra, want] : cases) {
    std::vector<std::string> args{"run",        "--seq-len", "96",      "--heads",    "4",
                                  "--head-dim", "16",        "--check", "--backward", "--iters",
                                  "1",          "--warmup",  "0",       "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    EXPECT_EQ(j["window"].get<std::vector<int64_t>>(), want) << r.out;
    EXPECT_TRUE(j["check"].value("passed", false)) << r.out;
  }
  const CliResult dense = run_cli({"run", "--seq-len", "64", "--heads", "2", "--head-dim", "16",
                                   "--iters", "1", "--warmup", "0", "--json"});
  ASSERT_EQ(dense.exit_code, 0) << describe(dense);
  EXPECT_TRUE(last_line_json(dense.out)["window"].is_null());
}

// Packed sequences: --seqlens and an int32 --cu-seqlens file give the same bits, checked
// against float64 on one process and on 3 virtual ranks (bytes equal the minimum); --json
// reports the documents, the layout and the imbalance.
TEST(CliPacked, SeqlensAndCuSeqlensRunCheckedAndAgree) {
  TempDir tmp;
  const std::string cu = tmp.file("cu.npy");
  {
    const std::vector<int32_t> offsets{0, 1, 40, 41, 150, 168};
    const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }";
    const std::size_t padding = (64 - (10 + dict.size() + 1) % 64) % 64;
    const std::size_t header_len = dict.size() + padding + 1;
    std::string bytes("\x93NUMPY\x01\x00", 8);
    bytes += static_cast<char>(header_len & 0xff);
    bytes += static_cast<char>(header_len >> 8);
    bytes += dict + std::string(padding, ' ') + "\n";
    bytes.append(reinterpret_cast<const char*>(offsets.data()), offsets.size() * sizeof(int32_t));
    std::ofstream(cu, std::ios::binary) << bytes;
  }
  for (const char* ring : {"1", "3"})
    for (bool causal : {false, true}) {
      std::vector<std::string> base{
          "run", "--seq-len",  "168", "--heads", "4",           "--kv-heads",
          "2",   "--head-dim", "16",  "--check", "--backward",  "--iters",
          "1",   "--warmup",   "0",   "--json",  "--ring-size", ring};
      if (causal) base.push_back("--causal");
      std::vector<std::string> by_list = base, by_file = base;
      by_list.insert(by_list.end(), {"--seqlens", "1,39,1,109,18", "--out", tmp.file("a.npy")});
      by_file.insert(by_file.end(), {"--cu-seqlens", cu, "--out", tmp.file("b.npy")});
      const CliResult a = run_cli(by_list), b = run_cli(by_file);
      ASSERT_EQ(a.exit_code, 0) << describe(a);
      ASSERT_EQ(b.exit_code, 0) << describe(b);
      const nlohmann::json j = last_line_json(a.out);
      EXPECT_TRUE(j["check"].value("passed", false)) << a.out;
      EXPECT_EQ(j["documents"], 5) << a.out;
      EXPECT_EQ(j["bytes_sent"], j["bytes_sent_min"]) << a.out;
      EXPECT_GE(j["imbalance"].get<double>(), 1.0);
      EXPECT_TRUE(j.contains("layout"));
      EXPECT_EQ(read_bytes(tmp.file("a.npy")), read_bytes(tmp.file("b.npy")))
          << "ring " << ring << (causal ? " causal" : "");
    }
}

}  // namespace

TEST(CliGolden, GroupedCasesMatchGoldenOutputsGradientsAndReportJson) {
  const auto names = ringattn::testing::golden_case_names("grouped");
  ASSERT_FALSE(names.empty()) << "no grouped golden cases under "
                              << ringattn::testing::golden_dir();
  for (const auto& name : names) check_golden_case(name);
}

TEST(CliGolden, MixtureCasesMatchGoldenOutputsGradientsAndReportJson) {
  const auto names = ringattn::testing::golden_case_names("mixture");
  ASSERT_FALSE(names.empty()) << "no mixture golden cases under "
                              << ringattn::testing::golden_dir();
  for (const auto& name : names) check_golden_case(name);
}

TEST(CliGolden, RunHelpExitsZeroAndListsTheRunOptions) {
  const CliResult r = run_cli({"run", "--help"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  for (const char* opt :
       {"--segments", "--dilations", "--combine", "--kv-heads", "--out", "--config"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt << " missing from help:\n" << r.out;
}

TEST(CliGolden, TopLevelHelpExitsZeroAndShowsUsage) {
  const CliResult r = run_cli({"--help"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("usage"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run"), std::string::npos) << r.out;
}

TEST(CliGolden, VersionPrintsTheBuildVersion) {
  const CliResult r = run_cli({"--version"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find(RINGATTN_VERSION), std::string::npos) << r.out;
}

TEST(CliGolden, CheckOnSmallSyntheticDilatedCausalProblemPasses) {
  const CliResult r = run_cli({"run",        "--seq-len",   "64",          "--heads",  "4",
                               "--head-dim", "16",          "--attention", "dilated",  "--segments",
                               "16,32",      "--dilations", "1,2",         "--causal", "--backward",
                               "--check",    "--iters",     "1",           "--warmup", "0"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  // "-> OK" rather than "OK": the failure text "NOT OK" contains "OK" too.
  EXPECT_NE(r.out.find("-> OK"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("NOT OK"), std::string::npos) << r.out;
}

TEST(CliGolden, ConfigFileSuppliesOptionsAndTheCommandLineOverridesIt) {
  TempDir tmp;
  const std::string cfg = tmp.file("run.cfg");
  // `attention` has a built-in default; the file must still replace it.
  std::ofstream(cfg) << "# a comment line\n"
                        "seq-len = 128\n"
                        "heads = 4\n"
                        "head-dim = 16\n"
                        "attention = dilated\n"
                        "combine = mixture\n"
                        "segments = 32,64\n"
                        "dilations = 1,2\n"
                        "iters = 1\n"
                        "warmup = 0\n";
  {
    const CliResult r = run_cli({"run", "--config", cfg, "--json"});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    EXPECT_EQ(j.value("seq_len", -1), 128);
    EXPECT_EQ(j.value("heads", -1), 4);
    EXPECT_EQ(j.value("head_dim", -1), 16);
    EXPECT_EQ(j.value("attention", ""), "dilated");
    EXPECT_EQ(j.value("combine", ""), "mixture");
    EXPECT_EQ(j.value("segments", std::vector<int64_t>{}), (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(j.value("iters", -1), 1);
  }
  {
    // Command line wins over the file, for plain values and for lists alike.
    const CliResult r =
        run_cli({"run", "--config", cfg, "--seq-len", "64", "--segments", "16,32", "--json"});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const nlohmann::json j = last_line_json(r.out);
    EXPECT_EQ(j.value("seq_len", -1), 64);
    EXPECT_EQ(j.value("segments", std::vector<int64_t>{}), (std::vector<int64_t>{16, 32}));
    EXPECT_EQ(j.value("heads", -1), 4);  // still from the file
  }
}

TEST(CliGolden, Float16InputsGiveTheSameResultAsFloat32InputsOfTheRoundedValues) {
  TempDir tmp;
  const std::vector<int64_t> shape{1, 64, 4, 16};
  const std::size_t n = 64 * 4 * 16;
  std::vector<std::string> f16_args = {"run"}, f32_args = {"run"};
  uint64_t seed = 77;
  for (const char* name : {"q", "k", "v", "dout"}) {
    const std::vector<float> raw = ringattn::testing::random_normal(n, seed++);
    std::vector<float> rounded(n);
    for (std::size_t i = 0; i < n; ++i)
      rounded[i] = ringattn::half_to_float(ringattn::float_to_half(raw[i]));
    const std::string h = tmp.file(std::string(name) + "16.npy");
    const std::string f = tmp.file(std::string(name) + "32.npy");
    write_npy_half(h, shape, raw);
    ringattn::write_npy_float_atomic(f, shape, rounded.data());
    f16_args.insert(f16_args.end(), {std::string("--") + name, h});
    f32_args.insert(f32_args.end(), {std::string("--") + name, f});
  }
  // One thread, so both runs take the identical arithmetic path and must agree bit for bit.
  const std::vector<std::string> common = {
      "--attention", "dilated", "--segments", "16,32", "--dilations", "1,2", "--causal",
      "--threads",   "1",       "--iters",    "1",     "--warmup",    "0"};
  const std::pair<const char*, const char*> outputs[] = {{"--out", "out"},
                                                         {"--lse-out", "lse"},
                                                         {"--dq-out", "dq"},
                                                         {"--dk-out", "dk"},
                                                         {"--dv-out", "dv"}};
  for (const auto& [option, stem] : outputs) {
    f16_args.insert(f16_args.end(), {option, tmp.file(std::string(stem) + "_from16.npy")});
    f32_args.insert(f32_args.end(), {option, tmp.file(std::string(stem) + "_from32.npy")});
  }
  for (auto* args : {&f16_args, &f32_args}) args->insert(args->end(), common.begin(), common.end());
  const CliResult r16 = run_cli(f16_args);
  ASSERT_EQ(r16.exit_code, 0) << describe(r16);
  const CliResult r32 = run_cli(f32_args);
  ASSERT_EQ(r32.exit_code, 0) << describe(r32);
  for (const auto& [option, stem] : outputs) {
    const std::string a = read_bytes(tmp.file(std::string(stem) + "_from16.npy"));
    const std::string b = read_bytes(tmp.file(std::string(stem) + "_from32.npy"));
    EXPECT_GT(a.size(), 128u) << option << " wrote no data";
    EXPECT_TRUE(a == b) << option << ": float16 and float32 inputs gave different files";
  }
}

// `ringattn run` on bad input: every case must exit 2 (no signal), say on stderr which option
// or file is wrong and what is wrong, and leave the --out directory exactly as it was (no
// output file, no temp file). Good input is covered by test_cli_golden.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cli/npy.hpp"
#include "cli_runner.hpp"
#include "random.hpp"
#include "single/cuda_plan.hpp"

using ringattn::testing::CliResult;
using ringattn::testing::run_cli;
using ringattn::testing::TempDir;

namespace {

namespace fs = std::filesystem;

using Args = std::vector<std::string>;

const std::vector<int64_t> kShape{1, 64, 4, 16};  // [B, N, H, D]: small, so runs are instant
constexpr std::size_t kCount = 64 * 4 * 16;

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) +
         "\n--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err;
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// The contract for every bad input: exit 2, no crash, a message naming `subject` (option or
// file) that contains `problem`, and the directory of --out untouched. Returns the run for
// further checks.
CliResult expect_bad_input(const TempDir& dir, const Args& args, const std::string& subject,
                           const std::string& problem) {
  const std::set<std::string> before = listing(dir.path());
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.signal, 0) << describe(r);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find(subject), std::string::npos) << "stderr does not name '" << subject << "'\n"
                                                    << describe(r);
  EXPECT_NE(r.err.find(problem), std::string::npos) << "stderr does not say '" << problem << "'\n"
                                                    << describe(r);
  EXPECT_FALSE(fs::exists(dir.file("out.npy"))) << "--out was written despite the error";
  EXPECT_EQ(listing(dir.path()), before) << "files appeared or vanished in " << dir.path();
  return r;
}

// Raw .npy bytes with any header dict (padded as the spec says) and any payload.
std::string npy_bytes(const std::string& dict, const std::string& payload) {
  const std::size_t padding = (64 - (10 + dict.size() + 1) % 64) % 64;
  const std::size_t header_len = dict.size() + padding + 1;
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header_len & 0xff);
  bytes += static_cast<char>(header_len >> 8);
  return bytes + dict + std::string(padding, ' ') + "\n" + payload;
}

std::string dict_for(const std::string& descr, const std::string& shape,
                     const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

void write_float32(const std::string& path, const std::vector<int64_t>& shape, uint64_t seed) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  const std::vector<float> values = ringattn::testing::random_normal(n, seed);
  ringattn::write_npy_float_atomic(path, shape, values.data());
}

// Valid q, k, v and dout of kShape in `dir`.
void write_inputs(const TempDir& dir) {
  uint64_t seed = 11;
  for (const char* name : {"q.npy", "k.npy", "v.npy", "dout.npy"})
    write_float32(dir.file(name), kShape, seed++);
}

// A run over dir's q/k/v writing dir/out.npy (or `out`); tests append the rest. Boost
// rejects a repeated option, so the few values tests need to vary are parameters.
struct Base {
  std::string out;  // empty: dir/out.npy
  std::string attention = "dilated";
  std::string iters = "1";
};
Args base_args(const TempDir& dir, const Base& b = {}) {
  return {"run",
          "--q",
          dir.file("q.npy"),
          "--k",
          dir.file("k.npy"),
          "--v",
          dir.file("v.npy"),
          "--attention",
          b.attention,
          "--iters",
          b.iters,
          "--warmup",
          "0",
          "--out",
          b.out.empty() ? dir.file("out.npy") : b.out};
}

Args with(Args args, const Args& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

const Args kPattern = {"--segments", "16,32", "--dilations", "1,2"};

// q, k and v of `shape` (zero-filled float32) in `dir`.
void write_inputs_of_shape(const TempDir& dir, const std::vector<int64_t>& shape) {
  std::string dims;
  std::size_t count = 1;
  for (const int64_t d : shape) {
    dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    count *= static_cast<std::size_t>(d);
  }
  const std::string bytes =
      npy_bytes(dict_for("<f4", "(" + dims + ")"), std::string(count * 4, '\0'));
  for (const char* name : {"q.npy", "k.npy", "v.npy"}) write_bytes(dir.file(name), bytes);
}

void expect_shape_file_blamed(const std::vector<int64_t>& shape, const std::string& problem,
                              const Args& more = {}) {
  TempDir dir;
  write_inputs_of_shape(dir, shape);
  Base dense;
  dense.attention = "dense";
  const CliResult r = expect_bad_input(dir, with(base_args(dir, dense), more),
                                       "--q (" + dir.file("q.npy") + "): ", problem);
  for (const char* option : {"--batch", "--seq-len", "--heads", "--head-dim"})
    EXPECT_EQ(r.err.find(option), std::string::npos) << "blames " << option << "\n" << describe(r);
}

// Exactly one line on stderr, with no control byte (< 0x20, 0x7f) before its newline.
void expect_one_printable_line(const CliResult& r) {
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << describe(r);
  for (std::size_t i = 0; i + 1 < r.err.size(); ++i) {
    const auto c = static_cast<unsigned char>(r.err[i]);
    EXPECT_TRUE(c >= 0x20 && c != 0x7f) << "byte " << static_cast<int>(c) << " at " << i;
  }
}

}  // namespace

// The inputs themselves are fine: otherwise every "bad" case below could pass by accident.
TEST(CliBadInput, BaselineRunOnTheSameInputsSucceeds) {
  TempDir dir;
  write_inputs(dir);
  const CliResult r = run_cli(
      with(base_args(dir),
           with(kPattern, {"--dout", dir.file("dout.npy"), "--dq-out", dir.file("dq.npy")})));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(fs::exists(dir.file("out.npy")));
  EXPECT_TRUE(fs::exists(dir.file("dq.npy")));
}

// ---- pattern options -------------------------------------------------------------------

TEST(CliBadInput, SegmentsAndDilationsOfDifferentLengthsAreRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "16,32", "--dilations", "1"}),
                   "--segments", "must pair up");
}

TEST(CliBadInput, EmptySegmentListIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "", "--dilations", "1"}), "--segments",
                   "empty");
}

TEST(CliBadInput, ZeroSegmentIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "0,32", "--dilations", "1,2"}),
                   "--segments", "segment 0 is 0; must be positive");
}

TEST(CliBadInput, NegativeSegmentIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "16,-32", "--dilations", "1,2"}),
                   "--segments", "segment 1 is -32; must be positive");
}

TEST(CliBadInput, ZeroDilationIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "16,32", "--dilations", "1,0"}),
                   "--dilations", "dilation 1 is 0; must be positive");
}

TEST(CliBadInput, NegativeDilationIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "16,32", "--dilations", "-1,2"}),
                   "--dilations", "dilation 0 is -1; must be positive");
}

TEST(CliBadInput, SegmentThatDoesNotDivideSequenceLengthIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "16,24", "--dilations", "1,2"}),
                   "--segments", "24 does not divide the sequence length 64");
}

TEST(CliBadInput, NonIntegerInSegmentListIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), {"--segments", "1,x", "--dilations", "1,2"}),
                   "--segments", "'x' in '1,x' is not an integer");
}

TEST(CliBadInput, FewerHeadsThanGroupsIsRejectedForGroupedCombine) {
  TempDir dir;
  for (const char* name : {"q.npy", "k.npy", "v.npy"})
    write_float32(dir.file(name), {1, 64, 2, 16}, 5);
  // The heads came from the files, not from --heads, so the message names the file.
  const CliResult r = expect_bad_input(
      dir,
      with(base_args(dir),
           {"--combine", "grouped", "--segments", "16,32,64", "--dilations", "1,2,4"}),
      "--q (" + dir.file("q.npy") + "): heads (dim 2): ", "2 heads cannot be split into 3 groups");
  EXPECT_EQ(r.err.find("--heads"), std::string::npos) << describe(r);
}

TEST(CliBadInput, UnknownAttentionValueIsRejected) {
  TempDir dir;
  write_inputs(dir);
  Base b;
  b.attention = "sparse";
  expect_bad_input(dir, with(base_args(dir, b), kPattern), "--attention", "unknown value 'sparse'");
}

TEST(CliBadInput, UnknownCombineValueIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--combine", "average"})), "--combine",
                   "unknown value 'average'");
}

// ---- shapes ----------------------------------------------------------------------------

TEST(CliBadInput, KeysOfADifferentShapeThanQueriesAreRejected) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("k.npy"), {1, 64, 4, 8}, 3);
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"), "differs from --q's");
}

TEST(CliBadInput, ValuesOfADifferentShapeThanQueriesAreRejected) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("v.npy"), {1, 32, 4, 16}, 3);
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("v.npy"), "differs from --q's");
}

// ---- grouped-query attention (--kv-heads) ---------------------------------------------

TEST(CliBadInput, KvHeadsThatDoNotDivideTheHeadsAreRejected) {
  TempDir dir;
  expect_bad_input(dir,
                   {"run", "--seq-len", "64", "--heads", "4", "--kv-heads", "3", "--head-dim", "16",
                    "--out", dir.file("out.npy")},
                   "--kv-heads", "must divide --heads");
}

TEST(CliBadInput, NonPositiveKvHeadsAreRejected) {
  TempDir dir;
  expect_bad_input(dir, {"run", "--seq-len", "64", "--kv-heads", "0", "--out", dir.file("out.npy")},
                   "--kv-heads", "must be positive");
}

TEST(CliBadInput, KeyFileWithOtherHeadsThanKvHeadsIsRejectedNamingFileAndOption) {
  TempDir dir;
  write_inputs(dir);  // q has 4 heads
  write_float32(dir.file("k.npy"), {1, 64, 2, 16}, 3);
  write_float32(dir.file("v.npy"), {1, 64, 2, 16}, 4);
  // Without --kv-heads, K/V must have --q's heads; the message says what to pass.
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"),
                   "has 2 heads, but --kv-heads is 4 (the default: --q's heads); for "
                   "grouped-query attention pass --kv-heads 2");
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--kv-heads", "1"})),
                   dir.file("k.npy"), "has 2 heads, but --kv-heads is 1");
}

TEST(CliBadInput, ValueFileWithOtherHeadsThanKvHeadsIsRejectedNamingFileAndOption) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("k.npy"), {1, 64, 2, 16}, 3);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--kv-heads", "2"})),
                   dir.file("v.npy"), "has 4 heads, but --kv-heads is 2");
}

TEST(CliBadInput, KeyHeadsThatDoNotDivideTheQueryHeadsAreRejected) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("k.npy"), {1, 64, 3, 16}, 3);
  write_float32(dir.file("v.npy"), {1, 64, 3, 16}, 4);
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"),
                   "pass --kv-heads 3, though it must divide --q's 4 heads");
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--kv-heads", "3"})), "--kv-heads",
                   "must divide --heads");
}

// ---- sliding window (--window) ----------------------------------------------------------

TEST(CliBadInput, BadWindowsAreRejectedNamingWindow) {
  TempDir dir;
  const Args base{"run",        "--seq-len", "64",    "--heads",          "2",
                  "--head-dim", "16",        "--out", dir.file("out.npy")};
  expect_bad_input(dir, with(base, {"--window=-1"}), "--window", "must be >= 0");
  expect_bad_input(dir, with(base, {"--window", "4,-2"}), "--window", "must be >= 0");
  expect_bad_input(dir, with(base, {"--window", "4.5"}), "--window", "is not an integer");
  expect_bad_input(dir, with(base, {"--window", "x"}), "--window", "is not an integer");
  expect_bad_input(dir, with(base, {"--window", "1,2,3"}), "--window", "expected L or L,R");
  expect_bad_input(dir, with(base, {"--window", "4,"}), "--window", "expected L or L,R");
  expect_bad_input(dir, with(base, {"--window", "4,2", "--causal"}), "--window",
                   "the right reach must be 0 or omitted");
  expect_bad_input(dir,
                   with(base, {"--window", "4", "--attention", "dilated", "--segments", "32",
                               "--dilations", "2"}),
                   "--window", "does not combine with --attention dilated");
}

// ---- packed sequences (--seqlens, --cu-seqlens) -----------------------------------------

// Document offsets as an .npy of `descr` ('<i4' or '<i8') and `shape`.
void write_offsets(const std::string& path, const std::string& descr, const std::string& shape,
                   const std::vector<int64_t>& values) {
  std::string payload;
  for (int64_t v : values) {
    if (descr == "<i4") {
      const auto x = static_cast<int32_t>(v);
      payload.append(reinterpret_cast<const char*>(&x), sizeof x);
    } else {
      payload.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
  }
  write_bytes(path, npy_bytes(dict_for(descr, shape), payload));
}

TEST(CliBadInput, BadSeqlensAreRejectedNamingSeqlens) {
  TempDir dir;
  const Args base{"run",        "--seq-len", "64",    "--heads",          "2",
                  "--head-dim", "16",        "--out", dir.file("out.npy")};
  expect_bad_input(dir, with(base, {"--seqlens", "30,30"}), "--seqlens",
                   "the document lengths sum to 60, not to the sequence length 64");
  expect_bad_input(dir, with(base, {"--seqlens", "64,0"}), "--seqlens",
                   "document lengths must be positive, got 0");
  expect_bad_input(dir, with(base, {"--seqlens", "32,x"}), "--seqlens", "is not an integer");
  expect_bad_input(dir,
                   with(base, {"--seqlens", "32,32", "--attention", "dilated", "--segments", "32",
                               "--dilations", "2"}),
                   "--seqlens", "do not combine with --attention dilated");
  write_offsets(dir.file("cu.npy"), "<i8", "(3,)", {0, 32, 64});
  expect_bad_input(dir, with(base, {"--seqlens", "32,32", "--cu-seqlens", dir.file("cu.npy")}),
                   "--seqlens", "not both");
}

TEST(CliBadInput, BadCuSeqlensFilesAreRejectedNamingTheFile) {
  TempDir dir;
  const Args base{"run",        "--seq-len", "64",    "--heads",          "2",
                  "--head-dim", "16",        "--out", dir.file("out.npy")};
  const std::string cu = dir.file("cu.npy");
  const std::string subject = "--cu-seqlens (" + cu + ")";
  const Args args = with(base, {"--cu-seqlens", cu});
  write_offsets(cu, "<i4", "(4,)", {0, 40, 30, 64});
  expect_bad_input(dir, args, subject, "offsets must increase strictly: element 2 is 30");
  write_offsets(cu, "<i8", "(3,)", {0, 32, 60});
  expect_bad_input(dir, args, subject, "the last offset must be the sequence length 64, got 60");
  write_offsets(cu, "<i8", "(3,)", {1, 32, 64});
  expect_bad_input(dir, args, subject, "the first offset must be 0, got 1");
  write_offsets(cu, "<i8", "(1, 3)", {0, 32, 64});
  expect_bad_input(dir, args, subject, "expected a 1-D array");
  write_offsets(cu, "<i8", "(1,)", {0});
  expect_bad_input(dir, args, subject, "expected a 1-D array");
  write_bytes(cu, npy_bytes(dict_for("<f4", "(2,)"), std::string(8, '\0')));
  expect_bad_input(dir, args, subject, "dtype float32, expected int32 ('<i4') or int64 ('<i8')");
  write_bytes(cu, npy_bytes(dict_for("<i8", "(3,)"), std::string(8, '\0')));
  expect_bad_input(dir, args, cu, "");  // truncated data
  expect_bad_input(dir, with(base, {"--cu-seqlens", dir.file("missing.npy")}),
                   dir.file("missing.npy"), "");
  // --seqlens problems found only once the file is read name the file too.
  write_offsets(cu, "<i4", "(3,)", {0, 32, 64});
  expect_bad_input(dir,
                   with(args, {"--attention", "dilated", "--segments", "32", "--dilations", "2"}),
                   subject, "do not combine with --attention dilated");
}

TEST(CliBadInput, DoutOfADifferentShapeIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("dout.npy"), {1, 64, 4, 8}, 3);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--dout", dir.file("dout.npy")})),
                   dir.file("dout.npy"), "differs from the output's shape");
}

// Soft-capping takes a finite cap >= 0; values of their own head dim need --head-dim-v.
TEST(CliBadInput, SoftcapMustBeFiniteAndNonNegative) {
  for (const char* bad : {"-1", "nan", "inf"}) {
    TempDir dir;
    expect_bad_input(dir, {"run", "--softcap", bad, "--out", dir.file("out.npy")}, "--softcap",
                     std::string("must be a finite number >= 0 (0: none), got ") + bad);
  }
}

TEST(CliBadInput, ValuesOfAnotherHeadDimNeedHeadDimV) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("v.npy"), {kShape[0], kShape[1], kShape[2], 4}, 5);
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("v.npy"),
                   "head dim 4 differs from --q's 16; for values of their own head dim pass "
                   "--head-dim-v 4");
  TempDir other;
  write_inputs(other);
  write_float32(other.file("v.npy"), {kShape[0], kShape[1], kShape[2], 4}, 5);
  expect_bad_input(other, with(base_args(other), with(kPattern, {"--head-dim-v", "6"})),
                   other.file("v.npy"), "head dim 4 differs from --head-dim-v 6");
}

TEST(CliBadInput, HeadDimVOutOfRangeIsRejected) {
  TempDir dir;
  expect_bad_input(dir, {"run", "--head-dim-v", "0", "--out", dir.file("out.npy")},
                   "--head-dim-v", "must be in 1..256, got 0");
}

TEST(CliBadInput, HeadDimZeroIsRejected) {
  TempDir dir;
  expect_bad_input(dir, {"run", "--head-dim", "0", "--out", dir.file("out.npy")}, "--head-dim",
                   "must be in 1..256, got 0");
}

TEST(CliBadInput, HeadDim257IsRejected) {
  TempDir dir;
  expect_bad_input(dir, {"run", "--head-dim", "257", "--out", dir.file("out.npy")}, "--head-dim",
                   "must be in 1..256, got 257");
}

// With input files the shape options are a cross-check against the files; an explicit 0
// must still be an error, not read as "option not given".
TEST(CliBadInput, HeadDimZeroNextToInputFilesIsRejected) {
  TempDir dir;
  write_inputs(dir);
  const CliResult r = run_cli(with(base_args(dir), with(kPattern, {"--head-dim", "0"})));
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--head-dim"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(dir.file("out.npy")));
}

// ---- shapes read from files --------------------------------------------------------------
// When --q/--k/--v give the shape, a bad dimension is the file's fault: the message names the
// file and the option it came with, never --batch/--seq-len/--heads/--head-dim (not given).

TEST(CliBadInput, ZeroSequenceLengthInTheInputFilesNamesTheFile) {
  expect_shape_file_blamed({1, 0, 2, 16}, "sequence length (dim 1) must be positive, got 0");
}

TEST(CliBadInput, ZeroBatchInTheInputFilesNamesTheFile) {
  expect_shape_file_blamed({0, 4, 2, 16}, "batch (dim 0) must be positive, got 0");
}

TEST(CliBadInput, ZeroHeadsInTheInputFilesNamesTheFile) {
  expect_shape_file_blamed({1, 4, 0, 16}, "heads (dim 2) must be positive, got 0");
}

TEST(CliBadInput, ZeroHeadDimInTheInputFilesNamesTheFile) {
  expect_shape_file_blamed({1, 4, 2, 0}, "head dim (dim 3) must be in 1..256, got 0");
}

TEST(CliBadInput, HeadDim257InTheInputFilesNamesTheFile) {
  expect_shape_file_blamed({1, 4, 2, 257}, "head dim (dim 3) must be in 1..256, got 257");
}

TEST(CliBadInput, HeadDim300InTheInputFilesNamesTheFile) {
  expect_shape_file_blamed({1, 4, 2, 300}, "head dim (dim 3) must be in 1..256, got 300");
}

// The ring layout's check, not the file reader's: one token cannot be split over two ranks.
TEST(CliBadInput, OneTokenFileOnACausalRingOfTwoNamesTheFile) {
  expect_shape_file_blamed({1, 1, 2, 16},
                           "sequence length (dim 1): 1 tokens cannot be split evenly over 2 ranks",
                           {"--causal", "--ring-size", "2"});
}

// --dout's dimensions are checked the same way, naming --dout.
TEST(CliBadInput, ZeroSequenceLengthInDoutNamesDout) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("dout.npy"), npy_bytes(dict_for("<f4", "(1, 0, 4, 16)"), ""));
  const CliResult r = expect_bad_input(
      dir, with(base_args(dir), with(kPattern, {"--dout", dir.file("dout.npy")})),
      "--dout (" + dir.file("dout.npy") + "): ", "sequence length (dim 1) must be positive, got 0");
  EXPECT_EQ(r.err.find("--seq-len"), std::string::npos) << describe(r);
}

// ---- file contents in messages -----------------------------------------------------------
// Bytes from a file are shown escaped and cut short: a header must not drive the terminal.

TEST(CliBadInput, ControlBytesInTheDtypeAreShownEscaped) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("q.npy"), npy_bytes(dict_for("\x1b[2J\x07\x7f\x01", "(1, 64, 4, 16)"),
                                           std::string(kCount * 4, '\0')));
  const CliResult r = expect_bad_input(
      dir, with(base_args(dir), kPattern),
      "--q (" + dir.file("q.npy") + "): ", "unsupported dtype '\\x1b[2J\\x07\\x7f\\x01'");
  expect_one_printable_line(r);
}

TEST(CliBadInput, LongDtypeIsCutToSixtyBytes) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("k.npy"), npy_bytes(dict_for(std::string(500, 'x'), "(1, 64, 4, 16)"),
                                           std::string(kCount * 4, '\0')));
  const CliResult r =
      expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"),
                       "unsupported dtype '" + std::string(60, 'x') + "'... (need float32");
  expect_one_printable_line(r);
}

TEST(CliBadInput, ControlBytesInAHeaderKeyAreShownEscaped) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("v.npy"),
              npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 64, 4, 16), "
                        "'\x1b]0;pwned\x07': 1}",
                        std::string(kCount * 4, '\0')));
  const CliResult r = expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("v.npy"),
                                       "unexpected key '\\x1b]0;pwned\\x07'");
  expect_one_printable_line(r);
}

// A --config file is read by Boost, whose messages quote the offending line or value.
TEST(CliBadInput, ControlBytesInAConfigFileAreShownEscaped) {
  TempDir dir;
  write_inputs(dir);
  for (const auto& [text, problem] :
       {std::pair<std::string, std::string>{"this line \x1b[2J has no equals sign\n",
                                            "invalid line 'this line \\x1b[2J has"},
        {"threads = 1\x1b[2J\n", "the argument ('1\\x1b[2J') for option 'threads'"},
        {"combine = gr\x1b[2Jouped\n", "unknown value 'gr\\x1b[2Jouped'"}}) {
    SCOPED_TRACE(problem);
    write_bytes(dir.file("run.cfg"), text);
    const CliResult r = expect_bad_input(
        dir, with(base_args(dir), with(kPattern, {"--config", dir.file("run.cfg")})), "", problem);
    expect_one_printable_line(r);
  }
}

// ---- files -----------------------------------------------------------------------------

TEST(CliBadInput, MissingInputFileIsRejected) {
  TempDir dir;
  write_inputs(dir);
  fs::remove(dir.file("v.npy"));
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("v.npy"), "file is missing");
}

TEST(CliBadInput, UnreadableInputFileIsRejected) {
  TempDir dir;
  write_inputs(dir);
  fs::permissions(dir.file("q.npy"), fs::perms::none);
  if (::geteuid() == 0) {
    // root reads mode-000 files anyway, so the error cannot be provoked; still no crash.
    std::printf(
        "  [skip] running as root: chmod 000 does not stop root from reading; "
        "only checking that the run does not crash\n");
    std::fflush(stdout);  // run_cli forks; an unflushed buffer would be printed twice
    const CliResult r = run_cli(with(base_args(dir), kPattern));
    EXPECT_EQ(r.signal, 0) << describe(r);
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 2) << describe(r);
    return;
  }
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("q.npy"),
                   "cannot open: Permission denied");
}

TEST(CliBadInput, TruncatedInputFileIsRejected) {
  TempDir dir;
  write_inputs(dir);
  const std::string full =
      npy_bytes(dict_for("<f4", "(1, 64, 4, 16)"), std::string(kCount * 4, '\0'));
  write_bytes(dir.file("k.npy"), full.substr(0, full.size() - 100));
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"),
                   "but the file holds 16284 bytes of data");
}

TEST(CliBadInput, TextFileInsteadOfNpyIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("q.npy"), "1.0 2.0 3.0\n4.0 5.0 6.0\n");
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("q.npy"),
                   "not a .npy file (bad magic)");
}

TEST(CliBadInput, Float64InputIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("q.npy"),
              npy_bytes(dict_for("<f8", "(1, 64, 4, 16)"), std::string(kCount * 8, '\0')));
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("q.npy"),
                   "unsupported dtype '<f8'");
}

TEST(CliBadInput, Int32InputIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("v.npy"),
              npy_bytes(dict_for("<i4", "(1, 64, 4, 16)"), std::string(kCount * 4, '\0')));
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("v.npy"),
                   "dtype int32, expected float32 or float16");
}

// bool passes the header-only shape pass; it must still be refused when the data is read.
TEST(CliBadInput, BoolInputIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("k.npy"),
              npy_bytes(dict_for("|b1", "(1, 64, 4, 16)"), std::string(kCount, '\0')));
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"),
                   "dtype bool, expected float32 or float16");
}

TEST(CliBadInput, Rank3InputIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_float32(dir.file("q.npy"), {64, 4, 16}, 1);
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("q.npy"),
                   "array has rank 3, expected rank 4");
}

TEST(CliBadInput, FortranOrderInputIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("k.npy"),
              npy_bytes(dict_for("<f4", "(1, 64, 4, 16)", "True"), std::string(kCount * 4, '\0')));
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("k.npy"),
                   "Fortran-order arrays are not supported");
}

// A header promising ~1 PB must be refused from the file size alone: no allocation, no read.
TEST(CliBadInput, HeaderClaimingFarMoreDataThanTheFileHoldsFailsFast) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("q.npy"),
              npy_bytes(dict_for("<f4", "(1, 4194304, 4096, 16384)"), std::string(1024, '\0')));
  const auto t0 = std::chrono::steady_clock::now();
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("q.npy"),
                   "but the file holds 1024 bytes of data");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 5.0);
}

TEST(CliBadInput, NaNInAnInputIsRejected) {
  TempDir dir;
  write_inputs(dir);
  std::vector<float> values = ringattn::testing::random_normal(kCount, 9);
  values[123] = std::numeric_limits<float>::quiet_NaN();
  ringattn::write_npy_float_atomic(dir.file("v.npy"), kShape, values.data());
  expect_bad_input(dir, with(base_args(dir), kPattern), dir.file("v.npy"),
                   "element 123 is NaN; inputs must be finite");
}

TEST(CliBadInput, QueriesWithoutKeysAndValuesAreRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, {"run", "--q", dir.file("q.npy"), "--out", dir.file("out.npy")}, "--k",
                   "--q, --k and --v must be given together");
}

// ---- output paths ----------------------------------------------------------------------

TEST(CliBadInput, OutPathInMissingDirectoryIsRejected) {
  TempDir dir;
  write_inputs(dir);
  Base b;
  b.out = dir.file("missing/out.npy");
  const Args args = with(base_args(dir, b), kPattern);
  expect_bad_input(dir, args, "--out", "directory '" + dir.file("missing") + "' of output file");
  EXPECT_FALSE(fs::exists(dir.file("missing")));
}

TEST(CliBadInput, LseOutPathInMissingDirectoryIsRejectedBeforeAnyOutputIsWritten) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--lse-out", dir.file("missing/lse.npy")})),
                   "--lse-out", "does not exist");
}

TEST(CliBadInput, DqOutPathInMissingDirectoryIsRejectedBeforeAnyOutputIsWritten) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--dout", dir.file("dout.npy"), "--dq-out",
                                                        dir.file("missing/dq.npy")})),
                   "--dq-out", "does not exist");
}

TEST(CliBadInput, DqOutWithoutBackwardPassIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--dq-out", dir.file("dq.npy")})),
                   "--dq-out", "needs the backward pass");
}

// ---- option syntax and run control -----------------------------------------------------

TEST(CliBadInput, UnknownOptionIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--frobnicate", "3"})), "--frobnicate",
                   "unknown option");
}

TEST(CliBadInput, NonNumericSeqLenIsRejected) {
  TempDir dir;
  expect_bad_input(dir, {"run", "--seq-len", "abc", "--out", dir.file("out.npy")}, "--seq-len",
                   "('abc')");
}

// On a machine (or build) without a usable GPU, --device cuda is bad input that says why;
// where a GPU is usable the run is legal and test_cli_cuda.cpp covers it.
TEST(CliBadInput, CudaDeviceWithoutAUsableGpuIsRejectedNamingTheReason) {
  const ringattn::CudaDeviceStatus gpu = ringattn::probe_cuda_device();
  if (gpu.usable) GTEST_SKIP() << "SKIPPED: a CUDA device is usable here (" << gpu.name << ")";
  TempDir dir;
  write_inputs(dir);
  // A build without CUDA says so; a build with it names why the device cannot be used.
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--device", "cuda"})), "--device",
                   ringattn::cuda_built() ? "'cuda' cannot be used: " + gpu.reason
                                          : std::string("'cuda' is not available"));
}

TEST(CliBadInput, CudnnKernelWithTheCpuDeviceIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--device", "cpu", "--kernel", "cudnn"})),
                   "--kernel", "needs --device cuda");
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--device", "cpu", "--kernel", "hopper"})),
                   "--kernel", "'hopper' is a CUDA kernel");
}

TEST(CliBadInput, HalfPrecisionWithTheCpuDeviceIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--device", "cpu", "--dtype", "bf16"})),
                   "--dtype", "CPU kernels compute in fp32");
}

TEST(CliBadInput, UnknownKernelAndDtypeNamesAreRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--kernel", "flash3"})), "--kernel",
                   "unknown value 'flash3'");
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--dtype", "fp8"})), "--dtype",
                   "unknown value 'fp8'");
}

// --device auto on a machine without a GPU is the CPU path, and cudnn/bf16 then say so.
TEST(CliBadInput, CudaOnlyOptionsUnderAutoWithoutAGpuAreRejected) {
  if (ringattn::probe_cuda_device().usable)
    GTEST_SKIP() << "SKIPPED: a CUDA device is usable here, so --device auto picks it";
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--device", "auto", "--kernel", "cudnn"})),
                   "--kernel", "this run uses the CPU (--device auto)");
  expect_bad_input(dir,
                   with(base_args(dir), with(kPattern, {"--device", "auto", "--dtype", "fp16"})),
                   "--dtype", "this run uses the CPU (--device auto)");
}

TEST(CliBadInput, NegativeThreadCountIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--threads", "-1"})), "--threads",
                   "must be >= 0");
}

TEST(CliBadInput, ZeroIterationsIsRejected) {
  TempDir dir;
  write_inputs(dir);
  Base b;
  b.iters = "0";
  expect_bad_input(dir, with(base_args(dir, b), kPattern), "--iters", "must be >= 1");
}

TEST(CliBadInput, NonPositiveTimeoutIsRejected) {
  TempDir dir;
  write_inputs(dir);
  for (const char* t : {"0", "-2"})
    expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--timeout", t})), "--timeout",
                     std::string("must be a number of seconds in (0, 1e6], got ") + t);
}

TEST(CliBadInput, MissingConfigFileIsRejected) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--config", dir.file("nope.cfg")})),
                   "--config", "cannot open config file '" + dir.file("nope.cfg") + "'");
}

TEST(CliBadInput, ConfigFileWithUnknownOptionIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("run.cfg"), "seq-len = 64\nwarp-speed = 9\n");
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--config", dir.file("run.cfg")})),
                   "warp-speed", "unknown option in config file '" + dir.file("run.cfg") + "'");
}

// A line "= value" has no name; the error says so rather than naming an empty option
// (found by fuzz_config).
TEST(CliBadInput, ConfigLineWithoutANameIsRejected) {
  TempDir dir;
  write_inputs(dir);
  write_bytes(dir.file("run.cfg"), "seq-len = 64\n= 9\n");
  const std::string problem =
      "a line with a value but no option name in config file '" + dir.file("run.cfg") + "'";
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--config", dir.file("run.cfg")})),
                   "options", problem);
}

// Boost formats its messages by replacing %placeholders% until none is left; a value that
// holds one made that loop forever (found by fuzz_config). Now exit 2, promptly.
TEST(CliBadInput, ValueHoldingABoostPlaceholderIsRejectedPromptly) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--threads", "x%value%"})),
                   "--threads", "x\\x25value\\x25");
  write_bytes(dir.file("run.cfg"), "seq-len = %value%%original_token%\n");
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"--config", dir.file("run.cfg")})),
                   "--seq-len", "\\x25value\\x25");
}

// Words that are no option were dropped by Boost, so the run went on with defaults.
TEST(CliBadInput, StrayArgumentIsRejectedNotIgnored) {
  TempDir dir;
  write_inputs(dir);
  expect_bad_input(dir, with(base_args(dir), with(kPattern, {"seq-len", "64"})), "options",
                   "unexpected argument 'seq-len'");
}

// ---- commands --------------------------------------------------------------------------

TEST(CliBadInput, NoCommandExitsWithUsageError) {
  const CliResult r = run_cli({});
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("missing command"), std::string::npos) << describe(r);
}

TEST(CliBadInput, UnknownCommandExitsWithUsageError) {
  const CliResult r = run_cli({"frobnicate"});
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << describe(r);
}

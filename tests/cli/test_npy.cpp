// Tests for the .npy reader/writer: round trips, hand-built float16/bool files, every rejected
// header with its message, output path checks, AtomicOutputs cleanup, and half conversions
// checked exhaustively against an independent nearest-value search.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "ringattn/errors.hpp"
#include "cli/npy.hpp"

using ringattn::AtomicOutputs;
using ringattn::InputError;
using ringattn::NpyDtype;
using ringattn::NpyHeader;
using ringattn::RuntimeFailure;

namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed with everything in it at the end.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string pattern = (fs::temp_directory_path() / "ringattn_npy_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  ~ScopedTempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Builds a .npy file the way the spec describes it, independently of the code under test.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < preamble - 8; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string dict_for(const std::string& descr, const std::string& shape,
                     const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

std::string half_bytes(const std::vector<uint16_t>& halves) {
  std::string out;
  for (const uint16_t h : halves) {
    out += static_cast<char>(h & 0xff);
    out += static_cast<char>(h >> 8);
  }
  return out;
}

std::string float_bytes(const std::vector<float>& values) {
  std::string out;
  for (const float v : values) {
    const auto bits = std::bit_cast<uint32_t>(v);
    for (int b = 0; b < 4; ++b) out += static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  return out;
}

// Runs `read` and checks that it throws InputError naming `path` and containing `phrase`.
template <typename Read>
void expect_input_error(Read read, const std::string& path, const std::string& phrase) {
  try {
    read();
    ADD_FAILURE() << "no InputError for " << path << " (expected '" << phrase << "')";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(phrase), std::string::npos)
        << "expected '" << phrase << "' in: " << message;
    EXPECT_EQ(e.subject(), path);
  }
}

void expect_float_read_error(const std::string& path, const std::string& phrase) {
  expect_input_error([&] { (void)ringattn::read_npy_float(path); }, path, phrase);
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i) * 0.37f - 11.0f;
  return values;
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

}  // namespace

TEST(NpyRoundTrip, Float32OneDimensional) {
  ScopedTempDir dir;
  const std::string path = dir.file("a.npy");
  std::vector<float> values = ramp(37);
  values[3] = -0.0f;
  values[4] = std::numeric_limits<float>::infinity();
  values[5] = std::numeric_limits<float>::denorm_min();
  ringattn::write_npy_float_atomic(path, {37}, values.data());

  NpyHeader header;
  const std::vector<float> back = ringattn::read_npy_float(path, &header);
  EXPECT_EQ(header.dtype, NpyDtype::float32);
  EXPECT_EQ(header.shape, std::vector<int64_t>({37}));
  EXPECT_EQ(header.data_offset % 64, 0u);
  ASSERT_EQ(back.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(same_bits(back[i], values[i])) << i;

  // The exact header numpy itself writes for this array.
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), header.data_offset + 37 * 4);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header_length =
      static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ(10 + header_length, header.data_offset);
  const std::string text = bytes.substr(10, header_length);
  EXPECT_EQ(text.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (37,), }", 0), 0u)
      << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find_first_not_of(' ', text.find('}') + 1), text.size() - 1)
      << "padding must be spaces";
  EXPECT_EQ(read_bytes(path).substr(header.data_offset), float_bytes(values));
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"a.npy"}));
}

TEST(NpyRoundTrip, Float32FourDimensional) {
  ScopedTempDir dir;
  const std::string path = dir.file("q.npy");
  const std::vector<float> values = ramp(2 * 3 * 4 * 5);
  ringattn::write_npy_float_atomic(path, {2, 3, 4, 5}, values.data());
  NpyHeader header;
  EXPECT_EQ(ringattn::read_npy_float(path, &header), values);
  EXPECT_EQ(header.shape, std::vector<int64_t>({2, 3, 4, 5}));
  EXPECT_EQ(header.data_offset % 64, 0u);
  EXPECT_NE(read_bytes(path).find("'shape': (2, 3, 4, 5), }"), std::string::npos);
  const NpyHeader again = ringattn::read_npy_header(path);
  EXPECT_EQ(again.shape, header.shape);
  EXPECT_EQ(again.data_offset, header.data_offset);
}

TEST(NpyRoundTrip, ScalarAndEmptyArrays) {
  ScopedTempDir dir;
  const float scalar = 2.5f;
  ringattn::write_npy_float_atomic(dir.file("s.npy"), {}, &scalar);
  NpyHeader header;
  EXPECT_EQ(ringattn::read_npy_float(dir.file("s.npy"), &header), std::vector<float>({2.5f}));
  EXPECT_TRUE(header.shape.empty());
  EXPECT_NE(read_bytes(dir.file("s.npy")).find("'shape': (), }"), std::string::npos);

  ringattn::write_npy_float_atomic(dir.file("e.npy"), {0, 3}, nullptr);
  EXPECT_TRUE(ringattn::read_npy_float(dir.file("e.npy"), &header).empty());
  EXPECT_EQ(header.shape, std::vector<int64_t>({0, 3}));

  // A zero dimension empties the array whatever the others are (as in numpy), even when
  // the others multiply past int64: reader and writer agree (found by fuzz_npy).
  const std::vector<int64_t> huge_empty = {int64_t{1} << 40, int64_t{1} << 40, 0, 7};
  ringattn::write_npy_float_atomic(dir.file("he.npy"), huge_empty, nullptr);
  EXPECT_TRUE(ringattn::read_npy_float(dir.file("he.npy"), &header).empty());
  EXPECT_EQ(header.shape, huge_empty);
}

TEST(NpyRoundTrip, OverwritesAnExistingFile) {
  ScopedTempDir dir;
  const std::string path = dir.file("o.npy");
  write_bytes(path, "old contents");
  const std::vector<float> values = ramp(5);
  ringattn::write_npy_float_atomic(path, {5}, values.data());
  EXPECT_EQ(ringattn::read_npy_float(path), values);
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"o.npy"}));
}

TEST(NpyRead, Float16IncludingSubnormalsAndSpecials) {
  ScopedTempDir dir;
  const std::string path = dir.file("h.npy");
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x0400, 0x7bff,
                                        0x7c00, 0xfc00, 0x8000, 0x3555, 0x7e00};
  write_bytes(path, npy_bytes(dict_for("<f2", "(11,)"), half_bytes(halves)));
  NpyHeader header;
  const std::vector<float> values = ringattn::read_npy_float(path, &header);
  EXPECT_EQ(header.dtype, NpyDtype::float16);
  ASSERT_EQ(values.size(), 11u);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(values[3], std::ldexp(1023.0f, -24));
  EXPECT_EQ(values[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(values[5], 65504.0f);
  EXPECT_EQ(values[6], std::numeric_limits<float>::infinity());
  EXPECT_EQ(values[7], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(same_bits(values[8], -0.0f));
  EXPECT_EQ(values[9], 0.333251953125f);
  EXPECT_TRUE(std::isnan(values[10]));
}

TEST(NpyRead, Float16LargerThanOneReadChunk) {
  ScopedTempDir dir;
  const std::string path = dir.file("big16.npy");
  std::vector<uint16_t> halves(100000);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i % 0x7c00);
  write_bytes(path, npy_bytes(dict_for("<f2", "(100, 1000)"), half_bytes(halves)));
  const std::vector<float> values = ringattn::read_npy_float(path);
  ASSERT_EQ(values.size(), halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i)
    ASSERT_EQ(values[i], ringattn::half_to_float(halves[i])) << i;
}

TEST(NpyRead, Versions2And3AndLooseButValidHeaders) {
  ScopedTempDir dir;
  const std::vector<float> values = {1.5f, -2.0f};
  for (const int major : {2, 3}) {
    const std::string path = dir.file("v" + std::to_string(major) + ".npy");
    write_bytes(path, npy_bytes(dict_for("<f4", "(2,)"), float_bytes(values), major));
    NpyHeader header;
    EXPECT_EQ(ringattn::read_npy_float(path, &header), values);
    EXPECT_EQ(header.data_offset % 64, 0u);
  }
  // Other key order, double quotes, no trailing comma, Python 2 longs: all valid headers.
  const std::string path = dir.file("loose.npy");
  write_bytes(path, npy_bytes("{\"shape\": (1L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}",
                              float_bytes(values)));
  NpyHeader header;
  EXPECT_EQ(ringattn::read_npy_float(path, &header), values);
  EXPECT_EQ(header.shape, std::vector<int64_t>({1, 2}));
}

TEST(NpyRead, BoolMask) {
  ScopedTempDir dir;
  const std::string path = dir.file("mask.npy");
  write_bytes(path,
              npy_bytes(dict_for("|b1", "(2, 3)"), std::string("\x01\x00\x01\x01\x00\x00", 6)));
  NpyHeader header;
  EXPECT_EQ(ringattn::read_npy_bool(path, &header), std::vector<uint8_t>({1, 0, 1, 1, 0, 0}));
  EXPECT_EQ(header.dtype, NpyDtype::bool8);
  EXPECT_EQ(header.shape, std::vector<int64_t>({2, 3}));

  const std::string bad = dir.file("bad_mask.npy");
  write_bytes(bad, npy_bytes(dict_for("|b1", "(3,)"), std::string("\x01\x02\x00", 3)));
  expect_input_error([&] { (void)ringattn::read_npy_bool(bad); }, bad,
                     "bool element 1 has byte value 2");

  const std::string floats = dir.file("floats.npy");
  write_bytes(floats, npy_bytes(dict_for("<f4", "(1,)"), float_bytes({1.0f})));
  expect_input_error([&] { (void)ringattn::read_npy_bool(floats); }, floats,
                     "dtype float32, expected bool");
}

TEST(NpyRead, RejectsMissingEmptyAndNonNpyFiles) {
  ScopedTempDir dir;
  expect_float_read_error(dir.file("nope.npy"), "file is missing");

  const std::string empty = dir.file("empty.npy");
  write_bytes(empty, "");
  expect_float_read_error(empty, "file is empty");

  const std::string text = dir.file("text.npy");
  write_bytes(text, "hello, this is not numpy\n");
  expect_float_read_error(text, "not a .npy file (bad magic)");

  const std::string short_magic = dir.file("short.npy");
  write_bytes(short_magic, std::string("\x93NUM", 4));
  expect_float_read_error(short_magic, "truncated header");

  const std::string directory = dir.file("subdir");
  fs::create_directory(directory);
  expect_float_read_error(directory, "is a directory");
}

TEST(NpyRead, RejectsBadHeaders) {
  ScopedTempDir dir;
  const std::string data8 = float_bytes({1.0f, 2.0f});
  struct Case {
    std::string name, bytes, phrase;
  };
  const std::string good = npy_bytes(dict_for("<f4", "(2,)"), data8);
  std::string version4 = good;
  version4[6] = 4;
  const std::vector<Case> cases = {
      {"truncated.npy", good.substr(0, 40), "truncated header"},
      {"version.npy", version4, "unsupported .npy format version 4.0"},
      {"big_endian.npy", npy_bytes(dict_for(">f4", "(2,)"), data8), "unsupported dtype '>f4'"},
      {"double.npy", npy_bytes(dict_for("<f8", "(1,)"), data8), "unsupported dtype '<f8'"},
      {"fortran.npy", npy_bytes(dict_for("<f4", "(1, 2)", "True"), data8),
       "Fortran-order arrays are not supported; save with np.ascontiguousarray"},
      {"not_tuple.npy", npy_bytes(dict_for("<f4", "(2)"), data8), "'shape' must be a tuple"},
      {"negative.npy", npy_bytes(dict_for("<f4", "(-2,)"), data8), "negative dimension -2"},
      {"no_shape.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False}", data8),
       "header has no 'shape' key"},
      {"extra_key.npy",
       npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data8),
       "unexpected key 'x'"},
      {"twice.npy",
       npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", data8),
       "key 'descr' appears twice"},
      {"structured.npy",
       npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", data8),
       "structured dtypes"},
      {"garbage.npy", npy_bytes(dict_for("<f4", "(2,)") + " junk", data8),
       "unexpected text after the header"},
      {"short_data.npy", npy_bytes(dict_for("<f4", "(3,)"), data8),
       "header claims 3 elements (12 bytes) but the file holds 8 bytes of data"},
      {"trailing.npy", npy_bytes(dict_for("<f4", "(1,)"), data8),
       "4 trailing bytes after the data"},
      {"overflow.npy", npy_bytes(dict_for("<f4", "(4294967296, 4294967296, 4294967296)"), data8),
       "more elements than fit in int64"},
      {"bool.npy", npy_bytes(dict_for("|b1", "(8,)"), data8),
       "dtype bool, expected float32 or float16"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name);
    write_bytes(path, c.bytes);
    expect_float_read_error(path, c.phrase);
  }
}

TEST(NpyRead, HugeClaimedShapeFailsBeforeAllocating) {
  // 1e15 float32 elements (4 PB): allocating first would throw bad_alloc, not InputError.
  ScopedTempDir dir;
  const std::string path = dir.file("huge.npy");
  write_bytes(path, npy_bytes(dict_for("<f4", "(1000000000, 1000000)"), std::string(128, '\0')));
  expect_float_read_error(
      path,
      "header claims 1000000000000000 elements (4000000000000000 bytes) but the file holds "
      "128 bytes of data");
  expect_input_error([&] { (void)ringattn::read_npy_header(path); }, path,
                     "but the file holds 128 bytes");
}

TEST(NpyOutputPath, AcceptsAWritableDirectory) {
  ScopedTempDir dir;
  EXPECT_NO_THROW(ringattn::check_output_path("--out", dir.file("out.npy")));
  write_bytes(dir.file("exists.npy"), "x");
  EXPECT_NO_THROW(ringattn::check_output_path("--out", dir.file("exists.npy")));
  if (::access(".", W_OK | X_OK) == 0) {
    EXPECT_NO_THROW(ringattn::check_output_path("--out", "relative_output.npy"));
  }
}

TEST(NpyOutputPath, RejectsMissingDirectoryAndDirectories) {
  ScopedTempDir dir;
  const std::string missing = dir.file("no_such_dir");
  const std::string in_missing = missing + "/out.npy";
  expect_input_error(
      [&] { ringattn::check_output_path("--out", in_missing); }, "--out",
      "directory '" + missing + "' of output file '" + in_missing + "' does not exist");

  const std::string file = dir.file("plain_file");
  write_bytes(file, "x");
  expect_input_error([&] { ringattn::check_output_path("--lse-out", file + "/out.npy"); },
                     "--lse-out",
                     "(the directory of output file '" + file + "/out.npy') is not a directory");

  const std::string subdir = dir.file("sub");
  fs::create_directory(subdir);
  expect_input_error([&] { ringattn::check_output_path("--out", subdir); }, "--out",
                     "is an existing directory");
  expect_input_error([&] { ringattn::check_output_path("--out", ""); }, "--out",
                     "output path is empty");
}

TEST(NpyAtomicOutputs, DestructorRemovesUncommittedTemps) {
  ScopedTempDir dir;
  const std::vector<float> values = ramp(6);
  {
    AtomicOutputs outputs;
    outputs.stage(dir.file("out.npy"), {2, 3}, values.data());
    outputs.stage(dir.file("lse.npy"), {6}, values.data());
    const std::vector<std::string> staged = dir.entries();
    ASSERT_EQ(staged.size(), 2u);
    for (const std::string& name : staged) EXPECT_NE(name.find(".tmp."), std::string::npos) << name;
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(NpyAtomicOutputs, CommitRenamesEverything) {
  ScopedTempDir dir;
  const std::vector<float> values = ramp(6);
  {
    AtomicOutputs outputs;
    outputs.stage(dir.file("out.npy"), {2, 3}, values.data());
    outputs.stage(dir.file("lse.npy"), {6}, values.data());
    EXPECT_FALSE(fs::exists(dir.file("out.npy")));
    outputs.commit();
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>({"lse.npy", "out.npy"}));
  EXPECT_EQ(ringattn::read_npy_float(dir.file("out.npy")), values);
  EXPECT_EQ(ringattn::read_npy_float(dir.file("lse.npy")), values);
}

TEST(NpyAtomicOutputs, FailedStageThrowsRuntimeFailureAndLeavesNothing) {
  ScopedTempDir dir;
  const std::vector<float> values = ramp(4);
  const std::string unwritable = dir.file("missing_dir") + "/out.npy";
  {
    AtomicOutputs outputs;
    outputs.stage(dir.file("first.npy"), {4}, values.data());
    try {
      outputs.stage(unwritable, {4}, values.data());
      ADD_FAILURE() << "staging into a missing directory succeeded";
    } catch (const RuntimeFailure& e) {
      EXPECT_NE(std::string(e.what()).find(unwritable), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(dir.entries().empty());
  EXPECT_THROW(ringattn::write_npy_float_atomic(unwritable, {4}, values.data()), RuntimeFailure);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(NpyAtomicOutputs, WriteErrorRemovesTempAndNamesTheErrno) {
  // A file size limit makes write() fail with EFBIG part-way through the data, which is the
  // closest portable stand-in for a full disk.
  ScopedTempDir dir;
  const std::vector<float> values = ramp(1 << 16);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small_limit = old_limit;
  small_limit.rlim_cur = 4096;
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small_limit), 0);
  std::string message;
  try {
    AtomicOutputs outputs;
    outputs.stage(dir.file("big.npy"), {1 << 16}, values.data());
  } catch (const RuntimeFailure& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find(dir.file("big.npy")), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_TRUE(dir.entries().empty());
}

TEST(NpyHalf, KnownValues) {
  struct Pair {
    float value;
    uint16_t half;
  };
  const std::vector<Pair> exact = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.5f, 0x3800},
      {65504.0f, 0x7bff},
      {0.333251953125f, 0x3555},
      {std::ldexp(1.0f, -14), 0x0400},
      {std::ldexp(1.0f, -24), 0x0001},
      {std::ldexp(1023.0f, -24), 0x03ff},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
  };
  for (const Pair& p : exact) {
    EXPECT_EQ(ringattn::float_to_half(p.value), p.half) << p.value;
    EXPECT_TRUE(same_bits(ringattn::half_to_float(p.half), p.value)) << p.half;
  }
  // Rounding: ties go to the even neighbour, overflow goes to infinity.
  EXPECT_EQ(ringattn::float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, down to even
  EXPECT_EQ(ringattn::float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, up to even
  EXPECT_EQ(ringattn::float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(ringattn::float_to_half(2.0f - std::ldexp(1.0f, -12)),
            0x4000);  // tie carries into exponent
  EXPECT_EQ(ringattn::float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(ringattn::float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(ringattn::float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(ringattn::float_to_half(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(ringattn::float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie to zero
  EXPECT_EQ(ringattn::float_to_half(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(ringattn::float_to_half(std::ldexp(1.0f, -25) * 1.0001f), 0x0001);
  EXPECT_EQ(ringattn::float_to_half(std::ldexp(3.0f, -25)), 0x0002);     // tie up to even
  EXPECT_EQ(ringattn::float_to_half(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up to normal
  EXPECT_EQ(ringattn::float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN (never becomes infinity), with its sign.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(ringattn::half_to_float(ringattn::float_to_half(nan))));
  EXPECT_TRUE(std::isnan(ringattn::half_to_float(ringattn::float_to_half(-nan))));
  EXPECT_EQ(ringattn::float_to_half(-nan) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(
      ringattn::half_to_float(ringattn::float_to_half(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(ringattn::half_to_float(0x7c01)));
}

TEST(NpyHalf, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = ringattn::half_to_float(half);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(ringattn::half_to_float(ringattn::float_to_half(f)))) << h;
    } else {
      ASSERT_EQ(ringattn::float_to_half(f), half) << h;
    }
  }
}

TEST(NpyHalf, FloatToHalfPicksTheNearestHalf) {
  // Independent reference: the finite non-negative halves 0x0000..0x7bff are increasing, so
  // the nearest one can be found by binary search and compared in double precision.
  std::vector<double> halves(0x7c00);
  for (uint32_t h = 0; h < 0x7c00; ++h)
    halves[h] = ringattn::half_to_float(static_cast<uint16_t>(h));
  const auto reference = [&](float f) -> uint16_t {
    const double magnitude = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (magnitude >= 65520.0) return static_cast<uint16_t>(sign | 0x7c00);
    const auto above = std::lower_bound(halves.begin(), halves.end(), magnitude);
    if (above == halves.end()) return static_cast<uint16_t>(sign | 0x7bff);
    auto index = static_cast<uint32_t>(above - halves.begin());
    if (index > 0) {
      const double up = halves[index] - magnitude, down = magnitude - halves[index - 1];
      if (down < up || (down == up && ((index - 1) & 1u) == 0)) --index;
    }
    return static_cast<uint16_t>(sign | index);
  };
  // A prime stride visits about 4 million float bit patterns spread over every exponent.
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 1021) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(ringattn::float_to_half(f), reference(f)) << std::hexfloat << f;
  }
}

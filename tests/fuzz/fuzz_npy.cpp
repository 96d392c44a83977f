// libFuzzer target for the .npy reader (cli/npy.hpp): the input is a whole file.
// Invariants: a file is either read, with a header that accounts for every byte, or refused
// with an InputError naming the file whose message shows header bytes only escaped; the
// float, bool and int readers each take only their dtypes and the ranged reader agrees with
// the float one; a float32 array written back and read again
// is bitwise the same, and writing leaves no temporary file behind.
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "memory_file.hpp"
#include "cli/npy.hpp"

namespace {

using ringattn::InputError;
using ringattn::NpyDtype;
using ringattn::NpyHeader;
using ringattn::fuzz::check;

// A private directory for the write round trip.
struct OutputDir {
  std::string path;
  OutputDir() {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/fuzz_npy.XXXXXX";
    check(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path = tmpl;
  }
  ~OutputDir() { std::filesystem::remove_all(path); }
};

// numpy's count: 0 if any dimension is 0 (the others may then multiply past int64).
int64_t element_count(const NpyHeader& h) {
  int64_t n = 1;
  for (const int64_t d : h.shape)
    if (d == 0) return 0;
  for (const int64_t d : h.shape)
    check(!__builtin_mul_overflow(n, d, &n), "accepted a shape whose count overflows");
  return n;
}

int64_t item_bytes(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::float32:
    case NpyDtype::int32:
      return 4;
    case NpyDtype::float16:
      return 2;
    case NpyDtype::int64:
      return 8;
    case NpyDtype::bool8:
      return 1;
  }
  return 1;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void write_round_trip(const std::vector<float>& values, const NpyHeader& h) {
  static const OutputDir dir;
  const std::string out = dir.path + "/out.npy";
  ringattn::write_npy_float_atomic(out, h.shape, values.data());
  NpyHeader back_header;
  const std::vector<float> back = ringattn::read_npy_float(out, &back_header);
  check(back_header.shape == h.shape, "written shape reads back differently");
  check(back_header.dtype == NpyDtype::float32, "written dtype is not float32");
  check(back_header.data_offset % 64 == 0, "written header is not padded to 64 bytes");
  check(same_bits(back, values), "written values read back differently");
  std::filesystem::remove(out);
  check(std::filesystem::is_empty(dir.path), "writing left a file behind");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static ringattn::fuzz::MemoryFile input("fuzz_npy_input");
  input.set(data, size);
  const std::string& path = input.path;

  NpyHeader h;
  try {
    h = ringattn::read_npy_header(path);
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e, path);
    return 0;
  }
  // Accepted: the header accounts for every byte of the file.
  const int64_t count = element_count(h);
  for (const int64_t d : h.shape) check(d >= 0, "negative dimension accepted");
  check(h.data_offset <= size, "data offset past the end of the file");
  check(h.data_offset + static_cast<uint64_t>(count * item_bytes(h.dtype)) == size,
        "header and file size disagree");

  if (h.dtype == NpyDtype::bool8) {
    try {
      const std::vector<uint8_t> b = ringattn::read_npy_bool(path);
      check(b.size() == static_cast<std::size_t>(count), "bool read has the wrong length");
      for (const uint8_t v : b) check(v <= 1, "bool element other than 0 or 1 accepted");
    } catch (const InputError& e) {
      ringattn::fuzz::check_input_error(e, path);  // a byte other than 0 or 1
    }
    try {
      ringattn::read_npy_float(path);
      ringattn::fuzz::fail("a bool array was read as float");
    } catch (const InputError& e) {
      ringattn::fuzz::check_input_error(e, path);
    }
    return 0;
  }

  if (h.dtype == NpyDtype::int32 || h.dtype == NpyDtype::int64) {
    // Integers (document offsets): read as int64, element for element; the float and bool
    // readers refuse them.
    const std::vector<int64_t> ints = ringattn::read_npy_int64(path);
    check(ints.size() == static_cast<std::size_t>(count), "int read has the wrong length");
    for (std::size_t i = 0; i < ints.size(); ++i) {
      int64_t want = 0;
      if (h.dtype == NpyDtype::int64) {
        std::memcpy(&want, data + h.data_offset + 8 * i, 8);
      } else {
        int32_t narrow = 0;
        std::memcpy(&narrow, data + h.data_offset + 4 * i, 4);
        want = narrow;
      }
      check(ints[i] == want, "int element read wrongly");
    }
    for (const bool as_float : {true, false}) {
      try {
        if (as_float)
          ringattn::read_npy_float(path);
        else
          ringattn::read_npy_bool(path);
        ringattn::fuzz::fail("an int array was read as float or bool");
      } catch (const InputError& e) {
        ringattn::fuzz::check_input_error(e, path);
      }
    }
    return 0;
  }
  try {
    ringattn::read_npy_int64(path);
    ringattn::fuzz::fail("a float or bool array was read as int");
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e, path);
  }

  // float32 or float16: the whole array, and a few ranges of it, agree.
  NpyHeader read_header;
  const std::vector<float> values = ringattn::read_npy_float(path, &read_header);
  check(values.size() == static_cast<std::size_t>(count), "float read has the wrong length");
  check(read_header.shape == h.shape && read_header.dtype == h.dtype &&
            read_header.data_offset == h.data_offset,
        "the header differs between reads");
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, count / 2}, {count / 3, count - count / 3}, {count, 0}};
  const std::vector<float> ranged = ringattn::read_npy_float_ranges(path, ranges);
  std::vector<float> expected(values.begin(), values.begin() + count / 2);
  expected.insert(expected.end(), values.begin() + count / 3, values.end());
  check(same_bits(ranged, expected), "ranged read differs from the whole read");
  try {
    ringattn::read_npy_bool(path);
    ringattn::fuzz::fail("a float array was read as bool");
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e, path);
  }

  if (h.dtype == NpyDtype::float16) {
    // Every half is exactly a float, and converts back to itself (NaNs: to a NaN).
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto* bytes = data + h.data_offset + 2 * i;
      const auto half = static_cast<uint16_t>(bytes[0] | (bytes[1] << 8));
      const uint16_t again = ringattn::float_to_half(values[i]);
      const bool nan = (half & 0x7c00u) == 0x7c00u && (half & 0x3ffu) != 0;
      check(nan ? (again & 0x7c00u) == 0x7c00u && (again & 0x3ffu) != 0 : again == half,
            "half -> float -> half changed the value");
    }
  }
  if (count <= (1 << 16)) write_round_trip(values, h);
  return 0;
}

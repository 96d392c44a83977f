// NumPy .npy files: strict reading (float32/float16/bool/int32/int64, C order, size checked against
// the header before anything is allocated) and atomic writing (temp file + rename).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ringattn {

enum class NpyDtype { float32, float16, bool8, int32, int64 };

struct NpyHeader {
  NpyDtype dtype = NpyDtype::float32;
  std::vector<int64_t> shape;
  std::size_t data_offset = 0;  // bytes from the start of the file to the data
};

// Parses and validates the header of `path`; throws InputError(path, reason) for a missing,
// unreadable or non-.npy file, an unsupported dtype (anything but <f4, <f2, |b1, <i4, <i8), Fortran
// order, or a header whose shape needs more (or fewer) bytes than the file holds.
NpyHeader read_npy_header(const std::string& path);

// Reads a float32 or float16 array as float32. Throws InputError as above, and also when
// the array is bool.
std::vector<float> read_npy_float(const std::string& path, NpyHeader* header_out = nullptr);

// Reads only the given element ranges {first, count} of a float32/float16 array, in order,
// as float32 (how a rank reads its shard without loading the whole file).
std::vector<float> read_npy_float_ranges(const std::string& path,
                                         const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                         NpyHeader* header_out = nullptr);

// Reads a bool array (one byte per element, 0 or 1).
std::vector<uint8_t> read_npy_bool(const std::string& path, NpyHeader* header_out = nullptr);

// Reads an int32 or int64 array as int64 (document offsets, --cu-seqlens).
std::vector<int64_t> read_npy_int64(const std::string& path, NpyHeader* header_out = nullptr);

// Writes a float32 C-order array to `path` through a temporary file in the same directory
// and an atomic rename. Throws RuntimeFailure on I/O errors and leaves no file behind.
void write_npy_float_atomic(const std::string& path, const std::vector<int64_t>& shape,
                            const float* data);

// Checks that `path` could be written: its directory exists and is writable.
// Throws InputError(option, ...) naming the option the path came from.
void check_output_path(const std::string& option, const std::string& path);

// Several outputs that must appear all together or not at all: every file is first written
// to a temp file; commit() renames them all; the destructor removes uncommitted temps.
class AtomicOutputs {
 public:
  AtomicOutputs() = default;
  AtomicOutputs(const AtomicOutputs&) = delete;
  AtomicOutputs& operator=(const AtomicOutputs&) = delete;
  ~AtomicOutputs();

  void stage(const std::string& path, const std::vector<int64_t>& shape, const float* data);
  void stage_bool(const std::string& path, const std::vector<int64_t>& shape, const uint8_t* data);
  void commit();

 private:
  std::vector<std::pair<std::string, std::string>> staged_;  // {temp, final}
};

// IEEE half <-> single conversions (round to nearest even on the way down).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

}  // namespace ringattn

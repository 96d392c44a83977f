// The .npy reader and writer behind cli/npy.hpp, written from the NumPy format spec:
// strict header parsing with sizes checked against the real file before any allocation,
// writes through temp files + rename, output path checks, and IEEE half <-> single.
#include "cli/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"

namespace ringattn {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicBytes = 6;
// Our headers are ~100 bytes; the cap only stops a corrupt length field from making us
// read (and allocate) megabytes of "header".
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr std::size_t kIoChunkBytes = 1 << 16;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string errno_text(int err) { return std::system_category().message(err); }

// Owns a POSIX descriptor: we need errno from open/read/write/close, which iostreams hide.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Returns 0 or the errno of close(), which is where NFS and friends report lost writes.
  int close_checked() {
    const int fd = std::exchange(fd_, -1);
    return ::close(fd) == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// Returns the number of bytes read (< n only at end of file); throws on a read error.
std::size_t read_fully(int fd, void* buffer, std::size_t n, const std::string& path) {
  auto* out = static_cast<unsigned char*>(buffer);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::read(fd, out + done, n - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw InputError(path, "read error: " + errno_text(errno));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

// Returns 0 or the errno of the failed write.
int write_fully(int fd, const void* buffer, std::size_t n) {
  const auto* in = static_cast<const unsigned char*>(buffer);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t put = ::write(fd, in + done, n - done);
    if (put < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    // write() returning 0 for a non-empty buffer has no errno; report it as an I/O error.
    if (put == 0) return EIO;
    done += static_cast<std::size_t>(put);
  }
  return 0;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ',';  // Python's one-element tuple
  return text + ")";
}

const char* dtype_name(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::float32:
      return "float32";
    case NpyDtype::float16:
      return "float16";
    case NpyDtype::bool8:
      return "bool";
    case NpyDtype::int32:
      return "int32";
    case NpyDtype::int64:
      return "int64";
  }
  return "?";
}

int64_t dtype_bytes(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::float32:
      return 4;
    case NpyDtype::float16:
      return 2;
    case NpyDtype::bool8:
      return 1;
    case NpyDtype::int32:
      return 4;
    case NpyDtype::int64:
      return 8;
  }
  return 1;
}

bool checked_mul(int64_t a, int64_t b, int64_t* product) {
  if (a != 0 && b > kInt64Max / a) return false;
  *product = a * b;
  return true;
}

// The number of elements of `shape`, or false for a negative dimension or a count past
// `limit`. A zero dimension empties the array whatever the others are, as in numpy
// ((2**40, 2**40, 0) is a valid empty shape), so reader and writer accept the same shapes
// (fuzz_npy found the writer refusing an empty shape the reader had accepted).
bool shape_elements(const std::vector<int64_t>& shape, int64_t limit, int64_t* count) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) return false;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    *count = 0;
    return true;
  }
  int64_t n = 1;
  for (const int64_t dim : shape)
    if (!checked_mul(n, dim, &n) || n > limit) return false;
  *count = n;
  return true;
}

// Parses the Python dict literal of a .npy header. Accepts exactly what the spec allows
// for our dtypes: keys 'descr', 'fortran_order', 'shape', each once, in any order.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  struct Fields {
    std::string descr;
    bool fortran_order = false;
    std::vector<int64_t> shape;
  };

  Fields parse() {
    Fields fields;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_space();
    expect('{', "the header does not start with '{'");
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string("a quoted key");
      skip_space();
      expect(':', "expected ':' after key " + quote(key));
      skip_space();
      if (key == "descr") {
        mark_seen(&have_descr, key);
        if (peek() == '[') fail_plain("structured dtypes (a list in 'descr') are not supported");
        fields.descr = parse_string("a dtype string for 'descr'");
      } else if (key == "fortran_order") {
        mark_seen(&have_fortran, key);
        fields.fortran_order = parse_bool(key);
      } else if (key == "shape") {
        mark_seen(&have_shape, key);
        fields.shape = parse_shape();
      } else {
        fail_plain("unexpected key " + quote(key) + " in header");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}' after the value of " + quote(key));
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the header dict");
    if (!have_descr) fail_plain("header has no 'descr' key");
    if (!have_fortran) fail_plain("header has no 'fortran_order' key");
    if (!have_shape) fail_plain("header has no 'shape' key");
    return fields;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  // The spec pads with spaces and ends with '\n'; other whitespace is harmless to allow.
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  void expect(char c, const std::string& reason) {
    if (peek() != c) fail(reason);
    ++pos_;
  }

  [[noreturn]] void fail_plain(const std::string& reason) const {
    throw InputError(path_, "malformed .npy header: " + reason);
  }

  // Shows where parsing stopped, since the header text is the only clue the user has.
  [[noreturn]] void fail(const std::string& reason) const {
    const std::string where = pos_ >= text_.size() ? "at the end of the header"
                                                   : "at offset " + std::to_string(pos_) + " (" +
                                                         quote(text_.substr(pos_), 40) + ")";
    fail_plain(reason + " " + where);
  }

  void mark_seen(bool* seen, const std::string& key) const {
    if (*seen) fail_plain("key " + quote(key) + " appears twice");
    *seen = true;
  }

  std::string parse_string(const std::string& what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected " + what);
    const std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escape sequences in header strings are not supported");
      if (text_[pos_] == '\n') break;
      ++pos_;
    }
    if (peek() != quote) fail("unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool parse_bool(const std::string& key) {
    for (const auto& [word, value] :
         {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail("expected True or False for " + quote(key));
  }

  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(', "'shape' must be a tuple such as (3, 4) or (5,)");
    skip_space();
    while (peek() != ')') {
      shape.push_back(parse_dimension());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in 'shape'");
      } else if (shape.size() == 1) {
        // "(5)" is the integer 5 in Python, not a tuple: numpy never writes it.
        fail("'shape' must be a tuple (a one-element tuple needs a trailing comma)");
      }
    }
    ++pos_;
    return shape;
  }

  int64_t parse_dimension() {
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (peek() < '0' || peek() > '9') fail("expected an integer dimension in 'shape'");
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value > (kInt64Max - digit) / 10) fail("dimension in 'shape' does not fit in int64");
      value = value * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 longs, as old numpy versions wrote them
    if (negative) fail_plain("negative dimension -" + std::to_string(value) + " in 'shape'");
    return value;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

// An open .npy file whose header has been validated against its size; the descriptor is
// positioned at the first data byte.
struct OpenNpy {
  FileDescriptor fd{-1};
  NpyHeader header;
  int64_t element_count = 0;
};

// Returns the file's size.
uint64_t open_regular_file(const std::string& path, OpenNpy* npy) {
  // O_NONBLOCK keeps open() of a FIFO from hanging; it is rejected just below anyway.
  const int raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (raw_fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw InputError(path, "file is missing");
    throw InputError(path, "cannot open: " + errno_text(err));
  }
  npy->fd.reset(raw_fd);

  struct stat info {};
  if (::fstat(npy->fd.get(), &info) != 0)
    throw InputError(path, "cannot stat: " + errno_text(errno));
  if (S_ISDIR(info.st_mode)) throw InputError(path, "is a directory, not a .npy file");
  if (!S_ISREG(info.st_mode))
    throw InputError(path, "not a regular file (the size must be known before reading)");
  const auto file_bytes = static_cast<uint64_t>(info.st_size);
  if (file_bytes == 0) throw InputError(path, "file is empty (not a .npy file)");
  return file_bytes;
}

// Reads the preamble and the header text after it, leaving `fd` at the first data byte,
// whose offset goes to `data_offset`.
std::string read_header_text(int fd, uint64_t file_bytes, const std::string& path,
                             std::size_t* data_offset) {
  // Magic (6), version (2), header length (2 in 1.0, 4 in 2.0 and 3.0).
  unsigned char preamble[12] = {};
  const std::size_t got = read_fully(fd, preamble, sizeof preamble, path);
  if (std::memcmp(preamble, kMagic, std::min(got, kMagicBytes)) != 0)
    throw InputError(path, "not a .npy file (bad magic)");
  if (got < 8)
    throw InputError(path, "truncated header (the file is only " + std::to_string(got) + " bytes)");
  const unsigned major = preamble[6], minor = preamble[7];
  if (minor != 0 || major < 1 || major > 3)
    throw InputError(path, "unsupported .npy format version " + std::to_string(major) + "." +
                               std::to_string(minor) + " (need 1.0, 2.0 or 3.0)");
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t preamble_bytes = 8 + length_bytes;
  if (got < preamble_bytes)
    throw InputError(path, "truncated header (the file is only " + std::to_string(got) + " bytes)");
  uint64_t header_bytes = 0;
  for (std::size_t i = length_bytes; i-- > 0;) header_bytes = (header_bytes << 8) | preamble[8 + i];
  if (preamble_bytes + header_bytes > file_bytes)
    throw InputError(path, "truncated header (its length field says " +
                               std::to_string(header_bytes) + " bytes but only " +
                               std::to_string(file_bytes - preamble_bytes) + " follow)");
  if (header_bytes > kMaxHeaderBytes)
    throw InputError(path, "header of " + std::to_string(header_bytes) +
                               " bytes is implausibly large (limit " +
                               std::to_string(kMaxHeaderBytes) + ")");

  // We read 12 bytes but a 1.0 preamble is 10: the header text starts inside `preamble`.
  std::string text(reinterpret_cast<const char*>(preamble) + preamble_bytes, got - preamble_bytes);
  if (text.size() > header_bytes)
    throw InputError(
        path, "malformed .npy header: it is only " + std::to_string(header_bytes) + " bytes long");
  const std::size_t already = text.size();
  text.resize(static_cast<std::size_t>(header_bytes));
  if (read_fully(fd, text.data() + already, text.size() - already, path) != text.size() - already)
    throw InputError(path, "truncated header (the file shrank while it was read)");
  *data_offset = preamble_bytes + static_cast<std::size_t>(header_bytes);
  return text;
}

NpyDtype dtype_of(const std::string& descr, const std::string& path) {
  if (descr == "<f4") return NpyDtype::float32;
  if (descr == "<f2") return NpyDtype::float16;
  if (descr == "|b1") return NpyDtype::bool8;
  if (descr == "<i4") return NpyDtype::int32;
  if (descr == "<i8") return NpyDtype::int64;
  throw InputError(path, "unsupported dtype " + quote(descr) +
                             " (need float32 '<f4' or float16 '<f2'; masks use bool '|b1', "
                             "document offsets int32 '<i4' or int64 '<i8')");
}

// A header whose data would not exactly fill the rest of the file is rejected before any data
// is read. Returns the element count.
int64_t checked_element_count(const NpyHeader& header, uint64_t file_bytes,
                              const std::string& path) {
  int64_t count = 0, data_bytes = 0;
  if (!shape_elements(header.shape, kInt64Max, &count))
    throw InputError(path,
                     "shape " + shape_text(header.shape) + " has more elements than fit in int64");
  if (!checked_mul(count, dtype_bytes(header.dtype), &data_bytes))
    throw InputError(path,
                     "shape " + shape_text(header.shape) + " needs more bytes than fit in int64");
  const uint64_t held_bytes = file_bytes - header.data_offset;
  const std::string detail =
      " (shape " + shape_text(header.shape) + ", dtype " + dtype_name(header.dtype) + ")";
  if (static_cast<uint64_t>(data_bytes) > held_bytes)
    throw InputError(path, "header claims " + std::to_string(count) + " elements (" +
                               std::to_string(data_bytes) + " bytes) but the file holds " +
                               std::to_string(held_bytes) + " bytes of data" + detail);
  if (static_cast<uint64_t>(data_bytes) < held_bytes)
    throw InputError(path, std::to_string(held_bytes - static_cast<uint64_t>(data_bytes)) +
                               " trailing bytes after the data" + detail);
  return count;
}

void open_and_parse(const std::string& path, OpenNpy* npy) {
  const uint64_t file_bytes = open_regular_file(path, npy);
  std::size_t data_offset = 0;
  const std::string text = read_header_text(npy->fd.get(), file_bytes, path, &data_offset);
  const HeaderParser::Fields fields = HeaderParser(text, path).parse();
  NpyHeader& header = npy->header;
  header.dtype = dtype_of(fields.descr, path);
  if (fields.fortran_order)
    throw InputError(path,
                     "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  header.shape = fields.shape;
  header.data_offset = data_offset;
  npy->element_count = checked_element_count(header, file_bytes, path);
}

void read_data(OpenNpy& npy, const std::string& path, void* out, std::size_t bytes) {
  if (read_fully(npy.fd.get(), out, bytes, path) != bytes)
    throw InputError(path, "truncated data (the file shrank while it was read)");
}

std::string make_header(const std::vector<int64_t>& shape, const char* descr = "<f4") {
  const std::string dict = std::string("{'descr': '") + descr +
                           "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  // Version 1.0 is readable by every numpy; 2.0 only if the dict outgrows its 16-bit length.
  const bool version1 = dict.size() + 1 + 64 <= 0xffff;
  const std::size_t preamble_bytes = version1 ? 10 : 12;
  const std::size_t unpadded = preamble_bytes + dict.size() + 1;  // +1 for the final '\n'
  const std::size_t padding = (64 - unpadded % 64) % 64;
  const std::size_t header_bytes = dict.size() + padding + 1;

  std::string out(kMagic, kMagicBytes);
  out += static_cast<char>(version1 ? 1 : 2);
  out += '\0';
  for (std::size_t i = 0; i < preamble_bytes - 8; ++i)
    out += static_cast<char>((header_bytes >> (8 * i)) & 0xff);
  out += dict;
  out.append(padding, ' ');
  out += '\n';
  return out;
}

// Writes `header` and then what `body(fd)` writes into a new temp file next to `path`, and
// returns the temp file's name; on failure removes the temp and throws RuntimeFailure.
// `body` returns 0 or an errno value.
template <typename Body>
std::string write_temp_file(const std::string& path, const std::string& header, Body&& body) {
  static std::atomic<unsigned long long> temp_counter{0};
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter.fetch_add(1));
  // O_EXCL: never clobber a file someone else happens to be writing under the same name.
  FileDescriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.get() < 0)
    throw RuntimeFailure("cannot write '" + path + "': cannot create temporary file '" + temp +
                         "': " + errno_text(errno));
  int err = write_fully(fd.get(), header.data(), header.size());
  if (err == 0) err = body(fd.get());
  const int close_err = fd.close_checked();
  if (err == 0) err = close_err;
  if (err != 0) {
    ::unlink(temp.c_str());
    throw RuntimeFailure("cannot write '" + path + "' (temporary file '" + temp +
                         "'): " + errno_text(err));
  }
  return temp;
}

// Elements of `shape`, refusing negative dimensions and products past `max_count`.
int64_t element_count(const std::string& path, const std::vector<int64_t>& shape,
                      int64_t max_count) {
  int64_t count = 0;
  if (!shape_elements(shape, max_count, &count))
    throw RuntimeFailure("cannot write '" + path + "': invalid shape " + shape_text(shape));
  return count;
}

// A complete float32 .npy file next to `path` (see write_temp_file).
std::string write_temp_npy(const std::string& path, const std::vector<int64_t>& shape,
                           const float* data) {
  const int64_t count = element_count(path, shape, kInt64Max / 4);
  if (count > 0 && data == nullptr) throw RuntimeFailure("cannot write '" + path + "': no data");
  return write_temp_file(path, make_header(shape), [&](int fd) {
    const auto data_bytes = static_cast<std::size_t>(count) * sizeof(float);
    if constexpr (std::endian::native == std::endian::little) {
      return data_bytes > 0 ? write_fully(fd, data, data_bytes) : 0;
    } else {
      int err = 0;
      std::vector<unsigned char> chunk;
      for (std::size_t first = 0; err == 0 && first < static_cast<std::size_t>(count);) {
        const std::size_t n = std::min(static_cast<std::size_t>(count) - first, kIoChunkBytes / 4);
        chunk.resize(n * 4);
        for (std::size_t i = 0; i < n; ++i) {
          const auto bits = std::bit_cast<uint32_t>(data[first + i]);
          for (int b = 0; b < 4; ++b)
            chunk[4 * i + b] = static_cast<unsigned char>(bits >> (8 * b));
        }
        err = write_fully(fd, chunk.data(), chunk.size());
        first += n;
      }
      return err;
    }
  });
}

// The same for a bool array (one byte per element, no byte order).
std::string write_temp_npy_bool(const std::string& path, const std::vector<int64_t>& shape,
                                const uint8_t* data) {
  const int64_t count = element_count(path, shape, kInt64Max);
  return write_temp_file(path, make_header(shape, "|b1"), [&](int fd) {
    return count > 0 ? write_fully(fd, data, static_cast<std::size_t>(count)) : 0;
  });
}

void rename_into_place(const std::string& temp, const std::string& path) {
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw RuntimeFailure("cannot write '" + path + "': renaming '" + temp +
                         "' failed: " + errno_text(err));
  }
}

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  OpenNpy npy;
  open_and_parse(path, &npy);
  return npy.header;
}

std::vector<float> read_npy_float_ranges(const std::string& path,
                                         const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                         NpyHeader* header_out) {
  static_assert(std::endian::native == std::endian::little, "ranged reads assume little-endian");
  OpenNpy npy;
  open_and_parse(path, &npy);
  if (npy.header.dtype != NpyDtype::float32 && npy.header.dtype != NpyDtype::float16)
    throw InputError(path, std::string("dtype ") + dtype_name(npy.header.dtype) +
                               ", expected float32 or float16");
  const std::size_t item = npy.header.dtype == NpyDtype::float32 ? 4 : 2;
  std::size_t total = 0;
  for (const auto& [first, count] : ranges) {
    if (first < 0 || count < 0 || first + count > npy.element_count)
      throw InputError(path, "internal error: element range outside the array");
    total += static_cast<std::size_t>(count);
  }
  std::vector<float> values(total);
  std::vector<unsigned char> chunk;
  std::size_t at = 0;
  for (const auto& [first, count] : ranges) {
    std::size_t done = 0;
    while (done < static_cast<std::size_t>(count)) {
      const std::size_t n = std::min(static_cast<std::size_t>(count) - done, kIoChunkBytes / item);
      chunk.resize(n * item);
      const auto offset = static_cast<off_t>(npy.header.data_offset +
                                             (static_cast<std::size_t>(first) + done) * item);
      std::size_t got = 0;
      while (got < chunk.size()) {
        const ssize_t r = ::pread(npy.fd.get(), chunk.data() + got, chunk.size() - got,
                                  offset + static_cast<off_t>(got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) throw InputError(path, "truncated data (the file shrank while it was read)");
        got += static_cast<std::size_t>(r);
      }
      float* out = values.data() + at + done;
      if (item == 4) {
        std::memcpy(out, chunk.data(), chunk.size());
      } else {
        for (std::size_t i = 0; i < n; ++i)
          out[i] = half_to_float(static_cast<uint16_t>(chunk[2 * i] | (chunk[2 * i + 1] << 8)));
      }
      done += n;
    }
    at += static_cast<std::size_t>(count);
  }
  if (header_out) *header_out = npy.header;
  return values;
}

std::vector<float> read_npy_float(const std::string& path, NpyHeader* header_out) {
  OpenNpy npy;
  open_and_parse(path, &npy);
  if (npy.header.dtype != NpyDtype::float32 && npy.header.dtype != NpyDtype::float16)
    throw InputError(path, std::string("dtype ") + dtype_name(npy.header.dtype) +
                               ", expected float32 or float16");
  const auto count = static_cast<std::size_t>(npy.element_count);
  std::vector<float> values(count);
  if (npy.header.dtype == NpyDtype::float32) {
    read_data(npy, path, values.data(), count * sizeof(float));
    if constexpr (std::endian::native == std::endian::big) {
      for (float& v : values) {
        const auto bits = std::bit_cast<uint32_t>(v);
        v = std::bit_cast<float>((bits >> 24) | ((bits >> 8) & 0xff00u) |
                                 ((bits << 8) & 0xff0000u) | (bits << 24));
      }
    }
  } else {
    // Chunked so a float16 file never costs more than the float32 result plus a small buffer.
    std::vector<unsigned char> chunk;
    for (std::size_t first = 0; first < count;) {
      const std::size_t n = std::min(count - first, kIoChunkBytes / 2);
      chunk.resize(n * 2);
      read_data(npy, path, chunk.data(), chunk.size());
      for (std::size_t i = 0; i < n; ++i)
        values[first + i] =
            half_to_float(static_cast<uint16_t>(chunk[2 * i] | (chunk[2 * i + 1] << 8)));
      first += n;
    }
  }
  if (header_out) *header_out = npy.header;
  return values;
}

std::vector<uint8_t> read_npy_bool(const std::string& path, NpyHeader* header_out) {
  OpenNpy npy;
  open_and_parse(path, &npy);
  if (npy.header.dtype != NpyDtype::bool8)
    throw InputError(
        path, std::string("dtype ") + dtype_name(npy.header.dtype) + ", expected bool ('|b1')");
  std::vector<uint8_t> values(static_cast<std::size_t>(npy.element_count));
  read_data(npy, path, values.data(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] > 1)
      throw InputError(path, "bool element " + std::to_string(i) + " has byte value " +
                                 std::to_string(values[i]) + " (expected 0 or 1)");
  if (header_out) *header_out = npy.header;
  return values;
}

std::vector<int64_t> read_npy_int64(const std::string& path, NpyHeader* header_out) {
  static_assert(std::endian::native == std::endian::little, "integer reads assume little-endian");
  OpenNpy npy;
  open_and_parse(path, &npy);
  const auto count = static_cast<std::size_t>(npy.element_count);
  std::vector<int64_t> values(count);
  if (npy.header.dtype == NpyDtype::int64) {
    read_data(npy, path, values.data(), count * sizeof(int64_t));
  } else if (npy.header.dtype == NpyDtype::int32) {
    std::vector<int32_t> narrow(count);
    read_data(npy, path, narrow.data(), count * sizeof(int32_t));
    std::copy(narrow.begin(), narrow.end(), values.begin());
  } else {
    throw InputError(path, std::string("dtype ") + dtype_name(npy.header.dtype) +
                               ", expected int32 ('<i4') or int64 ('<i8')");
  }
  if (header_out) *header_out = npy.header;
  return values;
}

void write_npy_float_atomic(const std::string& path, const std::vector<int64_t>& shape,
                            const float* data) {
  rename_into_place(write_temp_npy(path, shape, data), path);
}

void check_output_path(const std::string& option, const std::string& path) {
  if (path.empty()) throw InputError(option, "output path is empty");
  if (path.back() == '/')
    throw InputError(option,
                     "output path '" + path + "' ends in '/' (it names a directory, not a file)");
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";

  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) {
    const int err = errno;
    if (err == ENOENT)
      throw InputError(option,
                       "directory '" + dir + "' of output file '" + path + "' does not exist");
    if (err == ENOTDIR)
      throw InputError(option, "directory '" + dir + "' of output file '" + path +
                                   "' does not exist (a part of it is a file)");
    throw InputError(option, "cannot access directory '" + dir + "' of output file '" + path +
                                 "': " + errno_text(err));
  }
  if (!S_ISDIR(info.st_mode))
    throw InputError(
        option, "'" + dir + "' (the directory of output file '" + path + "') is not a directory");
  // Creating the temp file and renaming it needs write and search permission on the directory.
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(option, "directory '" + dir + "' of output file '" + path +
                                 "' is not writable: " + errno_text(errno));
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    throw InputError(option, "output file '" + path + "' is an existing directory");
}

AtomicOutputs::~AtomicOutputs() {
  for (const auto& [temp, final_path] : staged_) ::unlink(temp.c_str());
}

void AtomicOutputs::stage(const std::string& path, const std::vector<int64_t>& shape,
                          const float* data) {
  // Reserve first so remembering the temp cannot throw once it exists on disk.
  staged_.reserve(staged_.size() + 1);
  std::string final_path = path;
  std::string temp = write_temp_npy(path, shape, data);
  staged_.emplace_back(std::move(temp), std::move(final_path));
}

void AtomicOutputs::stage_bool(const std::string& path, const std::vector<int64_t>& shape,
                               const uint8_t* data) {
  staged_.reserve(staged_.size() + 1);
  std::string final_path = path;
  std::string temp = write_temp_npy_bool(path, shape, data);
  staged_.emplace_back(std::move(temp), std::move(final_path));
}

void AtomicOutputs::commit() {
  // Renames are atomic one by one, not as a group: if one fails, the ones before it stay in
  // place (their old contents are gone) and the rest are removed by the destructor.
  while (!staged_.empty()) {
    const auto [temp, final_path] = staged_.front();
    staged_.erase(staged_.begin());
    rename_into_place(temp, final_path);
  }
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, or nan with its payload kept
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise, since every half subnormal is a normal float.
    uint32_t float_exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    bits = sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  const auto bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {
    if (magnitude == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    // Keep the top payload bits and force the quiet bit so the payload cannot become 0 (inf).
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 is halfway between 65504 (the largest half) and 65536; the tie goes to the even
  // neighbour, which is infinity.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {  // normal half range, |f| >= 2^-14
    // Rebias the exponent in place; a carry out of the mantissa correctly bumps the exponent.
    uint32_t half = (magnitude - ((127u - 15u) << 23)) >> 13;
    const uint32_t rest = magnitude & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // 2^-25 is exactly halfway to the smallest subnormal 2^-24 and rounds to the even zero.
  if (magnitude <= 0x33000000u) return sign;
  // Subnormal half: value = m * 2^-24, m = significand >> shift.
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - (magnitude >> 23);  // 14 .. 24 here
  uint32_t half = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

}  // namespace ringattn

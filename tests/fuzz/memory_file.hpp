// The fuzz input as a file: it lives in memory (memfd), so each run costs no disk I/O, and
// the code under test opens it by path as it would any file.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"

namespace ringattn::fuzz {

struct MemoryFile {
  int fd = -1;
  std::string path;
  explicit MemoryFile(const char* name) {
    fd = ::memfd_create(name, 0);
    check(fd >= 0, "memfd_create failed");
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  // Replaces the file's content with the input.
  void set(const uint8_t* data, std::size_t size) {
    check(::ftruncate(fd, 0) == 0, "ftruncate failed");
    std::size_t done = 0;
    while (done < size) {
      const ssize_t put = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
      check(put > 0, "pwrite failed");
      done += static_cast<std::size_t>(put);
    }
  }
};

}  // namespace ringattn::fuzz

// Which NCCL this process calls, and the table of its entry points the NCCL communicator calls
// through. ringattn does not link NCCL: it is opened on first use, so that importing or
// starting ringattn never puts a second NCCL into a process that has (or will load) its own,
// such as PyTorch's. In the emulated build the table holds the emulator's functions.
#pragma once

#include <nccl.h>

#include <string>

namespace ringattn::ring {

// ncclCommInitRankConfig and the nonblocking finalize came with NCCL 2.14.
inline constexpr int kMinNcclVersionCode = 21400;

// The NCCL entry points ringattn uses, listed once: X(name) for each.
// clang-format off
#define RINGATTN_NCCL_ENTRY_POINTS(X) \
  X(ncclGetVersion) \
  X(ncclGetUniqueId) \
  X(ncclGetErrorString) \
  X(ncclGetLastError) \
  X(ncclCommInitRankConfig) \
  X(ncclCommGetAsyncError) \
  X(ncclCommFinalize) \
  X(ncclCommDestroy) \
  X(ncclCommAbort) \
  X(ncclGroupStart) \
  X(ncclGroupEnd) \
  X(ncclSend) \
  X(ncclRecv)
// clang-format on

// The NCCL entry points ringattn uses, with nccl.h's own names and signatures.
struct NcclLibrary {
#define RINGATTN_NCCL_DECLARE(f) decltype(&::f) f = nullptr;
  RINGATTN_NCCL_ENTRY_POINTS(RINGATTN_NCCL_DECLARE)
#undef RINGATTN_NCCL_DECLARE
  int version_code = 0;  // ncclGetVersion's
  std::string file;      // where it came from, for the device report
};

// The NCCL in use, opened on the first call, from the first of: an NCCL already loaded in the
// process (PyTorch's, say); the file set_nccl_library_path named; "libnccl.so.2" by the
// dynamic loader's search; the file CMake found at build time. Throws RuntimeFailure naming
// each place tried and why it failed, or the version found when it is older than 2.14; a
// later call tries again. Thread-safe; once opened, NCCL stays for the process's life.
const NcclLibrary& nccl_library();

// A file to try when no NCCL is in the process yet, before the loader's search (the Python
// package passes the NCCL of PyPI's nvidia-nccl wheel, the one PyTorch loads). No effect once
// NCCL is open; an empty path clears it.
void set_nccl_library_path(std::string path);

// "NCCL 2.28.9" for ncclGetVersion's code.
std::string nccl_version_name(int code);

}  // namespace ringattn::ring

// Opening NCCL (see nccl_library.hpp): one NCCL per process, the one already there if any,
// found on first use and kept. An NCCL linked at load time would be the toolkit's, loaded
// before a later `import torch` asks for its own libnccl.so.2 and gets ours instead (by
// soname), older and missing symbols it needs.
#include "ring/nccl_library.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ringattn/errors.hpp"

#if !RINGATTN_CUDA_EMULATION
#include <dlfcn.h>
#endif

namespace ringattn::ring {

namespace {

std::mutex g_mu;
std::string g_handed_path;                        // set_nccl_library_path's, under g_mu
std::atomic<const NcclLibrary*> g_open{nullptr};  // set once, when NCCL is open

void check_version(NcclLibrary& l) {
  if (l.ncclGetVersion(&l.version_code) != ncclSuccess)
    throw RuntimeFailure("NCCL at " + l.file + ": ncclGetVersion failed");
  if (l.version_code < kMinNcclVersionCode)
    throw RuntimeFailure("NCCL at " + l.file + " is " + nccl_version_name(l.version_code) +
                         ", and ringattn needs " + nccl_version_name(kMinNcclVersionCode) +
                         " or newer (nonblocking ncclCommInitRankConfig)");
}

#if RINGATTN_CUDA_EMULATION

// The emulated devices' NCCL (src/emu/nccl.cpp), linked into this build.
NcclLibrary open_nccl(const std::string&) {
  NcclLibrary l;
#define RINGATTN_NCCL_TAKE(f) l.f = &::f;
  RINGATTN_NCCL_ENTRY_POINTS(RINGATTN_NCCL_TAKE)
#undef RINGATTN_NCCL_TAKE
  l.file = "the SIMT emulator";
  check_version(l);
  return l;
}

#else

constexpr const char* kSoname = "libnccl.so.2";

template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn, const std::string& file) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn) throw RuntimeFailure("NCCL at " + file + " has no " + name);
}

std::string why_not(const char* error) { return error && *error ? error : "not found"; }

// The table from an open NCCL, or a RuntimeFailure naming the file and what it lacks.
NcclLibrary resolve_all(void* handle) {
  NcclLibrary l;
  l.file = kSoname;
  resolve(handle, "ncclGetVersion", l.ncclGetVersion, l.file);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(l.ncclGetVersion), &info) && info.dli_fname)
    l.file = info.dli_fname;
  // Before the rest: an NCCL too old to have them is named as such, not as a missing symbol.
  check_version(l);
#define RINGATTN_NCCL_RESOLVE(f) resolve(handle, #f, l.f, l.file);
  RINGATTN_NCCL_ENTRY_POINTS(RINGATTN_NCCL_RESOLVE)  // ncclGetVersion again: the same symbol
#undef RINGATTN_NCCL_RESOLVE
  return l;
}

// Tries each place in turn; the first that opens is the process's NCCL from then on.
NcclLibrary open_nccl(const std::string& handed_path) {
  std::string tried;
  const auto note = [&](const std::string& what) { tried += (tried.empty() ? "" : "; ") + what; };
  // RTLD_NOLOAD opens nothing: a handle only if a libnccl.so.2 is in the process already
  // (matched by soname, so PyTorch's nvidia/nccl/lib copy too). Using another would put two
  // NCCLs in one process.
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_NOLOAD);
  if (!handle) {
    dlerror();  // clear it: not being loaded yet is not an error
    note("already in this process: no");
    std::vector<std::string> candidates;
    if (!handed_path.empty()) candidates.push_back(handed_path);
    candidates.emplace_back(kSoname);
#ifdef RINGATTN_NCCL_FILE
    if (std::string(RINGATTN_NCCL_FILE) != kSoname) candidates.emplace_back(RINGATTN_NCCL_FILE);
#endif
    for (const std::string& c : candidates) {
      // RTLD_LOCAL: ringattn reaches NCCL through this table only. A library loaded later
      // that needs libnccl.so.2 gets this one (by soname), and so does one opening the same
      // file by its path (torch preloads its wheel's: why the Python package hands it over).
      handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      const std::string why = why_not(dlerror());  // glibc's usually starts with the name
      note(why.rfind(c, 0) == 0 ? why : c + ": " + why);
    }
  }
  if (!handle)
    throw RuntimeFailure("cannot open NCCL, which the NCCL transport needs (" + tried +
                         "); install NCCL 2.14 or newer (the CUDA toolkit's, or pip's "
                         "nvidia-nccl-cu12/-cu13) where the dynamic loader finds it "
                         "(LD_LIBRARY_PATH)");
  try {
    return resolve_all(handle);  // the handle stays open for the process's life
  } catch (...) {
    // Not this one after all: an NCCL that ringattn cannot use must not stay loaded for a
    // later library (torch) to bind to. (Opened with RTLD_NOLOAD, this drops our reference.)
    dlclose(handle);
    throw;
  }
}

#endif

}  // namespace

const NcclLibrary& nccl_library() {
  if (const NcclLibrary* l = g_open.load(std::memory_order_acquire)) return *l;
  const std::lock_guard lock(g_mu);
  static NcclLibrary opened;  // written once, under g_mu, before g_open publishes it
  if (!g_open.load(std::memory_order_relaxed)) {
    opened = open_nccl(g_handed_path);  // throws, leaving nothing published, on failure
    g_open.store(&opened, std::memory_order_release);
  }
  return opened;
}

void set_nccl_library_path(std::string path) {
  const std::lock_guard lock(g_mu);
  g_handed_path = std::move(path);
}

std::string nccl_version_name(int code) {
  // Since 2.9 the code is major*10000 + minor*100 + patch (before: major*1000 + minor*100).
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(code % 100);
}

}  // namespace ringattn::ring

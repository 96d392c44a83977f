// The emulated CUDA runtime (see runtime.hpp and cuda_shim/cuda_runtime_api.h): devices with
// their own memory accounting and kernel attributes, streams as in-order task queues each
// run by a worker thread, events as generation counters, stream-ordered pools, and the
// runtime's error rules (per-thread last error, sticky device errors after a kernel fault,
// handles used on the wrong device refused as the real runtime refuses them).
#include "emu/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "core/environment.hpp"
#include "emu/fault.hpp"
#include "emu/launch.hpp"

namespace ringattn::emu::runtime {
namespace {

using Clock = std::chrono::steady_clock;

constexpr DeviceProfile kSm90{"sm_90", 9, 0, 132, 49152, 232448};
constexpr DeviceProfile kSm86{"sm_86", 8, 6, 84, 49152, 101376};

// A failure a stream task reports with its runtime code (a kernel fault is LaunchFailure).
struct TaskError : std::runtime_error {
  TaskError(cudaError_t e, const std::string& what) : std::runtime_error(what), error(e) {}
  cudaError_t error;
};

struct Pool {
  int device = 0;
  std::uint64_t release_threshold = 0;
  std::size_t reserved_unused = 0;  // freed into the pool, kept for reuse
};

struct Device;

struct Stream {
  Stream(Device& d, bool is_blocking, bool is_legacy, bool with_delays, std::uint64_t delay_seed);
  void run();
  // Blocks until the tasks submitted before `target` have run.
  void wait_for(std::uint64_t target) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return completed >= target; });
  }

  Device& device;
  const bool blocking, legacy;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  std::uint64_t submitted = 0, completed = 0;
  bool stopping = false;
  bool delays = false;
  std::mt19937_64 rng;
  std::thread worker;  // last: starts once the rest is built
};

struct Device {
  int id = 0;
  DeviceProfile profile{};
  std::size_t total = 0;
  std::mutex mu;                                  // guards everything below
  std::size_t used = 0;                           // live allocations plus what pools keep for reuse
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute, per kernel
  cudaError_t sticky = cudaSuccess;
  std::vector<Stream*> streams;  // every live stream of the device, legacy first
  Stream* legacy_stream = nullptr;
  Pool default_pool;
};

struct Allocation {
  std::size_t bytes;
  int device;
  Pool* pool;  // null for cudaMalloc
};

struct Event {
  int device = 0;
  bool timing = true;
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0, reached = 0;  // generations: record → reached when it runs
  Clock::time_point time{};
};

// The process's emulated machine. Never destroyed: stream workers may still be parked in a
// task (an NCCL wait) when the process exits, and joining them there would hang.
struct Machine {
  Machine();
  std::vector<std::unique_ptr<Device>> devices;
  std::uint64_t delay_seed = 0;
  bool delays = false;
  std::mutex mu;  // guards the registries
  std::set<Stream*> streams;
  // Destroyed streams (their objects are kept, so an address never names two streams): a
  // call naming one is undefined behaviour on a GPU, and a crash there (a lent H200 ended a
  // run in a segfault for a cudaStreamSynchronize after cudaStreamDestroy), so it is fatal.
  std::set<Stream*> destroyed;
  std::map<CUevent_st*, std::shared_ptr<Event>> events;
  std::set<Pool*> pools;
  std::map<std::uintptr_t, Allocation> allocations;  // by start address
  std::string last_detail;
  cudaError_t last_detail_error = cudaSuccess;
};

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

[[noreturn]] void bad_environment(const std::string& what) {
  std::fprintf(stderr, "ringattn emulator: %s\n", what.c_str());
  std::exit(2);
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> parts;
  while (true) {
    const auto comma = s.find(',');
    parts.emplace_back(s.substr(0, comma));
    if (comma == std::string_view::npos) return parts;
    s.remove_prefix(comma + 1);
  }
}

std::uint64_t parse_env_number(Env variable, std::uint64_t fallback, std::uint64_t lo,
                               std::uint64_t hi) {
  const char* env = environment_value(variable);
  if (!env || !*env) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*end != '\0' || env[0] == '-' || v < lo || v > hi)
    bad_environment(std::string(environment_name(variable)) + ": must be a number in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + env + "'");
  return v;
}

Machine::Machine() {
  const auto count = static_cast<int>(parse_env_number(Env::emu_devices, 4, 1, 64));
  const std::size_t memory = parse_env_number(Env::emu_device_memory, std::size_t{16} << 30,
                                              std::size_t{1} << 20, std::size_t{1} << 44);
  std::vector<std::string> profiles{"sm_90"};
  if (const char* env = environment_value(Env::emu_profile); env && *env)
    profiles = split_commas(env);
  if (const char* env = environment_value(Env::emu_stream_delay); env && *env) {
    delays = true;
    delay_seed = parse_env_number(Env::emu_stream_delay, 0, 0, UINT64_MAX);
  }
  for (int d = 0; d < count; ++d) {
    const std::string& name = profiles[std::min<std::size_t>(d, profiles.size() - 1)];
    auto dev = std::make_unique<Device>();
    dev->id = d;
    if (name == "sm_90")
      dev->profile = kSm90;
    else if (name == "sm_86")
      dev->profile = kSm86;
    else
      bad_environment("RINGATTN_EMU_PROFILE: '" + name +
                      "' is not a device profile (sm_90, sm_86)");
    dev->total = memory;
    dev->default_pool.device = d;
    devices.push_back(std::move(dev));
  }
}

Machine& machine() {
  static Machine* m = new Machine;
  return *m;
}

cudaError_t set_last(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

void note_detail(cudaError_t e, const std::string& detail) {
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  m.last_detail = detail;
  m.last_detail_error = e;
}

Device* device_at(int d) {
  Machine& m = machine();
  if (d < 0 || d >= static_cast<int>(m.devices.size())) return nullptr;
  return m.devices[static_cast<std::size_t>(d)].get();
}

Device& current() { return *machine().devices[static_cast<std::size_t>(t_device)]; }

cudaError_t sticky_of(Device& d) {
  std::lock_guard lock(d.mu);
  return d.sticky;
}

Stream::Stream(Device& d, bool is_blocking, bool is_legacy, bool with_delays,
               std::uint64_t delay_seed)
    : device(d),
      blocking(is_blocking),
      legacy(is_legacy),
      delays(with_delays),
      rng(delay_seed),
      worker([this] { run(); }) {}

void Stream::run() {
  t_device = device.id;
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      task = std::move(queue.front());
      queue.pop_front();
    }
    if (delays) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    if (sticky_of(device) == cudaSuccess) {
      cudaError_t error = cudaSuccess;
      std::string what;
      try {
        task();
      } catch (const TaskError& e) {
        error = e.error;
        what = e.what();
      } catch (const std::exception& e) {
        error = cudaErrorLaunchFailure;
        what = e.what();
      }
      if (error != cudaSuccess) {
        std::fprintf(stderr, "ringattn emulator: device %d: %s\n", device.id, what.c_str());
        note_detail(error, what);
        std::lock_guard lock(device.mu);
        if (device.sticky == cudaSuccess) device.sticky = error;
      }
    }
    {
      std::lock_guard lock(mu);
      ++completed;
    }
    cv.notify_all();
  }
}

Stream* legacy_of(Device& d) {
  std::lock_guard lock(d.mu);
  if (!d.legacy_stream) {
    Machine& m = machine();
    bool delays;
    std::uint64_t seed;
    {
      std::lock_guard machine_lock(m.mu);
      delays = m.delays;
      seed = m.delay_seed ^ 0x6c6567616379ull ^ static_cast<std::uint64_t>(d.id);
    }
    auto* s = new Stream(d, true, true, delays, seed);
    d.legacy_stream = s;
    d.streams.insert(d.streams.begin(), s);
  }
  return d.legacy_stream;
}

// The stream a handle names (nullptr: the current device's legacy stream), or null.
[[noreturn]] void used_after_destroy(const void* handle, const char* call) {
  std::fprintf(stderr,
               "ringattn emulator: %s names stream %p, which cudaStreamDestroy destroyed: "
               "undefined on a GPU (it can crash there), so the emulator stops\n",
               call, handle);
  std::abort();
}

Stream* resolve(cudaStream_t handle, const char* call = "a runtime call") {
  if (!handle) return legacy_of(current());
  auto* s = reinterpret_cast<Stream*>(handle);
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  if (m.streams.count(s)) return s;
  if (m.destroyed.count(s)) used_after_destroy(handle, call);
  return nullptr;
}

std::shared_ptr<Event> resolve(cudaEvent_t handle) {
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  const auto it = m.events.find(handle);
  return it == m.events.end() ? nullptr : it->second;
}

Pool* resolve(cudaMemPool_t handle) {
  auto* p = reinterpret_cast<Pool*>(handle);
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  if (m.pools.count(p)) return p;
  for (auto& d : m.devices)
    if (&d->default_pool == p) return p;
  return nullptr;
}

// Adds a task to `s` with the legacy stream's implicit ordering: work on the legacy stream
// waits for what the device's blocking streams were given before it, and theirs for it.
cudaError_t push(Stream& s, std::function<void()> task) {
  Device& d = s.device;
  std::vector<std::pair<Stream*, std::uint64_t>> before;
  {
    std::lock_guard lock(d.mu);
    if (d.sticky != cudaSuccess) return d.sticky;
    for (Stream* other : d.streams) {
      if (other == &s || !other->blocking) continue;
      if (!s.legacy && !other->legacy) continue;
      if (!s.blocking) continue;
      std::lock_guard other_lock(other->mu);
      before.emplace_back(other, other->submitted);
    }
    std::lock_guard lock_s(s.mu);
    if (!before.empty())
      s.queue.emplace_back([before] {
        for (const auto& [other, target] : before) other->wait_for(target);
      });
    s.queue.push_back(std::move(task));
    s.submitted += before.empty() ? 1 : 2;
  }
  s.cv.notify_all();
  return cudaSuccess;
}

void synchronize(Stream& s) {
  std::uint64_t target;
  {
    std::lock_guard lock(s.mu);
    target = s.submitted;
  }
  s.wait_for(target);
}

void synchronize(Device& d) {
  legacy_of(d);
  std::vector<Stream*> streams;
  {
    std::lock_guard lock(d.mu);
    streams = d.streams;
  }
  for (Stream* s : streams) synchronize(*s);
}

std::size_t rounded(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

void* host_block(std::size_t bytes) {
  void* p = std::aligned_alloc(256, rounded(bytes));
  // Poison what is small enough to be cheap: a kernel reading memory nobody wrote then sees
  // NaN (0xff bytes), not zeros that could pass for a result.
  if (p && bytes <= (std::size_t{64} << 20)) std::memset(p, 0xff, rounded(bytes));
  return p;
}

cudaError_t allocate(void** ptr, std::size_t bytes, Device& d, Pool* pool) {
  if (!ptr) return set_last(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const std::size_t size = rounded(bytes);
  {
    std::lock_guard lock(d.mu);
    std::size_t reuse = pool ? std::min(pool->reserved_unused, size) : 0;
    if (d.used - reuse + size > d.total) {
      // What the pools keep unused is given back before refusing (a trim), as the driver does.
      if (pool) {
        d.used -= pool->reserved_unused;
        pool->reserved_unused = 0;
        reuse = 0;
      }
      if (d.used + size > d.total) {
        note_detail(cudaErrorMemoryAllocation,
                    "asked for " + std::to_string(bytes) + " bytes on emulated device " +
                        std::to_string(d.id) + " with " + std::to_string(d.total - d.used) +
                        " free of " + std::to_string(d.total));
        return set_last(cudaErrorMemoryAllocation);
      }
    }
    if (pool) pool->reserved_unused -= reuse;
    d.used += size - reuse;
  }
  void* p = host_block(bytes);
  if (!p) {
    std::lock_guard lock(d.mu);
    d.used -= size;
    return set_last(cudaErrorMemoryAllocation);
  }
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  m.allocations[reinterpret_cast<std::uintptr_t>(p)] = {bytes, d.id, pool};
  *ptr = p;
  return cudaSuccess;
}

// Gives an allocation back (to its pool, which releases past its threshold).
void release(void* p, const Allocation& a) {
  std::free(p);
  Device& d = *device_at(a.device);
  const std::size_t size = rounded(a.bytes);
  std::lock_guard lock(d.mu);
  if (!a.pool) {
    d.used -= size;
    return;
  }
  a.pool->reserved_unused += size;
  if (a.pool->reserved_unused > a.pool->release_threshold) {
    const std::size_t excess = a.pool->reserved_unused - a.pool->release_threshold;
    a.pool->reserved_unused -= excess;
    d.used -= excess;
  }
}

// Takes the allocation starting at p out of the registry; false when there is none.
bool take_allocation(void* p, Allocation& out) {
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  const auto it = m.allocations.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == m.allocations.end()) return false;
  out = it->second;
  m.allocations.erase(it);
  return true;
}

bool valid_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  const bool dst_dev = is_device_memory(dst, bytes), src_dev = is_device_memory(src, bytes);
  switch (kind) {
    case cudaMemcpyHostToHost:
      return true;
    case cudaMemcpyHostToDevice:
      return dst_dev;
    case cudaMemcpyDeviceToHost:
      return src_dev;
    case cudaMemcpyDeviceToDevice:
      return dst_dev && src_dev;
    case cudaMemcpyDefault:
      return true;
  }
  return false;
}

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue:
      return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction:
      return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* error_text(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unknown error";
}

}  // namespace

int device_count() { return static_cast<int>(machine().devices.size()); }
const DeviceProfile& device_profile(int device) { return device_at(device)->profile; }
int current_device() { return t_device; }

int stream_device(cudaStream_t stream) {
  Stream* s = resolve(stream);
  return s ? s->device.id : -1;
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> task) {
  Stream* s = resolve(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  return push(*s, std::move(task));
}

bool is_device_memory(const void* p, std::size_t bytes, int device) {
  Machine& m = machine();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(m.mu);
  auto it = m.allocations.upper_bound(at);
  if (it == m.allocations.begin()) return false;
  --it;
  const Allocation& a = it->second;
  if (device >= 0 && a.device != device) return false;
  return at - it->first <= a.bytes && bytes <= a.bytes - (at - it->first);
}

cudaError_t fail(cudaError_t error, const std::string& detail) {
  note_detail(error, detail);
  return set_last(error);
}

void set_stream_delays(bool enabled, std::uint64_t seed) {
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  m.delays = enabled;
  m.delay_seed = seed;
}

std::string last_failure_detail() {
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  return m.last_detail;
}

cudaError_t launch(const void* kernel, const char* name, Dim3 grid, Dim3 block,
                   std::size_t shared_bytes, cudaStream_t stream, std::function<void()> body) {
  Stream* s = resolve(stream);
  if (!s)
    return fail(cudaErrorInvalidResourceHandle,
                std::string("launch of '") + name + "': not a live stream");
  Device& d = s->device;
  if (d.id != t_device)
    return fail(cudaErrorInvalidResourceHandle, std::string("launch of '") + name +
                                                    "' on a stream of device " +
                                                    std::to_string(d.id) + " while device " +
                                                    std::to_string(t_device) + " is current");
  const std::uint64_t threads = volume(block);
  if (threads == 0 || threads > 1024 || volume(grid) == 0 || block.z > 64 || grid.y > 65535 ||
      grid.z > 65535)
    return fail(cudaErrorInvalidConfiguration, std::string("launch of '") + name + "': grid " +
                                                   to_string(grid) + ", block " + to_string(block));
  int allowed = static_cast<int>(d.profile.shared_per_block);
  {
    std::lock_guard lock(d.mu);
    if (const auto it = d.max_dynamic_shared.find(kernel); it != d.max_dynamic_shared.end())
      allowed = std::max(allowed, it->second);
  }
  if (shared_bytes > static_cast<std::size_t>(allowed))
    return fail(cudaErrorInvalidValue,
                std::string("launch of '") + name + "' asks for " + std::to_string(shared_bytes) +
                    " bytes of dynamic shared memory; emulated " + d.profile.arch + " device " +
                    std::to_string(d.id) + " allows " + std::to_string(allowed) +
                    " for it (raise it with cudaFuncSetAttribute("
                    "cudaFuncAttributeMaxDynamicSharedMemorySize), up to " +
                    std::to_string(d.profile.shared_per_block_optin) + ")");
  LaunchConfig config{name, grid, block, static_cast<std::uint32_t>(shared_bytes), {}};
  return set_last(push(*s, [config, body = std::move(body)]() mutable {
    // The allocations live when the kernel runs: where its blocks' plain stores are checked
    // for races (emu/global_writes.hpp).
    {
      Machine& m = machine();
      std::lock_guard lock(m.mu);
      config.global.reserve(m.allocations.size());
      for (const auto& [at, a] : m.allocations) config.global.push_back({at, at + a.bytes});
    }
    emu::launch(config, body);
  }));
}

}  // namespace ringattn::emu::runtime

// ---- the runtime API ----------------------------------------------------------------------
using namespace ringattn::emu::runtime;

const char* cudaGetErrorName(cudaError_t error) { return error_name(error); }

const char* cudaGetErrorString(cudaError_t error) {
  // The runtime's text, and the emulator's account of the failure when it is this error.
  thread_local std::string text;
  text = error_text(error);
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  if (error != cudaSuccess && m.last_detail_error == error && !m.last_detail.empty())
    text += " (emulator: " + m.last_detail + ")";
  return text.c_str();
}

cudaError_t cudaGetLastError() {
  const cudaError_t sticky = sticky_of(current());
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return sticky != cudaSuccess ? sticky : e;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = sticky_of(current());
  return sticky != cudaSuccess ? sticky : t_last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return set_last(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!device_at(device))
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): " +
                                            std::to_string(device_count()) + " emulated devices");
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return set_last(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  Device* d = device_at(device);
  if (!d) return set_last(cudaErrorInvalidDevice);
  if (!prop) return set_last(cudaErrorInvalidValue);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated %s (CPU)", d->profile.arch);
  prop->totalGlobalMem = d->total;
  prop->sharedMemPerBlock = d->profile.shared_per_block;
  prop->sharedMemPerBlockOptin = d->profile.shared_per_block_optin;
  prop->sharedMemPerMultiprocessor = d->profile.shared_per_block_optin + 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = d->profile.major;
  prop->minor = d->profile.minor;
  prop->multiProcessorCount = d->profile.multiprocessors;
  prop->pciBusID = device + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  Device* d = device_at(device);
  if (!d) return set_last(cudaErrorInvalidDevice);
  if (!value) return set_last(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(d->profile.shared_per_block);
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = d->profile.multiprocessors;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = d->profile.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = d->profile.minor;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(d->profile.shared_per_block_optin);
      break;
    default:
      return set_last(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (!device_at(device)) return set_last(cudaErrorInvalidDevice);
  if (!bus_id || len < 13) return set_last(cudaErrorInvalidValue);
  std::snprintf(bus_id, static_cast<std::size_t>(len), "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  synchronize(current());
  return set_last(sticky_of(current()));
}

// Not in every runtime's hot path, but in the API: forgets a device's failure and memory, as
// a fresh context would (tests that provoke faults use it to go on with a clean device).
cudaError_t cudaDeviceReset() {
  Device& d = current();
  synchronize(d);
  Machine& m = machine();
  std::vector<std::pair<void*, Allocation>> mine;
  {
    std::lock_guard lock(m.mu);
    for (auto it = m.allocations.begin(); it != m.allocations.end();) {
      if (it->second.device == d.id) {
        mine.emplace_back(reinterpret_cast<void*>(it->first), it->second);
        it = m.allocations.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [p, a] : mine) release(p, a);
  std::lock_guard lock(d.mu);
  d.sticky = cudaSuccess;
  d.max_dynamic_shared.clear();
  t_last_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  if (!free || !total) return set_last(cudaErrorInvalidValue);
  Device& d = current();
  std::lock_guard lock(d.mu);
  *total = d.total;
  *free = d.total - d.used;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  if (const cudaError_t s = sticky_of(current()); s != cudaSuccess) return set_last(s);
  return allocate(ptr, bytes, current(), nullptr);
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  synchronize(current());  // cudaFree synchronises the device
  Allocation a{};
  if (!take_allocation(ptr, a))
    return fail(cudaErrorInvalidValue, "cudaFree of a pointer that is no live allocation");
  release(ptr, a);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, std::size_t bytes, cudaStream_t stream) {
  const int d = stream_device(stream);
  if (d < 0) return set_last(cudaErrorInvalidResourceHandle);
  Device& dev = *device_at(d);
  return cudaMallocFromPoolAsync(ptr, bytes, reinterpret_cast<cudaMemPool_t>(&dev.default_pool),
                                 stream);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (!ptr) return cudaSuccess;
  Stream* s = resolve(stream);
  if (!s) return set_last(cudaErrorInvalidResourceHandle);
  Allocation a{};
  if (!take_allocation(ptr, a))
    return fail(cudaErrorInvalidValue, "cudaFreeAsync of a pointer that is no live allocation");
  // The memory is reused once the stream reaches the free; until then it stays valid for the
  // work before it.
  const cudaError_t e = push(*s, [ptr, a] { release(ptr, a); });
  if (e != cudaSuccess) release(ptr, a);
  return set_last(e);
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (!pool || !props || props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice)
    return set_last(cudaErrorInvalidValue);
  if (!device_at(props->location.id)) return set_last(cudaErrorInvalidDevice);
  auto* p = new Pool;
  p->device = props->location.id;
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  m.pools.insert(p);
  *pool = reinterpret_cast<cudaMemPool_t>(p);
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  Pool* p = resolve(pool);
  if (!p) return set_last(cudaErrorInvalidValue);
  cudaMemPoolTrimTo(pool, 0);
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  if (!m.pools.erase(p)) return set_last(cudaErrorInvalidValue);  // a default pool
  delete p;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  Device* d = device_at(device);
  if (!d) return set_last(cudaErrorInvalidDevice);
  if (!pool) return set_last(cudaErrorInvalidValue);
  *pool = reinterpret_cast<cudaMemPool_t>(&d->default_pool);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Pool* p = resolve(pool);
  if (!p || !value || attr != cudaMemPoolAttrReleaseThreshold)
    return set_last(cudaErrorInvalidValue);
  Device& d = *device_at(p->device);
  std::lock_guard lock(d.mu);
  p->release_threshold = *static_cast<std::uint64_t*>(value);
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Pool* p = resolve(pool);
  if (!p || !value) return set_last(cudaErrorInvalidValue);
  Device& d = *device_at(p->device);
  std::lock_guard lock(d.mu);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      *static_cast<std::uint64_t*>(value) = p->release_threshold;
      return cudaSuccess;
    default:
      return set_last(cudaErrorInvalidValue);
  }
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, std::size_t min_bytes_to_keep) {
  Pool* p = resolve(pool);
  if (!p) return set_last(cudaErrorInvalidValue);
  Device& d = *device_at(p->device);
  std::lock_guard lock(d.mu);
  if (p->reserved_unused > min_bytes_to_keep) {
    d.used -= p->reserved_unused - min_bytes_to_keep;
    p->reserved_unused = min_bytes_to_keep;
  }
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, std::size_t bytes, cudaMemPool_t pool,
                                    cudaStream_t stream) {
  Pool* p = resolve(pool);
  const int d = stream_device(stream);
  if (!p || d < 0) return set_last(cudaErrorInvalidValue);
  if (const cudaError_t s = sticky_of(*device_at(p->device)); s != cudaSuccess) return set_last(s);
  return allocate(ptr, bytes, *device_at(p->device), p);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return set_last(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!valid_copy(dst, src, bytes, kind))
    return fail(cudaErrorInvalidValue,
                "cudaMemcpy: a pointer that the copy's kind says is device memory is not (or "
                "the range runs past its allocation)");
  return set_last(push(*s, [dst, src, bytes] { std::memmove(dst, src, bytes); }));
}

cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                              std::size_t width, std::size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return set_last(cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  // As CUDA: each pitch at least the row's width; the whole strided extent must be memory
  // of the kind the copy says.
  if (dpitch < width || spitch < width)
    return fail(cudaErrorInvalidPitchValue, "cudaMemcpy2D: a pitch is less than the width");
  const std::size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dst_dev && !is_device_memory(dst, dspan)) || (src_dev && !is_device_memory(src, sspan)))
    return fail(cudaErrorInvalidValue,
                "cudaMemcpy2D: a pointer that the copy's kind says is device memory is not (or "
                "the strided range runs past its allocation)");
  return set_last(push(*s, [=] {
    for (std::size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
  }));
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  synchronize(*legacy_of(current()));
  return set_last(sticky_of(current()));
}

cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return set_last(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!is_device_memory(dst, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemset of memory that is no device allocation");
  return set_last(push(*s, [dst, value, bytes] { std::memset(dst, value, bytes); }));
}

cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(dst, value, bytes, nullptr);
  if (e != cudaSuccess) return e;
  synchronize(*legacy_of(current()));
  return set_last(sticky_of(current()));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (!stream || flags > cudaStreamNonBlocking) return set_last(cudaErrorInvalidValue);
  Device& d = current();
  legacy_of(d);
  Machine& m = machine();
  static std::uint64_t ordinal = 0;
  std::uint64_t seed;
  bool delays;
  {
    std::lock_guard lock(m.mu);
    seed = m.delay_seed + 0x9e3779b97f4a7c15ull * ++ordinal;
    delays = m.delays;
  }
  auto* s = new Stream(d, (flags & cudaStreamNonBlocking) == 0, false, delays, seed);
  {
    std::lock_guard lock(d.mu);
    d.streams.push_back(s);
  }
  {
    std::lock_guard lock(m.mu);
    m.streams.insert(s);
  }
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  auto* s = reinterpret_cast<Stream*>(stream);
  Machine& m = machine();
  {
    std::lock_guard lock(m.mu);
    if (stream && m.destroyed.count(s)) used_after_destroy(stream, "cudaStreamDestroy");
    if (!stream || !m.streams.erase(s)) return set_last(cudaErrorInvalidResourceHandle);
    m.destroyed.insert(s);
  }
  // The work already given to it still runs (as on the device), then the worker stops.
  synchronize(*s);
  {
    std::lock_guard lock(s->device.mu);
    auto& v = s->device.streams;
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
  }
  // The worker stops; the object stays, because a legacy-ordering wait queued on another
  // stream may still name it (it only reads its counters, which no longer change).
  {
    std::lock_guard lock(s->mu);
    s->stopping = true;
  }
  s->cv.notify_all();
  s->worker.join();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Stream* s = resolve(stream, "cudaStreamSynchronize");
  if (!s) return set_last(cudaErrorInvalidResourceHandle);
  synchronize(*s);
  return set_last(sticky_of(s->device));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return set_last(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky_of(s->device); e != cudaSuccess) return set_last(e);
  std::lock_guard lock(s->mu);
  return s->completed >= s->submitted ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (!status) return set_last(cudaErrorInvalidValue);
  if (!resolve(stream)) return set_last(cudaErrorInvalidResourceHandle);
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (!event || flags > (cudaEventBlockingSync | cudaEventDisableTiming))
    return set_last(cudaErrorInvalidValue);
  auto e = std::make_shared<Event>();
  e->device = t_device;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  auto* handle = reinterpret_cast<CUevent_st*>(e.get());
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  m.events[handle] = std::move(e);
  *event = handle;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Machine& m = machine();
  std::lock_guard lock(m.mu);
  // Work that still refers to it keeps its own reference, as the runtime defers the release.
  if (!m.events.erase(event)) return set_last(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::shared_ptr<Event> e = resolve(event);
  Stream* s = resolve(stream);
  if (!e || !s)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a live event or stream");
  if (e->device != s->device.id)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventRecord: the event was created on device " + std::to_string(e->device) +
                    " and the stream belongs to device " + std::to_string(s->device.id));
  std::uint64_t generation;
  {
    std::lock_guard lock(e->mu);
    generation = ++e->recorded;
  }
  return set_last(push(*s, [e, generation] {
    {
      std::lock_guard lock(e->mu);
      e->reached = std::max(e->reached, generation);
      e->time = Clock::now();
    }
    e->cv.notify_all();
  }));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::shared_ptr<Event> e = resolve(event);
  if (!e) return set_last(cudaErrorInvalidResourceHandle);
  if (const cudaError_t s = sticky_of(*device_at(e->device)); s != cudaSuccess) return set_last(s);
  std::lock_guard lock(e->mu);
  return e->reached >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::shared_ptr<Event> e = resolve(event);
  if (!e) return set_last(cudaErrorInvalidResourceHandle);
  Device& d = *device_at(e->device);
  {
    std::unique_lock lock(e->mu);
    // A failed device skips its tasks but still counts them, so the wait ends either way.
    const std::uint64_t target = e->recorded;
    // The skipped record task of a failed device never notifies: look again now and then.
    while (e->reached < target && sticky_of(d) == cudaSuccess)
      e->cv.wait_for(lock, std::chrono::milliseconds(10));
  }
  return set_last(sticky_of(d));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  std::shared_ptr<Event> e = resolve(event);
  Stream* s = resolve(stream);
  if (flags != 0) return set_last(cudaErrorInvalidValue);
  if (!e || !s) return set_last(cudaErrorInvalidResourceHandle);
  std::uint64_t target;
  {
    std::lock_guard lock(e->mu);
    target = e->recorded;  // the record before this call; later records do not count
  }
  Device& waited = *device_at(e->device);
  return set_last(push(*s, [e, target, &waited] {
    std::unique_lock lock(e->mu);
    while (e->reached < target) {
      if (sticky_of(waited) != cudaSuccess)
        throw TaskError(cudaErrorLaunchFailure, "waited for an event of a failed device");
      e->cv.wait_for(lock, std::chrono::milliseconds(10));
    }
  }));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::shared_ptr<Event> a = resolve(start), b = resolve(end);
  if (!ms || !a || !b) return set_last(cudaErrorInvalidResourceHandle);
  if (!a->timing || !b->timing) return set_last(cudaErrorInvalidResourceHandle);
  std::scoped_lock lock(a->mu, b->mu);
  if (a->recorded == 0 || b->recorded == 0) return set_last(cudaErrorInvalidResourceHandle);
  if (a->reached < a->recorded || b->reached < b->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return set_last(cudaErrorInvalidDeviceFunction);
  Device& d = current();
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // a hint
  if (value < 0 || static_cast<std::size_t>(value) > d.profile.shared_per_block_optin)
    return fail(cudaErrorInvalidValue,
                "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize, " +
                    std::to_string(value) + "): emulated " + d.profile.arch + " device " +
                    std::to_string(d.id) + " allows at most " +
                    std::to_string(d.profile.shared_per_block_optin) + " bytes per block");
  std::lock_guard lock(d.mu);
  d.max_dynamic_shared[func] = value;
  return cudaSuccess;
}

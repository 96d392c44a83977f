// The per-device stream-ordered pools and their accounting (see device_memory.hpp).
#include "kernels/cuda/runtime/device_memory.hpp"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/environment.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"
#include "kernels/cuda/runtime/stream_order.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

std::atomic<std::size_t> g_now{0};
std::atomic<std::size_t> g_peak{0};

struct DevicePool {
  cudaMemPool_t pool = nullptr;
  std::size_t held = 0;  // bytes allocated from it and not yet freed
};
std::mutex g_mu;
std::vector<DevicePool> g_pools;  // by device; guarded by g_mu

std::string gib(std::size_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1ull << 30) << " GiB";
  return os.str();
}

cudaMemPool_t pool_of(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_pools.size() <= static_cast<std::size_t>(device))
    g_pools.resize(static_cast<std::size_t>(device) + 1);
  cudaMemPool_t& pool = g_pools[static_cast<std::size_t>(device)].pool;
  if (!pool) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    RINGATTN_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    // Keep freed memory for reuse while plans live (release_unused_device_memory gives it
    // back): this pool is ours alone, so no other allocator in the process is affected.
    uint64_t threshold = UINT64_MAX;
    RINGATTN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  return pool;
}

void count(int device, std::size_t bytes, bool add) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_pools.size() > static_cast<std::size_t>(device)) {
    std::size_t& held = g_pools[static_cast<std::size_t>(device)].held;
    held = add ? held + bytes : held - bytes;
  }
}

}  // namespace

// RINGATTN_DEVICE_MEMORY_LIMIT (bytes): the most ringattn may hold on all devices, to leave
// the rest of a shared GPU to the framework beside it. Read at every allocation (they are
// few: plans allocate once).
std::size_t memory_limit() {
  const char* env = environment_value(Env::device_memory_limit);
  if (!env || !*env) return SIZE_MAX;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (errno != 0 || *end != '\0' || env[0] == '-' || v == 0)
    throw InputError("RINGATTN_DEVICE_MEMORY_LIMIT",
                     std::string("must be a positive number of bytes, got '") + env + "'");
  return static_cast<std::size_t>(v);
}

[[noreturn]] void out_of_memory(std::size_t bytes, const char* what, int device,
                                const std::string& why) {
  std::size_t free_b = 0, total_b = 0;
  (void)cudaMemGetInfo(&free_b, &total_b);
  throw DeviceOutOfMemory(
      "out of device memory: asked for " + std::to_string(bytes) + " bytes (" + gib(bytes) +
      ") for " + what + " on device " + std::to_string(device) + ", with " + gib(g_now.load()) +
      " already held by ringattn and " + gib(free_b) + " free of " + gib(total_b) + why +
      ". To fit: spread the sequence over more ranks (the multi-GPU ring), use block-sparse "
      "attention, or run a smaller config.shape.batch or config.shape.seq_len");
}

void* device_allocate(std::size_t bytes, const char* what, int device, cudaStream_t stream) {
  if (bytes == 0) bytes = 16;  // a valid, distinct pointer for empty tensors
  if (const std::size_t limit = memory_limit(); g_now.load() + bytes > limit)
    out_of_memory(bytes, what, device,
                  " (RINGATTN_DEVICE_MEMORY_LIMIT=" + std::to_string(limit) + " bytes)");
  cudaMemPool_t pool = pool_of(device);
  void* p = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  if (err == cudaErrorMemoryAllocation) {
    // Memory this pool holds unused may be what is missing (another plan's, freed but kept):
    // wait for the frees in flight, trim, and try once more.
    (void)cudaGetLastError();
    (void)cudaDeviceSynchronize();
    (void)cudaMemPoolTrimTo(pool, 0);
    err = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear it; the context is still usable
    out_of_memory(bytes, what, device, "");
  }
  RINGATTN_CUDA_CHECK(err);
  count(device, bytes, true);
  const std::size_t now = g_now.fetch_add(bytes) + bytes;
  std::size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void device_free(void* p, std::size_t bytes, int device, cudaStream_t stream) noexcept {
  if (!p) return;
  if (bytes == 0) bytes = 16;
  (void)cudaFreeAsync(p, stream);
  count(device, bytes, false);
  g_now.fetch_sub(bytes);
}

void release_unused_device_memory(int device) noexcept {
  cudaMemPool_t pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_pools.size() <= static_cast<std::size_t>(device)) return;
    const DevicePool& d = g_pools[static_cast<std::size_t>(device)];
    if (d.held != 0 || !d.pool) return;
    pool = d.pool;
  }
  // Frees are stream-ordered: they reach the pool when their streams get there. The legacy
  // default stream waits for the device's blocking streams (ours are), not for others'; not
  // after the watchdog fired (device_wait.hpp), when one of them never finishes.
  if (device_stuck()) return;
  (void)cudaStreamSynchronize(nullptr);
  (void)cudaMemPoolTrimTo(pool, 0);
}

std::size_t device_bytes_now() noexcept { return g_now.load(); }
std::size_t device_bytes_peak() noexcept { return g_peak.load(); }

void order_after(void* first, void* then, int device) {
  if (first == then) return;
  const ScopedDevice on(device);
  cudaEvent_t e = nullptr;
  RINGATTN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, static_cast<cudaStream_t>(first));
  const cudaError_t waited = recorded == cudaSuccess
                                 ? cudaStreamWaitEvent(static_cast<cudaStream_t>(then), e, 0)
                                 : recorded;
  // The wait holds what it needs of the event: it may go now.
  (void)cudaEventDestroy(e);
  RINGATTN_CUDA_CHECK(waited);
}

}  // namespace ringattn::kernels::cuda

// The per-device stream-ordered pools and their accounting (see device_memory.hpp).
#include "kernels/cuda/device_memory.hpp"

#include <atomic>
#include <cstdint>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

std::atomic<std::size_t> g_now{0};
std::atomic<std::size_t> g_peak{0};

std::string gib(std::size_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1ull << 30) << " GiB";
  return os.str();
}

cudaMemPool_t pool_of(int device) {
  static std::mutex mu;
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  if (pools.size() <= static_cast<std::size_t>(device))
    pools.resize(static_cast<std::size_t>(device) + 1, nullptr);
  cudaMemPool_t& pool = pools[static_cast<std::size_t>(device)];
  if (!pool) {
    RINGATTN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    // Keep freed memory in the pool instead of returning it to the driver at every
    // synchronisation: repeated plans (benchmarks, a training loop) then allocate nothing new.
    uint64_t threshold = UINT64_MAX;
    RINGATTN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  return pool;
}

}  // namespace

void* device_allocate(std::size_t bytes, const char* what, int device, cudaStream_t stream) {
  if (bytes == 0) bytes = 16;  // a valid, distinct pointer for empty tensors
  cudaMemPool_t pool = pool_of(device);
  void* p = nullptr;
  const cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear it; the context is still usable
    std::size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    throw RuntimeFailure(
        "out of device memory: asked for " + std::to_string(bytes) + " bytes (" + gib(bytes) +
        ") for " + what + " on device " + std::to_string(device) + ", with " + gib(g_now.load()) +
        " already held by ringattn and " + gib(free_b) + " free of " + gib(total_b) +
        ". To fit: spread the sequence over more ranks (the multi-GPU ring), use block-sparse "
        "attention, or run a smaller --batch or --seq-len");
  }
  RINGATTN_CUDA_CHECK(err);
  const std::size_t now = g_now.fetch_add(bytes) + bytes;
  std::size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void device_free(void* p, std::size_t bytes, cudaStream_t stream) noexcept {
  if (!p) return;
  if (bytes == 0) bytes = 16;
  (void)cudaFreeAsync(p, stream);
  g_now.fetch_sub(bytes);
}

std::size_t device_bytes_now() noexcept { return g_now.load(); }
std::size_t device_bytes_peak() noexcept { return g_peak.load(); }

}  // namespace ringattn::kernels::cuda

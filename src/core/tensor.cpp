// Aligned host allocations with accounting, and the HostTensor that owns one.
#include "ringattn/tensor.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "ringattn/errors.hpp"

namespace ringattn {

namespace {
std::atomic<std::size_t> g_now{0}, g_peak{0};
constexpr std::size_t kAlign = 64;
// Size header stored in front of each block so the deleter can keep the count exact.
constexpr std::size_t kHeader = kAlign;
}  // namespace

void AlignedFree::operator()(void* p) const noexcept {
  if (!p) return;
  auto* base = static_cast<unsigned char*>(p) - kHeader;
  std::size_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  g_now.fetch_sub(bytes);
  std::free(base);
}

std::unique_ptr<float[], AlignedFree> aligned_floats(std::size_t count, const char* what) {
  if (count > (SIZE_MAX - kHeader) / sizeof(float))
    throw RuntimeFailure(std::string("allocation of ") + what + " is too large");
  const std::size_t bytes = count * sizeof(float);
  const std::size_t total = ((bytes + kHeader + kAlign - 1) / kAlign) * kAlign;
  void* base = std::aligned_alloc(kAlign, total);
  if (!base)
    throw RuntimeFailure(std::string("out of memory allocating ") + what + " (" +
                         std::to_string(bytes) + " bytes)");
  std::memcpy(base, &bytes, sizeof bytes);
  const std::size_t now = g_now.fetch_add(bytes) + bytes;
  std::size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return std::unique_ptr<float[], AlignedFree>(
      reinterpret_cast<float*>(static_cast<unsigned char*>(base) + kHeader));
}

std::size_t tracked_bytes_now() { return g_now.load(); }
std::size_t tracked_bytes_peak() { return g_peak.load(); }

HostTensor::HostTensor(Shape4 shape, const char* what)
    : HostTensor(std::vector<int64_t>{shape.batch, shape.seq_len, shape.heads, shape.head_dim},
                 what) {}

HostTensor::HostTensor(std::vector<int64_t> dims, const char* what) : dims_(std::move(dims)) {
  size_ = 1;
  for (int64_t d : dims_) size_ *= static_cast<std::size_t>(d);
  data_ = aligned_floats(size_, what);
  std::memset(data_.get(), 0, size_ * sizeof(float));
}

namespace {

// dst[b][h][n] row = src[b][n][h] row, or the reverse.
void swap_rows(const float* src, const Shape4& s, float* dst, bool to_head_major) {
  const int64_t n = s.seq_len, h = s.heads, d = s.head_dim;
  const auto row_bytes = static_cast<std::size_t>(d) * sizeof(float);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < h; ++j) {
        const int64_t token_major = ((b * n + t) * h + j) * d;
        const int64_t head_major = ((b * h + j) * n + t) * d;
        std::memcpy(dst + (to_head_major ? head_major : token_major),
                    src + (to_head_major ? token_major : head_major), row_bytes);
      }
}

}  // namespace

void to_head_major(const float* src, const Shape4& s, float* dst) { swap_rows(src, s, dst, true); }
void from_head_major(const float* src, const Shape4& s, float* dst) {
  swap_rows(src, s, dst, false);
}

}  // namespace ringattn

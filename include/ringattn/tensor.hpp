// Host tensors: an owned, 64-byte aligned float32 buffer with a [B, N, H, D] shape, plus
// the allocation accounting the CLI reports as peak_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ringattn/config.hpp"

namespace ringattn {

struct AlignedFree {
  void operator()(void* p) const noexcept;
};

// Allocates `bytes` aligned to 64 bytes; throws RuntimeFailure naming `what` and the size
// when the allocation fails. Every allocation made through here is counted.
std::unique_ptr<float[], AlignedFree> aligned_floats(std::size_t count, const char* what);

// Bytes currently held and the high-water mark of allocations made by aligned_floats.
std::size_t tracked_bytes_now();
std::size_t tracked_bytes_peak();

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(Shape4 shape, const char* what);               // zero-filled
  HostTensor(std::vector<int64_t> dims, const char* what);  // any rank (lse is [B,H,N])

  float* data() noexcept { return data_.get(); }
  const float* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  const std::vector<int64_t>& dims() const noexcept { return dims_; }

 private:
  std::vector<int64_t> dims_;
  std::size_t size_ = 0;
  std::unique_ptr<float[], AlignedFree> data_;
};

// Copies between the two TensorLayouts of the logical shape `s` ([B, N, H, D]):
// to_head_major reads bnhd `src` and writes bhnd `dst`; from_head_major the reverse.
void to_head_major(const float* src, const Shape4& s, float* dst);
void from_head_major(const float* src, const Shape4& s, float* dst);

}  // namespace ringattn

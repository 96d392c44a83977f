// fp32 → bf16 / fp16 on the host (see host_convert.hpp). bf16 is the upper half of the fp32
// pattern after rounding to nearest even; fp16 uses CUDA's host conversion.
#include "kernels/cuda/runtime/host_convert.hpp"

#include <cuda_fp16.h>

#include <cstring>

namespace ringattn::kernels::cuda {

namespace {

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void convert_from_float(const float* src, void* dst, std::size_t n, Elem e) {
  const auto count = static_cast<int64_t>(n);
  switch (e) {
    case Elem::fp32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case Elem::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) d[i] = to_bf16_bits(src[i]);
      break;
    }
    case Elem::fp16: {
      auto* d = static_cast<__half*>(dst);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) d[i] = __float2half_rn(src[i]);
      break;
    }
  }
}

void round_through(float* data, std::size_t n, Elem e) {
  const auto count = static_cast<int64_t>(n);
  switch (e) {
    case Elem::fp32:
      break;
    case Elem::bf16:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) data[i] = from_bf16_bits(to_bf16_bits(data[i]));
      break;
    case Elem::fp16:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < count; ++i) data[i] = __half2float(__float2half_rn(data[i]));
      break;
  }
}

}  // namespace ringattn::kernels::cuda

// The emulator's <cuda_fp16.h>: __half as its 16-bit pattern, converted with
// round-to-nearest-even by the emulator's numeric formats (the ones mma.sync decodes with).
#pragma once

#include <cstdint>

#include "emu/numeric_formats.hpp"

struct __half {
  std::uint16_t __x;
  __half() = default;
  __half(float f) : __x(ringattn::emu::float_to_f16(f)) {}  // NOLINT: as CUDA's
  operator float() const { return ringattn::emu::f16_to_float(__x); }
};
struct __half2 {
  __half x, y;
};
static_assert(sizeof(__half) == 2 && sizeof(__half2) == 4);

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half2 __floats2half2_rn(float lo, float hi) { return {__half(lo), __half(hi)}; }

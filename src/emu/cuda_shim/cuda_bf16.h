// The emulator's <cuda_bf16.h>: __nv_bfloat16 as its 16-bit pattern, converted with
// round-to-nearest-even by the emulator's numeric formats (the ones mma.sync decodes with).
#pragma once

#include <cstdint>

#include "emu/numeric_formats.hpp"

struct __nv_bfloat16 {
  std::uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(ringattn::emu::float_to_bf16(f)) {}  // NOLINT: as CUDA's
  operator float() const { return ringattn::emu::bf16_to_float(__x); }
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4);

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__nv_bfloat16(lo), __nv_bfloat16(hi)};
}

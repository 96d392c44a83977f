// Vectorisable float math for the CPU kernels. std::exp does not vectorise without
// -ffast-math, and -ffast-math would break the -inf sentinels the kernels rely on, so the
// exponential is written out here: range reduction to [-ln2/2, ln2/2] and a degree-6
// polynomial (max relative error ~2 ulp), with exact 0 below the float range.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace ringattn::kernels {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#pragma omp declare simd notinbranch
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  const bool underflow = x < -87.3f;  // also catches -inf
  float xc = x > 88.3f ? 88.3f : x;
  xc = underflow ? 0.0f : xc;
  const float n = __builtin_floorf(xc * kLog2e + 0.5f);
  const float r = xc - n * kLn2Hi - n * kLn2Lo;
  float p = 1.3888889e-3f;
  p = p * r + 8.3333333e-3f;
  p = p * r + 4.1666667e-2f;
  p = p * r + 1.6666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return underflow ? 0.0f : p * scale;
}

}  // namespace ringattn::kernels

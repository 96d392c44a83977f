// bf16 and fp16 as the 16-bit patterns mma.sync and ldmatrix move around: exact decoding to
// float, and float → 16 bits with round-to-nearest-even (NaN stays NaN, overflow → inf).
#pragma once

#include <cstdint>

namespace ringattn::emu {

float bf16_to_float(std::uint16_t bits);
float f16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float x);
std::uint16_t float_to_f16(float x);

// Two 16-bit patterns in one register, `lo` in the low half (the lower column).
constexpr std::uint32_t pack_halves(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
}
constexpr std::uint16_t half_of(std::uint32_t reg, int half) {
  return static_cast<std::uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16);
}

}  // namespace ringattn::emu

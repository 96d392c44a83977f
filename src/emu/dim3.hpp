// Dim3: the (x, y, z) extents and indices of emulated grids and blocks, with CUDA's linear
// order (x fastest), which is also how the emulator numbers warps and lanes.
#pragma once

#include <cstdint>
#include <string>

namespace ringattn::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

constexpr std::uint64_t volume(Dim3 d) {
  return std::uint64_t{d.x} * std::uint64_t{d.y} * std::uint64_t{d.z};
}

// The index of linear position `i` inside extents `d` (x fastest).
constexpr Dim3 unlinear(std::uint64_t i, Dim3 d) {
  return Dim3{static_cast<unsigned>(i % d.x), static_cast<unsigned>(i / d.x % d.y),
              static_cast<unsigned>(i / d.x / d.y)};
}

inline std::string to_string(Dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

}  // namespace ringattn::emu

// Warp shuffles (__shfl_sync: read lane src_lane; __shfl_xor_sync: read lane ^ lane_mask,
// both within groups of `width` lanes) and __syncwarp, as warp collectives: every lane of
// the mask must arrive at the same one; reading a lane outside the mask is a fault.
#pragma once

#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

namespace ringattn::emu {

enum class ShuffleKind { index, xor_lane };

// The shuffle on a value of `bytes` (1..8) bytes held in the low bytes of `bits`.
std::uint64_t shuffle_bits(ShuffleKind kind, std::uint32_t mask, std::uint64_t bits, unsigned bytes,
                           int lane_arg, int width, std::source_location where);

template <typename T>
T shuffle(ShuffleKind kind, std::uint32_t mask, T var, int lane_arg, int width,
          std::source_location where) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move 1-8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = shuffle_bits(kind, mask, bits, sizeof(T), lane_arg, width, where);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

void sync_warp(std::uint32_t mask, std::source_location where);

}  // namespace ringattn::emu

// The CUDA spellings a kernel body uses, for kernels compiled as host C++ against the
// emulator: threadIdx/blockIdx/blockDim/gridDim, warpSize, __syncthreads, __syncwarp,
// __shfl_sync and __shfl_xor_sync, and atomicAdd on floats. Each forwards to the emulator and
// records its caller's source line for fault messages.
#pragma once

#include <cstdint>
#include <source_location>

#include "emu/block_runner.hpp"
#include "emu/builtin_indices.hpp"
#include "emu/global_writes.hpp"
#include "emu/shuffle.hpp"

inline constexpr int warpSize = 32;

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ringattn::emu::arrive_at_barrier(where);
}

inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  ringattn::emu::sync_warp(mask, where);
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              std::source_location where = std::source_location::current()) {
  return ringattn::emu::shuffle(ringattn::emu::ShuffleKind::index, mask, var, src_lane, width,
                                where);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  std::source_location where = std::source_location::current()) {
  return ringattn::emu::shuffle(ringattn::emu::ShuffleKind::xor_lane, mask, var, lane_mask, width,
                                where);
}

// An atomic add: several blocks may add to one address (emu/global_writes.hpp).
inline float atomicAdd(float* address, float value) {
  return ringattn::emu::atomic_add_f32(address, value);
}

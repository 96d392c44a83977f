// threadIdx, blockIdx, blockDim and gridDim under their CUDA names: per OS thread, written
// by the block runner each time it switches to a fiber, so each emulated thread reads its
// own indices (fibers switch only inside the emulator's intrinsics).
#pragma once

#include "emu/dim3.hpp"

inline thread_local ringattn::emu::Dim3 threadIdx, blockIdx, blockDim, gridDim;

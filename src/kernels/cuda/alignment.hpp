// The alignment the GPU kernels need of a base pointer: one definition for the plans' choices
// (which forms may read a caller's view) and the launchers' own checks.
#pragma once

#include <cstdint>

namespace ringattn::kernels::cuda {

// Whether `p` is 16-byte aligned: what 16-byte copies, TMA and the fused backward's bulk
// reduce-adds into dq (cp.reduce.async.bulk) need of a base pointer. A caller's view at
// another offset runs the forms that do not need it, with a note. A template over the
// pointee, so that any object pointer binds as it is.
template <typename T>
bool aligned16(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace ringattn::kernels::cuda

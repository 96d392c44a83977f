// Host-side conversion of fp32 tensors to the device element type (round to nearest even),
// before upload; and the same rounding in place, so that a check against the float64
// reference can use exactly the values the device computed with.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/params.hpp"

namespace ringattn::kernels::cuda {

// dst holds n elements of type e (2 bytes each for bf16/fp16, 4 for fp32).
void convert_from_float(const float* src, void* dst, std::size_t n, Elem e);
// data[i] = float(e(data[i])).
void round_through(float* data, std::size_t n, Elem e);

}  // namespace ringattn::kernels::cuda

// Float constants of the CPU kernels. (Their exponential lives with the softmax steps that
// use it, compiled once per vector variant: cpu_keymajor_steps.inc.)
#pragma once

#include <limits>

namespace ringattn::kernels {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace ringattn::kernels

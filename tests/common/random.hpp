// Seeded random inputs for randomized comparisons.
#pragma once

#include <cstdint>
#include <vector>

namespace ringattn::testing {

// Normal(0, stddev) floats from a fixed-seed generator (same values on every platform run).
std::vector<float> random_normal(std::size_t n, uint64_t seed, float stddev = 1.0f);

}  // namespace ringattn::testing

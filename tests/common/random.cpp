#include "random.hpp"

#include <random>

namespace ringattn::testing {

std::vector<float> random_normal(std::size_t n, uint64_t seed, float stddev) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(gen);
  return out;
}

}  // namespace ringattn::testing

// random: k distinct key blocks per (head, query block), drawn uniformly with Floyd's
// sampling from a counter-based hash of (seed, head, query block, draw). No state is
// carried between rows, so every rank computes any row alone and gets the same answer.
#include <algorithm>

#include "sparse/pattern.hpp"

namespace ringattn::sparse {

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Random final : public BlockGenerator {
 public:
  Random(const Geometry& g, int64_t count, uint64_t seed)
      : count_(count), seed_(seed), blocks_(g.blocks()) {}
  std::string describe() const override {
    return "random:blocks=" + std::to_string(count_) + ",seed=" + std::to_string(seed_);
  }
  int64_t head_class(int64_t head) const override { return head; }
  void row(int64_t head, int64_t i, std::vector<int32_t>& cols) const override {
    const int64_t n = blocks_, k = std::min(count_, blocks_);
    const uint64_t base = mix(seed_ * 0x9E3779B97F4A7C15ull ^ mix(static_cast<uint64_t>(head) + 1) ^
                              mix(static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull + 7));
    // Floyd: for t = n-k .. n-1 draw u in [0, t]; take u unless taken, else take t.
    const std::size_t first = cols.size();
    for (int64_t t = n - k; t < n; ++t) {
      const uint64_t r = mix(base + static_cast<uint64_t>(t));
      const auto u = static_cast<int32_t>(r % static_cast<uint64_t>(t + 1));
      const bool taken = std::find(cols.begin() + static_cast<std::ptrdiff_t>(first), cols.end(),
                                   u) != cols.end();
      cols.push_back(taken ? static_cast<int32_t>(t) : u);
    }
  }

 private:
  int64_t count_;
  uint64_t seed_;
  int64_t blocks_;
};

}  // namespace

std::unique_ptr<BlockGenerator> make_random(const Geometry& g, int64_t blocks, uint64_t seed) {
  return std::make_unique<Random>(g, blocks, seed);
}

}  // namespace ringattn::sparse

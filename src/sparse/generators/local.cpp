// local: a window of `window` tokens centred on the query block, in whole blocks: key
// blocks j with |i - j| <= floor(window / (2·bs)).
#include <algorithm>

#include "sparse/pattern.hpp"

namespace ringattn::sparse {

namespace {

class Local final : public BlockGenerator {
 public:
  Local(const Geometry& g, int64_t window)
      : window_(window), radius_(window / (2 * g.block_size)), blocks_(g.blocks()) {}
  std::string describe() const override { return "local:window=" + std::to_string(window_); }
  int64_t head_class(int64_t) const override { return 0; }
  void row(int64_t, int64_t i, std::vector<int32_t>& cols) const override {
    const int64_t lo = std::max<int64_t>(0, i - radius_);
    const int64_t hi = std::min<int64_t>(blocks_ - 1, i + radius_);
    for (int64_t j = lo; j <= hi; ++j) cols.push_back(static_cast<int32_t>(j));
  }

 private:
  int64_t window_, radius_, blocks_;
};

}  // namespace

std::unique_ptr<BlockGenerator> make_local(const Geometry& g, int64_t window) {
  return std::make_unique<Local>(g, window);
}

}  // namespace ringattn::sparse

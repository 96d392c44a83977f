// global: the first G blocks attend to every block, and every block attends to them
// (BigBird's global tokens, at block granularity).
#include "sparse/pattern.hpp"

namespace ringattn::sparse {

namespace {

class Global final : public BlockGenerator {
 public:
  Global(const Geometry& g, int64_t count) : count_(count), blocks_(g.blocks()) {}
  std::string describe() const override { return "global:blocks=" + std::to_string(count_); }
  int64_t head_class(int64_t) const override { return 0; }
  void row(int64_t, int64_t i, std::vector<int32_t>& cols) const override {
    const int64_t upto = i < count_ ? blocks_ : count_;
    for (int64_t j = 0; j < upto; ++j) cols.push_back(static_cast<int32_t>(j));
  }

 private:
  int64_t count_, blocks_;
};

}  // namespace

std::unique_ptr<BlockGenerator> make_global(const Geometry& g, int64_t blocks) {
  return std::make_unique<Global>(g, blocks);
}

}  // namespace ringattn::sparse

// strided: every s-th block counted from the query block, both ways: key blocks j with
// (i - j) mod s == 0 (the strided half of the Sparse Transformer's factorised pattern;
// union it with `local` for the other half).
#include "sparse/pattern.hpp"

namespace ringattn::sparse {

namespace {

class Strided final : public BlockGenerator {
 public:
  Strided(const Geometry& g, int64_t stride) : stride_(stride), blocks_(g.blocks()) {}
  std::string describe() const override { return "strided:stride=" + std::to_string(stride_); }
  int64_t head_class(int64_t) const override { return 0; }
  void row(int64_t, int64_t i, std::vector<int32_t>& cols) const override {
    for (int64_t j = i % stride_; j < blocks_; j += stride_) cols.push_back(static_cast<int32_t>(j));
  }

 private:
  int64_t stride_, blocks_;
};

}  // namespace

std::unique_ptr<BlockGenerator> make_strided(const Geometry& g, int64_t stride) {
  return std::make_unique<Strided>(g, stride);
}

}  // namespace ringattn::sparse

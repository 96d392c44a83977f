// dilated-blocks: LongNet's segments and dilations at block granularity, with the per-head
// offsets of the mixture combine (offset = head mod r). Pattern k splits the blocks into
// segments of w_k / bs blocks and keeps block m of a segment when m mod r_k == offset; a
// kept query block attends to the kept key blocks of its own segment. Heads differ only by
// their offsets, so heads congruent modulo the lcm of the dilations share a class.
#include <numeric>

#include "sparse/pattern.hpp"

namespace ringattn::sparse {

namespace {

class DilatedBlocks final : public BlockGenerator {
 public:
  DilatedBlocks(const Geometry& g, std::vector<int64_t> segments, std::vector<int64_t> dilations)
      : bs_(g.block_size), segments_(std::move(segments)), dilations_(std::move(dilations)) {}
  std::string describe() const override {
    std::string s = "dilated-blocks:segments=";
    for (std::size_t k = 0; k < segments_.size(); ++k)
      s += (k ? "/" : "") + std::to_string(segments_[k]);
    s += ",dilations=";
    for (std::size_t k = 0; k < dilations_.size(); ++k)
      s += (k ? "/" : "") + std::to_string(dilations_[k]);
    return s;
  }
  // Heads with equal offsets (head mod r_k for every k) are the heads congruent modulo the
  // lcm of the dilations. Once the running lcm passes `head`, head is its own class, so the
  // lcm stays below head and cannot overflow (a mixed-radix number of the offsets did, with
  // a dozen patterns: signed overflow, and classes that could collide).
  int64_t head_class(int64_t head) const override {
    int64_t lcm = 1;
    for (const int64_t r : dilations_) {
      const int64_t step = r / std::gcd(lcm, r);
      if (lcm > head / step) return head;
      lcm *= step;
    }
    return head % lcm;
  }
  void row(int64_t head, int64_t i, std::vector<int32_t>& cols) const override {
    for (std::size_t k = 0; k < segments_.size(); ++k) {
      const int64_t seg = segments_[k] / bs_, r = dilations_[k], o = head % r;
      if ((i % seg) % r != o) continue;
      const int64_t first = i / seg * seg;
      for (int64_t m = o; m < seg; m += r) cols.push_back(static_cast<int32_t>(first + m));
    }
  }

 private:
  int64_t bs_;
  std::vector<int64_t> segments_, dilations_;
};

}  // namespace

std::unique_ptr<BlockGenerator> make_dilated_blocks(const Geometry& g,
                                                    std::vector<int64_t> segments,
                                                    std::vector<int64_t> dilations) {
  return std::make_unique<DilatedBlocks>(g, std::move(segments), std::move(dilations));
}

}  // namespace ringattn::sparse

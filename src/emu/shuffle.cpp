// Shuffle and __syncwarp collectives, with CUDA's rules for width and out-of-group lanes.
#include "emu/shuffle.hpp"

#include <string>
#include <string_view>

#include "emu/block_runner.hpp"

namespace ringattn::emu {
namespace {

class ShuffleOp final : public WarpOp {
 public:
  ShuffleOp(ShuffleKind kind, std::uint64_t bits, unsigned bytes, int lane_arg, int width)
      : kind_(kind), bits_(bits), bytes_(bytes), lane_arg_(lane_arg), width_(width) {}
  std::string_view name() const override {
    return kind_ == ShuffleKind::index ? "__shfl_sync" : "__shfl_xor_sync";
  }
  bool matches(const WarpOp& other) const override {
    if (other.name() != name()) return false;
    const auto& o = static_cast<const ShuffleOp&>(other);
    return o.bytes_ == bytes_ && o.width_ == width_;
  }
  void perform(const WarpLanes& lanes) override {
    for (unsigned l = 0; l < kWarpSize; ++l) {
      if (!lanes.op[l]) continue;
      ShuffleOp& me = lane_op<ShuffleOp>(lanes, l);
      const unsigned w = static_cast<unsigned>(width_);
      const unsigned group = l / w * w;
      unsigned src;
      if (kind_ == ShuffleKind::index) {
        src = group + (static_cast<unsigned>(me.lane_arg_) & (w - 1));
      } else {
        src = l ^ static_cast<unsigned>(me.lane_arg_);
        if (src >= group + w) src = l;  // later groups are out of reach: own value
      }
      if (src >= kWarpSize || !lanes.op[src]) {
        fault_at(*lanes.thread[l], std::string(name()) + " by lane " + std::to_string(l) +
                                       " reads lane " + std::to_string(src) +
                                       ", which is not in the mask (its value is undefined; at " +
                                       describe(lanes.thread[l]->where) + ")");
      }
      me.result = lane_op<ShuffleOp>(lanes, src).bits_;
    }
  }
  std::uint64_t result = 0;

 private:
  ShuffleKind kind_;
  std::uint64_t bits_;
  unsigned bytes_;
  int lane_arg_, width_;
};

class SyncWarpOp final : public WarpOp {
 public:
  std::string_view name() const override { return "__syncwarp"; }
  void perform(const WarpLanes&) override {}
};

}  // namespace

std::uint64_t shuffle_bits(ShuffleKind kind, std::uint32_t mask, std::uint64_t bits, unsigned bytes,
                           int lane_arg, int width, std::source_location where) {
  if (width < 1 || width > static_cast<int>(kWarpSize) || (width & (width - 1)) != 0) {
    fault_here(std::string(kind == ShuffleKind::index ? "__shfl_sync" : "__shfl_xor_sync") +
               " width " + std::to_string(width) + " is not a power of two in [1, 32] (at " +
               describe(where) + ")");
  }
  ShuffleOp op(kind, bits, bytes, lane_arg, width);
  arrive_at_warp_op(op, mask, false, where);
  return op.result;
}

void sync_warp(std::uint32_t mask, std::source_location where) {
  SyncWarpOp op;
  arrive_at_warp_op(op, mask, false, where);
}

}  // namespace ringattn::emu

// ldmatrix x4 (plain and .trans): gather the 32 rows, check their addresses, hand each lane
// its elements by the PTX fragment layout.
#include "emu/ldmatrix.hpp"

#include <cstring>
#include <string>

#include "emu/block_runner.hpp"
#include "emu/fragment_layouts.hpp"
#include "emu/numeric_formats.hpp"

namespace ringattn::emu {
namespace {

class LdmatrixOp final : public WarpOp {
 public:
  LdmatrixOp(SharedAddress row, bool trans) : row_(row), trans_(trans) {}
  std::string_view name() const override {
    return trans_ ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
                  : "ldmatrix.sync.aligned.m8n8.x4.shared.b16";
  }
  void perform(const WarpLanes& lanes) override {
    SharedArena& arena = current_block().arena();
    std::uint16_t rows[kWarpSize][8];
    for (unsigned l = 0; l < kWarpSize; ++l) {
      const SharedAddress at = lane_op<LdmatrixOp>(lanes, l).row_;
      if (at.offset % 16 != 0 || !arena.contains(at.offset, 16)) {
        fault_at(*lanes.thread[l],
                 std::string(name()) + ": lane " + std::to_string(l) + "'s row address (offset " +
                     std::to_string(at.offset) + ") " +
                     (at.offset % 16 != 0 ? "is not 16-byte aligned"
                                          : "is outside the block's " +
                                                std::to_string(arena.size()) + "-byte arena") +
                     " (at " + describe(lanes.thread[l]->where) + ")");
      }
      std::memcpy(rows[l], arena.at(at.offset), 16);
    }
    for (unsigned l = 0; l < kWarpSize; ++l) {
      LdmatrixOp& me = lane_op<LdmatrixOp>(lanes, l);
      for (int reg = 0; reg < 4; ++reg) {
        std::uint16_t h[2];
        for (int half = 0; half < 2; ++half) {
          const LdmatrixSource s = ldmatrix_source(static_cast<int>(l), reg, half, trans_);
          h[half] = rows[s.lane][s.element];
        }
        me.result[reg] = pack_halves(h[0], h[1]);
      }
    }
  }
  std::uint32_t result[4] = {};

 private:
  SharedAddress row_;
  bool trans_;
};

void load(std::uint32_t (&r)[4], SharedAddress row, bool trans, std::source_location where) {
  LdmatrixOp op(row, trans);
  arrive_at_warp_op(op, 0, true, where);
  for (int i = 0; i < 4; ++i) r[i] = op.result[i];
}

}  // namespace

void ldmatrix_x4(std::uint32_t (&r)[4], SharedAddress row, std::source_location where) {
  load(r, row, false, where);
}
void ldmatrix_x4_trans(std::uint32_t (&r)[4], SharedAddress row, std::source_location where) {
  load(r, row, true, where);
}

}  // namespace ringattn::emu

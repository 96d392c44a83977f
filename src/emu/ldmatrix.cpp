// ldmatrix x4 (plain and .trans): gather the 32 rows, check their addresses, hand each lane
// its elements by the PTX fragment layout; stmatrix x4, the same layout the other way.
#include "emu/ldmatrix.hpp"

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "emu/block_runner.hpp"
#include "emu/bulk_reduce.hpp"
#include "emu/fragment_layouts.hpp"
#include "emu/numeric_formats.hpp"

namespace ringattn::emu {
namespace {

// A row address that is not 16-byte aligned or leaves the arena: a fault naming the lane.
void check_row(const WarpLanes& lanes, unsigned l, SharedAddress at, std::string_view what) {
  SharedArena& arena = current_block().arena();
  if (at.offset % 16 == 0 && arena.contains(at.offset, 16)) return;
  fault_at(*lanes.thread[l],
           std::string(what) + ": lane " + std::to_string(l) + "'s row address (offset " +
               std::to_string(at.offset) + ") " +
               (at.offset % 16 != 0
                    ? "is not 16-byte aligned"
                    : "is outside the block's " + std::to_string(arena.size()) + "-byte arena") +
               " (at " + describe(lanes.thread[l]->where) + ")");
}

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
      check_row(lanes, l, at, name());
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

class StmatrixOp final : public WarpOp {
 public:
  StmatrixOp(const std::uint32_t (&r)[4], SharedAddress row, bool trans)
      : row_(row), trans_(trans) {
    for (int i = 0; i < 4; ++i) regs_[i] = r[i];
  }
  std::string_view name() const override {
    return trans_ ? "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
                  : "stmatrix.sync.aligned.m8n8.x4.shared.b16";
  }
  void perform(const WarpLanes& lanes) override {
    std::uint16_t rows[kWarpSize][8];
    for (unsigned l = 0; l < kWarpSize; ++l) {
      const StmatrixOp& me = lane_op<StmatrixOp>(lanes, l);
      for (int reg = 0; reg < 4; ++reg)
        for (int half = 0; half < 2; ++half) {
          const LdmatrixSource s = ldmatrix_source(static_cast<int>(l), reg, half, trans_);
          rows[s.lane][s.element] = half_of(me.regs_[reg], half);
        }
    }
    SharedArena& arena = current_block().arena();
    std::vector<GenericAccess>& units = current_block().unit_generic();
    for (unsigned l = 0; l < kWarpSize; ++l) {
      const SharedAddress at = lane_op<StmatrixOp>(lanes, l).row_;
      check_row(lanes, l, at, name());
      if (!current_block().bulk_reduces().empty()) detail::check_reduce_source(at.offset, 16);
      std::memcpy(arena.at(at.offset), rows[l], 16);
      const ThreadState& t = *lanes.thread[l];
      units[at.offset / 16] = GenericAccess{t.warp * kWarpSize + t.lane + 1, t.proxy_fences};
    }
  }

 private:
  SharedAddress row_;
  bool trans_;
  std::uint32_t regs_[4] = {};
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
void stmatrix_x4(const std::uint32_t (&r)[4], SharedAddress row, std::source_location where) {
  StmatrixOp op(r, row, false);
  arrive_at_warp_op(op, 0, true, where);
}
void stmatrix_x4_trans(const std::uint32_t (&r)[4], SharedAddress row,
                       std::source_location where) {
  StmatrixOp op(r, row, true);
  arrive_at_warp_op(op, 0, true, where);
}

}  // namespace ringattn::emu

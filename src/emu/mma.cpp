// mma.sync m16n8k16 with fp32 accumulation: gather the warp's fragments into A, B and C by
// the PTX layouts, multiply in the documented order, scatter D back.
#include "emu/mma.hpp"

#include "emu/block_runner.hpp"
#include "emu/fragment_layouts.hpp"
#include "emu/numeric_formats.hpp"

namespace ringattn::emu {
namespace {

class MmaOp final : public WarpOp {
 public:
  MmaOp(MmaInput input, const float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
        std::uint32_t b1)
      : input_(input), a_{a[0], a[1], a[2], a[3]}, b_{b0, b1}, d{c[0], c[1], c[2], c[3]} {}
  std::string_view name() const override {
    return input_ == MmaInput::bf16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                    : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
  }
  void perform(const WarpLanes& lanes) override {
    const auto decode = input_ == MmaInput::bf16 ? bf16_to_float : f16_to_float;
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < static_cast<int>(kWarpSize); ++l) {
      const MmaOp& me = lane_op<MmaOp>(lanes, static_cast<unsigned>(l));
      for (int reg = 0; reg < 4; ++reg) {
        for (int half = 0; half < 2; ++half) {
          const MatrixCoord x = mma_a_coord(l, reg, half);
          A[x.row][x.col] = decode(half_of(me.a_[reg], half));
        }
        const MatrixCoord y = mma_c_coord(l, reg);
        C[y.row][y.col] = me.d[reg];
      }
      for (int reg = 0; reg < 2; ++reg) {
        for (int half = 0; half < 2; ++half) {
          const MatrixCoord x = mma_b_coord(l, reg, half);
          B[x.row][x.col] = decode(half_of(me.b_[reg], half));
        }
      }
    }
    for (int l = 0; l < static_cast<int>(kWarpSize); ++l) {
      MmaOp& me = lane_op<MmaOp>(lanes, static_cast<unsigned>(l));
      for (int reg = 0; reg < 4; ++reg) {
        const MatrixCoord y = mma_c_coord(l, reg);
        float sum = C[y.row][y.col];
        // The product is exact in fp32 (8- or 11-bit significands), so only the sum rounds.
        for (int k = 0; k < 16; ++k) sum += A[y.row][k] * B[k][y.col];
        me.d[reg] = sum;
      }
    }
  }

 private:
  MmaInput input_;
  std::uint32_t a_[4], b_[2];

 public:
  float d[4];
};

}  // namespace

void mma_m16n8k16(MmaInput input, float (&acc)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                  std::uint32_t b1, std::source_location where) {
  MmaOp op(input, acc, a, b0, b1);
  arrive_at_warp_op(op, 0, true, where);
  for (int i = 0; i < 4; ++i) acc[i] = op.d[i];
}

}  // namespace ringattn::emu

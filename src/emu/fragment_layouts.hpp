// The fragment layouts of the PTX ISA that ldmatrix and mma.sync use, as the one place the
// emulator takes them from ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "Warp-level matrix load instruction: ldmatrix"). Lanes are 0..31, g = lane / 4 and
// t = lane % 4; a 32-bit register holds two 16-bit elements, `half` 0 in the low bits.
// tests/emu/test_cute_layouts.cpp checks every entry against CuTe's SM80/SM75 traits.
#pragma once

namespace ringattn::emu {

struct MatrixCoord {
  int row;
  int col;
  friend constexpr bool operator==(MatrixCoord, MatrixCoord) = default;
};

// mma.m16n8k16 A (16 × 16, rows m, columns k): registers a0..a3.
constexpr MatrixCoord mma_a_coord(int lane, int reg, int half) {
  return {lane / 4 + 8 * (reg & 1), 2 * (lane % 4) + half + 8 * (reg >> 1)};
}
// mma.m16n8k16 B (16 × 8, rows k, columns n): registers b0, b1.
constexpr MatrixCoord mma_b_coord(int lane, int reg, int half) {
  return {2 * (lane % 4) + half + 8 * reg, lane / 4};
}
// mma.m16n8k16 fp32 C and D (16 × 8, rows m, columns n): c0..c3, one float each.
constexpr MatrixCoord mma_c_coord(int lane, int reg) {
  return {lane / 4 + 8 * (reg >> 1), 2 * (lane % 4) + (reg & 1)};
}

// wgmma m64nNk16 fp32 D, one warp's 16 rows (row 0 = the warp's first; add 16 · (warp % 4)
// for the warpgroup's row): register i holds 8-column slice i / 4, as mma's C register i % 4.
constexpr MatrixCoord wgmma_d_coord(int lane, int reg) {
  return {lane / 4 + 8 * ((reg >> 1) & 1), 8 * (reg >> 2) + 2 * (lane % 4) + (reg & 1)};
}

// ldmatrix .m8n8 .x4 .b16: register `reg` of a lane comes from matrix `reg`, whose eight
// rows are the 16-byte rows at the addresses lanes 8·reg .. 8·reg + 7 give. Returns which
// lane's row and which 16-bit element of it (0..7) lands in (lane, reg, half).
struct LdmatrixSource {
  int lane;
  int element;
  friend constexpr bool operator==(LdmatrixSource, LdmatrixSource) = default;
};
constexpr LdmatrixSource ldmatrix_source(int lane, int reg, int half, bool trans) {
  if (!trans) return {8 * reg + lane / 4, 2 * (lane % 4) + half};
  return {8 * reg + 2 * (lane % 4) + half, lane / 4};
}

}  // namespace ringattn::emu

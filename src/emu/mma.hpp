// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 as a warp collective:
// D = A·B + C with the PTX ISA's fragment layouts (fragment_layouts.hpp). Arithmetic: each
// product of two bf16 (or fp16) inputs is exact in fp32 (unless a bf16 product leaves fp32's
// range), and D[m][n] is accumulated in fp32 starting from C[m][n], adding the products for
// k = 0, 1, ..., 15 in that order, each addition rounded to nearest even. Tensor cores sum
// differently (wider, with their own rounding), so results may differ from a GPU's in the last
// bits; they do not depend on the emulator's execution mode.
#pragma once

#include <cstdint>
#include <source_location>

namespace ringattn::emu {

enum class MmaInput { bf16, f16 };

// acc (C in, D out) += a · b for one 16×8×16 tile; a: a0..a3, b: b0, b1 of this lane.
void mma_m16n8k16(MmaInput input, float (&acc)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                  std::uint32_t b1, std::source_location where = std::source_location::current());

}  // namespace ringattn::emu

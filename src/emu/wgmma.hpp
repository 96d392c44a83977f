// Hopper's warpgroup matrix product on the CPU: wgmma.mma_async.sync.aligned.m64nNk16
// .f32.{bf16,f16}.{bf16,f16}, A from shared memory through a matrix descriptor or from
// registers, B from shared memory through a descriptor, both K-major (no transpose), D in
// fp32 registers; with wgmma.fence, wgmma.commit_group and wgmma.wait_group. Operands are
// K-major, or M|N-major with the transpose flags (imm-trans-a/b, 16-bit types).
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): a warpgroup
// is 4 consecutive warps (warp % 4 == 0 first); warp w of it owns rows 16w..16w+15 of the
// 64 × N accumulator, each 8-column slice laid out as mma.m16n8k16's C (register i of a lane:
// row lane/4 + 8·((i/2)%2), column 8·(i/4) + 2·(lane%4) + i%2). A from registers: the warp's
// 16 rows × 16 k as mma.m16n8k16's A fragment. Descriptors (64 bits): start address >> 4 in
// bits 0-13, leading-dimension byte offset >> 4 in 16-29, stride-dimension byte offset >> 4
// in 32-45, base offset in 49-51, swizzle in 62-63 (0 none, 1 128-byte, 2 64-byte, 3
// 32-byte). Element (row r, k) of a K-major operand is at, without swizzle,
// start + (r/8)·SBO + (k/8)·LBO + (r%8)·16 + (k%8)·2 (8 × 16-byte core matrices), and with a
// swizzle of W bytes at swizzle(start + (r/8)·SBO + (r%8)·W + 2k), the swizzle applied to the
// address as the TMA applies it (tma_swizzled_offset). M|N-major (transposed): 16-byte units
// of 8 consecutive M|N elements, one row per k; without swizzle element (i, k) is at
// start + (i/8)·SBO + (k/8)·LBO + (k%8)·16 + (i%8)·2, with a swizzle of W bytes at
// swizzle(start + (i/(W/2))·LBO + (k/8)·SBO + (k%8)·W + (i%(W/2))·2). Checked against
// CuTe's SM90 GMMA atoms (K- and MN-major) in test_cute_layouts.cpp.
//
// Arithmetic as mma.sync's: exact products, summed in fp32 in k order from D (or 0 with
// scale-d = 0). Timing: under CpAsyncLanding::at_copy the product is computed at the issue;
// under at_wait at the wgmma.wait_group that covers it, reading shared memory and D then, so
// reading D before the wait, or writing the operands before it, shows in the mode sweep.
//
// Faults: a warp outside a full warpgroup; a wgmma without a wgmma.fence since the lane's
// last wgmma.wait_group; N not a multiple of 8 in 8..256; a descriptor reading outside the
// arena, with a base offset, or whose swizzle row is not its atom's first; a unit written by
// a tensor copy with another swizzle than the descriptor's; a thread that exits with wgmma in
// flight; wait_group with more groups pending than allowed left in flight by the caller
// (reading D) is the kernel's to get right and shows as landing dependence.
#pragma once

#include <cstdint>
#include <source_location>

#include "emu/mma.hpp"
#include "emu/shared_memory.hpp"

namespace ringattn::emu {

enum class GmmaSwizzle : std::uint8_t { none = 0, bytes128 = 1, bytes64 = 2, bytes32 = 3 };

// The descriptor of a K-major operand (base offset 0).
std::uint64_t make_gmma_descriptor(SharedAddress start, std::uint32_t leading_byte_offset,
                                   std::uint32_t stride_byte_offset, GmmaSwizzle swizzle);

// The arena byte address of element (row, k) (row: the M or N index) of the operand `desc`
// describes, K-major or M|N-major (16-bit elements), or a fault naming the running thread
// when the descriptor cannot be read.
std::uint32_t gmma_element_address(std::uint64_t desc, std::uint32_t row, std::uint32_t k,
                                   bool mn_major = false);

void wgmma_fence(std::source_location where = std::source_location::current());
void wgmma_commit_group(std::source_location where = std::source_location::current());
void wgmma_wait_group(unsigned pending,
                      std::source_location where = std::source_location::current());

// d: this lane's n/2 accumulator registers. scale_d false: D = A·B (D's old values unused).
// trans_a / trans_b: the operand is M|N-major (PTX's imm-trans-a / imm-trans-b = 1).
void wgmma_m64k16_ss(MmaInput input, unsigned n, float* d, std::uint64_t desc_a,
                     std::uint64_t desc_b, bool scale_d, bool trans_a = false,
                     bool trans_b = false,
                     std::source_location where = std::source_location::current());
void wgmma_m64k16_rs(MmaInput input, unsigned n, float* d, const std::uint32_t (&a)[4],
                     std::uint64_t desc_b, bool scale_d, bool trans_b = false,
                     std::source_location where = std::source_location::current());

}  // namespace ringattn::emu

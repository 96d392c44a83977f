// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 as a warp collective: each lane gives
// the address of one 16-byte row (lanes 8j..8j+7: the rows of matrix j), and receives four
// registers in the PTX ISA's fragment layout (fragment_layouts.hpp). stmatrix (sm_90) is its
// inverse: each lane gives a row address and four registers, and the rows are written from
// the registers by the same layout. A row address that is not 16-byte aligned or leaves the
// arena faults naming that lane's thread; stmatrix's rows count as each lane's generic
// stores (a wgmma reading them needs that lane's fence.proxy.async, a bulk reduce in flight
// from them faults).
#pragma once

#include <cstdint>
#include <source_location>

#include "emu/shared_memory.hpp"

namespace ringattn::emu {

void ldmatrix_x4(std::uint32_t (&r)[4], SharedAddress row,
                 std::source_location where = std::source_location::current());
void ldmatrix_x4_trans(std::uint32_t (&r)[4], SharedAddress row,
                       std::source_location where = std::source_location::current());
void stmatrix_x4(const std::uint32_t (&r)[4], SharedAddress row,
                 std::source_location where = std::source_location::current());
void stmatrix_x4_trans(const std::uint32_t (&r)[4], SharedAddress row,
                       std::source_location where = std::source_location::current());

}  // namespace ringattn::emu

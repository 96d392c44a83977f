// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 as a warp collective: each lane gives
// the address of one 16-byte row (lanes 8j..8j+7: the rows of matrix j), and receives four
// registers in the PTX ISA's fragment layout (fragment_layouts.hpp). A row address that is
// not 16-byte aligned or leaves the arena faults naming that lane's thread.
#pragma once

#include <cstdint>
#include <source_location>

#include "emu/shared_memory.hpp"

namespace ringattn::emu {

void ldmatrix_x4(std::uint32_t (&r)[4], SharedAddress row,
                 std::source_location where = std::source_location::current());
void ldmatrix_x4_trans(std::uint32_t (&r)[4], SharedAddress row,
                       std::source_location where = std::source_location::current());

}  // namespace ringattn::emu

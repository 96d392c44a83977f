// Named barriers and register reallocation, the other warp-specialisation primitives of
// Hopper kernels (PTX: bar.sync / bar.arrive with an id and a thread count, and
// setmaxnreg.{inc,dec}.sync.aligned.u32).
//
// bar.sync id, count: the thread arrives at barrier `id` (1-15; 0 is __syncthreads') and
// waits until `count` threads have arrived in this generation; bar.arrive id, count arrives
// without waiting (a producer releasing consumers). A wait is a scheduling point like an
// mbarrier's, and one that can never end is a fault naming the barrier and its counts. Under
// ExecutionMode::arrive_yields a bar.arrive that ends a generation others wait in lets them
// run first, as a phase-completing mbarrier.arrive does: a thread that signals before its
// stores then shows, its waiters reading what it has not yet written.
// Faults: id 0 or above 15, a count that is not a positive multiple of 32 or exceeds the
// block, one barrier used with two counts in one generation.
//
// setmaxnreg: a full warp (aligned), the same count in every lane, a multiple of 8 in
// 24..256; the emulator has no register file, so only the checks apply.
#pragma once

#include <source_location>

namespace ringattn::emu {

void named_barrier_sync(unsigned id, unsigned count,
                        std::source_location where = std::source_location::current());
void named_barrier_arrive(unsigned id, unsigned count,
                          std::source_location where = std::source_location::current());
void setmaxnreg(bool increase, unsigned count,
                std::source_location where = std::source_location::current());

}  // namespace ringattn::emu

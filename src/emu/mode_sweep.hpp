// Runs one computation under several execution modes and compares the bytes it produced.
// A kernel whose result depends on warp order, on when cp.async lands or on who runs after a
// phase-completing mbarrier.arrive has a race (a missing __syncthreads or cp.async wait, a
// stage released before its last read) that a real GPU shows only sometimes; here it shows
// as a difference between two modes.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "emu/execution_mode.hpp"

namespace ringattn::emu {

// Forward and reverse, each with both landings, and shuffled orders with two seeds; half of
// them yield at a phase-completing mbarrier.arrive.
std::vector<ExecutionMode> standard_modes();

// Runs `run` once per mode (with that mode set process-wide) and returns a description of
// the first difference from the first mode's result ("results differ between ... and ...
// at byte B of N"), or nothing when every mode produced the same bytes.
std::optional<std::string> find_mode_dependence(const std::function<std::vector<std::byte>()>& run,
                                                std::span<const ExecutionMode> modes);

}  // namespace ringattn::emu

// Launching a kernel on the emulator: the grid's blocks run one after another on the
// calling thread (in the execution mode's block order), each with its own fibers and
// shared-memory arena. A fault anywhere stops the launch and is rethrown to the caller; so
// does a race between blocks on global memory (global_writes.hpp), at the end of the second
// block.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "emu/dim3.hpp"
#include "emu/global_writes.hpp"

namespace ringattn::emu {

struct LaunchConfig {
  std::string kernel;  // named in every fault
  Dim3 grid;
  Dim3 block;
  std::uint32_t shared_bytes = 0;  // dynamic shared memory per block
  // The device allocations live at the launch (the runtime's launches name them all): where
  // plain stores of two blocks to one address are a race (emu/global_writes.hpp). Empty: no
  // such check (a test's launch on host vectors).
  std::vector<GlobalRange> global = {};
};

// Runs `body` once per thread of every block. Throws EmuUsageError for a configuration
// CUDA would refuse (no threads, more than 1024 per block, ...) and EmuFault from a thread.
void launch(const LaunchConfig& config, const std::function<void()>& body);

// kernel<<<grid, block, shared_bytes>>>(args...): each thread gets its own copies.
template <typename... Params, typename... Args>
void launch(const LaunchConfig& config, void (*kernel)(Params...), const Args&... args) {
  launch(config, std::function<void()>([&] { kernel(args...); }));
}

}  // namespace ringattn::emu

// EmuFault: what the emulator throws where real hardware would fault or behave undefinedly
// (a barrier or warp collective not reached by everyone, a bad shared-memory address). It
// names the kernel, the block and the thread, so a failing test says where to look.
#pragma once

#include <stdexcept>
#include <string>

#include "emu/dim3.hpp"

namespace ringattn::emu {

class EmuFault : public std::runtime_error {
 public:
  EmuFault(std::string kernel, Dim3 block, Dim3 thread, const std::string& problem)
      : std::runtime_error("emulated kernel '" + kernel + "' block " + to_string(block) +
                           " thread " + to_string(thread) + ": " + problem),
        kernel_(std::move(kernel)),
        block_(block),
        thread_(thread) {}
  const std::string& kernel() const noexcept { return kernel_; }
  Dim3 block() const noexcept { return block_; }
  Dim3 thread() const noexcept { return thread_; }

 private:
  std::string kernel_;
  Dim3 block_, thread_;
};

// Misuse outside any thread (an invalid launch configuration, an intrinsic called from
// host code): there is no block or thread to name.
class EmuUsageError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace ringattn::emu

// Helpers for the emulator's tests: a launch's output as bytes (for comparing execution
// modes) and a check that a call faults naming the expected kernel, block and thread.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "emu/dim3.hpp"
#include "emu/fault.hpp"

namespace ringattn::emu::testing {

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// `run` throws an EmuFault naming `kernel`, `block` and `thread`, whose message contains
// `needle`; prints the message.
inline ::testing::AssertionResult faults(const std::function<void()>& run,
                                         const std::string& kernel, Dim3 block, Dim3 thread,
                                         const std::string& needle) {
  try {
    run();
  } catch (const EmuFault& f) {
    const std::string what = f.what();
    if (f.kernel() != kernel || to_string(f.block()) != to_string(block) ||
        to_string(f.thread()) != to_string(thread) ||
        what.find("'" + kernel + "' block " + to_string(block) + " thread " + to_string(thread)) ==
            std::string::npos ||
        what.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "fault names the wrong place or problem: " << what << " (expected kernel '"
             << kernel << "' block " << to_string(block) << " thread " << to_string(thread)
             << ", mentioning '" << needle << "')";
    }
    std::cout << "  reported: " << what << "\n";  // the fault as a user would see it
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no fault (expected one mentioning '" << needle << "')";
}

}  // namespace ringattn::emu::testing

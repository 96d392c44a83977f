// The standard set of execution modes and the bitwise comparison across them.
#include "emu/mode_sweep.hpp"

#include <algorithm>

namespace ringattn::emu {

std::vector<ExecutionMode> standard_modes() {
  using enum RunOrder;
  using enum CpAsyncLanding;
  // Half of them let a phase-completing mbarrier.arrive yield to the phase's waiters.
  return {{forward, 0, at_copy, false}, {reverse, 0, at_wait, false},
          {forward, 0, at_wait, true},  {reverse, 0, at_copy, true},
          {shuffled, 1, at_copy, true}, {shuffled, 2, at_wait, false}};
}

std::optional<std::string> find_mode_dependence(const std::function<std::vector<std::byte>()>& run,
                                                std::span<const ExecutionMode> modes) {
  std::vector<std::byte> first;
  for (std::size_t i = 0; i < modes.size(); ++i) {
    const ScopedExecutionMode scoped(modes[i]);
    std::vector<std::byte> result = run();
    if (i == 0) {
      first = std::move(result);
      continue;
    }
    if (result != first) {
      const auto at = static_cast<std::size_t>(
          std::mismatch(first.begin(), first.end(), result.begin(), result.end()).first -
          first.begin());
      return "results differ between '" + describe(modes[0]) + "' and '" + describe(modes[i]) +
             "' at byte " + std::to_string(at) + " of " + std::to_string(first.size());
    }
  }
  return std::nullopt;
}

}  // namespace ringattn::emu

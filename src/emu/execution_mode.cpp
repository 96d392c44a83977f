// The process-wide execution mode, its text form, and the orders it draws.
#include "emu/execution_mode.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/environment.hpp"
#include "emu/fault.hpp"

namespace ringattn::emu {
namespace {

ExecutionMode& current_mode() {
  static ExecutionMode mode = [] {
    const char* order = environment_value(Env::emu_order);
    const char* landing = environment_value(Env::emu_cp_async);
    const char* arrive = environment_value(Env::emu_arrive);
    return parse_execution_mode(order ? order : "", landing ? landing : "",
                                "RINGATTN_EMU_ORDER / RINGATTN_EMU_CP_ASYNC / RINGATTN_EMU_ARRIVE",
                                arrive ? arrive : "");
  }();
  return mode;
}

// SplitMix64: a small, portable generator, so that a seed means the same order everywhere
// (std::shuffle's algorithm is the library's choice).
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::string describe(const ExecutionMode& mode) {
  std::string order = mode.order == RunOrder::forward   ? "forward"
                      : mode.order == RunOrder::reverse ? "reverse"
                                                        : "shuffled:" + std::to_string(mode.seed);
  return "order=" + order +
         " cp.async=" + (mode.landing == CpAsyncLanding::at_copy ? "at-copy" : "at-wait") +
         (mode.arrive_yields ? " arrive=yield" : "");
}

ExecutionMode parse_execution_mode(std::string_view order, std::string_view landing,
                                   std::string_view source, std::string_view arrive) {
  ExecutionMode mode;
  const auto bad = [&](std::string_view what) {
    return EmuUsageError(std::string(source) + ": '" + std::string(what) +
                         "' is not an execution mode (order: forward, reverse, shuffled[:SEED]; "
                         "cp.async: at-copy, at-wait; arrive: continue, yield)");
  };
  if (order == "forward" || order.empty()) {
    mode.order = RunOrder::forward;
  } else if (order == "reverse") {
    mode.order = RunOrder::reverse;
  } else if (order.starts_with("shuffled")) {
    mode.order = RunOrder::shuffled;
    std::string_view rest = order.substr(8);
    if (!rest.empty()) {
      if (rest.front() != ':' || rest.size() == 1) throw bad(order);
      const std::string digits(rest.substr(1));
      char* end = nullptr;
      mode.seed = std::strtoull(digits.c_str(), &end, 10);
      if (*end != '\0' || digits.front() == '-') throw bad(order);
    }
  } else {
    throw bad(order);
  }
  if (landing == "at-copy" || landing.empty()) {
    mode.landing = CpAsyncLanding::at_copy;
  } else if (landing == "at-wait") {
    mode.landing = CpAsyncLanding::at_wait;
  } else {
    throw bad(landing);
  }
  if (arrive == "yield") {
    mode.arrive_yields = true;
  } else if (!arrive.empty() && arrive != "continue") {
    throw bad(arrive);
  }
  return mode;
}

const ExecutionMode& execution_mode() { return current_mode(); }

ScopedExecutionMode::ScopedExecutionMode(const ExecutionMode& mode) : saved_(current_mode()) {
  current_mode() = mode;
}
ScopedExecutionMode::~ScopedExecutionMode() { current_mode() = saved_; }

std::vector<unsigned> run_order(const ExecutionMode& mode, unsigned count, std::uint64_t salt) {
  std::vector<unsigned> order(count);
  std::iota(order.begin(), order.end(), 0u);
  if (mode.order == RunOrder::reverse) {
    std::reverse(order.begin(), order.end());
  } else if (mode.order == RunOrder::shuffled) {
    std::uint64_t state = mode.seed * 0x2545f4914f6cdd1dull ^ salt;
    for (unsigned i = count; i > 1; --i) {  // Fisher-Yates
      const auto j = static_cast<unsigned>(splitmix64(state) % i);
      std::swap(order[i - 1], order[j]);
    }
  }
  return order;
}

}  // namespace ringattn::emu

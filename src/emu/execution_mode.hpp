// What the emulator decides where real hardware gives no order: the order in which blocks,
// warps (inside each barrier interval) and lanes (between warp collectives) run, the moment
// a cp.async lands (at the copy or at its wait_group), and whether a thread whose
// mbarrier.arrive completes a phase that others wait on runs on, or lets them run first
// (then a consumer that frees a stage before its last read of it sees the producer's next
// copy land there). One mode is process-wide, read from RINGATTN_EMU_ORDER /
// RINGATTN_EMU_CP_ASYNC / RINGATTN_EMU_ARRIVE; tests switch it with ScopedExecutionMode.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ringattn::emu {

enum class RunOrder { forward, reverse, shuffled };
enum class CpAsyncLanding { at_copy, at_wait };

struct ExecutionMode {
  RunOrder order = RunOrder::forward;
  std::uint64_t seed = 0;  // shuffled only
  CpAsyncLanding landing = CpAsyncLanding::at_copy;
  bool arrive_yields = false;  // a phase-completing arrive lets the phase's waiters run first
};

// "order=shuffled:7 cp.async=at-wait" (and " arrive=yield" when it yields)
std::string describe(const ExecutionMode& mode);

// `order`: forward | reverse | shuffled[:SEED]; `landing`: at-copy | at-wait; `arrive`:
// continue | yield. Empty strings keep the defaults. Throws EmuUsageError naming `source`
// (e.g. the variable) when invalid.
ExecutionMode parse_execution_mode(std::string_view order, std::string_view landing,
                                   std::string_view source, std::string_view arrive = "");

// The mode launches run under (first use reads the environment).
const ExecutionMode& execution_mode();

// Sets the process-wide mode for a scope (not for use while kernels run on other threads).
class ScopedExecutionMode {
 public:
  explicit ScopedExecutionMode(const ExecutionMode& mode);
  ~ScopedExecutionMode();
  ScopedExecutionMode(const ScopedExecutionMode&) = delete;
  ScopedExecutionMode& operator=(const ScopedExecutionMode&) = delete;

 private:
  ExecutionMode saved_;
};

// The order to run `count` things in (a permutation of 0..count-1). `salt` distinguishes
// the places a shuffled order is drawn for (block list, barrier interval, warp round), so
// each gets its own permutation, the same in every run with the same seed.
std::vector<unsigned> run_order(const ExecutionMode& mode, unsigned count, std::uint64_t salt);

}  // namespace ringattn::emu

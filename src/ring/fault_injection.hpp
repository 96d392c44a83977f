// Test-only fault injection for the ring (RINGATTN_FAULT_INJECT): one rank either throws at
// a ring step (mode=fail, the default) or stops participating there (mode=stall, which only
// the watchdog can end). Parsed once per RingPlan from the environment, read-only after.
#pragma once

#include <string>

namespace ringattn::ring {

class Communicator;

struct FaultInjection {
  enum class Mode { fail, stall };
  int rank = -1;  // -1: disarmed
  int step = -1;
  Mode mode = Mode::fail;

  // Parses "rank=R,step=S[,mode=fail|stall]"; unset or empty means disarmed. Anything else
  // is an InputError naming RINGATTN_FAULT_INJECT (a silently ignored fault spec would make
  // a fault test pass for the wrong reason).
  static FaultInjection parse(const std::string& spec);
  static FaultInjection from_env();

  // mode=fail: throws RuntimeFailure when (rank, step) is this one.
  void fail_if_due(int my_rank, int my_step) const;
  // mode=stall: called where step `my_step`'s exchange would be posted; on the chosen rank,
  // from the chosen step on, never returns normally: it sleeps until the job is aborted
  // (an MPI abort kills the process; in-process ranks get Communicator::check_aborted()).
  void stall_if_due(int my_rank, int my_step, Communicator& comm) const;
};

}  // namespace ringattn::ring

// RINGATTN_FAULT_INJECT parsing and the two injected faults.
#include "ring/fault_injection.hpp"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "core/environment.hpp"
#include "ring/communicator.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {

FaultInjection FaultInjection::parse(const std::string& spec) {
  FaultInjection f;
  if (spec.empty()) return f;
  char mode[16] = {};
  int used = 0;
  const int n = std::sscanf(spec.c_str(), "rank=%d,step=%d%n,mode=%15[a-z]%n", &f.rank, &f.step,
                            &used, mode, &used);
  const bool whole = used == static_cast<int>(spec.size());
  const std::string m = mode;
  if (n < 2 || !whole || f.rank < 0 || f.step < 0 || (n == 3 && m != "fail" && m != "stall"))
    throw InputError("RINGATTN_FAULT_INJECT",
                     "'" + spec + "' is not rank=R,step=S[,mode=fail|stall] (R, S >= 0)");
  f.mode = m == "stall" ? Mode::stall : Mode::fail;
  return f;
}

FaultInjection FaultInjection::from_env() {
  // A read only; nothing in ringattn sets it, so concurrent virtual ranks may each parse it.
  const char* e = environment_value(Env::fault_inject);
  return parse(e ? e : "");
}

void FaultInjection::fail_if_due(int my_rank, int my_step) const {
  if (mode == Mode::fail && my_rank == rank && my_step == step)
    throw RuntimeFailure("fault injected at ring step " + std::to_string(my_step) +
                         " (RINGATTN_FAULT_INJECT)");
}

void FaultInjection::stall_if_due(int my_rank, int my_step, Communicator& comm) const {
  if (mode != Mode::stall || my_rank != rank || my_step < step) return;
  std::cerr << ("ringattn: rank " + std::to_string(comm.job_rank(my_rank)) +
                ": stalling at ring step " + std::to_string(my_step) +
                " (RINGATTN_FAULT_INJECT mode=stall)\n")
            << std::flush;
  for (;;) {
    comm.check_aborted();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace ringattn::ring

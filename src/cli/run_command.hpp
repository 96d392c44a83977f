// `ringattn run`: load (each rank its own shard) or synthesise inputs, plan, time forward
// (and backward), optionally check against the float64 reference, gather and write outputs
// atomically on rank 0, report.
#pragma once

#include <iosfwd>

#include "cli/options.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn::cli {

// Returns the process exit code. Setup errors (bad input, on any rank) are agreed on by all
// ranks, printed once, and returned as 2 (or 3) everywhere. An error after setup ends the
// whole job through Comm::abort, naming the rank.
int run_command(const RunOptions& opts, Comm& comm, std::ostream& out);

// run_command on opts.ring_size virtual ranks in this process (threads; see
// ringattn::run_virtual_ranks). --threads is per rank, as under MPI; 0 shares this
// process's OpenMP threads out (at least one per rank). Same output and exit codes as
// `mpiexec -n P ringattn run`.
int run_command_virtual_ranks(const RunOptions& opts, std::ostream& out);

// Runs `f`; if it throws on any rank, every rank learns it (no rank is left waiting) and the
// lowest failing rank prints its message. Returns the exit code all ranks agree on.
template <typename F>
int agree_on_errors(Comm& comm, F&& f);

}  // namespace ringattn::cli

#include "cli/agree_on_errors.ipp"

// `ringattn run`: load or synthesise inputs, plan, time forward (and backward), optionally
// check against the float64 reference, write outputs atomically, report.
#pragma once

#include <iosfwd>

#include "cli/options.hpp"

namespace ringattn::cli {

// Returns the process exit code (0, or 3 when --check finds a wrong result). Throws
// InputError / RuntimeFailure for the caller to turn into exit codes 2 / 3.
int run_command(const RunOptions& opts, std::ostream& out);

}  // namespace ringattn::cli

// Loads the golden cases of tests/data/golden: inputs and the expected outputs that
// docs/SEMANTICS.md defines (tests/data/golden/README.md says how they were made).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ringattn/config.hpp"

namespace ringattn::testing {

struct GoldenCase {
  std::string name;     // folder name, e.g. "g01_two_groups"
  std::string dir;      // absolute folder path
  std::string mode;     // "grouped", "mixture" or "blockmask"
  AttentionConfig cfg;  // attention=dilated for grouped/mixture (a single {N,1} pattern too)
  int64_t block_size = 0;
  std::vector<float> q, k, v, dout, out, dq, dk, dv;
  std::vector<uint8_t> block_mask;  // blockmask cases only
};

std::string golden_dir();
std::vector<std::string> golden_case_names(const std::string& mode_filter = "");
GoldenCase load_golden(const std::string& name);

// `ringattn run` arguments for a grouped/mixture case: its files (q, k, v, dout), pattern,
// causal flag and exact scale; callers append outputs and run control.
std::vector<std::string> golden_run_args(const GoldenCase& c);

}  // namespace ringattn::testing

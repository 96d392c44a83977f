// `ringattn run` options: parsed with Boost.Program_options from the command line and an
// optional --config file, then checked; every problem is an InputError naming the option.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ringattn/config.hpp"

namespace ringattn::cli {

// Virtual ranks are threads of one process; beyond this many the run is a mistake.
inline constexpr int kMaxVirtualRanks = 1024;

struct RunOptions {
  AttentionConfig cfg;  // shape filled from files when --q/--k/--v are given
  bool shape_from_options = false;
  std::string q_path, k_path, v_path, dout_path;
  std::string out_path, lse_out_path, dq_out_path, dk_out_path, dv_out_path;
  std::string sinks_path, dsinks_out_path;  // --sinks FILE, --dsinks-out FILE
  uint64_t seed = 0;
  bool backward = false;  // --dout or --backward
  // Block-sparse (--attention block-sparse, or auto past --sparse-threshold tokens).
  bool attention_auto = false;
  int64_t sparse_threshold = 1048576;
  std::string pattern;           // --pattern text
  std::string block_mask_path;   // --block-mask FILE
  std::string pattern_out_path;  // --pattern-out FILE
  std::string cu_seqlens_path;   // --cu-seqlens FILE (read once the sequence length is known)
  std::string device = "auto";   // cpu | cuda | auto (cuda when one rank and a usable GPU)
  std::string kernel = "auto";   // auto | native | cudnn (CUDA forward kernel)
  std::string dtype;             // bf16 | fp16 | fp32; empty: bf16 on cuda, fp32 on cpu
  int threads = 0;
  int warmup = 1;
  int iters = 3;
  std::string comm = "auto";   // --comm: auto | nccl | mpi | local (see cli/comm_choice.hpp)
  int ring_size = 0;           // --ring-size: 0 = the launcher's world size (1 without one)
  int ulysses = 1;             // --ulysses: U (0: auto)
  bool deterministic = false;  // --deterministic
  double timeout_s = 300;      // watchdog: longest wait for an exchange or a GPU kernel (--timeout)
  bool check = false;
  bool json = false;
  bool progress = false;  // --progress: progress lines on stderr even when it is no terminal
  bool quiet = false;     // --quiet: no progress
  bool demo = false;      // no options at all: the embedded demo config
};

// Parses `args` (the words after "run"). Returns false when --help was asked for (help is
// then written to `help_out`). Throws InputError on any bad option or value.
bool parse_run_options(const std::vector<std::string>& args, RunOptions& opts,
                       std::ostream& help_out);

// The embedded demo: what `ringattn run` with no options runs.
RunOptions demo_options();

}  // namespace ringattn::cli

// libFuzzer target for the --config file parser (Boost.Program_options' config syntax
// plus our checks, src/cli/options.cpp): the input is the whole file. Invariants: a file is
// refused only with an InputError whose subject (an option, or a key as the file spells
// it) is escaped and whose message carries no terminal controls however the file's bytes
// look (Boost quotes whole lines; we pass them through printable()); a file that is
// accepted gives options inside their documented ranges, and validate() refuses or accepts
// the config without any other exception.
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "fuzz_check.hpp"
#include "memory_file.hpp"
#include "ringattn/config.hpp"

namespace {

using ringattn::InputError;
using ringattn::fuzz::check;
using ringattn::fuzz::Text;

void check_ranges(const ringattn::cli::RunOptions& o) {
  check(o.threads >= 0 && o.warmup >= 0 && o.iters >= 1, "thread/warmup/iters out of range");
  check(o.ring_size >= 0 && o.ring_size <= ringattn::cli::kMaxVirtualRanks,
        "--ring-size out of range");
  check(o.timeout_s > 0 && o.timeout_s <= 1e6, "--timeout out of range");
  check(!(o.progress && o.quiet), "--progress and --quiet both accepted");
  check(o.backward || (o.dq_out_path.empty() && o.dk_out_path.empty() && o.dv_out_path.empty()),
        "gradient output without the backward pass");
  check(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "unknown --device");
  check(o.comm == "auto" || o.comm == "nccl" || o.comm == "mpi" || o.comm == "local",
        "unknown --comm");
  if (o.cfg.attention == ringattn::AttentionKind::block_sparse)
    check(!o.pattern.empty() != !o.block_mask_path.empty(),
          "block-sparse without exactly one of --pattern and --block-mask");
  if (o.shape_from_options) {
    const ringattn::Shape4& s = o.cfg.shape;
    check(s.batch > 0 && s.seq_len > 0 && s.heads > 0 && s.head_dim > 0,
          "non-positive dimension accepted");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static ringattn::fuzz::MemoryFile file("fuzz_config_input");
  file.set(data, size);
  ringattn::cli::RunOptions o;
  std::ostringstream help;
  try {
    // --help may come from the file too; then nothing else is parsed.
    if (!ringattn::cli::parse_run_options({"--config", file.path}, o, help)) return 0;
  } catch (const InputError& e) {
    // The subject is an option, or a key as the file spells it ("section.key"), escaped.
    ringattn::fuzz::check_input_error(e, {}, Text::printable);
    ringattn::fuzz::check_message(e.subject());
    return 0;
  }
  check_ranges(o);
  if (!o.shape_from_options) return 0;  // the shape comes from files the run would read
  try {
    ringattn::validate(o.cfg);
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e);
    check(e.subject().rfind("config.", 0) == 0, "validate() names no config field", e.what());
  }
  return 0;
}

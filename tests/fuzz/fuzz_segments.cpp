// libFuzzer target for --segments/--dilations: the option parser, validate() and the
// pattern arithmetic and schedule every layer builds on them. The first two bytes choose
// the sequence length, heads, combine and causal; the rest is "SEGMENTS\nDILATIONS".
// Invariants: refusals are InputErrors on a named option with escaped messages; accepted
// lists print back to text that parses to the same lists; every offset, count and task of
// the schedule stays inside the sequence; the schedule covers exactly attended_pairs.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "core/patterns.hpp"
#include "fuzz_check.hpp"
#include "ringattn/config.hpp"
#include "single/schedule.hpp"

namespace {

using ringattn::AttentionConfig;
using ringattn::InputError;
using ringattn::fuzz::check;

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// Parses like `ringattn run`; false when refused (after checking the error).
bool parse(const std::vector<std::string>& args, ringattn::cli::RunOptions& o) {
  std::ostringstream help;
  try {
    check(ringattn::cli::parse_run_options(args, o, help), "--help where none was asked");
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e, {}, ringattn::fuzz::Text::printable);
    check(e.subject().rfind("--", 0) == 0 || e.subject() == "options", "error names no option",
          e.what());
    return false;
  }
  return true;
}

void check_schedule(const AttentionConfig& cfg) {
  const ringattn::Shape4& s = cfg.shape;
  const int64_t q_floats = s.numel(), k_floats = cfg.kv_shape().numel();
  const auto tiles = ringattn::single::choose_tiles(s.head_dim, 0, 0);
  const ringattn::single::LocalSchedule sched = ringattn::single::build_local_schedule(cfg, tiles);
  double pairs = 0;
  for (const auto& pass : sched.passes) {
    for (const auto& t : pass.tasks) {
      check(t.n_q > 0 && t.n_k > 0, "empty task scheduled");
      check(t.q_row0 >= 0 && t.q_row0 + (t.n_q - 1) * t.q_stride + s.head_dim <= q_floats,
            "task reads queries outside q");
      check(t.k_row0 >= 0 && t.k_row0 + (t.n_k - 1) * t.k_stride + s.head_dim <= k_floats,
            "task reads keys outside k");
      const double n = static_cast<double>(t.n_q);
      pairs += cfg.causal ? n * (n + 1) / 2 : n * static_cast<double>(t.n_k);
    }
    for (const auto& item : pass.items)
      check(item.task >= 0 && static_cast<std::size_t>(item.task) < pass.tasks.size() &&
                item.q_begin >= 0 && item.q_begin < pass.tasks[item.task].n_q,
            "forward item outside its task");
  }
  const double expected = ringattn::attended_pairs(cfg) / static_cast<double>(s.batch);
  check(pairs == expected, "the schedule does not cover attended_pairs",
        std::to_string(pairs) + " vs " + std::to_string(expected));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  // Sequence lengths with many divisors, small enough that a schedule is cheap.
  constexpr int64_t kSeqLens[] = {1, 12, 64, 360, 720, 1024, 2520, 4096};
  const int64_t seq_len = kSeqLens[data[0] % 8];
  const int64_t heads = 1 + data[1] % 8;
  const bool mixture = (data[1] >> 3) & 1, causal = (data[1] >> 4) & 1;
  const std::string rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const auto newline = rest.find('\n');
  std::vector<std::string> args = {"--attention=dilated",
                                   "--seq-len=" + std::to_string(seq_len),
                                   "--heads=" + std::to_string(heads),
                                   "--head-dim=8",
                                   "--combine=" + std::string(mixture ? "mixture" : "grouped"),
                                   "--segments=" + rest.substr(0, newline)};
  if (newline != std::string::npos) args.push_back("--dilations=" + rest.substr(newline + 1));
  if (causal) args.push_back("--causal");

  ringattn::cli::RunOptions o;
  if (!parse(args, o)) return 0;
  const AttentionConfig& cfg = o.cfg;

  // What parsed prints back to the same lists.
  std::vector<std::string> again_args = args;
  again_args[5] = "--segments=" + join(cfg.segments);
  if (newline != std::string::npos) again_args[6] = "--dilations=" + join(cfg.dilations);
  ringattn::cli::RunOptions again;
  check(parse(again_args, again) && again.cfg.segments == cfg.segments &&
            again.cfg.dilations == cfg.dilations,
        "printed lists do not parse back to themselves", join(cfg.segments));

  try {
    ringattn::validate(cfg);
  } catch (const InputError& e) {
    ringattn::fuzz::check_input_error(e);
    check(e.subject() == "config.segments" || e.subject() == "config.dilations" ||
              e.subject() == "config.shape.heads",
          "a list error names another field", e.what());
    return 0;
  }
  const auto patterns = ringattn::patterns_of(cfg);
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t offset =
          ringattn::pattern_offset(cfg, ringattn::HeadSlice{}, static_cast<int64_t>(i), h);
      check(offset >= 0 && offset < cfg.dilations[i], "offset outside [0, dilation)");
      check(patterns[i].dilation >= 1 && patterns[i].dilation <= patterns[i].segment,
            "pattern dilation outside [1, segment]");
      const int64_t m = ringattn::selected_per_segment(patterns[i], offset);
      check(m >= 0 && m <= patterns[i].segment, "more positions selected than the segment has");
    }
  }
  const double pairs = ringattn::attended_pairs(cfg);
  // Mixture counts a pair once per pattern that selects it.
  const double n = static_cast<double>(seq_len);
  const double most = static_cast<double>(heads * patterns.size()) * n * n;
  check(std::isfinite(pairs) && pairs >= 0 && pairs <= most, "attended pairs out of range");
  // The schedule has up to heads x segments tasks per pattern; past ~10^5 (thousands of
  // tiny mixture segments) one input would take seconds, and libFuzzer would call it a hang.
  double tasks = 0;
  for (const auto& p : patterns) tasks += static_cast<double>(heads * (seq_len / p.segment));
  if (tasks <= 1e5) check_schedule(cfg);
  return 0;
}

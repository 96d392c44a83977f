// Option parsing for `ringattn run`. Boost.Program_options does the syntax (command line
// and config file); this file turns its errors into InputErrors that name the option, and
// checks what Boost cannot (lists, ranges, combinations).
#include "cli/options.hpp"

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <sstream>

#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"

namespace po = boost::program_options;

namespace ringattn::cli {

namespace {

std::vector<int64_t> parse_int_list(const std::string& option, const std::string& text) {
  std::vector<int64_t> values;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw InputError(option, quote(item) + " in " + quote(text) +
                                   " is not an integer (expected a comma-separated list "
                                   "like 2048,4096,8192)");
    values.push_back(v);
  }
  if (!text.empty() && text.back() == ',')
    throw InputError(option, "trailing comma in " + quote(text));
  return values;
}

// --window L or L,R: non-negative integers; R is left unset when omitted (it defaults to L,
// or 0 under --causal, in the config).
void parse_window(const std::string& text, AttentionConfig& cfg) {
  std::vector<int64_t> reach;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw InputError("--window", quote(item) + " in " + quote(text) +
                                       " is not an integer (expected L or L,R, e.g. 256 or "
                                       "128,0)");
    if (v < 0)
      throw InputError("--window",
                       "reaches must be >= 0, got " + std::to_string(v) + " in " + quote(text));
    reach.push_back(v);
  }
  if (reach.empty() || reach.size() > 2 || (!text.empty() && text.back() == ','))
    throw InputError("--window", "expected L or L,R (one or two integers), got " + quote(text));
  cfg.window_left = reach[0];
  if (reach.size() == 2) cfg.window_right = reach[1];
}

po::options_description input_options() {
  po::options_description input("Input");
  input.add_options()("q", po::value<std::string>(),
                      "queries, .npy float32/float16 [B,N,H,D] (with --k, --v)")(
      "k", po::value<std::string>(), "keys, .npy [B,N,HKV,D]: as --q, with --kv-heads heads")(
      "v", po::value<std::string>(),
      "values, .npy [B,N,HKV,Dv]: as --k, with --head-dim-v columns")(
      "batch", po::value<int64_t>(), "synthetic inputs: batch B (default 1)")(
      "seq-len", po::value<int64_t>(), "synthetic inputs: sequence length N (default 4096)")(
      "heads", po::value<int64_t>(), "synthetic inputs: heads H (default 8)")(
      "head-dim", po::value<int64_t>(), "synthetic inputs: head dim D (default 64, max 256)")(
      "head-dim-v", po::value<int64_t>(),
      "values' head dim Dv (v, out, dout; default D): multi-head latent attention runs "
      "q and k of D = 192 against v of Dv = 128")(
      "kv-heads", po::value<int64_t>(),
      "K/V heads HKV for grouped-query attention (1: multi-query); must divide H "
      "(default H); query head j reads K/V head j / (H / HKV)")(
      "seed", po::value<uint64_t>()->default_value(0), "seed for synthetic inputs");
  return input;
}

po::options_description pattern_options() {
  po::options_description pattern("Pattern");
  pattern.add_options()("attention", po::value<std::string>()->default_value("dense"),
                        "dense | dilated | block-sparse | auto (dense/dilated up to "
                        "--sparse-threshold tokens, block-sparse dilated-blocks above)")(
      "segments", po::value<std::string>(), "dilated: segment lengths, e.g. 2048,4096,8192")(
      "dilations", po::value<std::string>(), "dilated: dilation per segment, e.g. 1,2,4")(
      "combine", po::value<std::string>()->default_value("grouped"),
      "dilated: grouped (head groups, output / G) | mixture (LongNet, lse-weighted)")(
      "causal", po::bool_switch(), "causal masking (t <= p by original position)")(
      "window", po::value<std::string>(),
      "sliding window L or L,R: query p attends keys p-L..p+R (R defaults to L; with --causal "
      "R must be 0 or omitted); dense and block-sparse attention (not dilated)")(
      "seqlens", po::value<std::string>(),
      "packed sequences: document lengths L1,L2,... summing to the sequence length (every "
      "batch row); a query attends only to its own document. Dense and block-sparse attention "
      "(not dilated)")(
      "cu-seqlens", po::value<std::string>(),
      "packed sequences from a file: .npy int32/int64 [n_docs + 1] document offsets, 0 first, "
      "strictly increasing, N last")("scale", po::value<double>(),
                                     "softmax scale (default 1/sqrt(D))")(
      "softcap", po::value<double>(),
      "logit soft-capping c (Gemma 2): each scaled score s becomes c*tanh(s/c) before the "
      "softmax; 0 (default): none")(
      "sinks", po::value<std::string>(),
      "attention sinks: .npy float32 [H], a learned logit per query head joining every row's "
      "softmax normaliser (-inf: none for that head); dense and block-sparse attention");
  return pattern;
}

po::options_description sparse_options() {
  po::options_description sparse("Block-sparse");
  sparse.add_options()("block-size", po::value<int64_t>(),
                       "block-sparse: tokens per block (default 128; must divide N)")(
      "pattern", po::value<std::string>(),
      "block-sparse: generated pattern, terms joined by '+': local:window=W, global:blocks=G, "
      "random:blocks=K,seed=S, strided:stride=S, dilated-blocks (from --segments/--dilations), "
      "bigbird:window=W,global=G,random=K,seed=S")(
      "block-mask", po::value<std::string>(),
      "block-sparse: explicit mask, .npy bool [H,nb,nb] or [nb,nb] (nb = N / block size)")(
      "pattern-out", po::value<std::string>(),
      "write the block mask used (.npy bool [H,nb,nb]; small N only)")(
      "sparse-threshold", po::value<int64_t>(),
      "auto: sequence length above which block-sparse runs (default 1048576)");
  return sparse;
}

po::options_description backward_options() {
  po::options_description backward("Backward");
  backward.add_options()("dout", po::value<std::string>(),
                         "upstream gradient .npy [B,N,H,D]; runs the backward pass")(
      "backward", po::bool_switch(), "run the backward pass with a synthetic dout")(
      "dq-out", po::value<std::string>(), "write dQ (.npy float32 [B,N,H,D])")(
      "dk-out", po::value<std::string>(), "write dK (.npy float32 [B,N,HKV,D])")(
      "dv-out", po::value<std::string>(), "write dV (.npy float32 [B,N,HKV,D])")(
      "dsinks-out", po::value<std::string>(),
      "write the attention sinks' gradient (.npy float32 [H]; needs --sinks)");
  return backward;
}

po::options_description output_options() {
  po::options_description output("Output");
  output.add_options()("out", po::value<std::string>(),
                       "write the output (.npy float32 [B,N,H,D])")(
      "lse-out", po::value<std::string>(), "write the log-sum-exp (.npy float32 [B,H,N])")(
      "json", po::bool_switch(), "print one JSON object as the last stdout line")(
      "progress", po::bool_switch(),
      "progress on stderr (rank 0) even when it is not a terminal, e.g. a Slurm log: one "
      "line per ring step, at most one a second, and one at least every 30 s (on a "
      "terminal, one line redrawn up to 4 times a second, shown without this option)")(
      "quiet", po::bool_switch(), "no progress on stderr (errors are still printed)");
  return output;
}

po::options_description control_options() {
  po::options_description control("Run control");
  control.add_options()("device", po::value<std::string>()->default_value("auto"),
                        "cpu | cuda | auto (cuda on one rank when a GPU is usable)")(
      "kernel", po::value<std::string>()->default_value("auto"),
      "cuda kernel: auto (one GPU: cuDNN or ours, the faster, timed on the first forward and "
      "backward, ours wherever cuDNN does not run; ours, and the ring's and block-sparse's: "
      "hopper where it runs, else native) | native | cudnn (one GPU, and the ring's dense "
      "steps) | hopper (the sm_90a forward and backward)")(
      "dtype", po::value<std::string>(),
      "device input precision: bf16 (cuda default) | fp16 | fp32 (cpu: fp32 only)")(
      "threads", po::value<int>()->default_value(0), "OpenMP threads (0: all cores)")(
      "layout", po::value<std::string>()->default_value("bnhd"),
      "how the engine holds q, k, v and the results: bnhd ([B,N,H,D]) | bhnd ([B,H,N,D], "
      "PyTorch SDPA's convention; the CPU engines, any number of ranks). Files stay "
      "[B,N,H,D]: the CLI lays them out outside the timed calls")(
      "kv-layout", po::value<std::string>(),
      "k, v and their gradients laid out unlike q: bnhd | bhnd (a head-major KV cache beside "
      "token-major queries; the CPU engines; default: --layout)")(
      "warmup", po::value<int>()->default_value(1), "untimed iterations")(
      "iters", po::value<int>()->default_value(3), "timed iterations (median reported)")(
      "check", po::bool_switch(), "compare with the float64 reference (small problems)")(
      "comm", po::value<std::string>()->default_value("auto"),
      "auto | nccl | mpi | local: how ranks exchange K/V (auto: nccl on cuda when built, "
      "else mpi under a launcher, else local)")(
      "ring-size", po::value<int>()->default_value(0),
      "ranks in the ring; without an MPI launcher P > 1 runs P virtual ranks in this process "
      "(0: the launcher's world size, else 1)")(
      "deterministic", po::bool_switch(),
      "bitwise the same results run to run (the CPU always is; on GPUs the kernel is chosen "
      "by rule, not timing, and no atomics-accumulating backward is used)")(
      "ulysses", po::value<std::string>()->default_value("1"),
      "U: Ulysses x ring; the P ranks form P/U groups of U consecutive ranks, an all-to-all "
      "in each group trades sequence for heads (U must divide P and --heads) and the ring "
      "runs across the groups. 1: the ring alone; auto: the split the cost model picks "
      "(docs/COMMUNICATION.md)")(
      "timeout", po::value<double>()->default_value(300),
      "seconds a ring step may wait for its exchange, a rank for the others at a "
      "collective (between calls, gathering results), or the job for a GPU kernel, before "
      "the job is aborted")(
      "config", po::value<std::string>(), "read options from FILE (name = value lines)")(
      "help,h", "show this help");
  return control;
}

// The groups' order is the order of the --help text.
po::options_description run_description() {
  po::options_description all("ringattn run [options]");
  all.add(input_options())
      .add(pattern_options())
      .add(sparse_options())
      .add(backward_options())
      .add(output_options())
      .add(control_options());
  return all;
}

std::string option_name(const po::error_with_option_name& e) {
  std::string name = e.get_option_name();
  if (name.empty()) return "options";
  return name.rfind("--", 0) == 0 || name.rfind('-', 0) == 0 ? name : "--" + name;
}

// Boost's messages quote the offending token (an option name, a value, a whole --config
// line) raw; it may come from a file, so it is escaped and the message kept short.
constexpr std::size_t kBoostMessageMaxBytes = 200;

// Boost (1.74) builds what() by replacing each %name% placeholder with its token until none
// is left, so a token holding its own placeholder (--seq-len '%value%', or a --config line
// with it) never finishes and grows without bound (found by fuzz_config). Before what() is
// called, every '%' in the tokens becomes the text \x25, as quote.hpp writes escapes. The
// tokens are a protected member; a pointer to it, named through a derived class, reaches
// it on any error_with_option_name.
struct BoostTokens : po::error_with_option_name {
  static constexpr auto member = &BoostTokens::m_substitutions;
};

void defuse_placeholders(po::error_with_option_name& e) {
  for (auto& [name, token] : e.*BoostTokens::member) {
    std::string safe;
    for (const char c : token) safe += c == '%' ? std::string("\\x25") : std::string(1, c);
    token = std::move(safe);
  }
}

template <typename F>
void translating_errors(const std::string& where, F&& f) {
  try {
    f();
  } catch (const po::unknown_option& e) {
    // A --config line "= value" has no name: say so instead of naming an empty option
    // (found by fuzz_config).
    const std::string name = e.get_option_name();
    if (name.empty())
      throw InputError("options", "a line with a value but no option name" + where +
                                      " (lines are 'name = value')");
    throw InputError(escaped(name), "unknown option" + where + " (see 'ringattn run --help')");
  } catch (po::error_with_option_name& e) {
    defuse_placeholders(e);
    throw InputError(escaped(option_name(e)), printable(e.what(), kBoostMessageMaxBytes) + where);
  } catch (const po::error& e) {
    throw InputError("options", printable(e.what(), kBoostMessageMaxBytes) + where);
  }
}

std::string require_choice(const std::string& option, const std::string& value,
                           std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) {
    if (value == c) return value;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  throw InputError(option, "unknown value " + quote(value) + " (choose one of: " + list + ")");
}

void store_command_line(const std::vector<std::string>& args, const po::options_description& desc,
                        po::variables_map& vm) {
  translating_errors("", [&] {
    const po::parsed_options parsed = po::command_line_parser(args).options(desc).run();
    // Boost keeps words that are no option (a forgotten "--", a typo such as "seq-len 64")
    // as unnamed positional options and store() drops them: the run would silently use
    // defaults instead of what the user meant.
    for (const po::option& o : parsed.options)
      if (o.string_key.empty() && !o.original_tokens.empty())
        throw InputError("options", "unexpected argument " + quote(o.original_tokens.front()) +
                                        " (options are written --name value)");
    po::store(parsed, vm);
  });
}

// Stored after the command line, so that an option given in both keeps its command-line value.
void store_config_file(const po::options_description& desc, po::variables_map& vm) {
  if (!vm.count("config")) return;
  const std::string path = vm["config"].as<std::string>();
  std::ifstream f(path);
  if (!f) throw InputError("--config", "cannot open config file '" + path + "'");
  translating_errors(" in config file '" + path + "'", [&] {
    po::store(po::parse_config_file(f, desc, /*allow_unregistered=*/false), vm);
  });
}

std::string string_or_empty(const po::variables_map& vm, const char* name) {
  return vm.count(name) ? vm[name].as<std::string>() : std::string();
}

int64_t shape_dim(const po::variables_map& vm, const char* name, int64_t fallback) {
  if (!vm.count(name)) return fallback;
  const int64_t value = vm[name].as<int64_t>();
  if (value <= 0)
    throw InputError(std::string("--") + name, (std::string(name) == "head-dim"
                                                    ? "must be in 1.." + std::to_string(kMaxHeadDim)
                                                    : std::string("must be positive")) +
                                                   ", got " + std::to_string(value));
  return value;
}

void read_files_and_shape(const po::variables_map& vm, RunOptions& o) {
  o.q_path = string_or_empty(vm, "q");
  o.k_path = string_or_empty(vm, "k");
  o.v_path = string_or_empty(vm, "v");
  o.dout_path = string_or_empty(vm, "dout");
  o.out_path = string_or_empty(vm, "out");
  o.lse_out_path = string_or_empty(vm, "lse-out");
  o.dq_out_path = string_or_empty(vm, "dq-out");
  o.dk_out_path = string_or_empty(vm, "dk-out");
  o.dv_out_path = string_or_empty(vm, "dv-out");
  o.seed = vm["seed"].as<uint64_t>();

  const bool any_file = !o.q_path.empty() || !o.k_path.empty() || !o.v_path.empty();
  if (any_file) {
    for (const auto& [name, path] :
         {std::pair{"--q", o.q_path}, {"--k", o.k_path}, {"--v", o.v_path}})
      if (path.empty()) throw InputError(name, "missing: --q, --k and --v must be given together");
  }
  if (vm.count("head-dim-v")) {
    o.cfg.head_dim_v = vm["head-dim-v"].as<int64_t>();
    if (*o.cfg.head_dim_v <= 0 || *o.cfg.head_dim_v > kMaxHeadDim)
      throw InputError("--head-dim-v", "must be in 1.." + std::to_string(kMaxHeadDim) + ", got " +
                                           std::to_string(*o.cfg.head_dim_v));
  }
  if (vm.count("kv-heads")) {
    o.cfg.kv_heads = vm["kv-heads"].as<int64_t>();
    if (*o.cfg.kv_heads <= 0)
      throw InputError("--kv-heads", "must be positive, got " + std::to_string(*o.cfg.kv_heads));
  }
  o.shape_from_options = !any_file;
  // With input files the shape options are only a cross-check: 0 marks one not given.
  const int64_t unset = 0;
  o.cfg.shape = {shape_dim(vm, "batch", any_file ? unset : 1),
                 shape_dim(vm, "seq-len", any_file ? unset : 4096),
                 shape_dim(vm, "heads", any_file ? unset : 8),
                 shape_dim(vm, "head-dim", any_file ? unset : 64)};
}

// Returns --attention as written, "auto" included; o.cfg.attention gets the kind to start from.
std::string read_attention(const po::variables_map& vm, RunOptions& o) {
  const std::string attention = require_choice("--attention", vm["attention"].as<std::string>(),
                                               {"dense", "dilated", "block-sparse", "auto"});
  o.attention_auto = attention == "auto";
  if (attention == "dense") o.cfg.attention = AttentionKind::dense;
  if (attention == "dilated") o.cfg.attention = AttentionKind::dilated;
  if (attention == "block-sparse") o.cfg.attention = AttentionKind::block_sparse;
  // auto: dilated when segments are given, else dense; setup switches to block-sparse past
  // the threshold, once N is known (it may come from the input files).
  if (o.attention_auto)
    o.cfg.attention = vm.count("segments") ? AttentionKind::dilated : AttentionKind::dense;
  return attention;
}

void read_block_sparse(const po::variables_map& vm, const std::string& attention, RunOptions& o) {
  const bool sparse = attention == "block-sparse";
  o.pattern = string_or_empty(vm, "pattern");
  o.block_mask_path = string_or_empty(vm, "block-mask");
  o.pattern_out_path = string_or_empty(vm, "pattern-out");
  if (vm.count("block-size")) {
    if (!sparse && !o.attention_auto)
      throw InputError("--block-size", "only applies to --attention block-sparse or auto");
    o.cfg.block_size = vm["block-size"].as<int64_t>();
    if (o.cfg.block_size <= 0)
      throw InputError("--block-size", "must be positive, got " + std::to_string(o.cfg.block_size));
  }
  for (const auto& [name, given] : {std::pair{"--pattern", vm.count("pattern") > 0},
                                    {"--block-mask", vm.count("block-mask") > 0}}) {
    if (given && !sparse)
      throw InputError(name, o.attention_auto
                                 ? "not used by --attention auto (it derives the dilated-blocks "
                                   "pattern from --segments/--dilations)"
                                 : "only applies to --attention block-sparse");
  }
  if (vm.count("pattern-out") && !sparse && !o.attention_auto)
    throw InputError("--pattern-out", "only applies to --attention block-sparse or auto");
  if (sparse && o.pattern.empty() && o.block_mask_path.empty())
    throw InputError("--pattern",
                     "block-sparse attention needs a pattern: --pattern TEXT or --block-mask FILE");
  if (sparse && !o.pattern.empty() && !o.block_mask_path.empty())
    throw InputError("--block-mask", "give either --pattern or --block-mask, not both");
  if (vm.count("sparse-threshold")) {
    if (!o.attention_auto)
      throw InputError("--sparse-threshold", "only applies to --attention auto");
    o.sparse_threshold = vm["sparse-threshold"].as<int64_t>();
    if (o.sparse_threshold <= 0)
      throw InputError("--sparse-threshold",
                       "must be positive, got " + std::to_string(o.sparse_threshold));
  }
}

void read_dilated(const po::variables_map& vm, const std::string& attention, RunOptions& o) {
  const std::string combine =
      require_choice("--combine", vm["combine"].as<std::string>(), {"grouped", "mixture"});
  o.cfg.combine = combine == "grouped" ? Combine::grouped : Combine::mixture;
  if (vm.count("segments"))
    o.cfg.segments = parse_int_list("--segments", string_or_empty(vm, "segments"));
  if (vm.count("dilations"))
    o.cfg.dilations = parse_int_list("--dilations", string_or_empty(vm, "dilations"));
  if (attention == "dense" && (vm.count("segments") || vm.count("dilations")))
    throw InputError(vm.count("segments") ? "--segments" : "--dilations",
                     "only applies to --attention dilated (or block-sparse's dilated-blocks)");
}

void read_mask_and_documents(const po::variables_map& vm, RunOptions& o) {
  o.cfg.causal = vm["causal"].as<bool>();
  if (vm.count("window")) parse_window(string_or_empty(vm, "window"), o.cfg);
  if (vm.count("seqlens") && vm.count("cu-seqlens"))
    throw InputError("--seqlens", "give the documents once: --seqlens or --cu-seqlens, not both");
  if (vm.count("seqlens")) {
    const std::string text = string_or_empty(vm, "seqlens");
    o.cfg.cu_seqlens = {0};
    for (const int64_t len : parse_int_list("--seqlens", text)) {
      if (len <= 0)
        throw InputError("--seqlens", "document lengths must be positive, got " +
                                          std::to_string(len) + " in " + quote(text));
      if (o.cfg.cu_seqlens.back() > INT64_MAX - len)
        throw InputError("--seqlens", "the document lengths overflow");
      o.cfg.cu_seqlens.push_back(o.cfg.cu_seqlens.back() + len);
    }
  }
  if (vm.count("cu-seqlens")) {
    o.cu_seqlens_path = string_or_empty(vm, "cu-seqlens");
    if (o.cu_seqlens_path.empty()) throw InputError("--cu-seqlens", "the path is empty");
  }
  if (vm.count("scale")) o.cfg.scale = vm["scale"].as<double>();
  if (vm.count("softcap")) {
    o.cfg.softcap = vm["softcap"].as<double>();
    if (!(std::isfinite(o.cfg.softcap) && o.cfg.softcap >= 0.0)) {
      std::ostringstream got;
      got << o.cfg.softcap;
      throw InputError("--softcap", "must be a finite number >= 0 (0: none), got " + got.str());
    }
  }
}

void read_backward(const po::variables_map& vm, RunOptions& o) {
  o.backward = vm["backward"].as<bool>() || !o.dout_path.empty();
  o.sinks_path = string_or_empty(vm, "sinks");
  if (vm.count("sinks") && o.sinks_path.empty()) throw InputError("--sinks", "the path is empty");
  o.dsinks_out_path = string_or_empty(vm, "dsinks-out");
  if (!o.dsinks_out_path.empty() && o.sinks_path.empty())
    throw InputError("--dsinks-out", "needs attention sinks: give --sinks FILE");
  for (const auto& [name, path] : {std::pair{"--dq-out", o.dq_out_path},
                                   {"--dk-out", o.dk_out_path},
                                   {"--dv-out", o.dv_out_path},
                                   {"--dsinks-out", o.dsinks_out_path}})
    if (!path.empty() && !o.backward)
      throw InputError(name, "needs the backward pass: give --dout FILE (or --backward)");
}

void read_device(const po::variables_map& vm, RunOptions& o) {
  o.device = require_choice("--device", vm["device"].as<std::string>(), {"cpu", "cuda", "auto"});
  o.cfg.layout =
      require_choice("--layout", vm["layout"].as<std::string>(), {"bnhd", "bhnd"}) == "bnhd"
          ? TensorLayout::bnhd
          : TensorLayout::bhnd;
  if (vm.count("kv-layout"))
    o.cfg.kv_layout =
        require_choice("--kv-layout", vm["kv-layout"].as<std::string>(), {"bnhd", "bhnd"}) == "bnhd"
            ? TensorLayout::bnhd
            : TensorLayout::bhnd;
  o.kernel = require_choice("--kernel", vm["kernel"].as<std::string>(),
                            {"auto", "native", "cudnn", "hopper"});
  if (vm.count("dtype"))
    o.dtype = require_choice("--dtype", vm["dtype"].as<std::string>(), {"bf16", "fp16", "fp32"});
  if (o.device == "cpu" && (o.kernel == "cudnn" || o.kernel == "hopper"))
    throw InputError("--kernel", "'" + o.kernel +
                                     "' is a CUDA kernel; it needs --device cuda (or auto on a "
                                     "machine with a GPU), not --device cpu");
  if (o.device == "cpu" && !o.dtype.empty() && o.dtype != "fp32")
    throw InputError("--dtype",
                     "'" + o.dtype + "' needs --device cuda; the CPU kernels compute in fp32");
}

// --ulysses: a positive integer, or auto (0).
int parse_ulysses(const std::string& text) {
  if (text == "auto") return 0;
  std::size_t used = 0;
  int u = 0;
  try {
    u = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || u < 1 || u > kMaxVirtualRanks * 64)
    throw InputError("--ulysses", "must be a positive integer or auto, got '" + text + "'");
  return u;
}

void read_run_control(const po::variables_map& vm, RunOptions& o) {
  o.threads = vm["threads"].as<int>();
  if (o.threads < 0) throw InputError("--threads", "must be >= 0 (0 means all cores)");
  o.warmup = vm["warmup"].as<int>();
  if (o.warmup < 0) throw InputError("--warmup", "must be >= 0");
  o.iters = vm["iters"].as<int>();
  if (o.iters < 1) throw InputError("--iters", "must be >= 1");
  o.comm = require_choice("--comm", vm["comm"].as<std::string>(), {"auto", "nccl", "mpi", "local"});
  o.ring_size = vm["ring-size"].as<int>();
  if (o.ring_size < 0 || o.ring_size > kMaxVirtualRanks)
    throw InputError("--ring-size", "must be in 0.." + std::to_string(kMaxVirtualRanks) + ", got " +
                                        std::to_string(o.ring_size));
  o.ulysses = parse_ulysses(vm["ulysses"].as<std::string>());
  o.deterministic = vm["deterministic"].as<bool>();
  o.timeout_s = vm["timeout"].as<double>();
  if (!(o.timeout_s > 0) || o.timeout_s > 1e6) {
    std::ostringstream got;
    got << o.timeout_s;
    throw InputError("--timeout", "must be a number of seconds in (0, 1e6], got " + got.str());
  }
  o.check = vm["check"].as<bool>();
  o.json = vm["json"].as<bool>();
  o.progress = vm["progress"].as<bool>();
  o.quiet = vm["quiet"].as<bool>();
  if (o.progress && o.quiet)
    throw InputError("--progress", "cannot be combined with --quiet (choose one)");
}

}  // namespace

RunOptions demo_options() {
  RunOptions o;
  o.demo = true;
  o.cfg.shape = {1, 4096, 8, 64};
  o.shape_from_options = true;
  o.cfg.attention = AttentionKind::dilated;
  o.cfg.combine = Combine::grouped;
  o.cfg.segments = {1024, 2048, 4096};
  o.cfg.dilations = {1, 2, 4};
  o.backward = true;
  o.check = true;
  o.iters = 3;
  o.warmup = 1;
  return o;
}

bool parse_run_options(const std::vector<std::string>& args, RunOptions& opts,
                       std::ostream& help_out) {
  if (args.empty()) {
    opts = demo_options();
    return true;
  }
  const po::options_description desc = run_description();
  po::variables_map vm;
  store_command_line(args, desc, vm);
  if (vm.count("help")) {
    help_out << desc << '\n';
    return false;
  }
  store_config_file(desc, vm);
  translating_errors("", [&] { po::notify(vm); });

  // Each group checks its own options; their order fixes which error a bad run reports first.
  RunOptions o;
  read_files_and_shape(vm, o);
  const std::string attention = read_attention(vm, o);
  read_block_sparse(vm, attention, o);
  read_dilated(vm, attention, o);
  read_mask_and_documents(vm, o);
  read_backward(vm, o);
  read_device(vm, o);
  read_run_control(vm, o);
  opts = std::move(o);
  return true;
}

}  // namespace ringattn::cli

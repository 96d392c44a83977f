// Keywords → config → engine, for the Python package. The options go through the CLI's
// parser (cli::parse_run_options) as the words a user would type, so that option values and
// errors mean exactly what they mean on the command line.
#include "attention_op.hpp"

#include <iomanip>
#include <sstream>
#include <utility>

#include "cli/options.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"
#include "sparse/block_lists.hpp"
#include "sparse/pattern.hpp"
#include "sparse/pattern_cache.hpp"

namespace ringattn::python {

namespace {

std::string join(const std::vector<int64_t>& values) {
  std::string text;
  for (std::size_t i = 0; i < values.size(); ++i)
    text += (i ? "," : "") + std::to_string(values[i]);
  return text;
}

std::string number(double x) {
  std::ostringstream s;
  s << std::setprecision(17) << x;
  return s.str();
}

// --attention auto switches to block-sparse above this many tokens (the CLI's default
// --sparse-threshold; the Python API has no keyword for it).
constexpr int64_t kSparseThreshold = 1048576;

// What the CLI's parser and setup make of the options for a full [B, N, H, D] problem with
// kv_heads K/V heads. Throws InputError (the CLI's message) on any bad option.
struct Resolved {
  AttentionConfig cfg;
  std::string pattern;  // block-sparse: the pattern text (auto: dilated-blocks)
};

Resolved resolve(const AttentionOptions& o, const Shape4& full, int64_t kv_heads) {
  std::vector<std::string> args = {"--device",
                                   "cpu",
                                   "--quiet",
                                   "--attention",
                                   o.attention,
                                   "--combine",
                                   o.combine,
                                   "--batch",
                                   std::to_string(full.batch),
                                   "--seq-len",
                                   std::to_string(full.seq_len),
                                   "--heads",
                                   std::to_string(full.heads),
                                   "--head-dim",
                                   std::to_string(full.head_dim),
                                   "--kv-heads",
                                   std::to_string(kv_heads)};
  auto add = [&](const char* option, std::string value) {
    args.emplace_back(option);
    args.push_back(std::move(value));
  };
  if (o.segments) add("--segments", join(*o.segments));
  if (o.dilations) add("--dilations", join(*o.dilations));
  if (o.causal) args.emplace_back("--causal");
  add("--layout", o.layout);
  if (o.scale) add("--scale", number(*o.scale));
  if (o.window) add("--window", join(*o.window));
  if (o.pattern) add("--pattern", *o.pattern);
  // The mask itself is an array here, not a file; the parser only needs to know it is given.
  if (o.has_block_mask) add("--block-mask", "block_mask");
  if (o.block_size != 128 || o.attention == "block-sparse" || o.attention == "auto")
    add("--block-size", std::to_string(o.block_size));
  if (o.seqlens) add("--seqlens", join(*o.seqlens));
  cli::RunOptions opts;
  std::ostringstream help;
  cli::parse_run_options(args, opts, help);

  Resolved r{opts.cfg, opts.pattern};
  if (opts.attention_auto && full.seq_len > kSparseThreshold) {
    // What the CLI's setup does for --attention auto past --sparse-threshold.
    if (r.cfg.segments.empty())
      throw InputError("--attention", "auto: N = " + std::to_string(full.seq_len) +
                                          " is above --sparse-threshold " +
                                          std::to_string(kSparseThreshold) +
                                          ", where block-sparse runs the dilated-blocks pattern; "
                                          "give --segments and --dilations for it");
    r.cfg.attention = AttentionKind::block_sparse;
    r.pattern = "dilated-blocks";
  }
  validate(r.cfg);
  return r;
}

std::shared_ptr<const sparse::BlockLists> block_lists(const AttentionConfig& cfg,
                                                      const std::string& pattern,
                                                      const std::optional<BlockMask>& mask) {
  const Shape4& s = cfg.shape;
  const int64_t nb = s.seq_len / cfg.block_size;
  if (mask) {
    const auto& d = mask->dims;
    const bool shared = d.size() == 2 && d[0] == nb && d[1] == nb;
    const bool per_head = d.size() == 3 && d[0] == s.heads && d[1] == nb && d[2] == nb;
    if (!shared && !per_head) {
      std::string got;
      for (int64_t x : d) got += (got.empty() ? "" : ", ") + std::to_string(x);
      throw InputError("block_mask",
                       "block mask shape [" + got + "] does not match " + std::to_string(s.heads) +
                           " heads and N / block size = " + std::to_string(s.seq_len) + " / " +
                           std::to_string(cfg.block_size) + " = " + std::to_string(nb) +
                           " blocks: expected [" + std::to_string(s.heads) + ", " +
                           std::to_string(nb) + ", " + std::to_string(nb) + "] or [" +
                           std::to_string(nb) + ", " + std::to_string(nb) + "] (see block_size)");
    }
    return std::make_shared<const sparse::BlockLists>(
        sparse::lists_from_mask(mask->data, shared ? 1 : s.heads, s.heads, nb, cfg.block_size));
  }
  const sparse::Geometry g{s.seq_len, cfg.block_size, s.heads};
  const sparse::Pattern p = sparse::parse_pattern(pattern, g, cfg.segments, cfg.dilations, 0);
  if (!cfg.segments.empty() && p.canonical.find("dilated-blocks") == std::string::npos)
    throw InputError("--segments", "only used by the dilated-blocks pattern (--pattern " +
                                       quote(pattern) + " has none)");
  return sparse::PatternCache::global().get(
      sparse::cache_key(s.seq_len, cfg.block_size, s.heads, p.canonical),
      [&] { return sparse::build_lists(p, g); });
}

}  // namespace

ring::ShardLayout layout_for(AttentionOptions o, const Shape4& full, int world) {
  if (o.attention == "block-sparse" && !o.pattern) o.has_block_mask = true;
  const Resolved r = resolve(o, full, full.heads);
  return r.cfg.attention == AttentionKind::block_sparse ? sparse::sparse_layout(r.cfg, world)
                                                        : ring::make_layout(r.cfg, world);
}

AttentionOp::AttentionOp(const AttentionOptions& o, const Shape4& local_q, int64_t kv_heads,
                         const CommHandle& comm, const std::optional<BlockMask>& mask)
    : comm_(comm) {
  ring::Communicator& c = comm.comm();
  const int world = c.size();
  std::shared_ptr<const sparse::BlockLists> lists;
  // Setup (options, validation, layout, block lists) is agreed on by every rank before any
  // engine is built, as the CLI's is: one rank's bad option must not leave the others waiting
  // inside the engine's first exchange.
  int code = 0;
  std::string message;
  std::exception_ptr error;
  try {
    const Shape4 full{local_q.batch, local_q.seq_len * world, local_q.heads, local_q.head_dim};
    Resolved r = resolve(o, full, kv_heads);
    cfg_ = r.cfg;
    if (cfg_.attention == AttentionKind::block_sparse) {
      lists = block_lists(cfg_, r.pattern, mask);
      layout_ = sparse::sparse_layout(cfg_, world);
    } else {
      if (mask) throw InputError("block_mask", "only applies to attention=\"block-sparse\"");
      layout_ = ring::make_layout(cfg_, world);
    }
  } catch (const InputError& e) {
    code = static_cast<int>(ExitCode::bad_input);
    message = e.what();
    error = std::current_exception();
  } catch (const std::exception& e) {
    code = static_cast<int>(ExitCode::runtime_failure);
    message = e.what();
    error = std::current_exception();
  }
  if (world > 1) {
    const int64_t worst = c.max(static_cast<int64_t>(code));
    if (worst != 0) {
      const auto first_bad =
          static_cast<int>(-c.max(code ? -static_cast<int64_t>(c.rank()) : INT64_MIN));
      uint64_t length = message.size();
      c.broadcast(&length, sizeof length, first_bad);
      message.resize(length);
      c.broadcast(message.data(), length, first_bad);
      const std::string rank = "rank " + std::to_string(first_bad);
      if (worst == static_cast<int64_t>(ExitCode::bad_input)) throw InputError(rank, message);
      throw RuntimeFailure(rank + ": " + message);
    }
  } else if (error) {
    std::rethrow_exception(error);
  }

  ring::RingOptions ring_opts;
  ring_opts.timeout_s = comm.timeout_s();
  if (lists)
    sparse_.emplace(cfg_, lists, c, PlanOptions{}, ring_opts);
  else if (world == 1)
    plan_.emplace(cfg_, PlanOptions{});
  else
    ring_.emplace(cfg_, c, PlanOptions{}, ring_opts);
}

AttentionOp::~AttentionOp() = default;

std::string AttentionOp::engine() const {
  return sparse_ ? "SparsePlan" : plan_ ? "Plan" : "RingPlan";
}

template <typename F>
void AttentionOp::run_engine(F&& f) {
  if (comm_.is_mpi() && mpi_ended())
    throw RuntimeFailure("MPI has been finalised (the interpreter is exiting); no ring can run");
  std::lock_guard lock(running_);
  try {
    f();
  } catch (const RuntimeFailure& e) {
    // The ring may now hold abandoned transfers: the job ends at exit, not by finalising.
    comm_.mark_failed();
    if (comm_.size() > 1)
      throw RuntimeFailure("rank " + std::to_string(comm_.rank()) + ": " + e.what());
    throw;
  }
}

void AttentionOp::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  run_engine([&] {
    if (sparse_)
      sparse_->forward(q, k, v, out, lse);
    else if (plan_)
      plan_->forward(q, k, v, out, lse);
    else
      ring_->forward(q, k, v, out, lse);
  });
}

void AttentionOp::backward(const float* q, const float* k, const float* v, const float* out,
                           const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  run_engine([&] {
    if (sparse_)
      sparse_->backward(q, k, v, out, lse, dout, dq, dk, dv);
    else if (plan_)
      plan_->backward(q, k, v, out, lse, dout, dq, dk, dv);
    else
      ring_->backward(q, k, v, out, lse, dout, dq, dk, dv);
  });
}

}  // namespace ringattn::python

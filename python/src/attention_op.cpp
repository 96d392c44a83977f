// Keywords -> JobSpec -> Engine, for the Python package (attention_op.hpp). Keyword
// combinations are checked here, naming the keyword; everything else (validation, layout,
// block lists, agreement across ranks) is make_engine's, whose errors name the JobSpec field
// and are said here with the keyword that sets it (keyword_of); the field words in the
// library's messages too (keyword_words).
#include "attention_op.hpp"

#include <optional>
#include <string_view>
#include <utility>

#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::python {

std::string keyword_of(const std::string& subject) {
  static constexpr std::pair<std::string_view, std::string_view> kKeywords[] = {
      {"config.shape.batch", "batch"},
      {"config.shape.seq_len", "seq_len"},
      {"config.shape.heads", "heads"},
      {"config.shape.head_dim", "head_dim"},
      {"config.kv_heads", "kv_heads"},
      {"config.head_dim_v", "head_dim_v"},  // v's last dim, as head_dim is q's
      {"config.softcap", "softcap"},
      {"config.attention", "attention"},
      {"config.combine", "combine"},
      {"config.segments", "segments"},
      {"config.dilations", "dilations"},
      {"config.causal", "causal"},
      {"config.scale", "scale"},
      {"config.window_left", "window"},
      {"config.window_right", "window"},
      {"config.cu_seqlens", "seqlens"},
      {"config.block_size", "block_size"},
      {"config.layout", "layout"},
      {"config.kv_layout", "kv_layout"},
      {"block_sparse.pattern", "pattern"},
      {"block_sparse.mask", "block_mask"},
      {"sparse_threshold", "sparse_threshold"},
      {"attention_auto", "attention"},
      {"ulysses", "ulysses"},
      {"deterministic", "deterministic"},
      {"sinks", "sinks"},
      {"transport", "comm"},
      {"timeout_s", "timeout"},
  };
  for (const auto& [field, keyword] : kKeywords)
    if (subject == field) return std::string(keyword);
  return subject;  // no keyword sets it ("device", "kernel"), or no field ("q")
}

namespace {

// One field word as Python says it: the keyword, with the value as a Python literal. None
// where no keyword sets the field (device, kernel, dtype, threads; transport, since comm takes
// a Comm and not a transport's name): the library's words stay.
std::optional<std::string> keyword_saying(std::string_view field,
                                          std::optional<std::string_view> value) {
  const std::string keyword = keyword_of(std::string(field));
  const bool same_word = field == "ulysses" || field == "deterministic" || field == "sinks";
  if (field == "transport" || (keyword == field && !same_word)) return std::nullopt;
  if (!value) return keyword;
  const std::string_view v = *value;
  if (field == "attention_auto" && v == "true") return keyword + "=\"auto\"";
  if (field == "sinks" && v == "false") return keyword + "=None";  // sinks takes the logits
  if (v == "true" || v == "false") return keyword + (v == "true" ? "=True" : "=False");
  const char c = v.front();
  if (c == '\'' || c == '"' || c == '-' || (c >= '0' && c <= '9'))
    return keyword + "=" + std::string(v);  // quoted already, or a number
  return keyword + "=\"" + std::string(v) + "\"";
}

}  // namespace

std::string keyword_words(std::string_view text) { return reword_fields(text, keyword_saying); }

std::string keyword_message(const std::exception& e) {
  if (const auto* input = dynamic_cast<const InputError*>(&e))
    return keyword_of(input->subject()) + ": " + keyword_words(input->problem());
  return keyword_words(e.what());
}

namespace {

template <typename F>
auto naming_keywords(F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    throw InputError(keyword_of(e.subject()), e.problem()).from_rank(e.rank());
  }
}

std::string choice(const char* keyword, const std::string& value,
                   std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) {
    if (value == c) return value;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  throw InputError(keyword, "unknown value '" + value + "' (choose one of: " + list + ")");
}

// The keywords as a JobSpec for a full [B, N, H, D] problem with kv_heads K/V heads.
JobSpec spec_of(const AttentionOptions& o, const Shape4& full, int64_t kv_heads,
                const std::optional<BlockMask>& mask, double timeout_s) {
  JobSpec spec;
  AttentionConfig& c = spec.config;
  c.shape = full;
  c.kv_heads = kv_heads;
  const std::string attention =
      choice("attention", o.attention, {"dense", "dilated", "block-sparse", "auto"});
  spec.attention_auto = attention == "auto";
  c.attention = attention == "dilated"              ? AttentionKind::dilated
                : attention == "block-sparse"       ? AttentionKind::block_sparse
                : spec.attention_auto && o.segments ? AttentionKind::dilated
                                                    : AttentionKind::dense;
  const bool sparse = c.attention == AttentionKind::block_sparse;
  c.combine = choice("combine", o.combine, {"grouped", "mixture"}) == "grouped" ? Combine::grouped
                                                                                : Combine::mixture;
  if (attention == "dense" && (o.segments || o.dilations))
    throw InputError(o.segments ? "segments" : "dilations",
                     "only applies to attention=\"dilated\" (or block-sparse's dilated-blocks)");
  if (o.segments) c.segments = *o.segments;
  if (o.dilations) c.dilations = *o.dilations;
  c.causal = o.causal;
  c.scale = o.scale;
  c.head_dim_v = o.head_dim_v;
  c.softcap = o.softcap;
  if (o.window) {
    if (o.window->empty() || o.window->size() > 2)
      throw InputError("window", "expected L or (L, R): one or two integers");
    for (const int64_t r : *o.window)
      if (r < 0) throw InputError("window", "reaches must be >= 0, got " + std::to_string(r));
    c.window_left = (*o.window)[0];
    if (o.window->size() == 2) c.window_right = (*o.window)[1];
  }
  if (o.seqlens) {
    c.cu_seqlens = {0};
    for (const int64_t len : *o.seqlens) {
      if (len <= 0)
        throw InputError("seqlens",
                         "document lengths must be positive, got " + std::to_string(len));
      c.cu_seqlens.push_back(c.cu_seqlens.back() + len);
    }
  }
  if (o.block_size != 128 && !sparse && !spec.attention_auto)
    throw InputError("block_size", "only applies to attention=\"block-sparse\" or \"auto\"");
  if (o.block_size <= 0)
    throw InputError("block_size", "must be positive, got " + std::to_string(o.block_size));
  c.block_size = o.block_size;
  if ((o.pattern || o.has_block_mask) && !sparse)
    throw InputError(o.pattern ? "pattern" : "block_mask",
                     spec.attention_auto ? "not used by attention=\"auto\" (it derives the "
                                           "dilated-blocks pattern from segments/dilations)"
                                         : "only applies to attention=\"block-sparse\"");
  if (o.pattern && o.has_block_mask)
    throw InputError("block_mask", "give either pattern or block_mask, not both");
  if (sparse && !o.pattern && !o.has_block_mask)
    throw InputError("pattern",
                     "block-sparse attention needs a pattern: pattern=TEXT or block_mask=ARRAY");
  if (o.pattern) spec.block_sparse.pattern = *o.pattern;
  if (mask) {
    std::size_t n = 1;
    for (const int64_t d : mask->dims) n *= static_cast<std::size_t>(d);
    spec.block_sparse.mask =
        std::make_shared<const std::vector<uint8_t>>(mask->data, mask->data + n);
    spec.block_sparse.mask_dims = mask->dims;
    spec.block_sparse.mask_name = "block_mask";
  }
  c.layout = choice("layout", o.layout, {"bnhd", "bhnd"}) == "bnhd" ? TensorLayout::bnhd
                                                                    : TensorLayout::bhnd;
  if (o.kv_layout != o.layout)
    c.kv_layout = choice("kv_layout", o.kv_layout, {"bnhd", "bhnd"}) == "bnhd" ? TensorLayout::bnhd
                                                                               : TensorLayout::bhnd;
  // The tensors' device decides the engine's: the GPU they are on, in their dtype.
  if (o.device == "cuda") {
    spec.device = Device::cuda;
    spec.device_index = o.device_index;
    spec.dtype = o.dtype == "bf16"   ? DeviceDType::bf16
                 : o.dtype == "fp16" ? DeviceDType::fp16
                                     : DeviceDType::fp32;
  } else {
    spec.device = Device::cpu;
  }
  spec.timeout_s = timeout_s;
  spec.ulysses = o.ulysses;
  spec.deterministic = o.deterministic;
  spec.sinks = o.sinks;
  return spec;
}

}  // namespace

std::vector<std::vector<int64_t>> rows_for(const AttentionOptions& o, const Shape4& full,
                                           int world) {
  return naming_keywords([&] {
    AttentionOptions layout_only = o;
    // The layout needs no block lists: stand in for a pattern the caller may pass later.
    if (layout_only.attention == "block-sparse" && !o.pattern) layout_only.has_block_mask = true;
    const JobSpec spec = spec_of(layout_only, full, full.heads, std::nullopt, 300);
    std::vector<std::vector<int64_t>> rows;
    for (int r = 0; r < world; ++r) rows.push_back(shard_rows(spec, world, r));
    return rows;
  });
}

AttentionOp::AttentionOp(const AttentionOptions& o, const Shape4& local_q, int64_t kv_heads,
                         const CommHandle& comm, const std::optional<BlockMask>& mask)
    : comm_(comm) {
  const Shape4 full{local_q.batch, local_q.seq_len * comm.size(), local_q.heads, local_q.head_dim};
  try {
    // A keyword error on one rank reaches every rank (the lowest failing rank's), as
    // make_engine's own errors do, so no rank is left waiting in the engine's setup.
    JobSpec spec;
    Comm c = comm.comm();
    c.agree([&] { spec = spec_of(o, full, kv_heads, mask, comm.timeout_s()); });
    engine_.emplace(make_engine(spec, c));
  } catch (const InputError& e) {
    const InputError k(keyword_of(e.subject()), e.problem());
    if (comm.size() > 1 && e.rank() >= 0)
      throw InputError("rank " + std::to_string(e.rank()), k.what());
    throw k;
  } catch (const RuntimeFailure& e) {
    if (comm.size() > 1 && e.rank() >= 0)
      throw RuntimeFailure("rank " + std::to_string(e.rank()) + ": " + e.what());
    throw;
  }
}

AttentionOp::~AttentionOp() = default;

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

void AttentionOp::forward(const float* q, const float* k, const float* v, float* out, float* lse,
                          const float* sinks) {
  run_engine([&] { engine_->forward(q, k, v, out, lse, sinks); });
}

void AttentionOp::forward(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                          const TensorRef& out, const TensorRef& lse, const TensorRef& sinks) {
  run_engine([&] { engine_->forward(q, k, v, out, lse, sinks); });
}

void AttentionOp::backward(const TensorRef& q, const TensorRef& k, const TensorRef& v,
                           const TensorRef& out, const TensorRef& lse, const TensorRef& dout,
                           const TensorRef& dq, const TensorRef& dk, const TensorRef& dv,
                           const TensorRef& sinks, const TensorRef& dsinks) {
  run_engine([&] { engine_->backward(q, k, v, out, lse, dout, dq, dk, dv, sinks, dsinks); });
}

void AttentionOp::backward(const float* q, const float* k, const float* v, const float* out,
                           const float* lse, const float* dout, float* dq, float* dk, float* dv,
                           const float* sinks, float* dsinks) {
  run_engine([&] { engine_->backward(q, k, v, out, lse, dout, dq, dk, dv, sinks, dsinks); });
}

}  // namespace ringattn::python

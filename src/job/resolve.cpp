// JobSpec -> ResolvedJob: where the job runs (device = auto), what it computes (attention =
// auto past the threshold), whether the pieces fit together (dtype and kernel against the
// device, cuDNN against the features), validation, the block lists (pattern through the
// process-wide cache, or the caller's mask) and the shard layout. Every error names the
// JobSpec field at fault (errors.hpp).
#include "job/resolve.hpp"

#include <optional>
#include <sstream>
#include <string>

#include "core/patterns.hpp"
#include "job/ulysses.hpp"
#include "kernels/cpu_blas.hpp"
#include "ring/ulysses_model.hpp"
#include "ringattn/field_words.hpp"
#include "ringattn/quote.hpp"
#include "ringattn/ringattn.hpp"
#include "sparse/pattern.hpp"
#include "sparse/pattern_cache.hpp"
#include "sparse/sparse_plan.hpp"

namespace ringattn::job {

namespace {

// Whether the job runs on the GPU: cuda (checked: CUDA kernels built, a usable device, NCCL
// where ranks exchange over it), or automatic with one rank, a usable device, [B, N, H, D]
// tensors (the GPU engines read no other layout) and a config they compute (`note` then
// says why a usable GPU was passed over). Everything else runs on the CPU.
bool resolve_cuda(const JobSpec& spec, const Ranks& ranks, std::string& note) {
  if (spec.device == Device::cpu) return false;
  if (spec.device == Device::automatic) {
    if (!(cuda_built() && ranks.world == 1 && spec.config.layout == TensorLayout::bnhd &&
          spec.config.effective_kv_layout() == TensorLayout::bnhd && probe_cuda_device().usable))
      return false;
    if (const std::string f = value_dim_and_cap_words(spec.config); !f.empty()) {
      note = field_is("device", "auto") + ": the CPU, since no GPU has run the kernels that compute " +
             f + " yet (" + field_is("device", "cuda") + " runs them)";
      return false;
    }
    return true;
  }
  if (!cuda_built())
    throw InputError("device",
                     "'cuda' is not available: this build of ringattn has CPU kernels only (use " +
                         field_is("device", "cpu") + " or auto)");
  const CudaDeviceStatus s = probe_cuda_device();
  const bool shares_gpus = ranks.in_process && std::max(1, s.device_count) < ranks.world;
  // The build's flag, not the library: NCCL is opened only when the transport is made.
  if (ranks.world > 1 && !shares_gpus && !build_features().nccl)
    throw InputError("device", "'cuda' on " + std::to_string(ranks.world) +
                                   " ranks needs NCCL, and this build has none (build with "
                                   "NCCL, run one rank, or use " +
                                   field_is("device", "cpu") + ")");
  if (!s.usable)
    throw InputError("device", "'cuda' cannot be used: " + s.reason + " (use " +
                                   field_is("device", "cpu") + " or auto)");
  return true;
}

// A job on the CPU takes neither cuDNN nor a half-precision dtype; `where` says why it is on
// the CPU, as the messages continue it for the kernel and the dtype.
struct CpuReason {
  std::string kernel, dtype;
};
void check_cpu_fields(const JobSpec& spec, const CpuReason& where) {
  if (spec.kernel == KernelChoice::cudnn || spec.kernel == KernelChoice::hopper)
    throw InputError("kernel", std::string("'") + to_string(spec.kernel) +
                                   "' is a CUDA kernel, but " + where.kernel);
  if (spec.dtype && *spec.dtype != DeviceDType::fp32)
    throw InputError(
        "dtype", "'" + std::string(to_string(*spec.dtype)) + "' needs the GPU, but " + where.dtype);
}

std::shared_ptr<const sparse::BlockLists> block_lists(const AttentionConfig& cfg,
                                                      const BlockSparseSource& src,
                                                      const std::string& pattern,
                                                      std::string& description) {
  const Shape4& s = cfg.shape;
  const int64_t nb = s.seq_len / cfg.block_size;
  if (src.mask && pattern.empty()) {
    const auto& d = src.mask_dims;
    const bool shared = d.size() == 2 && d[0] == nb && d[1] == nb;
    const bool per_head = d.size() == 3 && d[0] == s.heads && d[1] == nb && d[2] == nb;
    if (!shared && !per_head) {
      std::string got;
      for (int64_t x : d) got += (got.empty() ? "" : ", ") + std::to_string(x);
      throw InputError("block_sparse.mask",
                       "block mask shape [" + got + "] does not match " + std::to_string(s.heads) +
                           " heads and N / block size = " + std::to_string(s.seq_len) + " / " +
                           std::to_string(cfg.block_size) + " = " + std::to_string(nb) +
                           " blocks: expected [" + std::to_string(s.heads) + ", " +
                           std::to_string(nb) + ", " + std::to_string(nb) + "] or [" +
                           std::to_string(nb) + ", " + std::to_string(nb) +
                           "] (see config.block_size)");
    }
    if (src.mask->size() != static_cast<std::size_t>((shared ? 1 : s.heads) * nb * nb))
      throw InputError("block_sparse.mask", "holds " + std::to_string(src.mask->size()) +
                                                " elements, not the product of its dimensions");
    description = "mask " + src.mask_name;
    return std::make_shared<const sparse::BlockLists>(sparse::lists_from_mask(
        src.mask->data(), shared ? 1 : s.heads, s.heads, nb, cfg.block_size));
  }
  const sparse::Geometry g{s.seq_len, cfg.block_size, s.heads};
  const sparse::Pattern p =
      sparse::parse_pattern(pattern, g, cfg.segments, cfg.dilations, src.seed);
  if (!cfg.segments.empty() && p.canonical.find("dilated-blocks") == std::string::npos)
    throw InputError("config.segments", "only used by the dilated-blocks pattern (" +
                                            field_is("block_sparse.pattern", quote(pattern)) +
                                            " has none)");
  description = p.canonical;
  return sparse::PatternCache::global().get(
      sparse::cache_key(s.seq_len, cfg.block_size, s.heads, p.canonical),
      [&] { return sparse::build_lists(p, g); });
}

// ulysses = 0 (auto): the cost model's split (ring/ulysses_model.hpp) for a training step
// (forward and backward) of this shape, with the ranks per node the launcher placed.
int auto_ulysses(const AttentionConfig& cfg, const Ranks& ranks, bool on_gpu, const JobSpec& spec) {
  const Shape4& s = cfg.shape;
  const int elem =
      on_gpu ? static_cast<int>(bytes_per_element(spec.dtype.value_or(DeviceDType::bf16))) : 4;
  ring::ModelShape m{ranks.world,
                     std::max(1, ranks.per_node),
                     s.seq_len,
                     s.heads,
                     cfg.effective_kv_heads(),
                     s.head_dim,
                     elem,
                     cfg.causal,
                     true};
  m.head_dim_v = cfg.effective_head_dim_v();
  return ring::recommend_ulysses(m, on_gpu ? ring::h100_nodes() : ring::cpu_hosts());
}

// U of a Ulysses job: checked against the ranks and the heads, or (0) the cost model's
// choice for this shape and the ranks per node.
int ulysses_degree(const JobSpec& spec, const AttentionConfig& cfg, const Ranks& ranks,
                   bool on_gpu) {
  int u = spec.ulysses;
  if (u < 0)
    throw InputError("ulysses", "must be a positive integer or auto, got " + std::to_string(u));
  if (u == 0) u = auto_ulysses(cfg, ranks, on_gpu, spec);
  if (u == 1) return 1;
  if (ranks.world % u != 0)
    throw InputError("ulysses", std::to_string(u) + " does not divide the " +
                                    std::to_string(ranks.world) +
                                    " ranks: the ranks form groups of U");
  if (std::string why = ulysses_head_split_problem(cfg.shape.heads, cfg.effective_kv_heads(), u);
      !why.empty())
    throw InputError("ulysses", why);
  return u;
}

}  // namespace

ResolvedJob resolve(const JobSpec& spec, const Ranks& ranks) {
  ResolvedJob r;
  AttentionConfig cfg = spec.config;
  bool use_cuda = resolve_cuda(spec, ranks, r.device_note);
  if (!use_cuda) {
    const std::string why =
        r.device_note.empty() ? field_is("device", to_string(spec.device)) : r.device_note;
    check_cpu_fields(spec, {"this run uses the CPU (" + why + "); use " + field_is("device", "cuda"),
                            "this run uses the CPU (" + why + "); the CPU kernels compute in fp32"});
  }
  if (!(spec.timeout_s > 0) || spec.timeout_s > 1e6) {
    std::ostringstream got;
    got << spec.timeout_s;
    throw InputError("timeout_s", "must be a number of seconds in (0, 1e6], got " + got.str());
  }
  if (spec.threads < 0) throw InputError("threads", "must be >= 0 (0 means all cores)");
  std::string pattern = spec.block_sparse.pattern;
  if (spec.attention_auto) {
    const int64_t n = cfg.shape.seq_len;
    const std::string threshold = std::to_string(spec.sparse_threshold);
    if (n > spec.sparse_threshold) {
      if (cfg.segments.empty())
        throw InputError("config.attention",
                         "auto: N = " + std::to_string(n) + " is above " +
                             field_is("sparse_threshold", threshold) +
                             ", where block-sparse runs the dilated-blocks pattern; "
                             "give config.segments and config.dilations for it");
      cfg.attention = AttentionKind::block_sparse;
      pattern = "dilated-blocks";
      r.auto_note = field_is("attention_auto", true) + ": N = " + std::to_string(n) + " > " +
                    field_is("sparse_threshold", threshold) + ": block-sparse";
    } else {
      r.auto_note = field_is("attention_auto", true) + ": N = " + std::to_string(n) +
                    " <= " + field_is("sparse_threshold", threshold) + ": " +
                    to_string(cfg.attention);
    }
  }
  const bool block_sparse = cfg.attention == AttentionKind::block_sparse;
  if (block_sparse && pattern.empty() && !spec.block_sparse.mask && ranks.with_lists)
    throw InputError("block_sparse.pattern",
                     "block-sparse attention needs a pattern: block_sparse.pattern or "
                     "block_sparse.mask");
  if (!block_sparse && spec.block_sparse.mask)
    throw InputError("block_sparse.mask",
                     "only applies to " + field_is("config.attention", "block-sparse"));
  // Block-sparse runs on the GPU when asked for (one rank or several); device = auto keeps
  // it on the CPU.
  if (block_sparse && use_cuda && spec.device != Device::cuda) {
    use_cuda = false;
    check_cpu_fields(spec,
                     {"block-sparse runs on the CPU", "block-sparse runs on the CPU, in fp32"});
  }
  validate(cfg);
  // A sink joins one softmax per row; dilated attention has one per pattern (grouped heads,
  // mixtures), where a sink has no single meaning.
  if (spec.sinks && cfg.attention == AttentionKind::dilated)
    throw InputError("sinks", "attention sinks join one softmax per row, and " +
                                  (spec.attention_auto
                                       ? field_is("attention_auto", true) + " (dilated at this N)"
                                       : field_is("config.attention", "dilated")) +
                                  " has one per pattern: use dense or block-sparse attention "
                                  "(config.attention), or " +
                                  field_is("sinks", false));
  if (block_sparse && ranks.with_lists)
    r.lists = block_lists(cfg, spec.block_sparse, pattern, r.pattern_text);
  r.ulysses = ulysses_degree(spec, cfg, ranks, use_cuda);
  // The ring runs over the groups, on a slice's heads.
  std::optional<UlyssesSlice> slice;
  if (r.ulysses > 1) slice = ulysses_slice(cfg, nullptr, r.ulysses, 0);
  const AttentionConfig& ring_cfg = slice ? slice->cfg : cfg;
  const int ring_world = ranks.world / r.ulysses;
  r.layout = block_sparse
                 ? sparse::sparse_layout(ring_cfg, ring_world)
                 : ring::make_layout(ring_cfg, ring_world, slice ? slice->heads : HeadSlice{});
  if (r.layout.local_len % r.ulysses != 0)
    throw InputError("ulysses", "each of the " + std::to_string(ring_world) + " groups holds " +
                                    std::to_string(r.layout.local_len) + " rows, which its " +
                                    std::to_string(r.ulysses) +
                                    " ranks cannot split evenly; choose config.shape.seq_len or "
                                    "ulysses so that they do");
  // Opens OpenBLAS now, so that a bad RINGATTN_BLAS_LIBRARY is reported before any work.
  if (!use_cuda && ranks.with_lists) (void)kernels::blas_info();
  r.cfg = std::move(cfg);
  r.device = use_cuda ? Device::cuda : Device::cpu;
  return r;
}

std::vector<int64_t> shard_rows_of(const JobSpec& spec, int world, int rank) {
  JobSpec cpu = spec;
  cpu.device = Device::cpu;
  cpu.kernel = KernelChoice::automatic;
  cpu.dtype.reset();
  return rows_of(resolve(cpu, {world, false, false}), rank);
}

std::vector<int64_t> rows_of(const ResolvedJob& r, int rank) {
  // With Ulysses, rank r holds the (r mod U)-th piece of its group's ring shard.
  std::vector<int64_t> group;
  for (const ring::Chunk& c : r.layout.chunks(rank / r.ulysses))
    for (int64_t i = 0; i < c.length; ++i) group.push_back(c.begin + i);
  const auto n = static_cast<std::ptrdiff_t>(r.local_len());
  const auto first = group.begin() + (rank % r.ulysses) * n;
  return {first, first + n};
}

}  // namespace ringattn::job

namespace ringattn {

std::vector<int64_t> shard_rows(const JobSpec& spec, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world)
    throw InputError(
        "rank", std::to_string(rank) + " is not a rank of " + std::to_string(world) + " ranks");
  return job::shard_rows_of(spec, world, rank);
}

}  // namespace ringattn

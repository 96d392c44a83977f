// RunOptions -> JobSpec (job_options.hpp).
#include "cli/job_options.hpp"

#include <memory>
#include <tuple>

#include "cli/inputs.hpp"
#include "cli/option_names.hpp"

namespace ringattn::cli {

namespace {

struct ShapeOption {
  const char* option;
  const char* name;
};
constexpr ShapeOption kShapeOptions[] = {{"--batch", "batch (dim 0)"},
                                         {"--seq-len", "sequence length (dim 1)"},
                                         {"--heads", "heads (dim 2)"},
                                         {"--head-dim", "head dim (dim 3)"}};

// The whole problem's shape from --q, --k and --v, checked against each other, against
// --kv-heads and against the shape options given beside them.
Shape4 shape_from_files(const RunOptions& opts) {
  const AttentionConfig& cfg = opts.cfg;
  const Shape4 sq = shape_of("--q", opts.q_path);
  const Shape4 sk = shape_of("--k", opts.k_path);
  const Shape4 sv = shape_of("--v", opts.v_path);
  // K and V are [B, N, HKV, D] with HKV = --kv-heads (default: --q's heads), V's head dim
  // --head-dim-v (default: --q's).
  const int64_t kv_heads = cfg.kv_heads.value_or(sq.heads);
  if (sv.head_dim != cfg.head_dim_v.value_or(sq.head_dim))
    throw InputError(
        file_subject("--v", opts.v_path),
        "head dim " + std::to_string(sv.head_dim) +
            (cfg.head_dim_v ? " differs from --head-dim-v " + std::to_string(*cfg.head_dim_v)
                            : " differs from --q's " + std::to_string(sq.head_dim) +
                                  "; for values of their own head dim pass --head-dim-v " +
                                  std::to_string(sv.head_dim)));
  for (const auto& [option, path, sx] :
       {std::tuple{"--k", &opts.k_path, sk}, std::tuple{"--v", &opts.v_path, sv}}) {
    if (sx.batch != sq.batch || sx.seq_len != sq.seq_len ||
        (option[2] == 'k' && sx.head_dim != sq.head_dim))
      throw InputError(file_subject(option, *path), "shape " + to_string(sx) +
                                                        " differs from --q's " + to_string(sq) +
                                                        " in batch, length or head dim");
    if (sx.heads == kv_heads) continue;
    std::string why =
        "has " + std::to_string(sx.heads) + " heads, but --kv-heads is " + std::to_string(kv_heads);
    if (!cfg.kv_heads)
      why += " (the default: --q's heads); for grouped-query attention pass --kv-heads " +
             std::to_string(sx.heads) +
             (sx.heads > 0 && sq.heads % sx.heads != 0
                  ? ", though it must divide --q's " + std::to_string(sq.heads) + " heads"
                  : "");
    throw InputError(file_subject(option, *path), why);
  }
  const Shape4& given = cfg.shape;  // 0 where the option was not given
  const int64_t given_dims[] = {given.batch, given.seq_len, given.heads, given.head_dim};
  const int64_t file_dims[] = {sq.batch, sq.seq_len, sq.heads, sq.head_dim};
  for (std::size_t i = 0; i < 4; ++i)
    if (given_dims[i] != 0 && given_dims[i] != file_dims[i])
      throw InputError(kShapeOptions[i].option, std::to_string(given_dims[i]) + " does not match " +
                                                    opts.q_path + " (" +
                                                    std::to_string(file_dims[i]) + ")");
  return sq;
}

KernelChoice kernel_of(const std::string& name) {
  return name == "native"   ? KernelChoice::native
         : name == "cudnn"  ? KernelChoice::cudnn
         : name == "hopper" ? KernelChoice::hopper
                            : KernelChoice::automatic;
}

Transport transport_of(const std::string& name) {
  return name == "nccl"    ? Transport::nccl
         : name == "mpi"   ? Transport::mpi
         : name == "local" ? Transport::local
                           : Transport::automatic;
}

}  // namespace

JobSpec job_spec(const RunOptions& opts) {
  JobSpec spec;
  spec.config = opts.cfg;
  if (!opts.q_path.empty()) spec.config.shape = shape_from_files(opts);
  if (!opts.cu_seqlens_path.empty())
    spec.config.cu_seqlens = read_cu_seqlens(opts.cu_seqlens_path, spec.config.shape.seq_len);
  if (!opts.dout_path.empty()) {
    const Shape4 sd = shape_of("--dout", opts.dout_path);
    if (!(sd == spec.config.out_shape()))
      throw InputError(file_subject("--dout", opts.dout_path),
                       "shape " + to_string(sd) + " differs from the output's shape " +
                           to_string(spec.config.out_shape()));
  }
  spec.attention_auto = opts.attention_auto;
  spec.sparse_threshold = opts.sparse_threshold;
  spec.block_sparse.pattern = opts.pattern;
  spec.block_sparse.seed = opts.seed;
  if (!opts.block_mask_path.empty()) {
    auto mask = std::make_shared<std::vector<uint8_t>>(
        read_block_mask(opts.block_mask_path, spec.block_sparse.mask_dims));
    spec.block_sparse.mask = std::move(mask);
    spec.block_sparse.mask_name = file_subject("--block-mask", opts.block_mask_path);
  }
  spec.device = opts.device == "cpu"    ? Device::cpu
                : opts.device == "cuda" ? Device::cuda
                                        : Device::automatic;
  if (!opts.dtype.empty())
    spec.dtype = opts.dtype == "fp16"   ? DeviceDType::fp16
                 : opts.dtype == "fp32" ? DeviceDType::fp32
                                        : DeviceDType::bf16;
  spec.kernel = kernel_of(opts.kernel);
  spec.transport = transport_of(opts.comm);
  spec.threads = opts.threads;
  spec.timeout_s = opts.timeout_s;
  spec.ulysses = opts.ulysses;
  spec.deterministic = opts.deterministic;
  spec.sinks = !opts.sinks_path.empty();
  return spec;
}

void blaming_input_files(const RunOptions& opts, const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    const std::string option = option_of(e.subject());
    if (option == "--seqlens" && !opts.cu_seqlens_path.empty())
      throw InputError(file_subject("--cu-seqlens", opts.cu_seqlens_path), e.problem())
          .from_rank(e.rank());
    if (option == "--block-mask" && !opts.block_mask_path.empty())
      throw InputError(file_subject("--block-mask", opts.block_mask_path), e.problem())
          .from_rank(e.rank());
    const Shape4& given = opts.cfg.shape;  // with input files: 0 where the option was not given
    const int64_t given_dims[] = {given.batch, given.seq_len, given.heads, given.head_dim};
    if (!opts.q_path.empty())
      for (std::size_t i = 0; i < 4; ++i)
        if (option == kShapeOptions[i].option && given_dims[i] == 0)
          throw InputError(file_subject("--q", opts.q_path),
                           std::string(kShapeOptions[i].name) + ": " + e.problem())
              .from_rank(e.rank());
    throw InputError(option, e.problem()).from_rank(e.rank());
  }
}

}  // namespace ringattn::cli

// The run command's steps, in the order that keeps failures cheap, collective and
// all-or-nothing: validate every input and output path and load the shards (any failure is
// agreed on by all ranks: exit 2 everywhere, no hang), then compute (a failure now aborts the
// whole job), then check and write on rank 0.
#include "cli/run_command.hpp"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>

#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "kernels/cpu_blas.hpp"
#include "ring/cuda_ring_engine.hpp"
#include "ring/inproc_communicator.hpp"
#include "ring/nccl_communicator.hpp"
#include "ring/ring_engine.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "ringattn/cuda_plan.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/npy.hpp"
#include "ringattn/plan.hpp"
#include "ringattn/quote.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/tensor.hpp"
#include "sparse/block_lists.hpp"
#include "sparse/cuda_sparse_plan.hpp"
#include "sparse/pattern.hpp"
#include "sparse/pattern_cache.hpp"
#include "sparse/sparse_plan.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn::cli {

namespace {

constexpr double kCheckTolerance = 1e-5;
// On CUDA the check compares with the float64 reference of the inputs as the device holds
// them (rounded to --dtype); what remains is the kernels' own rounding (bf16/fp16 P and dS
// in the tensor-core products, fp32 accumulation).
constexpr double kCheckToleranceHalf = 1e-2;
constexpr double kCheckToleranceFp32 = 1e-4;
// The float64 reference visits every (query, key) pair of every head and pattern and does
// O(D) work per attended pair; past this budget it takes minutes.
constexpr double kCheckMaxWork = 4e9;

double reference_work(const AttentionConfig& cfg) {
  const Shape4& s = cfg.shape;
  const double n = static_cast<double>(s.seq_len);
  const double visits =
      static_cast<double>(s.batch * s.heads) * n * n * static_cast<double>(patterns_of(cfg).size());
  return visits + attended_pairs(cfg) * static_cast<double>(s.head_dim);
}

// How a message names an input file: with the option that brought it in, "--q (q.npy)".
std::string file_subject(const std::string& option, const std::string& path) {
  return option + " (" + path + ")";
}

// Runs `f`, which reads the file `path` given with `option`; the reader's errors name the
// path alone, so they are re-aimed at file_subject(option, path).
template <typename F>
auto reading(const std::string& option, const std::string& path, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    if (e.subject() != path) throw;
    throw InputError(file_subject(option, path), e.problem());
  }
}

// The dimensions of a [B, N, H, D] file and the shape options that give them otherwise.
struct ShapeDim {
  const char* option;
  const char* name;
};
constexpr ShapeDim kShapeDims[] = {{"--batch", "batch (dim 0)"},
                                   {"--seq-len", "sequence length (dim 1)"},
                                   {"--heads", "heads (dim 2)"},
                                   {"--head-dim", "head dim (dim 3)"}};

// The shape of a [B, N, H, D] file, each dimension checked here, where the message can
// name the file: validate() would blame --seq-len, --heads, ..., which the user never gave.
Shape4 shape_of(const std::string& option, const std::string& path) {
  const NpyHeader h = reading(option, path, [&] { return read_npy_header(path); });
  const std::string subject = file_subject(option, path);
  if (h.shape.size() != 4)
    throw InputError(subject, "array has rank " + std::to_string(h.shape.size()) +
                                  ", expected rank 4 [B,N,H,D]");
  for (std::size_t i = 0; i < 3; ++i)
    if (h.shape[i] <= 0)
      throw InputError(subject, std::string(kShapeDims[i].name) + " must be positive, got " +
                                    std::to_string(h.shape[i]));
  if (h.shape[3] <= 0 || h.shape[3] > kMaxHeadDim)
    throw InputError(subject, std::string(kShapeDims[3].name) + " must be in 1.." +
                                  std::to_string(kMaxHeadDim) + ", got " +
                                  std::to_string(h.shape[3]));
  return {h.shape[0], h.shape[1], h.shape[2], h.shape[3]};
}

// Runs `f`; when the shape came from the input files, an InputError that blames a shape
// option the user did not give (the ring layout's "--seq-len: N tokens cannot be split ...",
// validate()'s "--heads") is re-aimed at --q's file, where that dimension came from.
template <typename F>
void blaming_input_files(const RunOptions& opts, F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    // --seqlens problems found in a --cu-seqlens file name the file.
    if (e.subject() == "--seqlens" && !opts.cu_seqlens_path.empty())
      throw InputError(file_subject("--cu-seqlens", opts.cu_seqlens_path), e.problem());
    if (opts.q_path.empty()) throw;
    const Shape4& given = opts.cfg.shape;  // with input files: 0 where the option was not given
    const int64_t given_dims[] = {given.batch, given.seq_len, given.heads, given.head_dim};
    for (std::size_t i = 0; i < 4; ++i)
      if (e.subject() == kShapeDims[i].option && given_dims[i] == 0)
        throw InputError(file_subject("--q", opts.q_path),
                         std::string(kShapeDims[i].name) + ": " + e.problem());
    throw;
  }
}

// The document offsets of --cu-seqlens FILE: int32/int64, [n_docs + 1], 0 first, strictly
// increasing, the sequence length last. Problems name the file and the option.
std::vector<int64_t> read_cu_seqlens(const RunOptions& opts, int64_t seq_len) {
  const std::string& path = opts.cu_seqlens_path;
  const std::string subject = file_subject("--cu-seqlens", path);
  NpyHeader h;
  std::vector<int64_t> cu = reading("--cu-seqlens", path, [&] { return read_npy_int64(path, &h); });
  if (h.shape.size() != 1 || cu.size() < 2) {
    std::string dims;
    for (int64_t d : h.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw InputError(subject,
                     "expected a 1-D array of n_docs + 1 >= 2 offsets, got shape [" + dims + "]");
  }
  if (cu.front() != 0)
    throw InputError(subject, "the first offset must be 0, got " + std::to_string(cu.front()));
  for (std::size_t d = 0; d + 1 < cu.size(); ++d)
    if (cu[d + 1] <= cu[d])
      throw InputError(subject, "offsets must increase strictly: element " + std::to_string(d + 1) +
                                    " is " + std::to_string(cu[d + 1]) + " after " +
                                    std::to_string(cu[d]) +
                                    " (every document needs at least one token)");
  if (cu.back() != seq_len)
    throw InputError(subject, "the last offset must be the sequence length " +
                                  std::to_string(seq_len) + ", got " + std::to_string(cu.back()));
  return cu;
}

// Element ranges of `rank`'s shard in a [B, N, H, D] file, in local order.
std::vector<std::pair<int64_t, int64_t>> shard_ranges(const ring::ShardLayout& l, int rank,
                                                      const Shape4& s) {
  std::vector<std::pair<int64_t, int64_t>> r;
  const int64_t inner = s.heads * s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (const ring::Chunk& c : l.chunks(rank))
      r.push_back({(b * s.seq_len + c.begin) * inner, c.length * inner});
  return r;
}

void load_shard(const std::string& option, const std::string& path, const ring::ShardLayout& l,
                int rank, const Shape4& s, HostTensor& t) {
  const auto ranges = shard_ranges(l, rank, s);
  const std::vector<float> data =
      reading(option, path, [&] { return read_npy_float_ranges(path, ranges); });
  std::size_t i = 0;
  for (const auto& [first, count] : ranges)
    for (int64_t j = 0; j < count; ++j, ++i)
      if (!std::isfinite(data[i]))
        throw InputError(file_subject(option, path),
                         "element " + std::to_string(first + j) + " is " +
                             (std::isnan(data[i]) ? "NaN" : "infinite") +
                             "; inputs must be finite");
  std::copy(data.begin(), data.end(), t.data());
}

// Uniform on [-sqrt(3), sqrt(3)] (unit variance) from a counter-based hash of the global
// element index, so every rank generates its own shard of the same tensor, for any thread
// count and any number of ranks (and a sampled check can regenerate any row).
float synthetic_value(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>((2.0 * u - 1.0) * 1.7320508075688772);
}

void fill_synthetic(HostTensor& t, const ring::ShardLayout& l, int rank, const Shape4& s,
                    uint64_t seed, uint64_t stream) {
  float* p = t.data();
  for (const auto& range : shard_ranges(l, rank, s)) {
    // Plain locals: clang (before 16) cannot use structured bindings inside an OpenMP region.
    const int64_t first = range.first, count = range.second;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i)
      p[i] = synthetic_value(seed, stream, static_cast<uint64_t>(first + i));
    p += count;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  return "unknown CPU";
}

std::size_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::size_t>(ru.ru_maxrss) * 1024;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Everything the run needs, made during setup.
struct RunState {
  AttentionConfig cfg;
  ring::ShardLayout layout;
  Shape4 local;     // [B, N/P, H, D]: q, out, dout, dq
  Shape4 local_kv;  // [B, N/P, HKV, D]: k, v, dk, dv
  std::vector<int64_t> lse_dims;
  HostTensor q, k, v, o, lse, dout, dq, dk, dv;
  std::optional<Plan> plan;            // world size 1
  // --layout bhnd (the CPU engines): the tensors the engine reads and writes, this rank's
  // [B, H, N/P, D], laid out from and back into the [B, N/P, H, D] ones above outside the
  // timed calls.
  struct HeadMajor {
    HostTensor q, k, v, o, dout, dq, dk, dv;
  };
  std::optional<HeadMajor> head_major;
  std::optional<ring::RingPlan> ring;  // world size > 1
  // Block-sparse runs (any world size).
  std::shared_ptr<const sparse::BlockLists> lists;
  std::optional<sparse::SparsePlan> sparse;
  std::string pattern_text;               // canonical pattern, or "mask FILE"
  std::string auto_note;                  // what --attention auto decided
  std::function<void(int, int)> on_step;  // rank 0's progress hook for the engines
  bool sampled_check = false;
  // --device cuda: the plan (one rank: dense/dilated; block-sparse on any number of ranks)
  // or the GPU ring (several ranks), and the device copies of the tensors, on `device`. The
  // device communicator (`nccl`) is declared first: the plans' communication threads use it
  // until the plans are gone.
  std::unique_ptr<ring::Communicator> nccl;
  std::optional<CudaPlan> cuda;
  std::optional<sparse::CudaSparsePlan> cuda_sparse;
  std::optional<ring::CudaRingPlan> cuda_ring;
  int device = 0;
  bool on_gpu() const { return cuda || cuda_sparse || cuda_ring; }
  DeviceDType dtype = DeviceDType::bf16;
  DeviceBuffer d_q, d_k, d_v, d_o, d_lse, d_dout, d_dq, d_dk, d_dv;
};

// What the engines take besides the plan options: the watchdog, test faults, progress.
ring::RingOptions ring_options(const RunOptions& opts, const RunState& st) {
  ring::RingOptions r;
  r.timeout_s = opts.timeout_s;
  r.fault = ring::FaultInjection::from_env();
  r.on_step = st.on_step;
  return r;
}

// Rows per (batch, head) and rank that a sampled check compares.
constexpr int64_t kSampledRows = 16;
// Past these sizes a block-sparse --check samples rows instead of gathering everything.
constexpr int64_t kFullCheckMaxElements = int64_t{1} << 24;

// The block lists of a block-sparse run: from --block-mask, or generated from --pattern
// through the process-wide pattern cache.
std::shared_ptr<const sparse::BlockLists> block_lists(const RunOptions& opts,
                                                      const AttentionConfig& cfg,
                                                      const std::string& pattern,
                                                      std::string& description) {
  const Shape4& s = cfg.shape;
  const int64_t nb = s.seq_len / cfg.block_size;
  if (!opts.block_mask_path.empty()) {
    const std::string& path = opts.block_mask_path;
    const std::string subject = file_subject("--block-mask", path);
    NpyHeader h = reading("--block-mask", path, [&] { return read_npy_header(path); });
    if (h.dtype != NpyDtype::bool8)
      throw InputError(subject, "block mask must be a bool array (numpy dtype bool, '|b1')");
    const bool shared = h.shape.size() == 2 && h.shape[0] == nb && h.shape[1] == nb;
    const bool per_head =
        h.shape.size() == 3 && h.shape[0] == s.heads && h.shape[1] == nb && h.shape[2] == nb;
    if (!shared && !per_head) {
      std::string got;
      for (int64_t d : h.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      throw InputError(
          subject, "block mask shape [" + got + "] does not match " + std::to_string(s.heads) +
                       " heads and N / block size = " + std::to_string(s.seq_len) + " / " +
                       std::to_string(cfg.block_size) + " = " + std::to_string(nb) +
                       " blocks: expected [" + std::to_string(s.heads) + ", " + std::to_string(nb) +
                       ", " + std::to_string(nb) + "] or [" + std::to_string(nb) + ", " +
                       std::to_string(nb) + "] (see --block-size)");
    }
    const std::vector<uint8_t> mask =
        reading("--block-mask", path, [&] { return read_npy_bool(path); });
    description = "mask " + path;
    return std::make_shared<const sparse::BlockLists>(
        sparse::lists_from_mask(mask.data(), shared ? 1 : s.heads, s.heads, nb, cfg.block_size));
  }
  const sparse::Geometry g{s.seq_len, cfg.block_size, s.heads};
  const sparse::Pattern p =
      sparse::parse_pattern(pattern, g, cfg.segments, cfg.dilations, opts.seed);
  if (!cfg.segments.empty() && p.canonical.find("dilated-blocks") == std::string::npos)
    throw InputError("--segments", "only used by the dilated-blocks pattern (--pattern " +
                                       quote(pattern) + " has none)");
  description = p.canonical;
  return sparse::PatternCache::global().get(
      sparse::cache_key(s.seq_len, cfg.block_size, s.heads, p.canonical),
      [&] { return sparse::build_lists(p, g); });
}

// Whether this run uses the GPU: --device cuda (checked: CUDA built in, a usable device,
// and NCCL for several ranks), or auto with one rank, a usable device and [B, N, H, D]
// tensors (the GPU engines read no other layout: auto keeps --layout bhnd on the CPU, and
// --device cuda refuses it naming --layout). Everything else runs on the CPU.
bool resolve_cuda(const RunOptions& opts, const ring::Communicator& comm) {
  if (opts.device == "cpu") return false;
  if (opts.device == "auto")
    return comm.size() == 1 && opts.cfg.layout == TensorLayout::bnhd &&
           probe_cuda_device().usable;
  if (comm.size() > 1 && ring::nccl_version_string().find("none") == 0)
    throw InputError("--device", "'cuda' on " + std::to_string(comm.size()) +
                                     " ranks needs NCCL, and this build has none (build with "
                                     "NCCL, run one rank, or use --device cpu)");
  const CudaDeviceStatus s = probe_cuda_device();
  if (!s.usable)
    throw InputError("--device",
                     "'cuda' cannot be used: " + s.reason + " (use --device cpu or auto)");
  return true;
}

DeviceDType dtype_of(const std::string& name) {
  return name == "fp16"   ? DeviceDType::fp16
         : name == "fp32" ? DeviceDType::fp32
                          : DeviceDType::bf16;
}

KernelChoice kernel_of(const std::string& name) {
  return name == "native"  ? KernelChoice::native
         : name == "cudnn" ? KernelChoice::cudnn
                           : KernelChoice::automatic;
}

// The CUDA plan and device tensors; host inputs are rounded in place to what the device
// holds, so that --check and the written outputs describe the same computation.
void setup_cuda(const RunOptions& opts, ring::Communicator& comm, RunState& st) {
  st.dtype = dtype_of(opts.dtype.empty() ? "bf16" : opts.dtype);
  if (comm.size() == 1) {
    const CudaPlanOptions plan_opts{st.dtype, kernel_of(opts.kernel), 0};
    // fp32 where the tensor-core kernels do not fit the device.
    if (st.lists) {
      st.cuda_sparse.emplace(st.cfg, st.lists, plan_opts);
      st.dtype = st.cuda_sparse->dtype();
    } else {
      st.cuda.emplace(st.cfg, plan_opts);
      st.dtype = st.cuda->dtype();
    }
  } else {
    if (opts.kernel == "cudnn")
      throw InputError("--kernel", std::string("'cudnn' runs on one rank; the GPU ") +
                                       (st.lists ? "block-sparse mode" : "ring") +
                                       " uses the native kernels (use --kernel native or auto)");
    // NCCL binds each rank to the GPU of its node-local rank (the only one when the launcher
    // gave each rank one visible GPU); the plan and the tensors live there too. Virtual
    // ranks on fewer GPUs than ranks share them, with device copies instead of NCCL (which
    // refuses two ranks on one GPU).
    const int gpus = std::max(1, probe_cuda_device().device_count);
    if (comm.in_process() && gpus < comm.size()) {
      st.device = comm.rank() % gpus;
      st.nccl = ring::make_device_inproc_communicator(comm, st.device);
    } else {
      st.nccl = ring::make_nccl_communicator(comm, {opts.timeout_s});
      st.device = gpus == 1 ? 0 : comm.local_rank();
    }
    const CudaPlanOptions plan_opts{st.dtype, KernelChoice::native, st.device};
    const ring::RingOptions ring_opts = ring_options(opts, st);
    if (st.lists) {
      st.cuda_sparse.emplace(st.cfg, st.lists, *st.nccl, plan_opts, ring_opts);
      st.dtype = st.cuda_sparse->dtype();
    } else {
      st.cuda_ring.emplace(st.cfg, *st.nccl, plan_opts, ring_opts);
      st.dtype = st.cuda_ring->dtype();
    }
  }
  // q, out, dout, dq: [B, N/P, H, D]; k, v, dk, dv: [B, N/P, HKV, D] (grouped-query attention).
  const std::size_t n = st.q.size(), n_kv = st.k.size(), n_lse = st.lse.size();
  const int dev = st.device;
  auto upload = [&](DeviceBuffer& d, HostTensor& h, const char* what) {
    d = DeviceBuffer(h.size() * (st.dtype == DeviceDType::fp32 ? 4 : 2), what, dev);
    d.upload(h.data(), h.size(), st.dtype);
    if (st.dtype != DeviceDType::fp32) round_to_device_dtype(h.data(), h.size(), st.dtype);
  };
  upload(st.d_q, st.q, "q");
  upload(st.d_k, st.k, "k");
  upload(st.d_v, st.v, "v");
  st.d_o = DeviceBuffer(n * sizeof(float), "out", dev);
  st.d_lse = DeviceBuffer(n_lse * sizeof(float), "lse", dev);
  if (opts.backward) {
    upload(st.d_dout, st.dout, "dout");
    st.d_dq = DeviceBuffer(n * sizeof(float), "dq", dev);
    st.d_dk = DeviceBuffer(n_kv * sizeof(float), "dk", dev);
    st.d_dv = DeviceBuffer(n_kv * sizeof(float), "dv", dev);
  }
}

void setup(const RunOptions& opts, ring::Communicator& comm, RunState& st) {
  AttentionConfig cfg = opts.cfg;
  bool use_cuda = resolve_cuda(opts, comm);
  if (!use_cuda && opts.kernel == "cudnn")
    throw InputError("--kernel", "'cudnn' is a CUDA kernel, but this run uses the CPU (--device " +
                                     opts.device + "); use --device cuda");
  if (!use_cuda && !opts.dtype.empty() && opts.dtype != "fp32")
    throw InputError("--dtype", "'" + opts.dtype +
                                    "' needs the GPU, but this run uses the CPU "
                                    "(--device " +
                                    opts.device + "); the CPU kernels compute in fp32");
  if (!opts.q_path.empty()) {
    const Shape4 sq = shape_of("--q", opts.q_path);
    const Shape4 sk = shape_of("--k", opts.k_path);
    const Shape4 sv = shape_of("--v", opts.v_path);
    // K and V are [B, N, HKV, D] with HKV = --kv-heads (default: --q's heads).
    const int64_t kv_heads = cfg.kv_heads.value_or(sq.heads);
    for (const auto& [option, path, sx] :
         {std::tuple{"--k", &opts.k_path, sk}, std::tuple{"--v", &opts.v_path, sv}}) {
      if (sx.batch != sq.batch || sx.seq_len != sq.seq_len || sx.head_dim != sq.head_dim)
        throw InputError(file_subject(option, *path), "shape " + to_string(sx) +
                                                          " differs from --q's " + to_string(sq) +
                                                          " in batch, length or head dim");
      if (sx.heads == kv_heads) continue;
      std::string why = "has " + std::to_string(sx.heads) + " heads, but --kv-heads is " +
                        std::to_string(kv_heads);
      if (!cfg.kv_heads)
        why += " (the default: --q's heads); for grouped-query attention pass --kv-heads " +
               std::to_string(sx.heads) +
               (sx.heads > 0 && sq.heads % sx.heads != 0
                    ? ", though it must divide --q's " + std::to_string(sq.heads) + " heads"
                    : "");
      throw InputError(file_subject(option, *path), why);
    }
    const Shape4& given = opts.cfg.shape;  // 0 where the option was not given
    const std::pair<const char*, std::pair<int64_t, int64_t>> dims[] = {
        {"--batch", {given.batch, sq.batch}},
        {"--seq-len", {given.seq_len, sq.seq_len}},
        {"--heads", {given.heads, sq.heads}},
        {"--head-dim", {given.head_dim, sq.head_dim}}};
    for (const auto& [name, v] : dims)
      if (v.first != 0 && v.first != v.second)
        throw InputError(name, std::to_string(v.first) + " does not match " + opts.q_path + " (" +
                                   std::to_string(v.second) + ")");
    cfg.shape = sq;
  }
  if (!opts.cu_seqlens_path.empty()) cfg.cu_seqlens = read_cu_seqlens(opts, cfg.shape.seq_len);
  std::string pattern = opts.pattern;
  if (opts.attention_auto) {
    const int64_t n = cfg.shape.seq_len;
    if (n > opts.sparse_threshold) {
      if (cfg.segments.empty())
        throw InputError("--attention", "auto: N = " + std::to_string(n) +
                                            " is above --sparse-threshold " +
                                            std::to_string(opts.sparse_threshold) +
                                            ", where block-sparse runs the dilated-blocks pattern; "
                                            "give --segments and --dilations for it");
      cfg.attention = AttentionKind::block_sparse;
      pattern = "dilated-blocks";
      st.auto_note = "--attention auto: N = " + std::to_string(n) + " > --sparse-threshold " +
                     std::to_string(opts.sparse_threshold) + ": block-sparse";
    } else {
      st.auto_note = "--attention auto: N = " + std::to_string(n) + " <= --sparse-threshold " +
                     std::to_string(opts.sparse_threshold) + ": " + to_string(cfg.attention);
    }
  }
  const bool block_sparse = cfg.attention == AttentionKind::block_sparse;
  // Block-sparse runs on the GPU when asked (--device cuda, one rank or several: the
  // distributed exchange goes over the device communicator); --device auto keeps the CPU
  // plan, whose answer and timings earlier runs were compared with.
  if (block_sparse && use_cuda && opts.device != "cuda") {
    use_cuda = false;
    if (!opts.dtype.empty() && opts.dtype != "fp32")
      throw InputError("--dtype", "'" + opts.dtype +
                                      "' needs the GPU, but block-sparse runs on "
                                      "the CPU, in fp32");
    if (opts.kernel == "cudnn")
      throw InputError("--kernel", "'cudnn' is a CUDA kernel, but block-sparse runs on the CPU");
  }
  if (!block_sparse && !opts.pattern_out_path.empty())
    throw InputError("--pattern-out", "this run is " + std::string(to_string(cfg.attention)) +
                                          ", not block-sparse: there is no block mask to write");
  blaming_input_files(opts, [&] { validate(cfg); });
  // Grouped-query attention, sliding windows and packed sequences run on the GPU's native
  // kernels; cuDNN's SDPA takes none of them.
  if (use_cuda && opts.kernel == "cudnn" &&
      (cfg.effective_kv_heads() != cfg.shape.heads || cfg.windowed() || cfg.packed()))
    throw InputError("--kernel",
                     "'cudnn' takes neither grouped-query attention, a sliding window nor packed "
                     "sequences; use --kernel native or auto");
  if (!opts.dout_path.empty()) {
    const Shape4 sd = shape_of("--dout", opts.dout_path);
    if (!(sd == cfg.shape))
      throw InputError(
          file_subject("--dout", opts.dout_path),
          "shape " + to_string(sd) + " differs from the input shape " + to_string(cfg.shape));
  }
  if (block_sparse) {
    st.lists = block_lists(opts, cfg, pattern, st.pattern_text);
    const double work = sparse::attended_token_pairs(*st.lists, cfg) *
                        static_cast<double>(cfg.shape.batch * cfg.shape.head_dim);
    st.sampled_check =
        opts.check && (work > kCheckMaxWork || cfg.shape.numel() > kFullCheckMaxElements);
    if (!opts.pattern_out_path.empty()) {
      const double bytes = static_cast<double>(st.lists->heads) *
                           static_cast<double>(st.lists->blocks) *
                           static_cast<double>(st.lists->blocks);
      if (bytes > static_cast<double>(int64_t{1} << 28))
        throw InputError("--pattern-out", "the dense mask would take " +
                                              std::to_string(static_cast<long long>(bytes)) +
                                              " bytes (H x nb x nb); it is for small N only");
    }
  }
  const double ref_work = block_sparse ? 0.0 : reference_work(cfg);
  if (opts.check && ref_work > kCheckMaxWork)
    throw InputError("--check", "problem too large for the float64 reference (" +
                                    std::to_string(static_cast<long long>(ref_work)) +
                                    " operations > " +
                                    std::to_string(static_cast<long long>(kCheckMaxWork)) +
                                    "); use a smaller --seq-len, --batch or --heads");
  blaming_input_files(opts, [&] {
    st.layout = block_sparse ? sparse::sparse_layout(cfg, comm.size())
                             : ring::make_layout(cfg, comm.size());
  });
  // Only rank 0 writes; it checks the paths before any work.
  if (comm.rank() == 0)
    for (const auto& [name, path] : {std::pair{"--out", &opts.out_path},
                                     {"--lse-out", &opts.lse_out_path},
                                     {"--pattern-out", &opts.pattern_out_path},
                                     {"--dq-out", &opts.dq_out_path},
                                     {"--dk-out", &opts.dk_out_path},
                                     {"--dv-out", &opts.dv_out_path}})
      if (!path->empty()) check_output_path(name, *path);
  if (opts.threads > 0) omp_set_num_threads(opts.threads);
  // Opens OpenBLAS now, so that a bad RINGATTN_BLAS_LIBRARY is reported before any work.
  if (!use_cuda) (void)kernels::blas_info();

  const Shape4& s = cfg.shape;
  st.cfg = cfg;
  const Shape4 skv = cfg.kv_shape();
  st.local = {s.batch, st.layout.local_len, s.heads, s.head_dim};
  st.local_kv = {s.batch, st.layout.local_len, skv.heads, s.head_dim};
  st.lse_dims = {s.batch, s.heads, st.layout.local_len};
  st.q = HostTensor(st.local, "q");
  st.k = HostTensor(st.local_kv, "k");
  st.v = HostTensor(st.local_kv, "v");
  st.o = HostTensor(st.local, "out");
  st.lse = HostTensor(st.lse_dims, "lse");
  const int rank = comm.rank();
  if (!opts.q_path.empty()) {
    load_shard("--q", opts.q_path, st.layout, rank, s, st.q);
    load_shard("--k", opts.k_path, st.layout, rank, skv, st.k);
    load_shard("--v", opts.v_path, st.layout, rank, skv, st.v);
  } else {
    fill_synthetic(st.q, st.layout, rank, s, opts.seed, 1);
    fill_synthetic(st.k, st.layout, rank, skv, opts.seed, 2);
    fill_synthetic(st.v, st.layout, rank, skv, opts.seed, 3);
  }
  if (opts.backward) {
    st.dout = HostTensor(st.local, "dout");
    st.dq = HostTensor(st.local, "dq");
    st.dk = HostTensor(st.local_kv, "dk");
    st.dv = HostTensor(st.local_kv, "dv");
    if (!opts.dout_path.empty())
      load_shard("--dout", opts.dout_path, st.layout, rank, s, st.dout);
    else
      fill_synthetic(st.dout, st.layout, rank, s, opts.seed, 4);
  }
  if (use_cuda)
    setup_cuda(opts, comm, st);
  else if (block_sparse)
    st.sparse.emplace(cfg, st.lists, comm, PlanOptions{opts.threads}, ring_options(opts, st));
  else if (comm.size() == 1)
    st.plan.emplace(cfg, PlanOptions{opts.threads});
  else
    st.ring.emplace(cfg, comm, PlanOptions{opts.threads}, ring_options(opts, st));
  // The GPU engines refuse bhnd (setup_cuda), so here it is one of the CPU engines.
  if (cfg.layout == TensorLayout::bhnd) {
    const auto head_major = [](const HostTensor& x, const Shape4& sx, const char* what) {
      HostTensor t(std::vector<int64_t>{sx.batch, sx.heads, sx.seq_len, sx.head_dim}, what);
      to_head_major(x.data(), sx, t.data());
      return t;
    };
    RunState::HeadMajor& hm = st.head_major.emplace();
    hm.q = head_major(st.q, st.local, "q [B,H,N,D]");
    hm.k = head_major(st.k, st.local_kv, "k [B,H,N,D]");
    hm.v = head_major(st.v, st.local_kv, "v [B,H,N,D]");
    hm.o = head_major(st.o, st.local, "out [B,H,N,D]");
    if (opts.backward) {
      hm.dout = head_major(st.dout, st.local, "dout [B,H,N,D]");
      hm.dq = head_major(st.dq, st.local, "dq [B,H,N,D]");
      hm.dk = head_major(st.dk, st.local_kv, "dk [B,H,N,D]");
      hm.dv = head_major(st.dv, st.local_kv, "dv [B,H,N,D]");
    }
  }
}

// The float64 reference's view of a block-sparse run: the run's own lists.
BlockReferenceProblem block_problem(const RunState& st) {
  BlockReferenceProblem pb = block_problem_of(st.cfg);
  pb.key_blocks = [lists = st.lists](int64_t h, int64_t i) {
    const auto row = lists->of_head(h).row(i);
    return std::vector<int64_t>(row.begin(), row.end());
  };
  return pb;
}

// Block-sparse --check on huge runs: every rank compares kSampledRows rows per (batch, head)
// of its shard with the float64 reference, fetching the K/V rows each needs (regenerated for
// synthetic inputs, read from the files otherwise). Forward only. Returns {out, lse} errors.
std::pair<double, double> sampled_check(const RunOptions& opts, ring::Communicator& comm,
                                        const RunState& st) {
  const Shape4& s = st.cfg.shape;
  const int64_t D = s.head_dim, H = s.heads, NL = st.layout.local_len, bs = st.cfg.block_size;
  const int rank = comm.rank();
  const BlockReferenceProblem pb = block_problem(st);
  double out_diff = 0, out_want = 0, lse_diff = 0, lse_want = 0;
  bool inf_mismatch = false;
  const int64_t rows = std::min(kSampledRows, NL);
  std::vector<double> ref(static_cast<std::size_t>(D));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < rows; ++k) {
        const int64_t r = rows == 1 ? 0 : k * (NL - 1) / (rows - 1);
        const int64_t p = st.layout.global_position(rank, r);
        // Positions of every listed key block (the reference applies causality itself).
        std::vector<int64_t> keys;
        for (int32_t j : st.lists->of_head(h).row(p / bs))
          for (int64_t t = j * bs; t < (j + 1) * bs; ++t) keys.push_back(t);
        const int64_t kv_heads = st.cfg.effective_kv_heads(), kvh = st.cfg.kv_head_of(h);
        auto element = [&](int64_t t) { return ((b * s.seq_len + t) * kv_heads + kvh) * D; };
        std::vector<float> kv[2];
        for (int which = 0; which < 2; ++which) {
          const std::string& path = which == 0 ? opts.k_path : opts.v_path;
          if (path.empty()) {
            kv[which].resize(keys.size() * static_cast<std::size_t>(D));
            for (std::size_t i = 0; i < keys.size(); ++i)
              for (int64_t c = 0; c < D; ++c)
                kv[which][i * static_cast<std::size_t>(D) + static_cast<std::size_t>(c)] =
                    synthetic_value(opts.seed, static_cast<uint64_t>(2 + which),
                                    static_cast<uint64_t>(element(keys[i]) + c));
          } else {
            std::vector<std::pair<int64_t, int64_t>> ranges;
            for (int64_t t : keys) ranges.push_back({element(t), D});
            kv[which] = read_npy_float_ranges(path, ranges);
          }
        }
        auto index_of = [&](int64_t t) {
          return static_cast<std::size_t>(std::lower_bound(keys.begin(), keys.end(), t) -
                                          keys.begin()) *
                 static_cast<std::size_t>(D);
        };
        double ref_lse = 0;
        const std::size_t at = static_cast<std::size_t>(((b * NL + r) * H + h) * D);
        reference_row_blocks(
            pb, h, p, st.q.data() + at, [&](int64_t t) { return kv[0].data() + index_of(t); },
            [&](int64_t t) { return kv[1].data() + index_of(t); }, ref.data(), &ref_lse);
        for (int64_t c = 0; c < D; ++c) {
          const double g = st.o.data()[at + static_cast<std::size_t>(c)];
          out_diff +=
              (g - ref[static_cast<std::size_t>(c)]) * (g - ref[static_cast<std::size_t>(c)]);
          out_want += ref[static_cast<std::size_t>(c)] * ref[static_cast<std::size_t>(c)];
        }
        const double got_lse = st.lse.data()[(b * H + h) * NL + r];
        if (std::isinf(ref_lse) || std::isinf(got_lse)) {
          inf_mismatch |= got_lse != ref_lse;
        } else {
          lse_diff += (got_lse - ref_lse) * (got_lse - ref_lse);
          lse_want += ref_lse * ref_lse;
        }
      }
  auto rel = [](double diff, double want) {
    return want == 0 ? std::sqrt(diff) : std::sqrt(diff) / std::sqrt(want);
  };
  const double inf = std::numeric_limits<double>::infinity();
  return {comm.max(rel(out_diff, out_want)),
          comm.max(inf_mismatch ? inf : rel(lse_diff, lse_want))};
}

// Gathers a local [B, N/P, H, D] (or lse [B, H, N/P]) tensor into the full one on rank 0;
// `heads` is the tensor's (kv_heads for k, v, dk, dv).
std::vector<float> gather_full(ring::Communicator& comm, const RunState& st, const HostTensor& t,
                               bool is_lse, int64_t heads) {
  const Shape4& s = st.cfg.shape;
  std::vector<float> all(comm.rank() == 0 ? t.size() * static_cast<std::size_t>(comm.size()) : 0);
  comm.gather(t.data(), t.size() * sizeof(float), all.data());
  std::vector<float> full;
  if (comm.rank() != 0) return full;
  full.resize(t.size() * static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    const float* part = all.data() + static_cast<std::size_t>(r) * t.size();
    if (is_lse)
      ring::insert_lse(st.layout, r, s.batch, heads, part, full.data());
    else
      ring::insert_rows(st.layout, r, s.batch, heads * s.head_dim, part, full.data());
  }
  return full;
}

int run_and_report(const RunOptions& opts, ring::Communicator& comm, RunState& st,
                   ProgressReporter& progress, std::ostream& out) {
  const int rank = comm.rank(), world = comm.size();
  const int threads = st.sparse ? st.sparse->threads()
                      : st.plan ? st.plan->threads()
                      : st.ring ? st.ring->threads()
                                : 1;
  if (rank == 0 && !st.auto_note.empty()) out << "ringattn: " << st.auto_note << "\n";
  if (world > 1) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::string device = st.on_gpu() ? "cuda:" + std::to_string(st.device)
                                           : "cpu (" + std::to_string(threads) + " threads)";
    const auto infos =
        comm.gather_info({host, static_cast<int>(getpid()), comm.local_rank(), device});
    if (rank == 0) {
      out << "ringattn: world size " << world << ", communicator: " << comm.library_version()
          << "\n";
      for (std::size_t r = 0; r < infos.size(); ++r)
        out << "  rank " << r << ": host " << infos[r].host << ", pid " << infos[r].pid
            << ", local rank " << infos[r].local_rank << ", device " << infos[r].device << "\n";
    }
  }

  // With --layout bhnd the CPU engines read and write the head-major copies.
  HostTensor* const q_in = st.head_major ? &st.head_major->q : &st.q;
  HostTensor* const k_in = st.head_major ? &st.head_major->k : &st.k;
  HostTensor* const v_in = st.head_major ? &st.head_major->v : &st.v;
  HostTensor* const o_io = st.head_major ? &st.head_major->o : &st.o;
  HostTensor* const dout_in = st.head_major ? &st.head_major->dout : &st.dout;
  HostTensor* const dq_out = st.head_major ? &st.head_major->dq : &st.dq;
  HostTensor* const dk_out = st.head_major ? &st.head_major->dk : &st.dk;
  HostTensor* const dv_out = st.head_major ? &st.head_major->dv : &st.dv;
  auto forward = [&] {
    if (st.sparse)
      st.sparse->forward(q_in->data(), k_in->data(), v_in->data(), o_io->data(), st.lse.data());
    else if (st.cuda_sparse) {
      st.cuda_sparse->forward(st.d_q.data(), st.d_k.data(), st.d_v.data(), st.d_o.as<float>(),
                              st.d_lse.as<float>());
      st.cuda_sparse->synchronize();
    } else if (st.cuda) {
      st.cuda->forward(st.d_q.data(), st.d_k.data(), st.d_v.data(), st.d_o.as<float>(),
                       st.d_lse.as<float>());
      st.cuda->synchronize();
    } else if (st.cuda_ring) {
      st.cuda_ring->forward(st.d_q.data(), st.d_k.data(), st.d_v.data(), st.d_o.as<float>(),
                            st.d_lse.as<float>());
      st.cuda_ring->synchronize();
    } else if (st.plan)
      st.plan->forward(q_in->data(), k_in->data(), v_in->data(), o_io->data(), st.lse.data());
    else
      st.ring->forward(q_in->data(), k_in->data(), v_in->data(), o_io->data(), st.lse.data());
  };
  auto backward = [&] {
    if (st.sparse)
      st.sparse->backward(q_in->data(), k_in->data(), v_in->data(), o_io->data(), st.lse.data(),
                          dout_in->data(), dq_out->data(), dk_out->data(), dv_out->data());
    else if (st.cuda_sparse) {
      st.cuda_sparse->backward(st.d_q.data(), st.d_k.data(), st.d_v.data(), st.d_o.as<float>(),
                               st.d_lse.as<float>(), st.d_dout.data(), st.d_dq.as<float>(),
                               st.d_dk.as<float>(), st.d_dv.as<float>());
      st.cuda_sparse->synchronize();
    } else if (st.cuda) {
      st.cuda->backward(st.d_q.data(), st.d_k.data(), st.d_v.data(), st.d_o.as<float>(),
                        st.d_lse.as<float>(), st.d_dout.data(), st.d_dq.as<float>(),
                        st.d_dk.as<float>(), st.d_dv.as<float>());
      st.cuda->synchronize();
    } else if (st.cuda_ring) {
      st.cuda_ring->backward(st.d_q.data(), st.d_k.data(), st.d_v.data(), st.d_o.as<float>(),
                             st.d_lse.as<float>(), st.d_dout.data(), st.d_dq.as<float>(),
                             st.d_dk.as<float>(), st.d_dv.as<float>());
      st.cuda_ring->synchronize();
    } else if (st.plan)
      st.plan->backward(q_in->data(), k_in->data(), v_in->data(), o_io->data(), st.lse.data(),
                        dout_in->data(), dq_out->data(), dk_out->data(), dv_out->data());
    else
      st.ring->backward(q_in->data(), k_in->data(), v_in->data(), o_io->data(), st.lse.data(),
                        dout_in->data(), dq_out->data(), dk_out->data(), dv_out->data());
  };
  std::vector<double> fwd_times, bwd_times;
  for (int it = 0; it < opts.warmup + opts.iters; ++it) {
    comm.barrier();
    progress.begin_call(false, it);
    auto t0 = std::chrono::steady_clock::now();
    forward();
    if (it >= opts.warmup) fwd_times.push_back(ms_since(t0));
    progress.end_call();
    if (opts.backward) {
      comm.barrier();
      progress.begin_call(true, it);
      t0 = std::chrono::steady_clock::now();
      backward();
      if (it >= opts.warmup) bwd_times.push_back(ms_since(t0));
      progress.end_call();
    }
  }

  if (st.head_major) {  // results back to the [B, N, H, D] tensors
    const RunState::HeadMajor& hm = *st.head_major;
    from_head_major(hm.o.data(), st.local, st.o.data());
    if (opts.backward) {
      from_head_major(hm.dq.data(), st.local, st.dq.data());
      from_head_major(hm.dk.data(), st.local_kv, st.dk.data());
      from_head_major(hm.dv.data(), st.local_kv, st.dv.data());
    }
  }
  const bool on_gpu = st.on_gpu();
  if (on_gpu) {  // results back to the host tensors
    st.d_o.download(st.o.data(), st.o.size());
    st.d_lse.download(st.lse.data(), st.lse.size());
    if (opts.backward) {
      st.d_dq.download(st.dq.data(), st.dq.size());
      st.d_dk.download(st.dk.data(), st.dk.size());
      st.d_dv.download(st.dv.data(), st.dv.size());
    }
  }

  RunReport rep;
  rep.cfg = st.cfg;
  rep.device = "cpu";
  rep.device_detail = cpu_model() + ", " + std::to_string(threads) + " threads per rank";
  if (st.cuda || st.cuda_sparse) {
    rep.device = "cuda";
    rep.kernel = st.cuda ? st.cuda->kernel_name() : st.cuda_sparse->kernel_name();
    rep.dtype = to_string(st.dtype);
    rep.device_detail =
        (st.cuda ? st.cuda->device_description() : st.cuda_sparse->device_description()) + ", " +
        rep.dtype + " inputs, kernel " + rep.kernel;
    if (st.nccl) rep.device_detail += " per rank, " + st.nccl->library_version();
    rep.notes = st.cuda ? st.cuda->notes() : st.cuda_sparse->notes();
    rep.emulated_device = probe_cuda_device(0).emulated;
  } else if (st.cuda_ring) {
    rep.device = "cuda";
    rep.kernel = st.cuda_ring->kernel_name();
    rep.dtype = to_string(st.dtype);
    const CudaDeviceStatus d = probe_cuda_device(st.device);
    rep.device_detail = d.name + " (sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) +
                        ") per rank, " + rep.dtype + " inputs, kernel " + rep.kernel + ", " +
                        st.nccl->library_version();
    rep.emulated_device = d.emulated;
  } else {
    rep.blas = kernels::blas_info();
  }
  rep.threads = threads;
  rep.world_size = world;
  rep.iters = opts.iters;
  rep.attention_note = st.auto_note;
  rep.fwd_ms = comm.max(median(fwd_times));
  if (opts.backward) rep.bwd_ms = comm.max(median(bwd_times));
  auto gather_figures = [&](const ring::RingTimings& t) {
    const RankFigures mine{t.compute_ms, t.comm_ms, t.exposed_ms, t.bytes_sent};
    std::vector<RankFigures> all(rank == 0 ? static_cast<std::size_t>(world) : 0);
    comm.gather(&mine, sizeof mine, all.data());
    return all;
  };
  if (st.cuda_sparse) {
    const sparse::BlockLists& l = *st.lists;
    rep.attended_pairs =
        sparse::attended_token_pairs(l, st.cfg) * static_cast<double>(st.cfg.shape.batch);
    rep.pattern = st.pattern_text;
    rep.sparsity = sparse::sparsity(l, st.cfg.causal);
    const auto ws =
        static_cast<std::size_t>(comm.max(static_cast<int64_t>(st.cuda_sparse->workspace_bytes())));
    rep.workspace_bytes = ws;
    rep.device_workspace_bytes = ws;
    rep.device_peak_bytes = device_bytes_peak();
    if (world > 1) {
      rep.peers = static_cast<int>(comm.max(static_cast<int64_t>(st.cuda_sparse->peers())));
      // K/V travel in the device dtype; the minimum is counted in fp32.
      const int64_t eb = st.dtype == DeviceDType::fp32 ? 4 : 2;
      rep.bytes_sent =
          static_cast<std::size_t>(comm.max(st.cuda_sparse->last_forward().bytes_sent));
      rep.bytes_sent_min = static_cast<std::size_t>(
          comm.max(sparse::minimum_bytes_sent(st.cfg, l, st.layout, rank) * eb / 4));
      rep.fwd_ranks = gather_figures(st.cuda_sparse->last_forward());
      if (opts.backward) rep.bwd_ranks = gather_figures(st.cuda_sparse->last_backward());
    }
  } else if (st.sparse) {
    const sparse::BlockLists& l = *st.lists;
    rep.attended_pairs =
        sparse::attended_token_pairs(l, st.cfg) * static_cast<double>(st.cfg.shape.batch);
    rep.pattern = st.pattern_text;
    rep.sparsity = sparse::sparsity(l, st.cfg.causal);
    rep.workspace_bytes =
        static_cast<std::size_t>(comm.max(static_cast<int64_t>(st.sparse->workspace_bytes())));
    rep.peers = static_cast<int>(comm.max(static_cast<int64_t>(st.sparse->peers())));
    if (world > 1) {
      rep.bytes_sent = static_cast<std::size_t>(comm.max(st.sparse->last_forward().bytes_sent));
      rep.bytes_sent_min = static_cast<std::size_t>(
          comm.max(sparse::minimum_bytes_sent(st.cfg, l, st.layout, rank)));
      rep.fwd_ranks = gather_figures(st.sparse->last_forward());
      if (opts.backward) rep.bwd_ranks = gather_figures(st.sparse->last_backward());
    }
  } else if (st.cuda) {
    rep.attended_pairs = attended_pairs(st.cfg);
    rep.workspace_bytes = st.cuda->workspace_bytes();
    rep.device_workspace_bytes = st.cuda->workspace_bytes();
    rep.device_peak_bytes = device_bytes_peak();
  } else if (st.cuda_ring) {
    rep.attended_pairs = attended_pairs(st.cfg);
    const auto ws =
        static_cast<std::size_t>(comm.max(static_cast<int64_t>(st.cuda_ring->workspace_bytes())));
    rep.workspace_bytes = ws;
    rep.device_workspace_bytes = ws;
    // Virtual ranks share the process's count; it is then the sum over ranks.
    rep.device_peak_bytes = device_bytes_peak();
    // K/V travel in the device dtype; the minimum is counted in fp32.
    const int64_t eb = st.dtype == DeviceDType::fp32 ? 4 : 2;
    rep.bytes_sent = static_cast<std::size_t>(comm.max(st.cuda_ring->last_forward().bytes_sent));
    rep.bytes_sent_min = static_cast<std::size_t>(
        comm.max(ring::minimum_bytes_sent(st.cfg, st.layout, rank) * eb / 4));
    rep.fwd_ranks = gather_figures(st.cuda_ring->last_forward());
    if (opts.backward) rep.bwd_ranks = gather_figures(st.cuda_ring->last_backward());
  } else if (st.plan) {
    rep.attended_pairs = attended_pairs(st.cfg);
    rep.workspace_bytes = st.plan->workspace_bytes();
    rep.workspace_bytes_per_thread = st.plan->workspace_bytes_per_thread();
  } else {
    rep.attended_pairs = attended_pairs(st.cfg);
    rep.workspace_bytes =
        static_cast<std::size_t>(comm.max(static_cast<int64_t>(st.ring->workspace_bytes())));
    rep.bytes_sent = static_cast<std::size_t>(comm.max(st.ring->last_forward().bytes_sent));
    rep.bytes_sent_min =
        static_cast<std::size_t>(comm.max(ring::minimum_bytes_sent(st.cfg, st.layout, rank)));
    rep.fwd_ranks = gather_figures(st.ring->last_forward());
    if (opts.backward) rep.bwd_ranks = gather_figures(st.ring->last_backward());
  }

  rep.layout = st.layout.name();
  rep.imbalance =
      ring::imbalance(st.lists ? sparse::attended_pairs_by_rank(*st.lists, st.layout, st.cfg)
                               : ring::attended_pairs_by_rank(st.cfg, st.layout));

  // A sampled check runs on every rank, on its own shard.
  std::pair<double, double> sampled{0, 0};
  if (opts.check) progress.phase("check");
  if (st.sampled_check) sampled = sampled_check(opts, comm, st);
  const bool full_check = opts.check && !st.sampled_check;
  // Full tensors on rank 0 (the local ones are the full ones on a single rank).
  const bool need_full = full_check || !opts.out_path.empty() || !opts.lse_out_path.empty() ||
                         !opts.dq_out_path.empty() || !opts.dk_out_path.empty() ||
                         !opts.dv_out_path.empty();
  // On one rank the local tensors are the full ones; on several, rank 0 gathers copies.
  std::vector<std::vector<float>> gathered;
  gathered.reserve(9);
  const int64_t heads = st.cfg.shape.heads, kv_heads = st.cfg.effective_kv_heads();
  auto full = [&](const HostTensor& t, bool is_lse, bool wanted, int64_t t_heads) -> const float* {
    if (!wanted || !need_full) return nullptr;
    if (world == 1) return t.data();
    gathered.push_back(gather_full(comm, st, t, is_lse, t_heads));
    return gathered.back().data();
  };
  const float* o = full(st.o, false, true, heads);
  const float* lse = full(st.lse, true, true, heads);
  const float* dq = full(st.dq, false, opts.backward, heads);
  const float* dk = full(st.dk, false, opts.backward, kv_heads);
  const float* dv = full(st.dv, false, opts.backward, kv_heads);
  const float* q = full(st.q, false, full_check, heads);
  const float* k = full(st.k, false, full_check, kv_heads);
  const float* v = full(st.v, false, full_check, kv_heads);
  const float* dout = full(st.dout, false, full_check && opts.backward, heads);
  const auto n_full = static_cast<std::size_t>(st.cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(st.cfg.kv_shape().numel());
  const auto n_lse =
      static_cast<std::size_t>(st.cfg.shape.batch * st.cfg.shape.heads * st.cfg.shape.seq_len);

  // The float64 reference's tolerance: the CPU's, or the device dtype's.
  const double tolerance = !on_gpu                         ? kCheckTolerance
                           : st.dtype == DeviceDType::fp32 ? kCheckToleranceFp32
                                                           : kCheckToleranceHalf;
  int code = 0;
  if (rank == 0) {
    if (st.sampled_check) {
      rep.check_tolerance = tolerance;
      rep.check_mode = "sampled: " + std::to_string(kSampledRows) +
                       " rows per (batch, head) on every rank, forward only";
      rep.checks.push_back({"out", sampled.first});
      rep.checks.push_back({"lse", sampled.second});
    } else if (opts.check && st.lists) {
      rep.check_tolerance = tolerance;
      rep.check_mode = "full";
      const BlockReferenceProblem pb = block_problem(st);
      const ReferenceForward ref = reference_forward_blocks(pb, q, k, v);
      rep.checks.push_back({"out", relative_error(o, ref.out.data(), n_full)});
      rep.checks.push_back({"lse", relative_error(lse, ref.lse.data(), n_lse)});
      if (opts.backward) {
        const ReferenceGradients g = reference_backward_blocks(pb, q, k, v, dout);
        rep.checks.push_back({"dq", relative_error(dq, g.dq.data(), n_full)});
        rep.checks.push_back({"dk", relative_error(dk, g.dk.data(), n_kv)});
        rep.checks.push_back({"dv", relative_error(dv, g.dv.data(), n_kv)});
      }
    } else if (opts.check) {
      rep.check_mode = "full";
      rep.check_tolerance = tolerance;
      const ReferenceForward ref = reference_forward(st.cfg, q, k, v);
      rep.checks.push_back({"out", relative_error(o, ref.out.data(), n_full)});
      rep.checks.push_back({"lse", relative_error(lse, ref.lse.data(), n_lse)});
      if (opts.backward) {
        const ReferenceGradients g = reference_backward(st.cfg, q, k, v, dout);
        rep.checks.push_back({"dq", relative_error(dq, g.dq.data(), n_full)});
        rep.checks.push_back({"dk", relative_error(dk, g.dk.data(), n_kv)});
        rep.checks.push_back({"dv", relative_error(dv, g.dv.data(), n_kv)});
      }
    }
    rep.peak_bytes = tracked_bytes_peak();
    rep.peak_rss_bytes = peak_rss_bytes();
    if (opts.check && !rep.check_passed()) {
      progress.finish();
      print_table(rep, out);
      if (opts.json) print_json(rep, out);
      std::cerr << "ringattn: error: --check: result differs from the float64 reference beyond "
                   "the tolerance; no output files written\n";
      code = static_cast<int>(ExitCode::runtime_failure);
    } else {
      const Shape4& s = st.cfg.shape;
      const std::vector<int64_t> dims4{s.batch, s.seq_len, s.heads, s.head_dim};
      const std::vector<int64_t> kv_dims4{s.batch, s.seq_len, kv_heads, s.head_dim};
      const std::vector<int64_t> lse_dims{s.batch, s.heads, s.seq_len};
      if (!opts.out_path.empty() || !opts.lse_out_path.empty() || !opts.dq_out_path.empty() ||
          !opts.dk_out_path.empty() || !opts.dv_out_path.empty() || !opts.pattern_out_path.empty())
        progress.phase("writing");
      AtomicOutputs files;
      if (!opts.out_path.empty()) files.stage(opts.out_path, dims4, o);
      if (!opts.lse_out_path.empty()) files.stage(opts.lse_out_path, lse_dims, lse);
      if (!opts.dq_out_path.empty()) files.stage(opts.dq_out_path, dims4, dq);
      if (!opts.dk_out_path.empty()) files.stage(opts.dk_out_path, kv_dims4, dk);
      if (!opts.dv_out_path.empty()) files.stage(opts.dv_out_path, kv_dims4, dv);
      if (!opts.pattern_out_path.empty()) {
        const std::vector<uint8_t> mask = sparse::mask_from_lists(*st.lists);
        files.stage_bool(opts.pattern_out_path,
                         {st.lists->heads, st.lists->blocks, st.lists->blocks}, mask.data());
      }
      files.commit();
      for (const auto* p : {&opts.out_path, &opts.lse_out_path, &opts.dq_out_path,
                            &opts.dk_out_path, &opts.dv_out_path, &opts.pattern_out_path})
        if (!p->empty()) rep.outputs_written.push_back(*p);
      progress.finish();
      print_table(rep, out);
      if (opts.json) print_json(rep, out);
    }
  }
  return static_cast<int>(comm.max(static_cast<int64_t>(code)));
}

}  // namespace

int run_command(const RunOptions& opts, ring::Communicator& comm, std::ostream& out) {
  comm.set_collective_timeout(opts.timeout_s);
  // Rank 0 alone reports progress; the others' reporter is off and gives the engines no hook.
  ProgressReporter progress(
      comm.rank() == 0 ? progress_mode(opts.progress, opts.quiet, isatty(STDERR_FILENO) == 1)
                       : ProgressMode::off,
      opts.warmup + opts.iters, opts.warmup, opts.backward, std::cerr);
  RunState st;
  st.on_step = progress.step_hook();
  if (const int code = agree_on_errors(comm, [&] {
        try {
          setup(opts, comm, st);
        } catch (...) {
          progress.finish();  // the message starts on a clean terminal line
          throw;
        }
      }))
    return code;
  try {
    return run_and_report(opts, comm, st, progress, out);
  } catch (const std::exception& e) {
    progress.finish();
    // A rank that failed because another one already aborted (in-process ranks) stays quiet.
    comm.check_aborted();
    // One write, so that ranks sharing a stderr (threads) do not interleave.
    std::cerr << ("ringattn: " +
                  (comm.size() > 1 ? "rank " + std::to_string(comm.rank()) + ": " : "") +
                  "error: " + printable(e.what()) + "\n")
              << std::flush;
    if (comm.size() > 1) comm.abort(static_cast<int>(ExitCode::runtime_failure));
    return static_cast<int>(ExitCode::runtime_failure);
  }
}

int run_command_virtual_ranks(const RunOptions& opts, std::ostream& out) {
  RunOptions per_rank = opts;
  const int ranks = std::max(1, opts.ring_size);
  if (per_rank.threads == 0) per_rank.threads = std::max(1, omp_get_max_threads() / ranks);
  return ring::run_virtual_ranks(
      ranks, [&](ring::Communicator& comm) { return run_command(per_rank, comm, out); });
}

}  // namespace ringattn::cli

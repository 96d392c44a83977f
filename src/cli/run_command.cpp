// The run command's steps, in the order that keeps failures cheap and outputs all-or-
// nothing: validate every input and output path first, compute, check, then write.
#include "cli/run_command.hpp"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>

#include "cli/report.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/npy.hpp"
#include "ringattn/plan.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn::cli {

namespace {

constexpr double kCheckTolerance = 1e-5;
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

Shape4 shape_of(const std::string& option, const std::string& path, const NpyHeader& h) {
  if (h.shape.size() != 4)
    throw InputError(path, "array has rank " + std::to_string(h.shape.size()) +
                               ", expected rank 4 [B,N,H,D] (" + option + ")");
  return {h.shape[0], h.shape[1], h.shape[2], h.shape[3]};
}

void load_into(const std::string& path, HostTensor& t) {
  NpyHeader h;
  std::vector<float> data = read_npy_float(path, &h);
  for (std::size_t i = 0; i < data.size(); ++i)
    if (!std::isfinite(data[i]))
      throw InputError(path, "element " + std::to_string(i) + " is " +
                                 (std::isnan(data[i]) ? "NaN" : "infinite") +
                                 "; inputs must be finite");
  std::copy(data.begin(), data.end(), t.data());
}

// Uniform on [-sqrt(3), sqrt(3)] (unit variance) from a counter-based hash, so synthetic
// inputs are the same for any thread count and cheap at any size.
void fill_synthetic(HostTensor& t, uint64_t seed, uint64_t stream) {
  float* p = t.data();
  const auto n = static_cast<int64_t>(t.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z =
        seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
    p[i] = static_cast<float>((2.0 * u - 1.0) * 1.7320508075688772);
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

}  // namespace

int run_command(const RunOptions& opts, std::ostream& out) {
  AttentionConfig cfg = opts.cfg;

  if (opts.device == "cuda")
    throw InputError("--device",
                     "'cuda' is not available: this build of ringattn has CPU "
                     "kernels only (use --device cpu or auto)");

  // 1. Input shapes (headers only) and the config they imply.
  if (!opts.q_path.empty()) {
    const Shape4 sq = shape_of("--q", opts.q_path, read_npy_header(opts.q_path));
    const Shape4 sk = shape_of("--k", opts.k_path, read_npy_header(opts.k_path));
    const Shape4 sv = shape_of("--v", opts.v_path, read_npy_header(opts.v_path));
    if (!(sk == sq))
      throw InputError(opts.k_path,
                       "shape " + to_string(sk) + " differs from --q's " + to_string(sq));
    if (!(sv == sq))
      throw InputError(opts.v_path,
                       "shape " + to_string(sv) + " differs from --q's " + to_string(sq));
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
  validate(cfg);
  if (!opts.dout_path.empty()) {
    const Shape4 sd = shape_of("--dout", opts.dout_path, read_npy_header(opts.dout_path));
    if (!(sd == cfg.shape))
      throw InputError(opts.dout_path, "shape " + to_string(sd) +
                                           " differs from the input "
                                           "shape " +
                                           to_string(cfg.shape) + " (--dout)");
  }
  const double ref_work = reference_work(cfg);
  if (opts.check && ref_work > kCheckMaxWork)
    throw InputError("--check", "problem too large for the float64 reference (" +
                                    std::to_string(static_cast<long long>(ref_work)) +
                                    " operations > " +
                                    std::to_string(static_cast<long long>(kCheckMaxWork)) +
                                    "); use a smaller --seq-len, --batch or --heads");

  // 2. Output paths, before any work, so a typo costs nothing and leaves nothing.
  const std::pair<const char*, const std::string*> outputs[] = {{"--out", &opts.out_path},
                                                                {"--lse-out", &opts.lse_out_path},
                                                                {"--dq-out", &opts.dq_out_path},
                                                                {"--dk-out", &opts.dk_out_path},
                                                                {"--dv-out", &opts.dv_out_path}};
  for (const auto& [name, path] : outputs)
    if (!path->empty()) check_output_path(name, *path);

  if (opts.threads > 0) omp_set_num_threads(opts.threads);

  // 3. Inputs.
  const Shape4 s = cfg.shape;
  const std::vector<int64_t> lse_dims{s.batch, s.heads, s.seq_len};
  HostTensor q(s, "q"), k(s, "k"), v(s, "v"), o(s, "out"), lse(lse_dims, "lse");
  if (!opts.q_path.empty()) {
    load_into(opts.q_path, q);
    load_into(opts.k_path, k);
    load_into(opts.v_path, v);
  } else {
    fill_synthetic(q, opts.seed, 1);
    fill_synthetic(k, opts.seed, 2);
    fill_synthetic(v, opts.seed, 3);
  }
  HostTensor dout, dq, dk, dv;
  if (opts.backward) {
    dout = HostTensor(s, "dout");
    dq = HostTensor(s, "dq");
    dk = HostTensor(s, "dk");
    dv = HostTensor(s, "dv");
    if (!opts.dout_path.empty())
      load_into(opts.dout_path, dout);
    else
      fill_synthetic(dout, opts.seed, 4);
  }

  // 4. Plan once, run many.
  Plan plan(cfg, PlanOptions{opts.threads});
  std::vector<double> fwd_times, bwd_times;
  for (int it = 0; it < opts.warmup + opts.iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    plan.forward(q.data(), k.data(), v.data(), o.data(), lse.data());
    if (it >= opts.warmup) fwd_times.push_back(ms_since(t0));
    if (opts.backward) {
      t0 = std::chrono::steady_clock::now();
      plan.backward(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                    dk.data(), dv.data());
      if (it >= opts.warmup) bwd_times.push_back(ms_since(t0));
    }
  }

  RunReport rep;
  rep.cfg = cfg;
  rep.device = "cpu";
  rep.device_detail = cpu_model() + ", " + std::to_string(plan.threads()) + " threads";
  rep.threads = plan.threads();
  rep.iters = opts.iters;
  rep.attended_pairs = attended_pairs(cfg);
  rep.fwd_ms = median(fwd_times);
  if (opts.backward) rep.bwd_ms = median(bwd_times);
  rep.workspace_bytes = plan.workspace_bytes();
  rep.workspace_bytes_per_thread = plan.workspace_bytes_per_thread();

  // 5. Check.
  if (opts.check) {
    rep.check_tolerance = kCheckTolerance;
    const ReferenceForward ref = reference_forward(cfg, q.data(), k.data(), v.data());
    rep.checks.push_back({"out", relative_error(o.data(), ref.out.data(), o.size())});
    rep.checks.push_back({"lse", relative_error(lse.data(), ref.lse.data(), lse.size())});
    if (opts.backward) {
      const ReferenceGradients g =
          reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
      rep.checks.push_back({"dq", relative_error(dq.data(), g.dq.data(), dq.size())});
      rep.checks.push_back({"dk", relative_error(dk.data(), g.dk.data(), dk.size())});
      rep.checks.push_back({"dv", relative_error(dv.data(), g.dv.data(), dv.size())});
    }
  }
  rep.peak_bytes = tracked_bytes_peak();
  rep.peak_rss_bytes = peak_rss_bytes();

  if (opts.check && !rep.check_passed()) {
    print_table(rep, out);
    if (opts.json) print_json(rep, out);
    std::cerr << "ringattn: error: --check: result differs from the float64 reference beyond "
                 "the tolerance; no output files written\n";
    return static_cast<int>(ExitCode::runtime_failure);
  }

  // 6. Outputs, all or nothing.
  AtomicOutputs files;
  const std::vector<int64_t> dims4{s.batch, s.seq_len, s.heads, s.head_dim};
  if (!opts.out_path.empty()) files.stage(opts.out_path, dims4, o.data());
  if (!opts.lse_out_path.empty()) files.stage(opts.lse_out_path, lse_dims, lse.data());
  if (!opts.dq_out_path.empty()) files.stage(opts.dq_out_path, dims4, dq.data());
  if (!opts.dk_out_path.empty()) files.stage(opts.dk_out_path, dims4, dk.data());
  if (!opts.dv_out_path.empty()) files.stage(opts.dv_out_path, dims4, dv.data());
  files.commit();
  for (const auto& [name, path] : outputs)
    if (!path->empty()) rep.outputs_written.push_back(*path);

  print_table(rep, out);
  if (opts.json) print_json(rep, out);
  return 0;
}

}  // namespace ringattn::cli

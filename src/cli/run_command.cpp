// The run command, top to bottom: options -> JobSpec (job_options) -> make_engine -> this
// rank's tensors (inputs) -> timed calls -> report from Engine::stats() -> check against
// float64 (check) and atomic outputs on rank 0. Setup runs in three phases whose errors all
// ranks agree on (exit 2 everywhere, no hang): reading the input files' headers, making the
// engine, loading the shards. A failure after setup aborts the whole job.
#include "cli/run_command.hpp"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>

#include "cli/check.hpp"
#include "cli/inputs.hpp"
#include "cli/job_options.hpp"
#include "cli/npy.hpp"
#include "cli/option_names.hpp"
#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "ringattn/device.hpp"
#include "ringattn/quote.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn::cli {

namespace {

// This rank's tensors: [B, N/P, H, D] q, out, dout, dq; [B, N/P, HKV, D] k, v, dk, dv;
// lse [B, H, N/P]. With --layout or --kv-layout bhnd the engine reads copies in its layouts
// (made and undone outside the timed calls); on a GPU, device copies in the engine's dtype.
struct Tensors {
  HostTensor q, k, v, o, lse, dout, dq, dk, dv;
  std::vector<float> sinks, dsinks;  // [H], --sinks
  struct Copies {
    HostTensor q, k, v, o, dout, dq, dk, dv;
  };
  std::optional<Copies> engine_copies;
  struct Device {
    DeviceBuffer q, k, v, o, lse, dout, dq, dk, dv, sinks, dsinks;
  };
  std::optional<Device> device;
};

struct Run {
  const RunOptions& opts;
  Comm& comm;
  JobSpec spec;
  std::optional<Engine> engine;
  Tensors t;
  bool sampled_check = false;
};

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

const std::pair<const char*, const std::string RunOptions::*> kOutputs[] = {
    {"--out", &RunOptions::out_path},
    {"--lse-out", &RunOptions::lse_out_path},
    {"--pattern-out", &RunOptions::pattern_out_path},
    {"--dq-out", &RunOptions::dq_out_path},
    {"--dk-out", &RunOptions::dk_out_path},
    {"--dv-out", &RunOptions::dv_out_path},
    {"--dsinks-out", &RunOptions::dsinks_out_path}};

bool writes_outputs(const RunOptions& opts) {
  for (const auto& [name, path] : kOutputs)
    if (!(opts.*path).empty()) return true;
  return false;
}

// Phase 1: the job from the options and the input files' headers; rank 0 alone writes, so
// it checks the output paths before any work.
void read_job(Run& run) {
  run.spec = job_spec(run.opts);
  if (run.comm.rank() == 0)
    for (const auto& [name, path] : kOutputs)
      if (!(run.opts.*path).empty()) check_output_path(name, run.opts.*path);
  if (run.opts.threads > 0) omp_set_num_threads(run.opts.threads);
}

// What the options ask of the engine's resolved job.
void check_resolved(const RunOptions& opts, const Engine& e) {
  const AttentionConfig& cfg = e.config();
  const bool block_sparse = cfg.attention == AttentionKind::block_sparse;
  const int64_t heads = cfg.shape.heads, blocks = cfg.shape.seq_len / cfg.block_size;
  if (!block_sparse && !opts.pattern_out_path.empty())
    throw InputError("--pattern-out", "this run is " + std::string(to_string(cfg.attention)) +
                                          ", not block-sparse: there is no block mask to write");
  if (block_sparse && !opts.pattern_out_path.empty() &&
      static_cast<double>(heads) * static_cast<double>(blocks) * static_cast<double>(blocks) >
          static_cast<double>(int64_t{1} << 28))
    throw InputError("--pattern-out",
                     "the dense mask would take " +
                         std::to_string(static_cast<long long>(heads * blocks * blocks)) +
                         " bytes (H x nb x nb); it is for small N only");
  if (opts.check) check_reference_fits(e);
}

HostTensor head_major(const HostTensor& x, const Shape4& s, const char* what) {
  HostTensor t(std::vector<int64_t>{s.batch, s.heads, s.seq_len, s.head_dim}, what);
  to_head_major(x.data(), s, t.data());
  return t;
}

// The engine's copies of the inputs: head-major on the host, or on the device in its dtype
// (the host tensors are then rounded to it, so that --check and the written outputs describe
// the computation the device made).
void make_engine_copies(Run& run) {
  const Engine& e = *run.engine;
  Tensors& t = run.t;
  const Shape4 s = e.local_shape(), skv = e.local_kv_shape();
  const Shape4 sv = e.local_v_shape(), so = e.local_out_shape();
  const bool backward = run.opts.backward;
  if (e.device() == Device::cuda) {
    const DeviceDType dt = e.dtype();
    const int dev = e.device_index();
    Tensors::Device& d = t.device.emplace();
    auto upload = [&](DeviceBuffer& b, HostTensor& h, const char* what) {
      b = DeviceBuffer(h.size() * bytes_per_element(dt), what, dev);
      b.upload(h.data(), h.size(), dt);
      if (dt != DeviceDType::fp32) round_to_device_dtype(h.data(), h.size(), dt);
    };
    upload(d.q, t.q, "q");
    upload(d.k, t.k, "k");
    upload(d.v, t.v, "v");
    d.o = DeviceBuffer(t.o.size() * sizeof(float), "out", dev);
    d.lse = DeviceBuffer(t.lse.size() * sizeof(float), "lse", dev);
    if (backward) {
      upload(d.dout, t.dout, "dout");
      d.dq = DeviceBuffer(t.q.size() * sizeof(float), "dq", dev);
      d.dk = DeviceBuffer(t.k.size() * sizeof(float), "dk", dev);
      d.dv = DeviceBuffer(t.v.size() * sizeof(float), "dv", dev);
    }
    if (!t.sinks.empty()) {
      d.sinks = DeviceBuffer(t.sinks.size() * sizeof(float), "sinks", dev);
      d.sinks.upload(t.sinks.data(), t.sinks.size(), DeviceDType::fp32);
      d.dsinks = DeviceBuffer(t.sinks.size() * sizeof(float), "dsinks", dev);
    }
  } else if (e.config().layout == TensorLayout::bhnd ||
             e.config().effective_kv_layout() == TensorLayout::bhnd) {
    // Each tensor in its own layout: q, out, dout, dq as --layout, k, v, dk, dv as
    // --kv-layout; a bnhd one is copied as it is.
    const bool q_hm = e.config().layout == TensorLayout::bhnd;
    const bool kv_hm = e.config().effective_kv_layout() == TensorLayout::bhnd;
    auto copy = [](const HostTensor& x, const Shape4& sh, bool hm, const char* what) {
      if (hm) return head_major(x, sh, what);
      HostTensor c(sh, what);
      std::copy_n(x.data(), x.size(), c.data());
      return c;
    };
    Tensors::Copies& hm = t.engine_copies.emplace();
    hm.q = copy(t.q, s, q_hm, "q (engine layout)");
    hm.k = copy(t.k, skv, kv_hm, "k (engine layout)");
    hm.v = copy(t.v, sv, kv_hm, "v (engine layout)");
    hm.o = copy(t.o, so, q_hm, "out (engine layout)");
    if (backward) {
      hm.dout = copy(t.dout, so, q_hm, "dout (engine layout)");
      hm.dq = copy(t.dq, s, q_hm, "dq (engine layout)");
      hm.dk = copy(t.dk, skv, kv_hm, "dk (engine layout)");
      hm.dv = copy(t.dv, sv, kv_hm, "dv (engine layout)");
    }
  }
}

// Phase 3: this rank's tensors, read or synthesised, and the engine's copies of them.
void load_tensors(Run& run) {
  const RunOptions& opts = run.opts;
  const Engine& e = *run.engine;
  check_resolved(opts, e);
  run.sampled_check = opts.check && samples_rows(e);
  const Shape4& s = e.config().shape;
  const Shape4 skv = e.config().kv_shape(), sv = e.config().v_shape(), so = e.config().out_shape();
  const Shape4 local = e.local_shape(), local_kv = e.local_kv_shape();
  const Shape4 local_v = e.local_v_shape(), local_out = e.local_out_shape();
  const std::vector<int64_t> rows = e.local_rows();
  Tensors& t = run.t;
  t.q = HostTensor(local, "q");
  t.k = HostTensor(local_kv, "k");
  t.v = HostTensor(local_v, "v");
  t.o = HostTensor(local_out, "out");
  t.lse = HostTensor(std::vector<int64_t>{s.batch, s.heads, local.seq_len}, "lse");
  if (opts.backward) {
    t.dout = HostTensor(local_out, "dout");
    t.dq = HostTensor(local, "dq");
    t.dk = HostTensor(local_kv, "dk");
    t.dv = HostTensor(local_v, "dv");
  }
  if (!opts.q_path.empty()) {
    load_shard("--q", opts.q_path, rows, s, t.q);
    load_shard("--k", opts.k_path, rows, skv, t.k);
    load_shard("--v", opts.v_path, rows, sv, t.v);
  } else {
    fill_synthetic(t.q, rows, s, opts.seed, 1);
    fill_synthetic(t.k, rows, skv, opts.seed, 2);
    fill_synthetic(t.v, rows, sv, opts.seed, 3);
  }
  if (opts.backward) {
    if (!opts.dout_path.empty())
      load_shard("--dout", opts.dout_path, rows, so, t.dout);
    else
      fill_synthetic(t.dout, rows, so, opts.seed, 4);
  }
  if (!opts.sinks_path.empty()) {
    t.sinks = read_sinks(opts.sinks_path, s.heads);
    t.dsinks.assign(t.sinks.size(), 0.0f);
  }
  make_engine_copies(run);
}

// The tensor references the engine's calls take: the device copies, the head-major copies,
// or the host tensors themselves.
struct CallTensors {
  TensorRef q, k, v, o, lse, dout, dq, dk, dv;
  TensorRef sinks, dsinks;  // null without --sinks
};

CallTensors call_tensors(Run& run) {
  Tensors& t = run.t;
  const bool sinks = !t.sinks.empty();
  if (t.device) {
    const DeviceDType in = run.engine->dtype(), f32 = DeviceDType::fp32;
    auto ref = [](const DeviceBuffer& b, DeviceDType dt) {
      return TensorRef{b.data(), dt, Memory::device, nullptr};
    };
    Tensors::Device& d = *t.device;
    CallTensors c{ref(d.q, in),
                  ref(d.k, in),
                  ref(d.v, in),
                  ref(d.o, f32),
                  ref(d.lse, f32),
                  ref(d.dout, in),
                  ref(d.dq, f32),
                  ref(d.dk, f32),
                  ref(d.dv, f32),
                  {},
                  {}};
    if (sinks) c.sinks = ref(d.sinks, f32), c.dsinks = ref(d.dsinks, f32);
    return c;
  }
  auto ref = [](HostTensor& h) { return TensorRef{h.data(), DeviceDType::fp32, Memory::host}; };
  CallTensors c{ref(t.q),  ref(t.k),  ref(t.v),  ref(t.o), ref(t.lse), ref(t.dout),
                ref(t.dq), ref(t.dk), ref(t.dv), {},       {}};
  if (t.engine_copies) {
    Tensors::Copies& hm = *t.engine_copies;
    c = {ref(hm.q),  ref(hm.k),  ref(hm.v),  ref(hm.o), ref(t.lse), ref(hm.dout),
         ref(hm.dq), ref(hm.dk), ref(hm.dv), {},        {}};
  }
  if (sinks) {
    c.sinks = {t.sinks.data(), DeviceDType::fp32, Memory::host};
    c.dsinks = {t.dsinks.data(), DeviceDType::fp32, Memory::host};
  }
  return c;
}

// Where each rank runs (several ranks only), printed once by rank 0.
void print_ranks(Run& run, std::ostream& out) {
  Comm& comm = run.comm;
  if (comm.size() == 1) return;
  const EngineStats s = run.engine->stats();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string device = s.device == "cuda"
                                 ? "cuda:" + std::to_string(run.engine->device_index())
                                 : "cpu (" + std::to_string(s.threads) + " threads)";
  const std::vector<std::string> lines =
      comm.gather(std::string("host ") + host + ", pid " + std::to_string(getpid()) +
                  ", local rank " + std::to_string(comm.local_rank()) + ", device " + device);
  if (comm.rank() != 0) return;
  out << "ringattn: world size " << comm.size() << ", communicator: " << comm.description() << "\n";
  for (std::size_t r = 0; r < lines.size(); ++r) out << "  rank " << r << ": " << lines[r] << "\n";
}

struct Timings {
  std::vector<double> fwd, bwd;
};

// --warmup untimed and --iters timed calls, each started together on every rank.
Timings time_calls(Run& run, ProgressReporter& progress) {
  Engine& e = *run.engine;
  const CallTensors c = call_tensors(run);
  const RunOptions& opts = run.opts;
  Timings tm;
  for (int it = 0; it < opts.warmup + opts.iters; ++it) {
    run.comm.barrier();
    progress.begin_call(false, it);
    auto t0 = std::chrono::steady_clock::now();
    e.forward(c.q, c.k, c.v, c.o, c.lse, c.sinks);
    e.synchronize();
    if (it >= opts.warmup) tm.fwd.push_back(ms_since(t0));
    progress.end_call();
    if (!opts.backward) continue;
    run.comm.barrier();
    progress.begin_call(true, it);
    t0 = std::chrono::steady_clock::now();
    e.backward(c.q, c.k, c.v, c.o, c.lse, c.dout, c.dq, c.dk, c.dv, c.sinks, c.dsinks);
    e.synchronize();
    if (it >= opts.warmup) tm.bwd.push_back(ms_since(t0));
    progress.end_call();
  }
  return tm;
}

// The results back in the [B, N/P, H, D] host tensors.
void results_to_host(Run& run) {
  Tensors& t = run.t;
  const bool backward = run.opts.backward;
  if (t.engine_copies) {
    const Shape4 s = run.engine->local_shape(), skv = run.engine->local_kv_shape();
    const bool q_hm = run.engine->config().layout == TensorLayout::bhnd;
    const bool kv_hm = run.engine->config().effective_kv_layout() == TensorLayout::bhnd;
    auto undo = [](const HostTensor& from, const Shape4& sh, bool hm, HostTensor& to) {
      if (hm)
        from_head_major(from.data(), sh, to.data());
      else
        std::copy_n(from.data(), from.size(), to.data());
    };
    undo(t.engine_copies->o, s, q_hm, t.o);
    if (backward) {
      undo(t.engine_copies->dq, s, q_hm, t.dq);
      undo(t.engine_copies->dk, skv, kv_hm, t.dk);
      undo(t.engine_copies->dv, skv, kv_hm, t.dv);
    }
  }
  if (t.device) {
    t.device->o.download(t.o.data(), t.o.size());
    t.device->lse.download(t.lse.data(), t.lse.size());
    if (backward) {
      t.device->dq.download(t.dq.data(), t.dq.size());
      t.device->dk.download(t.dk.data(), t.dk.size());
      t.device->dv.download(t.dv.data(), t.dv.size());
      if (!t.dsinks.empty()) t.device->dsinks.download(t.dsinks.data(), t.dsinks.size());
    }
  }
  // The job's sinks gradient, on rank 0: every rank's part, summed in rank order.
  Comm& comm = run.comm;
  if (backward && !t.dsinks.empty() && comm.size() > 1) {
    const std::size_t heads = t.dsinks.size();
    std::vector<float> all(comm.rank() == 0 ? heads * static_cast<std::size_t>(comm.size()) : 0);
    comm.gather(t.dsinks.data(), heads * sizeof(float), all.data());
    if (comm.rank() == 0)
      for (std::size_t h = 0; h < heads; ++h) {
        double sum = 0.0;
        for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r)
          sum += all[r * heads + h];
        t.dsinks[h] = static_cast<float>(sum);
      }
  }
}

// The report's figures from the engine's stats, reduced over ranks where the report shows
// a job-wide figure (every rank makes the same collectives).
RunReport make_report(Run& run, const Timings& tm) {
  Comm& comm = run.comm;
  const EngineStats s = run.engine->stats();
  const int world = comm.size();
  RunReport rep;
  rep.cfg = run.engine->config();
  rep.device = s.device;
  rep.threads = s.threads;
  rep.deterministic = s.deterministic;
  if (s.device == "cuda") {
    rep.kernel = s.kernel;
    rep.kernel_backward = s.kernel_backward;
    rep.dtype = to_string(s.dtype);
    rep.device_detail = s.device_detail;
    for (const std::string& n : s.notes) rep.notes.push_back(option_words(n));
    rep.emulated_device = s.emulated_device;
    rep.device_peak_bytes = s.device_peak_bytes;
  } else {
    rep.device_detail = cpu_model() + ", " + std::to_string(s.threads) + " threads per rank";
    rep.blas = s.blas;
  }
  rep.world_size = world;
  rep.iters = run.opts.iters;
  rep.attention_note = option_words(s.attention_note);
  rep.fwd_ms = comm.max(median(tm.fwd));
  if (run.opts.backward) rep.bwd_ms = comm.max(median(tm.bwd));
  rep.attended_pairs = s.attended_pairs;
  rep.workspace_bytes = static_cast<std::size_t>(comm.max(static_cast<int64_t>(s.workspace_bytes)));
  rep.workspace_bytes_per_thread = s.workspace_bytes_per_thread;
  if (s.device == "cuda") rep.device_workspace_bytes = rep.workspace_bytes;
  const bool sparse = !s.pattern.empty();
  if (sparse) {
    rep.pattern = s.pattern;
    rep.sparsity = s.sparsity;
    rep.peers = static_cast<int>(comm.max(static_cast<int64_t>(s.peers)));
  }
  if (world > 1) {
    rep.bytes_sent = static_cast<std::size_t>(comm.max(s.bytes_sent));
    rep.bytes_sent_min = static_cast<std::size_t>(comm.max(s.bytes_sent_min));
    rep.ulysses = s.ulysses;
    if (s.ulysses > 1) {
      const auto max_of = [&](int64_t v) { return static_cast<std::size_t>(comm.max(v)); };
      rep.bytes_sent_a2a = max_of(s.bytes_sent_a2a);
      rep.bytes_sent_a2a_min = max_of(s.bytes_sent_a2a_min);
      rep.bytes_sent_ring = max_of(s.bytes_sent - s.bytes_sent_a2a);
      rep.bytes_sent_ring_min = max_of(s.bytes_sent_min - s.bytes_sent_a2a_min);
    }
    auto gather = [&](const PassStats& p) {
      const RankFigures mine{p.compute_ms, p.comm_ms, p.comm_exposed_ms, p.bytes_sent};
      std::vector<RankFigures> all(comm.rank() == 0 ? static_cast<std::size_t>(world) : 0);
      comm.gather(&mine, sizeof mine, all.data());
      return all;
    };
    rep.fwd_ranks = gather(s.forward);
    if (run.opts.backward) rep.bwd_ranks = gather(s.backward);
  }
  rep.layout = s.layout;
  rep.imbalance = s.imbalance;
  return rep;
}

// Whole tensors on rank 0 (the local ones on one rank; gathered copies on several) for the
// full check and the output files.
struct Gathered {
  std::vector<std::vector<float>> storage;
  WholeTensors t;
};

Gathered gather_results(Run& run, bool full_check) {
  const RunOptions& opts = run.opts;
  const Engine& e = *run.engine;
  const Shape4& s = e.config().shape;
  const bool need = full_check || writes_outputs(opts);
  Gathered g;
  g.storage.reserve(9);
  const auto rows_of = [&](int r) { return e.rows_of(r); };
  // `cols`: floats per token (heads · head dim, or heads for lse).
  auto full = [&](const HostTensor& t, bool wanted, int64_t cols, bool is_lse) -> const float* {
    if (!wanted || !need) return nullptr;
    if (run.comm.size() == 1) return t.data();
    g.storage.push_back(gather_full(run.comm, t, s.batch, s.seq_len, cols, is_lse, rows_of));
    return g.storage.back().data();
  };
  const Tensors& t = run.t;
  const int64_t h = s.heads, hkv = e.config().effective_kv_heads();
  const int64_t d = s.head_dim, dv = e.config().effective_head_dim_v();
  const bool bwd = opts.backward;
  g.t.out = full(t.o, true, h * dv, false);
  g.t.lse = full(t.lse, true, h, true);
  g.t.dq = full(t.dq, bwd, h * d, false);
  g.t.dk = full(t.dk, bwd, hkv * d, false);
  g.t.dv = full(t.dv, bwd, hkv * dv, false);
  g.t.q = full(t.q, full_check, h * d, false);
  g.t.k = full(t.k, full_check, hkv * d, false);
  g.t.v = full(t.v, full_check, hkv * dv, false);
  g.t.dout = full(t.dout, full_check && bwd, h * dv, false);
  // Every rank holds the whole sinks; rank 0 the job's gradient (results_to_host).
  if (!t.sinks.empty()) {
    g.t.sinks = t.sinks.data();
    if (bwd) g.t.dsinks = t.dsinks.data();
  }
  return g;
}

// Rank 0: the output files, staged and renamed into place together.
void write_outputs(const RunOptions& opts, const Engine& e, const WholeTensors& w, RunReport& rep) {
  const Shape4& s = e.config().shape;
  const int64_t hkv = e.config().effective_kv_heads();
  const int64_t dv = e.config().effective_head_dim_v();
  const std::vector<int64_t> dims4{s.batch, s.seq_len, s.heads, s.head_dim};
  const std::vector<int64_t> kv_dims4{s.batch, s.seq_len, hkv, s.head_dim};
  const std::vector<int64_t> out_dims4{s.batch, s.seq_len, s.heads, dv};
  const std::vector<int64_t> v_dims4{s.batch, s.seq_len, hkv, dv};
  AtomicOutputs files;
  if (!opts.out_path.empty()) files.stage(opts.out_path, out_dims4, w.out);
  if (!opts.lse_out_path.empty())
    files.stage(opts.lse_out_path, {s.batch, s.heads, s.seq_len}, w.lse);
  if (!opts.dq_out_path.empty()) files.stage(opts.dq_out_path, dims4, w.dq);
  if (!opts.dk_out_path.empty()) files.stage(opts.dk_out_path, kv_dims4, w.dk);
  if (!opts.dv_out_path.empty()) files.stage(opts.dv_out_path, v_dims4, w.dv);
  if (!opts.dsinks_out_path.empty()) files.stage(opts.dsinks_out_path, {s.heads}, w.dsinks);
  if (!opts.pattern_out_path.empty()) {
    const int64_t nb = s.seq_len / e.config().block_size;
    const std::vector<uint8_t> mask = e.block_mask();
    files.stage_bool(opts.pattern_out_path, {s.heads, nb, nb}, mask.data());
  }
  files.commit();
  for (const auto& [name, path] : kOutputs)
    if (!(opts.*path).empty()) rep.outputs_written.push_back(opts.*path);
}

int run_and_report(Run& run, ProgressReporter& progress, std::ostream& out) {
  const RunOptions& opts = run.opts;
  Comm& comm = run.comm;
  const Engine& e = *run.engine;
  const std::string note = option_words(e.stats().attention_note);
  if (comm.rank() == 0 && !note.empty()) out << "ringattn: " << note << "\n";
  print_ranks(run, out);
  const Timings tm = time_calls(run, progress);
  results_to_host(run);
  RunReport rep = make_report(run, tm);

  if (opts.check) progress.phase("check");
  // A sampled check runs on every rank, on its own shard.
  const auto sampled = run.sampled_check
                           ? sampled_check(opts, comm, e, run.t.q, run.t.o, run.t.lse, run.t.sinks)
                           : std::pair<double, double>{0, 0};
  const bool whole = opts.check && !run.sampled_check;
  const Gathered g = gather_results(run, whole);
  int code = 0;
  if (comm.rank() == 0) {
    if (opts.check) {
      rep.check_tolerance = check_tolerance(e);
      if (run.sampled_check) {
        rep.check_mode = "sampled: " + std::to_string(kSampledRows) +
                         " rows per (batch, head) on every rank, forward only";
        rep.checks = {{"out", sampled.first}, {"lse", sampled.second}};
      } else {
        rep.check_mode = "full";
        rep.checks = full_check(e, g.t, opts.backward);
      }
    }
    rep.peak_bytes = tracked_bytes_peak();
    rep.peak_rss_bytes = peak_rss_bytes();
    const bool failed = opts.check && !rep.check_passed();
    if (!failed) {
      if (writes_outputs(opts)) progress.phase("writing");
      write_outputs(opts, e, g.t, rep);
    }
    progress.finish();
    print_table(rep, out);
    if (opts.json) print_json(rep, out);
    if (failed) {
      std::cerr << "ringattn: error: --check: result differs from the float64 reference beyond "
                   "the tolerance; no output files written\n";
      code = static_cast<int>(ExitCode::runtime_failure);
    }
  }
  return static_cast<int>(comm.max(static_cast<int64_t>(code)));
}

}  // namespace

int run_command(const RunOptions& opts, Comm& comm, std::ostream& out) {
  comm.set_timeout(opts.timeout_s);
  // Rank 0 alone reports progress; the others' reporter is off and gives the engines no hook.
  ProgressReporter progress(
      comm.rank() == 0 ? progress_mode(opts.progress, opts.quiet, isatty(STDERR_FILENO) == 1)
                       : ProgressMode::off,
      opts.warmup + opts.iters, opts.warmup, opts.backward, std::cerr);
  Run run{opts, comm, {}, std::nullopt, {}, false};
  // Each phase's errors are agreed on before the next collective starts.
  const auto phase = [&](const std::function<void()>& f) {
    return agree_on_errors(comm, [&] {
      try {
        f();
      } catch (...) {
        progress.finish();  // the message starts on a clean terminal line
        throw;
      }
    });
  };
  if (const int code = phase([&] { read_job(run); })) return code;
  run.spec.on_step = progress.step_hook();
  if (const int code = phase([&] {
        blaming_input_files(opts, [&] { run.engine.emplace(make_engine(run.spec, comm)); });
      }))
    return code;
  if (const int code = phase([&] { load_tensors(run); })) return code;
  try {
    return run_and_report(run, progress, out);
  } catch (const std::exception& e) {
    progress.finish();
    // A rank that failed because another one already aborted (in-process ranks) stays quiet.
    comm.check_aborted();
    // One write, so that ranks sharing a stderr (threads) do not interleave.
    std::cerr << ("ringattn: " +
                  (comm.size() > 1 ? "rank " + std::to_string(comm.rank()) + ": " : "") +
                  "error: " + printable(cli_message(e)) + "\n")
              << std::flush;
    if (comm.size() > 1) comm.abort(static_cast<int>(ExitCode::runtime_failure));
    // A kernel that never finished: the GPU still runs it, and unwinding (the engine's
    // destructors, the CUDA runtime's at exit) must not wait for it.
    if (dynamic_cast<const DeviceHang*>(&e)) std::_Exit(static_cast<int>(ExitCode::runtime_failure));
    return static_cast<int>(ExitCode::runtime_failure);
  }
}

int run_command_virtual_ranks(const RunOptions& opts, std::ostream& out) {
  RunOptions per_rank = opts;
  const int ranks = std::max(1, opts.ring_size);
  if (per_rank.threads == 0) per_rank.threads = std::max(1, omp_get_max_threads() / ranks);
  return run_virtual_ranks(ranks, [&](Comm& comm) { return run_command(per_rank, comm, out); });
}

}  // namespace ringattn::cli

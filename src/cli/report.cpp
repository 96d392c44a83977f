// Formatting of a RunReport: the human summary and the one-line JSON object.
#include "cli/report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

namespace ringattn::cli {

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::string human_bytes(std::size_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (b >= (1ull << 30))
    os << static_cast<double>(b) / (1ull << 30) << " GiB";
  else if (b >= (1ull << 20))
    os << static_cast<double>(b) / (1ull << 20) << " MiB";
  else
    os << static_cast<double>(b) / 1024.0 << " KiB";
  return os.str();
}

}  // namespace

// FLOPs per attended pair: forward S = QKᵀ (2·D) and PV (2·Dv); backward the recomputed S, dQ
// and dK (2·D each), dP and dV (2·Dv each): 2.5x the forward when Dv = D.
double RunReport::fwd_gflops() const {
  const auto d = static_cast<double>(cfg.shape.head_dim);
  const auto dv = static_cast<double>(cfg.effective_head_dim_v());
  return fwd_ms > 0 ? 2.0 * (d + dv) * attended_pairs / (fwd_ms * 1e6) : 0.0;
}

std::optional<double> RunReport::bwd_gflops() const {
  if (!bwd_ms || *bwd_ms <= 0) return std::nullopt;
  const auto d = static_cast<double>(cfg.shape.head_dim);
  const auto dv = static_cast<double>(cfg.effective_head_dim_v());
  return 2.0 * (3.0 * d + 2.0 * dv) * attended_pairs / (*bwd_ms * 1e6);
}

bool RunReport::check_passed() const {
  for (const auto& c : checks)
    if (!(c.rel_error <= check_tolerance)) return false;
  return true;
}

namespace {

void print_rank_figures(const char* pass, const std::vector<RankFigures>& v, std::ostream& os) {
  for (std::size_t i = 0; i < v.size(); ++i)
    os << "    " << pass << " rank " << i << ": compute " << std::fixed << std::setprecision(2)
       << v[i].compute_ms << " ms, communication " << v[i].comm_ms << " ms, exposed "
       << v[i].exposed_ms << " ms, sent " << v[i].bytes_sent << " bytes\n";
}

void print_ring(const RunReport& r, std::ostream& os) {
  os << "  ring             " << r.world_size << " ranks, forward bytes sent (max over ranks) "
     << r.bytes_sent << " (computed minimum " << r.bytes_sent_min << ")\n";
  if (r.ulysses > 1)
    os << "  ulysses          " << r.ulysses << " ranks per group x ring of "
       << r.world_size / r.ulysses << " groups: all-to-all bytes " << r.bytes_sent_a2a
       << " (minimum " << r.bytes_sent_a2a_min << "), ring bytes " << r.bytes_sent_ring
       << " (minimum " << r.bytes_sent_ring_min << ")\n";
  print_rank_figures("fwd", r.fwd_ranks, os);
  print_rank_figures("bwd", r.bwd_ranks, os);
}

void print_checks(const RunReport& r, std::ostream& os) {
  os << "  check vs float64 reference (" << r.check_mode << "; relative Frobenius error, tolerance "
     << std::scientific << std::setprecision(0) << r.check_tolerance << "):\n   ";
  os << std::setprecision(2);
  for (const auto& ch : r.checks) os << " " << ch.tensor << " " << ch.rel_error;
  os << "  -> " << (r.check_passed() ? "OK" : "NOT OK") << "\n";
}

// [L, R] as given (R: its default filled in, 0 under causal); null without a window.
nlohmann::json window_json(const AttentionConfig& c) {
  if (!c.windowed()) return nullptr;
  return {*c.window_left, c.causal ? 0 : c.window_right.value_or(*c.window_left)};
}

// Packed sequences: the number of documents per batch row; null when not packed.
nlohmann::json documents_json(const AttentionConfig& c) {
  if (!c.packed()) return nullptr;
  return c.cu_seqlens.size() - 1;
}

void add_problem(const RunReport& r, nlohmann::json& j) {
  const AttentionConfig& c = r.cfg;
  j["version"] = RINGATTN_VERSION;
  j["seq_len"] = c.shape.seq_len;
  j["batch"] = c.shape.batch;
  j["heads"] = c.shape.heads;
  j["kv_heads"] = c.effective_kv_heads();
  j["head_dim"] = c.shape.head_dim;
  j["head_dim_v"] = c.effective_head_dim_v();
  j["softcap"] = c.softcap;
  j["attention"] = to_string(c.attention);
  j["window"] = window_json(c);
  j["documents"] = documents_json(c);
  if (c.attention == AttentionKind::dilated) {
    j["combine"] = to_string(c.combine);
    j["segments"] = c.segments;
    j["dilations"] = c.dilations;
  }
  if (c.attention == AttentionKind::block_sparse) {
    j["block_size"] = c.block_size;
    j["pattern"] = r.pattern;
    j["sparsity"] = r.sparsity;
    j["peers"] = r.peers;
  }
  if (!r.attention_note.empty()) j["attention_auto"] = r.attention_note;
  j["causal"] = c.causal;
  j["scale"] = c.effective_scale();
}

void add_timings_and_memory(const RunReport& r, nlohmann::json& j) {
  j["world_size"] = r.world_size;
  j["device"] = r.device;
  if (r.emulated_device) j["emulated_device"] = true;
  j["threads"] = r.threads;
  j["iters"] = r.iters;
  j["attended_pairs"] = r.attended_pairs;
  j["fwd_ms"] = r.fwd_ms;
  j["fwd_gflops"] = r.fwd_gflops();
  if (r.bwd_ms) {
    j["bwd_ms"] = *r.bwd_ms;
    j["bwd_gflops"] = *r.bwd_gflops();
  }
  j["workspace_bytes"] = r.workspace_bytes;
  j["workspace_bytes_per_thread"] = r.workspace_bytes_per_thread;
  j["peak_bytes"] = r.peak_bytes;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["kernel"] = r.kernel;
  if (r.bwd_ms) j["kernel_backward"] = r.kernel_backward;
  j["deterministic"] = r.deterministic;
  j["dtype"] = r.dtype;
  j["device_peak_bytes"] = r.device_peak_bytes;
  if (r.blas)
    j["blas"] = {{"config", r.blas->config},         {"core", r.blas->core},
                 {"core_from", r.blas->core_from},   {"file", r.blas->file},
                 {"threading", r.blas->threading},   {"threads_per_call", r.blas->threads_per_call},
                 {"small_gemm", r.blas->small_gemm}, {"vector_kernels", r.blas->vector_kernels}};
}

nlohmann::json ranks_json(const std::vector<RankFigures>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (std::size_t i = 0; i < v.size(); ++i)
    a.push_back({{"rank", i},
                 {"compute_ms", v[i].compute_ms},
                 {"comm_ms", v[i].comm_ms},
                 {"exposed_ms", v[i].exposed_ms},
                 {"bytes_sent", v[i].bytes_sent}});
  return a;
}

// The most any rank's compute stood waiting for a transfer, beside fwd_ms / bwd_ms.
double worst_exposed(const std::vector<RankFigures>& v) {
  double w = 0;
  for (const RankFigures& f : v) w = std::max(w, f.exposed_ms);
  return w;
}

void add_ring(const RunReport& r, nlohmann::json& j) {
  j["bytes_sent"] = r.bytes_sent;
  j["bytes_sent_min"] = r.bytes_sent_min;
  j["ulysses"] = r.ulysses;
  if (r.ulysses > 1) {
    j["bytes_sent_a2a"] = r.bytes_sent_a2a;
    j["bytes_sent_a2a_min"] = r.bytes_sent_a2a_min;
    j["bytes_sent_ring"] = r.bytes_sent_ring;
    j["bytes_sent_ring_min"] = r.bytes_sent_ring_min;
  }
  j["layout"] = r.layout;
  j["tensor_layout"] = to_string(r.cfg.layout);
  if (r.cfg.kv_layout) j["kv_tensor_layout"] = to_string(*r.cfg.kv_layout);
  j["imbalance"] = r.imbalance;
  if (!r.fwd_ranks.empty()) j["fwd_ranks"] = ranks_json(r.fwd_ranks);
  if (!r.bwd_ranks.empty()) j["bwd_ranks"] = ranks_json(r.bwd_ranks);
  if (!r.fwd_ranks.empty()) {
    nlohmann::json e;
    e["fwd_ms"] = worst_exposed(r.fwd_ranks);
    if (!r.bwd_ranks.empty()) e["bwd_ms"] = worst_exposed(r.bwd_ranks);
    j["comm_exposed_ms"] = e;
  }
}

void add_checks(const RunReport& r, nlohmann::json& j) {
  if (r.checks.empty()) return;
  nlohmann::json ch;
  for (const auto& x : r.checks) ch[x.tensor] = x.rel_error;
  ch["tolerance"] = r.check_tolerance;
  ch["passed"] = r.check_passed();
  ch["mode"] = r.check_mode;
  j["check"] = ch;
}

}  // namespace

void print_table(const RunReport& r, std::ostream& os) {
  const AttentionConfig& c = r.cfg;
  os << "ringattn " << RINGATTN_VERSION << ": " << to_string(c.attention) << " attention";
  if (c.attention == AttentionKind::dilated) os << " (" << to_string(c.combine) << ")";
  os << " on " << r.device << " [" << r.device_detail << "], world size " << r.world_size << "\n";
  os << "  shape [B,N,H,D]  " << to_string(c.shape);
  if (c.effective_kv_heads() != c.shape.heads)
    os << "   K/V heads " << c.effective_kv_heads() << " (grouped-query)";
  if (c.effective_head_dim_v() != c.shape.head_dim)
    os << "   values' head dim " << c.effective_head_dim_v();
  os << "   causal " << (c.causal ? "yes" : "no") << "   scale " << c.effective_scale();
  if (c.softcapped()) os << "   soft-cap " << c.softcap;
  os << "\n";
  if (c.layout != TensorLayout::bnhd)
    os << "  tensor layout    " << to_string(c.layout) << " (the engine's tensors; files stay "
       << "[B,N,H,D])\n";
  if (c.windowed())
    os << "  window           keys p-" << c.window_reach().left << " .. p+"
       << c.window_reach().right << "\n";
  if (c.packed())
    os << "  packed           " << c.cu_seqlens.size() - 1 << " documents per batch row\n";
  if (r.world_size > 1)
    os << "  layout           " << r.layout << "   imbalance " << std::fixed << std::setprecision(3)
       << r.imbalance << " (max / mean attended pairs over ranks)" << std::defaultfloat << "\n";
  if (c.attention == AttentionKind::dilated)
    os << "  segments         " << join(c.segments) << "   dilations " << join(c.dilations) << "\n";
  if (!r.attention_note.empty()) os << "  auto             " << r.attention_note << "\n";
  if (c.attention == AttentionKind::block_sparse)
    os << "  pattern          " << r.pattern << "   block size " << c.block_size << "   sparsity "
       << std::fixed << std::setprecision(2) << 100.0 * r.sparsity << "% of block pairs skipped"
       << std::defaultfloat << "\n";
  os << std::fixed << std::setprecision(3);
  os << "  attended pairs   " << std::setprecision(0) << r.attended_pairs << "\n";
  os << std::setprecision(3);
  os << "  forward          " << std::setw(10) << r.fwd_ms << " ms  (median of " << r.iters << ")  "
     << std::setprecision(1) << r.fwd_gflops() << " GFLOP/s\n";
  if (r.bwd_ms)
    os << "  backward         " << std::setw(10) << std::setprecision(3) << *r.bwd_ms
       << " ms  (median of " << r.iters << ")  " << std::setprecision(1) << *r.bwd_gflops()
       << " GFLOP/s\n";
  if (r.emulated_device)
    os << "  timings          of the SIMT emulator on the CPU: not GPU timings\n";
  os << "  workspace        " << human_bytes(r.workspace_bytes);
  if (r.workspace_bytes_per_thread > 0)
    os << " (" << human_bytes(r.workspace_bytes_per_thread) << " per thread)";
  os << "   peak tracked " << human_bytes(r.peak_bytes) << "   peak RSS "
     << human_bytes(r.peak_rss_bytes) << "\n";
  if (r.device == "cuda")
    os << "  device memory    peak " << human_bytes(r.device_peak_bytes) << " (plan workspace "
       << human_bytes(r.device_workspace_bytes) << ")   kernel " << r.kernel
       << (r.bwd_ms && r.kernel_backward != r.kernel ? " (backward " + r.kernel_backward + ")" : "")
       << ", inputs " << r.dtype << "\n";
  if (r.blas) os << "  blas             " << r.blas->summary() << "\n";
  for (const auto& n : r.notes) os << "  note: " << n << "\n";
  if (r.world_size > 1) print_ring(r, os);
  if (!r.checks.empty()) print_checks(r, os);
  for (const auto& f : r.outputs_written) os << "  wrote " << f << "\n";
  os << std::defaultfloat;
}

void print_json(const RunReport& r, std::ostream& os) {
  nlohmann::json j;
  add_problem(r, j);
  add_timings_and_memory(r, j);
  add_ring(r, j);
  add_checks(r, j);
  os << j.dump() << "\n";
}

}  // namespace ringattn::cli

// CPU benchmark: dense and dilated attention, forward and backward, over sequence lengths,
// in GFLOP/s beside the same run's single-precision GEMM rate on the same threads. Prints a
// table and, last, one JSON object. Not a test: goals are judged by reading its output.
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "bench_timing.hpp"
#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cpu_peak.hpp"
#include "kernels/cpu_small_gemm.hpp"
#include "ringattn/tensor.hpp"
#include "single/plan.hpp"
#include "single/schedule.hpp"

namespace po = boost::program_options;
using namespace ringattn;
using ringattn::bench::time_ms;

namespace {

struct Series {
  std::string name;  // e.g. "dilated 2048,4096,8192/1,2,4 grouped"
  AttentionKind attention;
  Combine combine;
  std::vector<int64_t> segments, dilations;
};

// The rate the kernels' own GEMMs can reach: every thread multiplies its own n x n x n
// product at once, one thread per call, through the same BLAS and kernels as ringattn.
double sgemm_gflops(int n, int threads) {
  const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(nn * static_cast<std::size_t>(threads)), b(a.size()), c(a.size());
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& x : a) x = d(gen);
  for (auto& x : b) x = d(gen);
  const kernels::BlasSingleThreadScope one_thread_per_sgemm;
  const double ms = time_ms(
      [&] {
#pragma omp parallel num_threads(threads)
        {
          const std::size_t off = nn * static_cast<std::size_t>(omp_get_thread_num());
          for (int rep = 0; rep < 4; ++rep)
            kernels::sgemm(CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data() + off, n,
                           b.data() + off, n, 0.0f, c.data() + off, n);
        }
      },
      5);
  return 4.0 * threads * 2.0 * n * static_cast<double>(n) * n / (ms * 1e6);
}

// The forward's two tile products alone, at the plan's tile shape for head_dim, operands hot
// in cache: S = Qᵀ-tile · Kᵀ, then acc += P · V, as the forward calls them (cpu_small_gemm),
// every thread on its own tiles. What the forward could reach with a free softmax.
double tile_products_gflops(int64_t d, int threads) {
  const kernels::TileConfig tiles = single::choose_tiles(d, 0, 0);
  const int ld = static_cast<int>(kernels::tile_ld(tiles.q_tile));  // as the kernels pad it
  const int m = static_cast<int>(kernels::round_up16(static_cast<std::size_t>(tiles.q_tile)));
  const int bk = static_cast<int>(tiles.k_tile);
  const int id = static_cast<int>(d);
  const auto side = static_cast<std::size_t>(ld) * static_cast<std::size_t>(d);
  const auto tile = static_cast<std::size_t>(ld) * static_cast<std::size_t>(bk);
  const auto keys = static_cast<std::size_t>(bk) * static_cast<std::size_t>(d);
  constexpr int kReps = 400;
  const double ms = time_ms(
      [&] {
#pragma omp parallel num_threads(threads)
        {
          std::vector<float> qt(side, 0.01f), s(tile), acc(side, 0.0f), k(keys, 0.02f),
              v(keys, 0.03f);
          for (int rep = 0; rep < kReps; ++rep) {
            kernels::small_gemm(false, m, bk, id, qt.data(), ld, k.data(), id, 0.0f, s.data(), ld);
            kernels::small_gemm(true, m, id, bk, s.data(), ld, v.data(), id, 1.0f, acc.data(), ld);
          }
        }
      },
      3);
  return 4.0 * kReps * threads * static_cast<double>(m) * bk * static_cast<double>(d) / (ms * 1e6);
}

// The same dense kernels on rows of one head strided among the others ([B,N,H,D], the
// layout ringattn's API takes) and on each head's rows contiguous ([B,H,N,D], PyTorch SDPA's
// convention), forward and backward, alternating which goes first round by round: what the
// layout alone costs. The kernels take any row stride (SubseqTask), so only the task table
// differs. Returns the JSON row and prints one line.
nlohmann::json layout_ab(int64_t n, int64_t heads, int64_t d, int threads, int rounds) {
  const auto size = static_cast<std::size_t>(n * heads * d);
  std::vector<float> q(size), k(size), v(size), out(size), dout(size), dq(size), dk(size), dv(size),
      lse(static_cast<std::size_t>(n * heads));
  std::mt19937 gen(7);
  std::normal_distribution<float> dist;
  for (auto* t : {&q, &k, &v, &dout})
    for (auto& x : *t) x = dist(gen);
  std::vector<kernels::SubseqTask> layouts[2];  // 0: [B,N,H,D], 1: [B,H,N,D]
  for (int64_t h = 0; h < heads; ++h) {
    kernels::SubseqTask t;
    t.n_q = t.n_k = n;
    t.lse0 = h * n;
    t.lse_stride = 1;
    t.q_row0 = t.k_row0 = h * d;
    t.q_stride = t.k_stride = heads * d;
    layouts[0].push_back(t);
    t.q_row0 = t.k_row0 = h * n * d;
    t.q_stride = t.k_stride = d;
    layouts[1].push_back(t);
  }
  const kernels::TileConfig tiles = single::choose_tiles(d, 0, 0);
  const std::vector<kernels::ForwardItem> items[2] = {
      single::forward_items(layouts[0], false, tiles),
      single::forward_items(layouts[1], false, tiles)};
  const std::size_t per_thread = std::max(kernels::forward_workspace_floats(tiles, d),
                                          kernels::backward_workspace_floats(tiles, d));
  std::vector<float> workspace(per_thread * static_cast<std::size_t>(threads) + 16);
  float* ws =
      workspace.data() + (16 - reinterpret_cast<std::uintptr_t>(workspace.data()) / 4 % 16) % 16;
  kernels::ForwardParams fp;
  fp.q = q.data(), fp.k = k.data(), fp.v = v.data(), fp.out = out.data(), fp.lse = lse.data();
  fp.head_dim = d;
  fp.scale = 1.0f / std::sqrt(static_cast<float>(d));
  kernels::BackwardParams bp;
  bp.q = q.data(), bp.k = k.data(), bp.v = v.data(), bp.out = out.data(), bp.lse = lse.data();
  bp.dout = dout.data(), bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
  bp.head_dim = d;
  bp.scale = fp.scale;
  const auto timed = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return bench::seconds_since(t0) * 1e3;
  };
  std::vector<double> fwd[2], bwd[2], fwd_ratio, bwd_ratio;
  for (int r = -1; r < rounds; ++r) {  // round -1 warms both up
    double f[2], b[2];
    for (int x : {r % 2 == 0 ? 0 : 1, r % 2 == 0 ? 1 : 0}) {
      f[x] = timed([&] { kernels::flash_forward(fp, layouts[x], items[x], tiles, threads, ws); });
      b[x] = timed([&] { kernels::flash_backward(bp, layouts[x], tiles, threads, ws); });
    }
    if (r < 0) continue;
    for (int x : {0, 1}) fwd[x].push_back(f[x]), bwd[x].push_back(b[x]);
    fwd_ratio.push_back(f[0] / f[1]);
    bwd_ratio.push_back(b[0] / b[1]);
  }
  const auto median = [](std::vector<double> xs) {
    std::sort(xs.begin(), xs.end());
    return xs[xs.size() / 2];
  };
  const double flops = 4.0 * static_cast<double>(heads) * static_cast<double>(n) *
                       static_cast<double>(n) * static_cast<double>(d);
  std::printf(
      "# layout A/B, dense N=%lld H=%lld D=%lld, %d rounds: forward [B,N,H,D] %.1f ms "
      "(%.1f GFLOP/s), [B,H,N,D] %.1f ms (%.1f); backward %.1f ms (%.1f), %.1f ms (%.1f); "
      "[B,N,H,D] time / [B,H,N,D] time per round (median): forward %.3f, backward %.3f\n",
      static_cast<long long>(n), static_cast<long long>(heads), static_cast<long long>(d), rounds,
      median(fwd[0]), flops / (median(fwd[0]) * 1e6), median(fwd[1]),
      flops / (median(fwd[1]) * 1e6), median(bwd[0]), 2.5 * flops / (median(bwd[0]) * 1e6),
      median(bwd[1]), 2.5 * flops / (median(bwd[1]) * 1e6), median(fwd_ratio), median(bwd_ratio));
  return {{"seq_len", n},
          {"heads", heads},
          {"head_dim", d},
          {"rounds", rounds},
          {"fwd_ms_bnhd", fwd[0]},
          {"fwd_ms_bhnd", fwd[1]},
          {"bwd_ms_bnhd", bwd[0]},
          {"bwd_ms_bhnd", bwd[1]},
          {"fwd_paired_ratio", median(fwd_ratio)},
          {"bwd_paired_ratio", median(bwd_ratio)}};
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// A comma-separated list of sequence lengths; "0" or "" skips the series. Anything else
// that is not a positive integer throws std::invalid_argument naming the value.
std::vector<int64_t> parse_list(const std::string& s) {
  if (s.empty() || s == "0") return {};
  return bench::parse_numbers<int64_t>(
      s, [](int64_t n) { return n > 0; }, "a positive sequence length");
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("cpu_bench [options]");
  desc.add_options()("dense-n",
                     po::value<std::string>()->default_value("4096,8192,16384,32768,65536"),
                     "dense sequence lengths")(
      "dilated-n", po::value<std::string>()->default_value("8192,16384,32768,65536,131072,262144"),
      "dilated sequence lengths (default config)")(
      "legacy-n", po::value<std::string>()->default_value("4096,16384,65536"),
      "sequence lengths for the replaced project's configs")(
      "heads", po::value<int64_t>()->default_value(8), "heads")(
      "head-dim", po::value<int64_t>()->default_value(64), "head dim")(
      "threads", po::value<int>()->default_value(0), "threads (0: all)")(
      "iters", po::value<int>()->default_value(3), "timed iterations (median)")(
      "no-backward", po::bool_switch(), "forward only")(
      "q-tile", po::value<int64_t>()->default_value(0), "query tile (0: the plan's choice)")(
      "k-tile", po::value<int64_t>()->default_value(0), "key tile (0: the plan's choice)")(
      "layout-ab", po::value<int64_t>()->default_value(0),
      "dense sequence length for the layout A/B: the kernels on [B,N,H,D] rows against "
      "[B,H,N,D] rows, alternating, --iters rounds (at least 3; 0: skip)")(
      "sgemm-only", po::bool_switch(),
      "print only the machine's rates: SGEMM, the FMA peak and the forward's tile products "
      "alone (and a JSON line with them), for other scripts")(
      "commit", po::value<std::string>()->default_value("unknown"), "commit id to print")("help,h",
                                                                                          "help");
  po::variables_map vm;
  if (const int rc = bench::parse_options("cpu_bench", desc, argc, argv, vm); rc >= 0) return rc;
  for (const char* list : {"dense-n", "dilated-n", "legacy-n"}) {
    try {
      (void)parse_list(vm[list].as<std::string>());
    } catch (const std::invalid_argument& e) {
      std::cerr << "cpu_bench: --" << list << ": " << e.what() << " (0 skips the series)\n";
      return 2;
    }
  }
  const int threads = vm["threads"].as<int>() > 0 ? vm["threads"].as<int>() : omp_get_max_threads();
  const int iters = vm["iters"].as<int>();
  const int64_t heads = vm["heads"].as<int64_t>(), dim = vm["head-dim"].as<int64_t>();
  const bool backward = !vm["no-backward"].as<bool>();
  const int64_t q_tile = vm["q-tile"].as<int64_t>(), k_tile = vm["k-tile"].as<int64_t>();

  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));

  const double gemm = sgemm_gflops(512, threads);
  const double peak = kernels::fma_peak_gflops(threads);
  const double products = tile_products_gflops(dim, threads);
  if (vm["sgemm-only"].as<bool>()) {
    std::printf(
        "# same-run SGEMM (512^3 per thread, one thread per call, %d threads): %.1f GFLOP/s\n",
        threads, gemm);
    std::printf(
        "# FMA peak of this build (%s, registers only, %d threads): %.1f "
        "GFLOP/s\n",
        kernels::fma_peak_isa(), threads, peak);
    std::printf("# forward tile products alone (head dim %lld, %s): %.1f GFLOP/s\n",
                static_cast<long long>(dim), kernels::small_gemm_summary().c_str(), products);
    std::printf("%s\n", nlohmann::json{{"threads", threads},
                                       {"sgemm_gflops", gemm},
                                       {"fma_peak_gflops", peak},
                                       {"tile_products_gflops", products}}
                            .dump()
                            .c_str());
    return 0;
  }
  std::printf(
      "# ringattn CPU benchmark\n# command: %s\n# machine: %s, %d threads\n# date: %s\n"
      "# commit: %s\n# BLAS: %s\n"
      "# same-run SGEMM (512^3 per thread, one thread per call, %d threads): %.1f GFLOP/s\n"
      "# FMA peak of this build (%s, registers only): %.1f GFLOP/s\n"
      "# forward tile products alone (head dim %lld, operands in cache): %.1f GFLOP/s\n"
      "# FLOPs: forward 4*B*H*D*(attended pairs); backward 2.5x that\n\n",
      cmd.c_str(), cpu_model().c_str(), threads, date, vm["commit"].as<std::string>().c_str(),
      kernels::blas_info().summary().c_str(), threads, gemm, kernels::fma_peak_isa(), peak,
      static_cast<long long>(dim), products);
  std::printf("%-42s %8s %6s %11s %9s %6s %11s %9s %6s\n", "config", "N", "causal", "fwd ms",
              "GFLOP/s", "%gemm", "bwd ms", "GFLOP/s", "%gemm");

  std::vector<std::pair<Series, std::vector<int64_t>>> plan;
  plan.push_back({{"dense", AttentionKind::dense, Combine::grouped, {}, {}},
                  parse_list(vm["dense-n"].as<std::string>())});
  for (Combine c : {Combine::grouped, Combine::mixture})
    plan.push_back({{std::string("dilated 2048,4096,8192/1,2,4 ") + to_string(c),
                     AttentionKind::dilated,
                     c,
                     {2048, 4096, 8192},
                     {1, 2, 4}},
                    parse_list(vm["dilated-n"].as<std::string>())});
  const auto legacy_n = parse_list(vm["legacy-n"].as<std::string>());
  plan.push_back(
      {{"legacy 1024,2048/1,2", AttentionKind::dilated, Combine::grouped, {1024, 2048}, {1, 2}},
       legacy_n});
  plan.push_back({{"legacy 512,1024,2048/1,2,4",
                   AttentionKind::dilated,
                   Combine::grouped,
                   {512, 1024, 2048},
                   {1, 2, 4}},
                  legacy_n});
  plan.push_back({{"legacy 512..4096/1,4,16,64",
                   AttentionKind::dilated,
                   Combine::grouped,
                   {512, 1024, 2048, 4096},
                   {1, 4, 16, 64}},
                  legacy_n});

  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [series, ns] : plan) {
    for (int64_t n : ns) {
      for (bool causal : {false, true}) {
        AttentionConfig cfg;
        cfg.shape = {1, n, heads, dim};
        cfg.attention = series.attention;
        cfg.combine = series.combine;
        cfg.segments = series.segments;
        cfg.dilations = series.dilations;
        cfg.causal = causal;
        Plan p(cfg, PlanOptions{threads, q_tile, k_tile});
        HostTensor q(cfg.shape, "q"), k(cfg.shape, "k"), v(cfg.shape, "v"), o(cfg.shape, "out"),
            lse(std::vector<int64_t>{1, heads, n}, "lse");
        std::mt19937 gen(static_cast<unsigned>(n));
        std::normal_distribution<float> dist;
        for (auto* t : {&q, &k, &v})
          for (std::size_t i = 0; i < t->size(); ++i) t->data()[i] = dist(gen);
        const double pairs = attended_pairs(cfg);
        const double fwd_flops = 4.0 * static_cast<double>(dim) * pairs;
        const double fwd_ms =
            time_ms([&] { p.forward(q.data(), k.data(), v.data(), o.data(), lse.data()); }, iters);
        double bwd_ms = 0;
        if (backward) {
          HostTensor dout(cfg.shape, "dout"), dq(cfg.shape, "dq"), dk(cfg.shape, "dk"),
              dv(cfg.shape, "dv");
          for (std::size_t i = 0; i < dout.size(); ++i) dout.data()[i] = dist(gen);
          bwd_ms = time_ms(
              [&] {
                p.backward(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                           dq.data(), dk.data(), dv.data());
              },
              iters);
        }
        const double fwd_gf = fwd_flops / (fwd_ms * 1e6);
        const double bwd_gf = backward ? 2.5 * fwd_flops / (bwd_ms * 1e6) : 0.0;
        std::printf("%-42s %8lld %6s %11.2f %9.1f %5.0f%% %11.2f %9.1f %5.0f%%\n",
                    series.name.c_str(), static_cast<long long>(n), causal ? "yes" : "no", fwd_ms,
                    fwd_gf, 100 * fwd_gf / gemm, bwd_ms, bwd_gf, 100 * bwd_gf / gemm);
        std::fflush(stdout);
        rows.push_back({{"config", series.name},
                        {"seq_len", n},
                        {"batch", 1},
                        {"heads", heads},
                        {"head_dim", dim},
                        {"causal", causal},
                        {"attended_pairs", pairs},
                        {"fwd_ms", fwd_ms},
                        {"fwd_gflops", fwd_gf},
                        {"bwd_ms", bwd_ms},
                        {"bwd_gflops", bwd_gf},
                        {"workspace_bytes", p.workspace_bytes()}});
      }
    }
  }

  nlohmann::json layout = nullptr;
  if (const int64_t n = vm["layout-ab"].as<int64_t>(); n > 0)
    layout = layout_ab(n, heads, dim, threads, std::max(iters, 3));

  // Log-log slope of dilated forward time from 16K up to the largest N measured.
  nlohmann::json slopes = nlohmann::json::object();
  for (const auto& [series, ns] : plan) {
    if (series.attention != AttentionKind::dilated) continue;
    double t16 = 0, tmax = 0;
    int64_t nmax = 0;
    for (const auto& r : rows)
      if (r["config"] == series.name && !r["causal"].get<bool>()) {
        const int64_t n = r["seq_len"];
        if (n == 16384) t16 = r["fwd_ms"];
        if (n > nmax) nmax = n, tmax = r["fwd_ms"];
      }
    if (t16 > 0 && nmax > 16384) {
      const double slope = std::log(tmax / t16) / std::log(static_cast<double>(nmax) / 16384.0);
      slopes[series.name] = slope;
      std::printf("# %s: forward time log-log slope 16K->%lldK = %.3f\n", series.name.c_str(),
                  static_cast<long long>(nmax / 1024), slope);
    }
  }
  nlohmann::json j{{"machine", cpu_model()},
                   {"threads", threads},
                   {"date", date},
                   {"commit", vm["commit"].as<std::string>()},
                   {"command", cmd},
                   {"sgemm_gflops", gemm},
                   {"fma_peak_gflops", peak},
                   {"tile_products_gflops", products},
                   {"rows", rows},
                   {"dilated_slopes", slopes},
                   {"layout_ab", layout}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

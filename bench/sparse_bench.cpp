// Block-sparse benchmark: forward (and backward) time against sparsity on one process, beside
// the same run's dense kernel on the same shape and threads. The dense time is measured at
// --dense-n and scaled by N² to longer sequences (dense work is exactly quadratic, and its
// rate is flat past 16K here: see bench/results/cpu-*.txt); the ratio reported is
// dense time / sparse time against the ideal 1 / density. Prints a table, then JSON rows.
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "bench_timing.hpp"
#include "ring/communicator.hpp"
#include "ringattn/tensor.hpp"
#include "single/plan.hpp"
#include "sparse/pattern.hpp"
#include "sparse/sparse_plan.hpp"

namespace po = boost::program_options;
using namespace ringattn;
using ringattn::bench::time_ms;

namespace {

void fill(float* p, std::size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description desc("sparse_bench");
  desc.add_options()("seq-lens", po::value<std::string>()->default_value("65536,262144,1048576"),
                     "sequence lengths")(
      "densities", po::value<std::string>()->default_value("0.25,0.1,0.05,0.01"),
      "fractions of block pairs kept; each gives a local window and a random pattern")(
      "heads", po::value<int64_t>()->default_value(2), "")(
      "head-dim", po::value<int64_t>()->default_value(64), "")(
      "block-size", po::value<int64_t>()->default_value(128), "")(
      "dense-n", po::value<int64_t>()->default_value(32768), "dense measured at this N")(
      "threads", po::value<int>()->default_value(0), "")(
      "iters", po::value<int>()->default_value(3), "")(
      "backward", po::bool_switch(), "time the backward too")(
      "commit", po::value<std::string>()->default_value("unknown"), "")("help,h", "help");
  po::variables_map vm;
  if (const int rc = bench::parse_options("sparse_bench", desc, argc, argv, vm); rc >= 0) return rc;
  const int threads = vm["threads"].as<int>() > 0 ? vm["threads"].as<int>() : omp_get_max_threads();
  const int64_t H = vm["heads"].as<int64_t>(), D = vm["head-dim"].as<int64_t>(),
                bs = vm["block-size"].as<int64_t>(), dense_n = vm["dense-n"].as<int64_t>();
  const int iters = vm["iters"].as<int>();
  const bool bwd = vm["backward"].as<bool>();
  std::vector<int64_t> lens;
  std::vector<double> densities;
  for (const char* list : {"seq-lens", "densities"}) {
    try {
      const std::string text = vm[list].as<std::string>();
      if (std::string(list) == "seq-lens")
        lens = bench::parse_numbers<int64_t>(text, [](int64_t n) { return n > 0; },
                                             "a positive sequence length");
      else
        densities = bench::parse_numbers<double>(text, [](double x) { return x > 0.0 && x <= 1.0; },
                                                 "a fraction in (0, 1]");
    } catch (const std::invalid_argument& e) {
      std::cerr << "sparse_bench: --" << list << ": " << e.what() << "\n";
      return 2;
    }
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("sparse_bench, commit %s, %s, %d threads, H=%lld D=%lld bs=%lld\n",
              vm["commit"].as<std::string>().c_str(), date, threads, static_cast<long long>(H),
              static_cast<long long>(D), static_cast<long long>(bs));

  // Dense reference rate, same shape and threads.
  double dense_fwd_ms = 0, dense_bwd_ms = 0;
  {
    AttentionConfig cfg;
    cfg.shape = {1, dense_n, H, D};
    Plan plan(cfg, PlanOptions{threads});
    const auto n = static_cast<std::size_t>(cfg.shape.numel());
    auto q = aligned_floats(n, "q"), k = aligned_floats(n, "k"), v = aligned_floats(n, "v"),
         o = aligned_floats(n, "o"), lse = aligned_floats(static_cast<std::size_t>(H * dense_n), "lse");
    fill(q.get(), n, 1);
    fill(k.get(), n, 2);
    fill(v.get(), n, 3);
    dense_fwd_ms = time_ms([&] { plan.forward(q.get(), k.get(), v.get(), o.get(), lse.get()); }, iters);
    if (bwd) {
      auto g = aligned_floats(n, "g"), dq = aligned_floats(n, "dq"), dk = aligned_floats(n, "dk"),
           dv = aligned_floats(n, "dv");
      fill(g.get(), n, 4);
      dense_bwd_ms = time_ms([&] {
        plan.backward(q.get(), k.get(), v.get(), o.get(), lse.get(), g.get(), dq.get(), dk.get(), dv.get());
      }, iters);
    }
    const double flops = 4.0 * static_cast<double>(D * H) * static_cast<double>(dense_n) * static_cast<double>(dense_n);
    std::printf("dense N=%lld: forward %.1f ms (%.1f GFLOP/s)", static_cast<long long>(dense_n),
                dense_fwd_ms, flops / dense_fwd_ms / 1e6);
    if (bwd) std::printf(", backward %.1f ms (%.1f GFLOP/s)", dense_bwd_ms, 2.5 * flops / dense_bwd_ms / 1e6);
    std::printf("\n\n%-44s %9s %9s %11s %11s %8s %8s", "pattern", "N", "sparsity", "sparse ms",
                "dense ms*", "speedup", "ideal");
    if (bwd) std::printf(" %11s %8s", "bwd ms", "speedup");
    std::printf("\n");
  }
  nlohmann::json rows = nlohmann::json::array();
  auto comm = ring::make_local_communicator();
  for (int64_t n : lens)
    for (double density : densities)
      for (const bool random : {false, true}) {
      // A band of 2r+1 blocks (contiguous key spans) or as many random blocks (scattered).
      const int64_t nb = n / bs;
      const auto keep = std::max<int64_t>(1, std::llround(density * static_cast<double>(nb)));
      const std::string text =
          random ? "random:blocks=" + std::to_string(keep)
                 : "local:window=" + std::to_string(std::max<int64_t>(1, (keep - 1) / 2) * 2 * bs);
      AttentionConfig cfg;
      cfg.shape = {1, n, H, D};
      cfg.attention = AttentionKind::block_sparse;
      cfg.block_size = bs;
      const sparse::Geometry g{n, bs, H};
      auto lists = std::make_shared<const sparse::BlockLists>(
          sparse::build_lists(sparse::parse_pattern(text, g, {}, {}, 0), g));
      sparse::SparsePlan plan(cfg, lists, *comm, PlanOptions{threads});
      const auto sz = static_cast<std::size_t>(cfg.shape.numel());
      auto q = aligned_floats(sz, "q"), k = aligned_floats(sz, "k"), v = aligned_floats(sz, "v"),
           o = aligned_floats(sz, "o"), lse = aligned_floats(static_cast<std::size_t>(H * n), "lse");
      fill(q.get(), sz, 1);
      fill(k.get(), sz, 2);
      fill(v.get(), sz, 3);
      const double ms =
          time_ms([&] { plan.forward(q.get(), k.get(), v.get(), o.get(), lse.get()); }, iters);
      const double scale = static_cast<double>(n) / static_cast<double>(dense_n);
      const double dense_ms = dense_fwd_ms * scale * scale;
      const double sp = sparse::sparsity(*lists, false);
      const double ideal = 1.0 / (1.0 - sp);
      std::printf("%-44s %9lld %8.2f%% %11.1f %11.1f %8.2f %8.2f", text.c_str(),
                  static_cast<long long>(n), 100 * sp, ms, dense_ms, dense_ms / ms, ideal);
      nlohmann::json row = {{"pattern", text},      {"seq_len", n},
                            {"sparsity", sp},       {"fwd_ms", ms},
                            {"dense_fwd_ms_scaled", dense_ms}, {"speedup", dense_ms / ms},
                            {"ideal", ideal},       {"speedup_over_ideal", dense_ms / ms / ideal}};
      if (bwd) {
        auto gr = aligned_floats(sz, "g"), dq = aligned_floats(sz, "dq"), dk = aligned_floats(sz, "dk"),
             dv = aligned_floats(sz, "dv");
        fill(gr.get(), sz, 4);
        const double bms = time_ms([&] {
          plan.backward(q.get(), k.get(), v.get(), o.get(), lse.get(), gr.get(), dq.get(), dk.get(), dv.get());
        }, iters);
        const double dense_b = dense_bwd_ms * scale * scale;
        std::printf(" %11.1f %8.2f", bms, dense_b / bms);
        row["bwd_ms"] = bms;
        row["bwd_speedup"] = dense_b / bms;
      }
      std::printf("\n");
      std::fflush(stdout);
      rows.push_back(row);
      }
  std::printf("\n* dense time measured at N=%lld and scaled by (N/%lld)^2\n",
              static_cast<long long>(dense_n), static_cast<long long>(dense_n));
  nlohmann::json j = {{"bench", "sparse"}, {"commit", vm["commit"].as<std::string>()},
                      {"threads", threads}, {"heads", H}, {"head_dim", D}, {"block_size", bs},
                      {"dense_n", dense_n}, {"dense_fwd_ms", dense_fwd_ms}, {"rows", rows}};
  if (bwd) j["dense_bwd_ms"] = dense_bwd_ms;
  std::cout << j.dump() << "\n";
  return 0;
}

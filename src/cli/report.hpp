// What a run measured, and how it is shown: a readable table for people and, with --json,
// one JSON object on the last stdout line for machines.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/config.hpp"
#include "ringattn/stats.hpp"

namespace ringattn::cli {

struct CheckResult {
  std::string tensor;  // "out", "lse", "dq", "dk", "dv"
  double rel_error = 0;
};

// One rank's figures for one pass (forward or backward), from the last timed iteration.
struct RankFigures {
  double compute_ms = 0, comm_ms = 0, exposed_ms = 0;
  int64_t bytes_sent = 0;
};

struct RunReport {
  AttentionConfig cfg;
  std::string device = "cpu";
  std::string device_detail;
  bool emulated_device = false;  // timings then measure the emulator, not a GPU
  int threads = 1;
  int world_size = 1;
  int iters = 0;
  double attended_pairs = 0;
  double fwd_ms = 0;
  std::optional<double> bwd_ms;
  std::size_t workspace_bytes = 0;
  std::size_t workspace_bytes_per_thread = 0;
  std::size_t peak_bytes = 0;
  std::size_t peak_rss_bytes = 0;
  std::size_t bytes_sent = 0;         // forward K/V payload, max over ranks
  std::size_t bytes_sent_min = 0;     // the computed minimum for the config, max over ranks
  int ulysses = 1;                    // --ulysses U (Ulysses x ring when > 1)
  bool deterministic = false;         // --deterministic
  // Of a Ulysses job's forward bytes: the all-to-alls' and the ring's, each max over ranks,
  // with their computed minima.
  std::size_t bytes_sent_a2a = 0, bytes_sent_a2a_min = 0;
  std::size_t bytes_sent_ring = 0, bytes_sent_ring_min = 0;
  std::string layout = "contiguous";  // how the sequence is split over ranks
  double imbalance = 1.0;             // max / mean attended pairs over ranks
  std::vector<RankFigures> fwd_ranks, bwd_ranks;  // per rank, world_size > 1 only
  std::string attention_note;                     // what --attention auto decided
  // Block-sparse runs.
  std::string pattern;   // canonical pattern text, or "mask FILE"
  double sparsity = -1;  // fraction of the dense run's block pairs skipped
  int peers = 0;         // most peers one rank exchanges with
  std::vector<CheckResult> checks;
  std::string check_mode;  // "full" or how rows were sampled
  double check_tolerance = 0;
  std::vector<std::string> outputs_written;
  std::string kernel = "cpu";              // cpu | native | cudnn
  std::string kernel_backward = "cpu";     // the backward's, where it ran one
  std::string dtype = "fp32";              // the precision the kernels read inputs in
  std::size_t device_peak_bytes = 0;       // cuda: device memory held at most
  std::size_t device_workspace_bytes = 0;  // cuda: the plan's part of it
  std::vector<std::string> notes;          // e.g. a kernel fallback
  std::optional<BlasInfo> blas;            // cpu: the BLAS and its threading in our regions

  double fwd_gflops() const;
  std::optional<double> bwd_gflops() const;
  bool check_passed() const;
};

void print_table(const RunReport& r, std::ostream& os);
void print_json(const RunReport& r, std::ostream& os);

}  // namespace ringattn::cli

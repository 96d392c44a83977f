// The run's --check against the float64 reference: whole tensors on rank 0 for problems the
// reference can take, or, for huge block-sparse runs, sampled rows on every rank (each
// fetching the K/V rows its samples attend, from the files or the synthetic generator).
#pragma once

#include <utility>
#include <vector>

#include "cli/options.hpp"
#include "cli/report.hpp"
#include "ringattn/ringattn.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn::cli {

// The tolerance of the relative Frobenius error: the CPU's, or the device dtype's.
double check_tolerance(const Engine& engine);

// Throws InputError naming --check when the float64 reference would take minutes.
void check_reference_fits(const Engine& engine);

// Whether a block-sparse --check samples rows (huge problems) instead of comparing all.
bool samples_rows(const Engine& engine);

// The sampled check on this rank's shard (forward only); {out, lse} errors, max over ranks.
std::pair<double, double> sampled_check(const RunOptions& opts, Comm& comm, const Engine& engine,
                                        const HostTensor& q, const HostTensor& out,
                                        const HostTensor& lse, const std::vector<float>& sinks);

// Whole tensors (rank 0): the results against the float64 reference of the inputs.
struct WholeTensors {
  const float *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  const float *out = nullptr, *lse = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const float *sinks = nullptr, *dsinks = nullptr;  // [H], with --sinks
};
std::vector<CheckResult> full_check(const Engine& engine, const WholeTensors& t, bool backward);

// Rows per (batch, head) and rank that a sampled check compares.
inline constexpr int64_t kSampledRows = 16;

}  // namespace ringattn::cli

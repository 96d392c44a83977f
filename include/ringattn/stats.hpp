// What an Engine is and what it did (Engine::stats()): its kind, device, kernels, layout,
// workspace, bytes moved and timings, on this rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/types.hpp"

namespace ringattn {

// The BLAS under the CPU kernels (OpenBLAS, opened at run time) and how its calls run inside
// ringattn's parallel regions.
struct BlasInfo {
  std::string config;          // openblas_get_config(): version and build options
  std::string core;            // openblas_get_corename(): the kernels in use on this CPU
  std::string core_from;       // who chose them: OPENBLAS_CORETYPE, ringattn (CPUID), OpenBLAS
  std::string file;            // the shared object opened
  std::string threading;       // openblas_get_parallel(): "openmp", "pthreads" or "sequential"
  int threads_per_call = 1;    // threads one sgemm uses inside ringattn's parallel regions
  std::string small_gemm;      // what the kernels' tile products run on
  std::string vector_kernels;  // the softmax steps' variant and who chose it
  std::string summary() const;
};

// One pass's figures on this rank, from the last call.
struct PassStats {
  double compute_ms = 0;       // kernels, packing and unpacking
  double comm_ms = 0;          // from posting each exchange to its completion, summed
  double comm_exposed_ms = 0;  // time compute stood waiting for a transfer
  int64_t bytes_sent = 0;      // payload this rank sent
};

// What an engine is and what it did, on this rank (no collective: reduce across ranks
// yourself where you need a job-wide figure).
struct EngineStats {
  std::string engine;         // Plan, RingPlan, SparsePlan, CudaPlan, CudaRingPlan, CudaSparsePlan
  std::string device;         // "cpu" or "cuda"
  std::string device_detail;  // the GPU's name and kernel; empty on the CPU
  bool emulated_device = false;
  std::string kernel;           // cpu | native | cudnn | hopper: the forward's
  std::string kernel_backward;  // the backward's (cuDNN's may differ, or be refused)
  DeviceDType dtype = DeviceDType::fp32;
  int threads = 1;  // CPU threads per rank
  int world_size = 1;
  std::string layout;    // contiguous | zigzag | balanced
  double imbalance = 1;  // max / mean attended pairs over ranks
  double attended_pairs = 0;
  std::size_t workspace_bytes = 0;
  std::size_t workspace_bytes_per_thread = 0;  // single-process CPU plan
  std::size_t device_workspace_bytes = 0;
  std::size_t device_peak_bytes = 0;  // ringattn's device memory high-water mark
  int64_t bytes_sent = 0;             // last forward's payload (the ring's, and the a2a's)
  int64_t bytes_sent_min = 0;         // the computed minimum for this rank, in the same dtype
  int ulysses = 1;                    // U of a Ulysses x ring job
  bool deterministic = false;         // JobSpec::deterministic
  int64_t bytes_sent_a2a = 0;         // of bytes_sent: the Ulysses all-to-alls
  int64_t bytes_sent_a2a_min = 0;     // and their computed minimum
  PassStats forward, backward;
  double comm_exposed_ms = 0;  // forward's, for convenience
  // Block-sparse jobs.
  std::string pattern;  // canonical pattern, or the mask's name
  double sparsity = -1;
  int peers = 0;
  std::string attention_note;      // what attention = auto decided
  std::vector<std::string> notes;  // fallbacks and choices worth printing once
  std::optional<BlasInfo> blas;    // CPU engines: the BLAS under the kernels
};

}  // namespace ringattn

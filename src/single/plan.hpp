// A Plan is built once from a validated AttentionConfig: it decides tiling, builds the
// schedule of subsequence tasks, and allocates every workspace the kernels need. forward()
// and backward() then allocate nothing: the schedule *is* the cached pattern, and the
// workspace is the memory pool. Internal: callers reach it through make_engine (ringattn.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/head_slice.hpp"
#include "ringattn/config.hpp"

namespace ringattn {

struct PlanOptions {
  int threads = 0;  // 0: OpenMP's default
  // Tile sizes in rows (0: chosen from the head dim). Tests use small tiles to exercise
  // tile boundaries; benchmarks to tune.
  int64_t q_tile = 0;
  int64_t k_tile = 0;
  HeadSlice heads = {};  // the job's heads the config computes (Ulysses); default: all
};

class Plan {
 public:
  Plan(const AttentionConfig& cfg, PlanOptions opts = {});
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;

  const AttentionConfig& config() const noexcept;
  int threads() const noexcept;

  // q, out: [B, N, H, D]; k, v: [B, N, HKV, D] (HKV = cfg.kv_heads, default H);
  // lse: [B, H, N]. All float32, C order. With cfg.layout bhnd, q, out, dout, dq are
  // [B, H, N, D] and k, v, dk, dv [B, HKV, N, D] (lse as above).
  void forward(const float* q, const float* k, const float* v, float* out, float* lse);

  // Gradients of sum(out * dout). `out` and `lse` must come from forward() on the same
  // inputs. dq: [B, N, H, D], dk, dv: [B, N, HKV, D] (bhnd: as above); they are overwritten.
  void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv);

  // Bytes the plan holds beyond the caller's tensors (per-thread tiles and schedule).
  std::size_t workspace_bytes() const noexcept;
  std::size_t workspace_bytes_per_thread() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn

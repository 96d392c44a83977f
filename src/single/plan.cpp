// The single-process engine behind Plan: validates the config, builds the schedule and the
// per-thread workspace once, then runs kernel passes for forward and backward without
// allocating.
#include "single/plan.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>

#include "kernels/cpu_flash.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/tensor.hpp"
#include "single/schedule.hpp"

namespace ringattn {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

struct Plan::Impl {
  AttentionConfig cfg;
  int threads = 1;
  kernels::TileConfig tiles;
  single::LocalSchedule schedule;
  std::size_t per_thread_floats = 0;
  std::unique_ptr<float[], AlignedFree> workspace;
};

Plan::Plan(const AttentionConfig& cfg, PlanOptions opts) : impl_(std::make_unique<Impl>()) {
  validate(cfg, opts.heads);
  impl_->cfg = cfg;
  impl_->threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
  if (opts.threads < 0) throw InputError("threads", "must be >= 0");
  if (opts.q_tile < 0 || opts.k_tile < 0) throw InputError("tiles", "must be >= 0 (0: automatic)");
  impl_->tiles = single::choose_tiles(cfg.shape.head_dim, opts.q_tile, opts.k_tile);
  impl_->schedule = single::build_local_schedule(cfg, impl_->tiles, opts.heads);
  impl_->per_thread_floats =
      std::max(kernels::forward_workspace_floats(impl_->tiles, cfg.shape.head_dim,
                                                 cfg.effective_head_dim_v()),
               kernels::backward_workspace_floats(impl_->tiles, cfg.shape.head_dim,
                                                  cfg.effective_head_dim_v()));
  impl_->workspace = aligned_floats(
      impl_->per_thread_floats * static_cast<std::size_t>(impl_->threads), "plan workspace");
}

Plan::~Plan() = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;

const AttentionConfig& Plan::config() const noexcept { return impl_->cfg; }
int Plan::threads() const noexcept { return impl_->threads; }

std::size_t Plan::workspace_bytes_per_thread() const noexcept {
  return impl_->per_thread_floats * sizeof(float);
}

std::size_t Plan::workspace_bytes() const noexcept {
  return workspace_bytes_per_thread() * static_cast<std::size_t>(impl_->threads) +
         single::schedule_bytes(impl_->schedule);
}

void Plan::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  const Impl& m = *impl_;
  const Shape4& s = m.cfg.shape;
  if (m.schedule.clear_outputs_first) {
    const auto n = static_cast<std::size_t>(m.cfg.out_shape().numel());
    const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
#pragma omp parallel for num_threads(m.threads) schedule(static)
    for (std::size_t i = 0; i < n; ++i) out[i] = 0.0f;
#pragma omp parallel for num_threads(m.threads) schedule(static)
    for (std::size_t i = 0; i < rows; ++i) lse[i] = kNegInf;
  }
  kernels::ForwardParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.head_dim = s.head_dim;
  p.head_dim_v = m.cfg.effective_head_dim_v();
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.softcap = static_cast<float>(m.cfg.softcap);
  p.causal = m.cfg.causal;
  for (const auto& pass : m.schedule.passes) {
    p.accumulate = pass.accumulate;
    p.out_scale = pass.out_scale;
    kernels::flash_forward(p, pass.tasks, pass.items, m.tiles, m.threads, m.workspace.get());
  }
}

void Plan::backward(const float* q, const float* k, const float* v, const float* out,
                    const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const Impl& m = *impl_;
  const Shape4& s = m.cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_k = static_cast<std::size_t>(m.cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(m.cfg.v_shape().numel());
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) dq[i] = 0.0f;
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (std::size_t i = 0; i < n_k; ++i) dk[i] = 0.0f;
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (std::size_t i = 0; i < n_v; ++i) dv[i] = 0.0f;
  kernels::BackwardParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.dout = dout;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.head_dim = s.head_dim;
  p.head_dim_v = m.cfg.effective_head_dim_v();
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.softcap = static_cast<float>(m.cfg.softcap);
  p.causal = m.cfg.causal;
  for (const auto& pass : m.schedule.passes) {
    p.out_scale = pass.out_scale;
    p.dout_scale = pass.out_scale;
    // One call per place in the K/V groups, in order: calls never share dK/dV rows.
    const std::span<const kernels::SubseqTask> tasks(pass.tasks);
    std::size_t begin = 0;
    for (const std::size_t end : pass.backward_ends) {
      kernels::flash_backward(p, tasks.subspan(begin, end - begin), m.tiles, m.threads,
                              m.workspace.get());
      begin = end;
    }
  }
}

}  // namespace ringattn

#include "plan_runner.hpp"

#include <limits>

#include "random.hpp"

namespace ringattn::testing {

Tensors random_tensors(const AttentionConfig& cfg, uint64_t seed) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  return {random_normal(n, seed + 1), random_normal(n_kv, seed + 2), random_normal(n_kv, seed + 3),
          random_normal(n, seed + 4)};
}

std::vector<float> PlanResult::all() const {
  std::vector<float> a = out;
  for (const auto* t : {&lse, &dq, &dk, &dv}) a.insert(a.end(), t->begin(), t->end());
  return a;
}

PlanResult run_plan(const AttentionConfig& cfg, const Tensors& in, PlanOptions opts) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto rows = static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  PlanResult r{std::vector<float>(n, nan), std::vector<float>(rows, nan),
               std::vector<float>(n, nan), std::vector<float>(n_kv, nan),
               std::vector<float>(n_kv, nan)};
  Plan plan(cfg, opts);
  plan.forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  plan.backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

}  // namespace ringattn::testing

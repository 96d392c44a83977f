#include "plan_runner.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "random.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn::testing {

std::vector<float> head_major_copy(const std::vector<float>& x, const Shape4& s) {
  std::vector<float> y(x.size());
  to_head_major(x.data(), s, y.data());
  return y;
}

std::vector<float> token_major_copy(const std::vector<float>& x, const Shape4& s) {
  std::vector<float> y(x.size());
  from_head_major(x.data(), s, y.data());
  return y;
}

Tensors random_tensors(const AttentionConfig& cfg, uint64_t seed) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());
  const auto n_out = static_cast<std::size_t>(cfg.out_shape().numel());
  return {random_normal(n, seed + 1), random_normal(n_kv, seed + 2), random_normal(n_v, seed + 3),
          random_normal(n_out, seed + 4)};
}

std::vector<float> PlanResult::all() const {
  std::vector<float> a = out;
  for (const auto* t : {&lse, &dq, &dk, &dv}) a.insert(a.end(), t->begin(), t->end());
  return a;
}

PlanResult run_plan(const AttentionConfig& cfg, const Tensors& in, PlanOptions opts) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());
  const auto n_out = static_cast<std::size_t>(cfg.out_shape().numel());
  const auto rows = static_cast<std::size_t>(cfg.shape.batch * cfg.shape.heads * cfg.shape.seq_len);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  PlanResult r{std::vector<float>(n_out, nan), std::vector<float>(rows, nan),
               std::vector<float>(n, nan), std::vector<float>(n_kv, nan),
               std::vector<float>(n_v, nan)};
  Plan plan(cfg, opts);
  plan.forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  plan.backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

void expect_matches_float64(const AttentionConfig& cfg, const Tensors& in, const PlanResult& got,
                            double tol) {
  const ReferenceForward ref = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients g =
      reference_backward(cfg, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  ASSERT_EQ(got.out.size(), ref.out.size());
  ASSERT_EQ(got.dv.size(), g.dv.size());
  EXPECT_LE(relative_error(got.out.data(), ref.out.data(), got.out.size()), tol);
  EXPECT_LE(relative_error(got.lse.data(), ref.lse.data(), got.lse.size()), tol);
  EXPECT_LE(relative_error(got.dq.data(), g.dq.data(), got.dq.size()), tol);
  ASSERT_EQ(got.dk.size(), g.dk.size());
  EXPECT_LE(relative_error(got.dk.data(), g.dk.data(), got.dk.size()), tol);
  EXPECT_LE(relative_error(got.dv.data(), g.dv.data(), got.dv.size()), tol);
}

void expect_same_bits_for_thread_counts(const AttentionConfig& cfg, const Tensors& in,
                                        std::initializer_list<int> threads) {
  const std::vector<float> first = run_plan(cfg, in, PlanOptions{1, 32, 64}).all();
  for (int t : threads) {
    const std::vector<float> again = run_plan(cfg, in, PlanOptions{t, 32, 64}).all();
    ASSERT_EQ(first.size(), again.size());
    EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)))
        << t << " threads";
  }
}

}  // namespace ringattn::testing

#include "ring_compare.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "golden.hpp"
#include "plan_runner.hpp"
#include "random.hpp"
#include "ring/ring_engine.hpp"
#include "ring/sharding.hpp"
#include "ringattn/reference.hpp"
#include "single/plan.hpp"

namespace ringattn::testing {

FullResult single_process(const AttentionConfig& cfg, const RingInputs& in) {
  const Shape4 s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());
  const auto n_out = static_cast<std::size_t>(cfg.out_shape().numel());
  const auto rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_len);
  FullResult r{std::vector<float>(n_out), std::vector<float>(rows), std::vector<float>(n),
               std::vector<float>(n_kv), std::vector<float>(n_v)};
  Plan single(cfg, PlanOptions{1});
  single.forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  single.backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                  r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

bool same_bits(const FullResult& a, const FullResult& b) {
  for (auto [x, y] : {std::pair{&a.out, &b.out},
                      {&a.lse, &b.lse},
                      {&a.dq, &b.dq},
                      {&a.dk, &b.dk},
                      {&a.dv, &b.dv}})
    if (x->size() != y->size() || std::memcmp(x->data(), y->data(), x->size() * sizeof(float)) != 0)
      return false;
  return true;
}

FullResult float64_reference(const AttentionConfig& cfg, const RingInputs& in) {
  const ReferenceForward f = reference_forward(cfg, in.q.data(), in.k.data(), in.v.data());
  const ReferenceGradients g =
      reference_backward(cfg, in.q.data(), in.k.data(), in.v.data(), in.dout.data());
  auto rounded = [](const std::vector<double>& x) {
    return std::vector<float>(x.begin(), x.end());
  };
  return {rounded(f.out), rounded(f.lse), rounded(g.dq), rounded(g.dk), rounded(g.dv)};
}

void expect_ring_matches(const AttentionConfig& cfg, const RingInputs& in, const FullResult& want,
                         ring::Communicator& comm, const std::string& what, int threads) {
  using ring::Chunk;
  const Shape4 s = cfg.shape;
  ring::RingPlan ring(cfg, comm, PlanOptions{threads, 16, 32});
  const ring::ShardLayout& l = ring.layout();
  const int rank = comm.rank();
  const int64_t dv = cfg.effective_head_dim_v();
  const int64_t inner = s.heads * s.head_dim, out_inner = s.heads * dv;
  const int64_t kv_inner = cfg.effective_kv_heads() * s.head_dim;
  const int64_t v_inner = cfg.effective_kv_heads() * dv;
  const auto lrows = static_cast<std::size_t>(s.batch * s.heads * l.local_len);
  // This rank's rows of a [B, N, heads · width] tensor (`cols` = heads · width).
  auto shard_of = [&](const std::vector<float>& full, int64_t cols) {
    std::vector<float> local(static_cast<std::size_t>(s.batch * l.local_len * cols));
    ring::extract_rows(l, rank, s.batch, cols, full.data(), local.data());
    return local;
  };
  auto shard = [&](const std::vector<float>& full) { return shard_of(full, inner); };
  auto q = shard(in.q), k = shard_of(in.k, kv_inner), v = shard_of(in.v, v_inner);
  auto dout = shard_of(in.dout, out_inner);
  const auto ln = q.size(), ln_kv = k.size(), ln_v = v.size(), ln_out = dout.size();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lo(ln_out, nan), llse(lrows, nan), ldq(ln, nan), ldk(ln_kv, nan),
      ldv(ln_v, nan);
  // With TensorLayout::bhnd the ring reads and writes this rank's [B, H, N/P, D] shards: lay
  // the inputs out so, and the results back, to compare them with `want`'s [B, N, H, D] rows.
  const bool head_major = cfg.layout == TensorLayout::bhnd;
  const Shape4 local{s.batch, l.local_len, s.heads, s.head_dim};
  const Shape4 local_kv{s.batch, l.local_len, cfg.effective_kv_heads(), s.head_dim};
  const Shape4 local_v{s.batch, l.local_len, cfg.effective_kv_heads(), dv};
  const Shape4 local_out{s.batch, l.local_len, s.heads, dv};
  if (head_major) {
    q = head_major_copy(q, local), dout = head_major_copy(dout, local_out);
    k = head_major_copy(k, local_kv), v = head_major_copy(v, local_v);
  }
  ring.forward(q.data(), k.data(), v.data(), lo.data(), llse.data());
  ring.backward(q.data(), k.data(), v.data(), lo.data(), llse.data(), dout.data(), ldq.data(),
                ldk.data(), ldv.data());
  if (head_major) {
    lo = token_major_copy(lo, local_out), ldq = token_major_copy(ldq, local);
    ldk = token_major_copy(ldk, local_kv), ldv = token_major_copy(ldv, local_v);
  }

  // The single-process lse, sharded: lse is [B, H, N], positions last.
  std::vector<float> want_lse(lrows);
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(want.lse.data() + bh * s.seq_len + c.begin, c.length,
                  want_lse.data() + bh * l.local_len + c.local_begin);
  const double e_out = relative_error(lo.data(), shard_of(want.out, out_inner).data(), ln_out);
  const double e_lse = relative_error(llse.data(), want_lse.data(), lrows);
  const double e_dq = relative_error(ldq.data(), shard(want.dq).data(), ln);
  const double e_dk = relative_error(ldk.data(), shard_of(want.dk, kv_inner).data(), ln_kv);
  const double e_dv = relative_error(ldv.data(), shard_of(want.dv, v_inner).data(), ln_v);
  // Capped logits of the cap's size leave fp32 a few ulps of the cap in each score.
  const double tol = cfg.softcapped() ? 5e-5 : kRingTolerance;
  EXPECT_LE(e_out, tol) << what << " rank " << rank;
  EXPECT_LE(e_lse, tol) << what << " rank " << rank;
  EXPECT_LE(e_dq, tol) << what << " rank " << rank;
  EXPECT_LE(e_dk, tol) << what << " rank " << rank;
  EXPECT_LE(e_dv, tol) << what << " rank " << rank;
  if (rank == 0)
    std::printf("  %s P=%d: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e, sent %lld bytes\n",
                what.c_str(), comm.size(), e_out, e_lse, e_dq, e_dk, e_dv,
                static_cast<long long>(ring.last_forward().bytes_sent));
  // Forward traffic equals the independent minimum; the backward moves K/V again and
  // returns as many gradient bytes.
  const int64_t minimum = ring::minimum_bytes_sent(cfg, l, rank);
  EXPECT_EQ(ring.last_forward().bytes_sent, minimum) << what << " rank " << rank;
  EXPECT_EQ(ring.schedule().bytes_sent, minimum) << what << " rank " << rank;
}

std::vector<std::string> ring_golden_cases() {
  auto g = golden_case_names("grouped");
  auto m = golden_case_names("mixture");
  g.insert(g.end(), m.begin(), m.end());
  return g;
}

std::vector<RandomRingCase> random_ring_cases() {
  return {
      {"dense_D64", {2, 240, 3, 64}, AttentionKind::dense, Combine::grouped, {}, {}},
      {"grouped_straddling",
       {1, 240, 5, 16},
       AttentionKind::dilated,
       Combine::grouped,
       {16, 48, 240},
       {1, 3, 7}},
      {"mixture_straddling",
       {1, 240, 4, 24},
       AttentionKind::dilated,
       Combine::mixture,
       {40, 80, 240},
       {2, 3, 5}},
      {"grouped_D128_bigdil",
       {1, 240, 2, 128},
       AttentionKind::dilated,
       Combine::grouped,
       {120, 240},
       {1, 300}},
  };
}

std::vector<RandomRingCase> gqa_ring_cases() {
  using A = AttentionKind;
  using C = Combine;
  return {
      {"gqa_dense_mqa", {2, 240, 4, 32}, A::dense, C::grouped, {}, {}, 1},
      {"gqa_dense_half", {1, 240, 6, 16}, A::dense, C::grouped, {}, {}, 3},
      // 3 pattern groups of 2 heads over 2 K/V heads of 3: K/V head 0 serves two patterns
      {"gqa_grouped_straddling",
       {1, 240, 6, 16},
       A::dilated,
       C::grouped,
       {16, 48, 240},
       {1, 3, 7},
       2},
      // the query heads of the one K/V head select different rows (mixture offsets)
      {"gqa_mixture_mqa", {1, 240, 4, 24}, A::dilated, C::mixture, {40, 80, 240}, {2, 3, 5}, 1},
      {"gqa_mixture_half", {1, 240, 4, 16}, A::dilated, C::mixture, {80, 240}, {1, 4}, 2},
  };
}

std::vector<RandomRingCase> window_ring_cases() {
  using A = AttentionKind;
  using C = Combine;
  return {
      {"window_0", {1, 240, 2, 16}, A::dense, C::grouped, {}, {}, 0, 0, -1},
      {"window_7", {2, 240, 2, 16}, A::dense, C::grouped, {}, {}, 0, 7, -1},
      {"window_70_gqa", {1, 240, 4, 16}, A::dense, C::grouped, {}, {}, 2, 70, -1},
      {"window_500_mqa", {1, 240, 4, 16}, A::dense, C::grouped, {}, {}, 1, 500, -1},
      {"window_3_90", {1, 240, 2, 16}, A::dense, C::grouped, {}, {}, 0, 3, 90},
      {"window_45_0", {1, 240, 2, 16}, A::dense, C::grouped, {}, {}, 0, 45, 0},
  };
}

std::vector<RandomRingCase> packed_ring_cases() {
  using A = AttentionKind;
  using C = Combine;
  return {
      {"packed_mixed",
       {1, 240, 2, 16},
       A::dense,
       C::grouped,
       {},
       {},
       0,
       -1,
       -1,
       {1, 37, 150, 2, 50}},
      {"packed_gqa_b2",
       {2, 240, 4, 16},
       A::dense,
       C::grouped,
       {},
       {},
       2,
       -1,
       -1,
       {100, 1, 1, 80, 58}},
      {"packed_window_mqa", {1, 240, 4, 16}, A::dense, C::grouped, {}, {}, 1, 9, -1, {70, 3, 167}},
      {"packed_window_3_40", {1, 240, 2, 16}, A::dense, C::grouped, {}, {}, 0, 3, 40, {120, 120}},
      {"packed_singletons",
       {1, 240, 2, 8},
       A::dense,
       C::grouped,
       {},
       {},
       0,
       -1,
       -1,
       std::vector<int64_t>(240, 1)},
      {"packed_n252", {1, 252, 2, 16}, A::dense, C::grouped, {}, {}, 2, -1, -1, {31, 200, 21}},
      {"unpacked_n252", {1, 252, 2, 16}, A::dense, C::grouped, {}, {}, 0, -1, -1, {}},
  };
}

AttentionConfig config_of(const RandomRingCase& c, bool causal) {
  AttentionConfig cfg;
  cfg.shape = c.shape;
  if (c.kv_heads > 0) cfg.kv_heads = c.kv_heads;
  cfg.attention = c.attention;
  cfg.combine = c.combine;
  cfg.segments = c.segments;
  cfg.dilations = c.dilations;
  cfg.causal = causal;
  if (c.window_left >= 0) cfg.window_left = c.window_left;
  if (c.window_right >= 0 && !causal) cfg.window_right = c.window_right;
  if (!c.seqlens.empty()) {
    cfg.cu_seqlens = {0};
    for (int64_t len : c.seqlens) cfg.cu_seqlens.push_back(cfg.cu_seqlens.back() + len);
  }
  if (c.head_dim_v > 0) cfg.head_dim_v = c.head_dim_v;
  if (c.softcap > 0) {
    cfg.softcap = c.softcap;
    cfg.scale = c.softcap / std::sqrt(static_cast<double>(c.shape.head_dim));
  }
  return cfg;
}

std::vector<RandomRingCase> mla_softcap_ring_cases() {
  using A = AttentionKind;
  using C = Combine;
  auto mla = [](RandomRingCase c, int64_t dv) {
    c.head_dim_v = dv;
    return c;
  };
  auto capped = [](RandomRingCase c, double cap) {
    c.softcap = cap;
    return c;
  };
  return {
      mla({"mla_192_128", {1, 240, 2, 192}, A::dense, C::grouped, {}, {}, 1}, 128),
      mla({"mla_64_32_window", {1, 240, 4, 64}, A::dense, C::grouped, {}, {}, 2, 50, 10}, 32),
      mla({"mla_40_24_packed", {2, 240, 2, 40}, A::dense, C::grouped, {}, {}, 0, -1, -1,
           {31, 150, 59}},
          24),
      mla({"mla_64_32_mixture", {1, 240, 4, 64}, A::dilated, C::mixture, {48, 240}, {2, 3}, 2},
          32),
      capped({"cap1_dense", {1, 240, 2, 64}, A::dense, C::grouped, {}, {}}, 1),
      capped({"cap30_window_gqa", {1, 240, 4, 64}, A::dense, C::grouped, {}, {}, 2, 60, 20}, 30),
      capped({"cap50_grouped", {1, 240, 3, 32}, A::dilated, C::grouped, {16, 48, 240}, {1, 3, 7}},
             50),
      capped(mla({"cap30_mla_40_24_packed", {1, 240, 2, 40}, A::dense, C::grouped, {}, {}, 1, -1,
                  -1, {100, 140}},
                 24),
             30),
      capped(mla({"cap30_mla_192_128_window",
                  {1, 240, 2, 192},
                  A::dense,
                  C::grouped,
                  {},
                  {},
                  2,
                  70,
                  0},
                 128),
             30),
  };
}

RingInputs random_inputs(const AttentionConfig& cfg) {
  const auto n = static_cast<std::size_t>(cfg.shape.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());
  const auto n_out = static_cast<std::size_t>(cfg.out_shape().numel());
  return {random_normal(n, 1), random_normal(n_kv, 2), random_normal(n_v, 3),
          random_normal(n_out, 4)};
}

}  // namespace ringattn::testing

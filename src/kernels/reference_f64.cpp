// The float64 reference for dense, grouped and mixture attention with any number of K/V
// heads, an optional sliding window and packed documents, and relative_error. Everything is built
// straight from the definitions (tests/data/golden/README.md), naively, and on purpose shares no
// pattern arithmetic with src/core/config.cpp: it is the check on it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/patterns.hpp"
#include "ringattn/reference.hpp"

namespace ringattn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One dilated pattern as a particular head uses it (the offset depends on the head).
struct HeadPattern {
  int64_t segment = 0;
  int64_t dilation = 1;
  int64_t offset = 0;
};

// Which patterns each head attends with, and the factor on the whole output.
struct HeadPlan {
  std::vector<std::vector<HeadPattern>> patterns_of_head;
  double output_weight = 1.0;  // grouped divides by the number of groups
};

// The reference may run on configurations nobody validated (tests build them by hand), so it
// guards against the ones that would divide by zero or index out of range.
void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("reference: " + what);
}

HeadPlan plan_heads(const AttentionConfig& cfg) {
  const Shape4& s = cfg.shape;
  require(s.batch > 0 && s.seq_len > 0 && s.heads > 0 && s.head_dim > 0,
          "every shape dimension must be positive");
  const int64_t kv_heads = cfg.kv_heads.value_or(s.heads);
  require(kv_heads > 0 && s.heads % kv_heads == 0, "kv_heads must be positive and divide heads");
  HeadPlan plan;
  plan.patterns_of_head.resize(s.heads);

  if (cfg.attention == AttentionKind::dense) {
    // Dense is the single pattern {N, 1, 0}: one segment, every position selected.
    for (auto& pats : plan.patterns_of_head) pats.push_back({s.seq_len, 1, 0});
    return plan;
  }

  require(!cfg.segments.empty() && cfg.segments.size() == cfg.dilations.size(),
          "dilated attention needs as many segments as dilations, at least one");
  for (std::size_t i = 0; i < cfg.segments.size(); ++i)
    require(cfg.segments[i] > 0 && cfg.dilations[i] > 0, "segments and dilations must be positive");
  const auto num_patterns = static_cast<int64_t>(cfg.segments.size());

  if (cfg.combine == Combine::grouped) {
    // Contiguous head groups: group i gets H / G heads, one more while i < H % G.
    for (int64_t i = 0; i < num_patterns; ++i) {
      const int64_t w = cfg.segments[i], r = cfg.dilations[i];
      const HeadRange g = group_heads(s.heads, num_patterns, i);
      for (int64_t h = g.first; h < g.first + g.count; ++h)
        plan.patterns_of_head[h].push_back({w, r, i % r});
    }
    plan.output_weight = 1.0 / static_cast<double>(num_patterns);
  } else {
    // Mixture: every head uses every pattern, offset by its own head index.
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < num_patterns; ++i) {
        const int64_t w = cfg.segments[i], r = cfg.dilations[i];
        plan.patterns_of_head[h].push_back({w, r, h % r});
      }
  }
  return plan;
}

bool selects(const HeadPattern& pat, int64_t position) {
  return (position % pat.segment) % pat.dilation == pat.offset;
}

// How many of a head's patterns let query p see key t: the multiplicity of t in p's multiset
// of keys (mixture counts a key that two patterns select twice; grouped is 0 or 1).
// The sliding window (when cfg has one) also has its say: t in [p - L, p + R], R = L unless
// given (causal already keeps t <= p), and so do packed documents: p and t must lie in one.
int64_t multiplicity(const std::vector<HeadPattern>& patterns, const AttentionConfig& cfg,
                     int64_t p, int64_t t) {
  if (cfg.causal && t > p) return 0;
  if (cfg.packed()) {
    const auto& cu = cfg.cu_seqlens;
    if (std::upper_bound(cu.begin(), cu.end(), p) != std::upper_bound(cu.begin(), cu.end(), t))
      return 0;
  }
  if (cfg.window_left) {
    const int64_t left = *cfg.window_left, right = cfg.window_right.value_or(left);
    require(left >= 0 && right >= 0, "window reaches must be >= 0");
    if (p - t > left || t - p > right) return 0;
  }
  int64_t count = 0;
  for (const auto& pat : patterns)
    if (selects(pat, p) && selects(pat, t) && p / pat.segment == t / pat.segment) ++count;
  return count;
}

// Offsets into [B, N, H, D] rows and [B, H, N] lse.
struct Layout {
  int64_t seq_len, heads, head_dim;
  std::size_t row(int64_t b, int64_t p, int64_t h) const {
    return static_cast<std::size_t>(((b * seq_len + p) * heads + h) * head_dim);
  }
  std::size_t lse(int64_t b, int64_t h, int64_t p) const {
    return static_cast<std::size_t>((b * heads + h) * seq_len + p);
  }
};

double dot(const float* a, const float* b, int64_t n) {
  double sum = 0.0;
  for (int64_t d = 0; d < n; ++d) sum += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return sum;
}

// One query row's softmax over its multiset of keys.
struct RowSoftmax {
  std::vector<int64_t> keys;
  std::vector<double> prob;  // multiplicity * exp(score - lse); sums to 1
  // d(capped score)/d(score): 1 - tanh²(score / softcap) with soft-capping, else 1.
  std::vector<double> cap_slope;
  double lse = -kInf;  // stays -inf when the row attends to nothing
};

struct Problem {
  const AttentionConfig& cfg;
  HeadPlan plan;
  Layout layout;     // q, dq: H heads
  Layout kv_layout;  // k, dk: HKV heads (grouped-query attention), H by default
  Layout out_layout;  // out, dout: H heads of head_dim_v
  Layout v_layout;    // v, dv: HKV heads of head_dim_v
  int64_t queries_per_kv;
  double scale;
  const float* q;
  const float* k;
  const float* sinks;  // [H] or null

  explicit Problem(const AttentionConfig& c, const float* q_in, const float* k_in,
                   const float* sinks_in)
      : cfg(c),
        plan(plan_heads(c)),
        layout{c.shape.seq_len, c.shape.heads, c.shape.head_dim},
        kv_layout{c.shape.seq_len, c.kv_heads.value_or(c.shape.heads), c.shape.head_dim},
        out_layout{c.shape.seq_len, c.shape.heads, c.head_dim_v.value_or(c.shape.head_dim)},
        v_layout{c.shape.seq_len, kv_layout.heads, out_layout.head_dim},
        queries_per_kv(c.shape.heads / kv_layout.heads),
        scale(c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.shape.head_dim)))),
        q(q_in),
        k(k_in),
        sinks(sinks_in) {
    require(!sinks || c.attention != AttentionKind::dilated,
            "attention sinks are defined for one softmax per row, not dilated attention");
  }

  // The sink's logit for head h (-inf: none), a term of the row's normaliser with no value.
  double sink(int64_t h) const { return sinks ? static_cast<double>(sinks[h]) : -kInf; }

  // Query head h reads K/V head h / (H / HKV): consecutive query heads share one.
  std::size_t kv_row(int64_t b, int64_t t, int64_t h) const {
    return kv_layout.row(b, t, h / queries_per_kv);
  }
  std::size_t v_row(int64_t b, int64_t t, int64_t h) const {
    return v_layout.row(b, t, h / queries_per_kv);
  }

  RowSoftmax row_softmax(int64_t b, int64_t h, int64_t p) const {
    const auto& patterns = plan.patterns_of_head[h];
    const float* q_row = q + layout.row(b, p, h);
    RowSoftmax row;
    std::vector<double> scores, counts;
    double max_score = -kInf;
    for (int64_t t = 0; t < cfg.shape.seq_len; ++t) {
      const int64_t m = multiplicity(patterns, cfg, p, t);
      if (m == 0) continue;
      double score = scale * dot(q_row, k + kv_row(b, t, h), cfg.shape.head_dim);
      double slope = 1.0;
      if (cfg.softcap > 0) {  // s <- c tanh(s / c), before the mask and the softmax
        const double th = std::tanh(score / cfg.softcap);
        score = cfg.softcap * th;
        slope = 1.0 - th * th;
      }
      row.keys.push_back(t);
      row.cap_slope.push_back(slope);
      scores.push_back(score);
      counts.push_back(static_cast<double>(m));
      max_score = std::max(max_score, score);
    }
    const double sink_score = sink(h);
    max_score = std::max(max_score, sink_score);
    if (max_score == -kInf) return row;  // no key and no sink
    // Shift by the row maximum so exp cannot overflow.
    double sum = sink_score == -kInf ? 0.0 : std::exp(sink_score - max_score);
    for (std::size_t i = 0; i < scores.size(); ++i)
      sum += counts[i] * std::exp(scores[i] - max_score);
    row.lse = max_score + std::log(sum);
    row.prob.resize(scores.size());
    for (std::size_t i = 0; i < scores.size(); ++i)
      row.prob[i] = counts[i] * std::exp(scores[i] - max_score) / sum;
    return row;
  }
};

template <typename Want>
double relative_error_impl(const float* got, const Want* want, std::size_t n) {
  double diff_sq = 0.0, want_sq = 0.0, got_sq = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    // A NaN on either side means nothing can be vouched for.
    if (std::isnan(g) || std::isnan(w)) return kInf;
    if (std::isinf(w)) {
      // lse rows that attend to nothing: the answer must be exactly that infinity, and the
      // position says nothing about the size of the error elsewhere.
      if (g != w) return kInf;
      continue;
    }
    diff_sq += (g - w) * (g - w);
    want_sq += w * w;
    got_sq += g * g;
  }
  if (want_sq == 0.0) return std::sqrt(got_sq);
  return std::sqrt(diff_sq) / std::sqrt(want_sq);
}

}  // namespace

ReferenceForward reference_forward(const AttentionConfig& cfg, const float* q, const float* k,
                                   const float* v, const float* sinks) {
  const Problem prob(cfg, q, k, sinks);
  const Shape4& s = cfg.shape;
  ReferenceForward result;
  result.out.assign(static_cast<std::size_t>(cfg.out_shape().numel()), 0.0);
  result.lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seq_len), -kInf);

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t p = 0; p < s.seq_len; ++p) {
        const RowSoftmax row = prob.row_softmax(b, h, p);
        // lse is the head's own softmax normalizer: the grouped 1/G does not touch it.
        result.lse[prob.layout.lse(b, h, p)] = row.lse;
        double* out_row = result.out.data() + prob.out_layout.row(b, p, h);
        for (std::size_t i = 0; i < row.keys.size(); ++i) {
          const double weight = prob.plan.output_weight * row.prob[i];
          const float* v_row = v + prob.v_row(b, row.keys[i], h);
          for (int64_t d = 0; d < prob.out_layout.head_dim; ++d)
            out_row[d] += weight * static_cast<double>(v_row[d]);
        }
      }
  return result;
}

ReferenceGradients reference_backward(const AttentionConfig& cfg, const float* q, const float* k,
                                      const float* v, const float* dout, const float* sinks) {
  const Problem prob(cfg, q, k, sinks);
  const Shape4& s = cfg.shape;
  const int64_t dim = s.head_dim, dim_v = prob.out_layout.head_dim;
  ReferenceGradients grads;
  grads.dq.assign(static_cast<std::size_t>(s.numel()), 0.0);
  // A K/V head's gradient sums over the query heads sharing it.
  grads.dk.assign(static_cast<std::size_t>(cfg.kv_shape().numel()), 0.0);
  grads.dv.assign(static_cast<std::size_t>(cfg.v_shape().numel()), 0.0);
  if (sinks) grads.dsinks.assign(static_cast<std::size_t>(s.heads), 0.0);
  std::vector<double> d_head_out(static_cast<std::size_t>(dim_v));
  std::vector<double> d_prob;

  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t p = 0; p < s.seq_len; ++p) {
        const RowSoftmax row = prob.row_softmax(b, h, p);
        if (row.keys.empty()) continue;  // output is the constant 0: no gradient
        const std::size_t p_at = prob.layout.row(b, p, h);
        const std::size_t o_at = prob.out_layout.row(b, p, h);
        // The head's softmax output is scaled by the output weight (1/G for grouped) before
        // it reaches the loss, so its upstream gradient is scaled the same way.
        for (int64_t d = 0; d < dim_v; ++d)
          d_head_out[d] = prob.plan.output_weight * static_cast<double>(dout[o_at + d]);

        // dP_t = dO . v_t, then the softmax Jacobian dS = P (dP - sum(P dP)). The multiplicity
        // already sits inside P, which is exactly the sum over the key's copies.
        d_prob.assign(row.keys.size(), 0.0);
        double row_dot = 0.0;
        for (std::size_t i = 0; i < row.keys.size(); ++i) {
          const float* v_row = v + prob.v_row(b, row.keys[i], h);
          double acc = 0.0;
          for (int64_t d = 0; d < dim_v; ++d)
            acc += d_head_out[d] * static_cast<double>(v_row[d]);
          d_prob[i] = acc;
          row_dot += row.prob[i] * acc;
        }
        // The sink is one more softmax entry whose value is 0: dP_sink = 0, so its score's
        // gradient is P_sink (0 - row_dot).
        if (sinks) grads.dsinks[h] -= std::exp(prob.sink(h) - row.lse) * row_dot;
        for (std::size_t i = 0; i < row.keys.size(); ++i) {
          const std::size_t t_at = prob.kv_row(b, row.keys[i], h);
          const std::size_t tv_at = prob.v_row(b, row.keys[i], h);
          // Through the cap (its slope) to the scaled score, then to q and k.
          const double d_score = row.prob[i] * (d_prob[i] - row_dot) * row.cap_slope[i];
          for (int64_t d = 0; d < dim; ++d) {
            grads.dq[p_at + d] += prob.scale * d_score * static_cast<double>(k[t_at + d]);
            grads.dk[t_at + d] += prob.scale * d_score * static_cast<double>(q[p_at + d]);
          }
          for (int64_t d = 0; d < dim_v; ++d) grads.dv[tv_at + d] += row.prob[i] * d_head_out[d];
        }
      }
  return grads;
}

double relative_error(const float* got, const double* want, std::size_t n) {
  return relative_error_impl(got, want, n);
}

double relative_error(const float* got, const float* want, std::size_t n) {
  return relative_error_impl(got, want, n);
}

}  // namespace ringattn

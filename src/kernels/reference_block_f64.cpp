// The float64 reference for block-sparse attention, straight from the definition: for each
// query row, the allowed keys are every position of every listed key block (and t <= p when
// causal); one softmax over them. Naive on purpose: no tiling, no lists shared with the fast
// path (the mask comes from the caller's callback).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "ringattn/reference.hpp"

namespace ringattn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double scale_of(const BlockReferenceProblem& pb) {
  return pb.scale > 0 ? pb.scale : 1.0 / std::sqrt(static_cast<double>(pb.shape.head_dim));
}

std::vector<int64_t> allowed_keys(const BlockReferenceProblem& pb, int64_t h, int64_t p) {
  const int64_t bs = pb.block_size, n = pb.shape.seq_len;
  if (bs <= 0 || n % bs != 0) throw std::invalid_argument("reference: bad block size");
  std::vector<int64_t> blocks = pb.key_blocks(h, p / bs);
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  // The document of p: [doc_begin, doc_end).
  int64_t doc_begin = 0, doc_end = n;
  for (std::size_t d = 0; d + 1 < pb.cu_seqlens.size(); ++d)
    if (pb.cu_seqlens[d] <= p && p < pb.cu_seqlens[d + 1]) {
      doc_begin = pb.cu_seqlens[d];
      doc_end = pb.cu_seqlens[d + 1];
    }
  std::vector<int64_t> keys;
  for (int64_t kb : blocks)
    for (int64_t t = kb * bs; t < (kb + 1) * bs; ++t) {
      if (pb.causal && t > p) continue;
      if (t < doc_begin || t >= doc_end) continue;
      if (pb.window_left >= 0 && t < p - pb.window_left) continue;
      if (pb.window_right >= 0 && t > p + pb.window_right) continue;
      keys.push_back(t);
    }
  return keys;
}

int64_t kv_heads_of(const BlockReferenceProblem& pb) {
  const int64_t g = pb.kv_heads > 0 ? pb.kv_heads : pb.shape.heads;
  if (pb.shape.heads % g != 0) throw std::invalid_argument("reference: kv_heads must divide heads");
  return g;
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// Head h's attention sink (-inf: none), a term of every row's normaliser with no value.
double sink_of(const BlockReferenceProblem& pb, int64_t h) {
  return pb.sinks.empty() ? -kInf : static_cast<double>(pb.sinks[static_cast<std::size_t>(h)]);
}

int64_t head_dim_v_of(const BlockReferenceProblem& pb) {
  return pb.head_dim_v > 0 ? pb.head_dim_v : pb.shape.head_dim;
}

// Probabilities of one row of head h over `keys`; returns the lse (with the head's sink; -inf
// when there are no keys and no sink). `slope` (if given) gets d(capped score)/d(score) per key.
double softmax_row(const BlockReferenceProblem& pb, int64_t h, const float* q_row,
                   const std::vector<int64_t>& keys,
                   const std::function<const float*(int64_t)>& key_row, std::vector<double>& prob,
                   std::vector<double>* slope = nullptr) {
  const int64_t d = pb.shape.head_dim;
  const double sc = scale_of(pb);
  prob.resize(keys.size());
  if (slope) slope->assign(keys.size(), 1.0);
  const double sink = sink_of(pb, h);
  double mx = sink;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    prob[i] = sc * dot(q_row, key_row(keys[i]), d);
    if (pb.softcap > 0) {
      const double th = std::tanh(prob[i] / pb.softcap);
      prob[i] = pb.softcap * th;
      if (slope) (*slope)[i] = 1.0 - th * th;
    }
    mx = std::max(mx, prob[i]);
  }
  if (mx == -kInf) return -kInf;
  double sum = sink == -kInf ? 0.0 : std::exp(sink - mx);
  for (double& x : prob) sum += (x = std::exp(x - mx));
  for (double& x : prob) x /= sum;
  return mx + std::log(sum);
}

struct At {
  int64_t n, h, d;
  std::size_t row(int64_t b, int64_t p, int64_t head) const {
    return static_cast<std::size_t>(((b * n + p) * h + head) * d);
  }
};

}  // namespace

void reference_row_blocks(const BlockReferenceProblem& pb, int64_t h, int64_t p, const float* q_row,
                          const std::function<const float*(int64_t)>& key_row,
                          const std::function<const float*(int64_t)>& value_row, double* out,
                          double* lse) {
  const int64_t d = head_dim_v_of(pb);
  const std::vector<int64_t> keys = allowed_keys(pb, h, p);
  std::vector<double> prob;
  *lse = softmax_row(pb, h, q_row, keys, key_row, prob);
  std::fill(out, out + d, 0.0);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const float* v = value_row(keys[i]);
    for (int64_t c = 0; c < d; ++c) out[c] += prob[i] * static_cast<double>(v[c]);
  }
}

BlockReferenceProblem block_problem_of(const AttentionConfig& cfg) {
  BlockReferenceProblem pb;
  pb.shape = cfg.shape;
  pb.block_size = cfg.block_size;
  pb.causal = cfg.causal;
  pb.scale = cfg.effective_scale();
  pb.kv_heads = cfg.effective_kv_heads();
  pb.cu_seqlens = cfg.cu_seqlens;
  pb.head_dim_v = cfg.effective_head_dim_v();
  pb.softcap = cfg.softcap;
  if (cfg.windowed()) {
    const auto reach = cfg.window_reach();
    pb.window_left = reach.left;
    pb.window_right = reach.right;
  }
  return pb;
}

ReferenceForward reference_forward_blocks(const BlockReferenceProblem& pb, const float* q,
                                          const float* k, const float* v) {
  const Shape4& s = pb.shape;
  const At at{s.seq_len, s.heads, s.head_dim};
  const int64_t g = kv_heads_of(pb), per_kv = s.heads / g;
  const At kv{s.seq_len, g, s.head_dim};
  const int64_t dv = head_dim_v_of(pb);
  const At out_at{s.seq_len, s.heads, dv}, v_at{s.seq_len, g, dv};
  ReferenceForward r;
  r.out.assign(static_cast<std::size_t>(s.batch * s.seq_len * s.heads * dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seq_len), -kInf);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t p = 0; p < s.seq_len; ++p)
        reference_row_blocks(
            pb, h, p, q + at.row(b, p, h), [&](int64_t t) { return k + kv.row(b, t, h / per_kv); },
            [&](int64_t t) { return v + v_at.row(b, t, h / per_kv); },
            r.out.data() + out_at.row(b, p, h),
            &r.lse[static_cast<std::size_t>((b * s.heads + h) * s.seq_len + p)]);
  return r;
}

ReferenceGradients reference_backward_blocks(const BlockReferenceProblem& pb, const float* q,
                                             const float* k, const float* v, const float* dout) {
  const Shape4& s = pb.shape;
  const int64_t d = s.head_dim;
  const double sc = scale_of(pb);
  const At at{s.seq_len, s.heads, d};
  const int64_t n_kv = kv_heads_of(pb), per_kv = s.heads / n_kv;
  const At kv{s.seq_len, n_kv, d};
  const int64_t dv = head_dim_v_of(pb);
  const At out_at{s.seq_len, s.heads, dv}, v_at{s.seq_len, n_kv, dv};
  ReferenceGradients g;
  g.dq.assign(static_cast<std::size_t>(s.numel()), 0.0);
  g.dk.assign(static_cast<std::size_t>(s.batch * s.seq_len * n_kv * d), 0.0);
  g.dv.assign(static_cast<std::size_t>(s.batch * s.seq_len * n_kv * dv), 0.0);
  if (!pb.sinks.empty()) g.dsinks.assign(static_cast<std::size_t>(s.heads), 0.0);
  std::vector<double> prob, dprob, slope;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t p = 0; p < s.seq_len; ++p) {
        const std::vector<int64_t> keys = allowed_keys(pb, h, p);
        if (keys.empty()) continue;
        const std::size_t pa = at.row(b, p, h), oa = out_at.row(b, p, h);
        const double lse = softmax_row(
            pb, h, q + pa, keys, [&](int64_t t) { return k + kv.row(b, t, h / per_kv); }, prob,
            &slope);
        dprob.assign(keys.size(), 0.0);
        double row_dot = 0;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          dprob[i] = dot(dout + oa, v + v_at.row(b, keys[i], h / per_kv), dv);
          row_dot += prob[i] * dprob[i];
        }
        // The sink: one more softmax entry whose value is 0 (dP = 0).
        if (!g.dsinks.empty()) g.dsinks[h] -= std::exp(sink_of(pb, h) - lse) * row_dot;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          const std::size_t ta = kv.row(b, keys[i], h / per_kv);
          const std::size_t va = v_at.row(b, keys[i], h / per_kv);
          const double ds = prob[i] * (dprob[i] - row_dot) * slope[i];  // through the cap
          for (int64_t c = 0; c < d; ++c) {
            g.dq[pa + c] += sc * ds * static_cast<double>(k[ta + c]);
            g.dk[ta + c] += sc * ds * static_cast<double>(q[pa + c]);
          }
          for (int64_t c = 0; c < dv; ++c)
            g.dv[va + c] += prob[i] * static_cast<double>(dout[oa + c]);
        }
      }
  return g;
}

}  // namespace ringattn

// Host forms of the attention sinks' epilogue and gradient (attention_sinks.hpp).
#include "kernels/attention_sinks.hpp"

#include <omp.h>

#include <cmath>
#include <limits>

namespace ringattn::kernels {
namespace {

// Element (b, n, h, 0) of a [B, N, H, D] tensor in `layout`.
int64_t row_at(const SinkRows& s, int64_t b, int64_t n, int64_t h) {
  if (s.layout == TensorLayout::bhnd) return ((b * s.heads + h) * s.rows + n) * s.head_dim;
  return ((b * s.rows + n) * s.heads + h) * s.head_dim;
}

}  // namespace

void apply_sinks(const SinkRows& s, const float* sinks, float* out, float* lse, int threads) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t lines = s.batch * s.heads;
#pragma omp parallel for num_threads(threads > 0 ? threads : omp_get_max_threads()) schedule(static)
  for (int64_t bh = 0; bh < lines; ++bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads;
    const float sink = sinks[h];
    if (sink == kNegInf) continue;
    for (int64_t n = 0; n < s.rows; ++n) {
      float& l = lse[bh * s.rows + n];
      const double m = std::fmax(static_cast<double>(l), static_cast<double>(sink));
      const double merged = m + std::log(std::exp(l - m) + std::exp(sink - m));
      const auto factor = static_cast<float>(std::exp(l - merged));  // 0 for an empty row
      float* o = out + row_at(s, b, n, h);
      for (int64_t d = 0; d < s.head_dim; ++d) o[d] *= factor;
      l = static_cast<float>(merged);
    }
  }
}

void sink_gradient_terms(const SinkRows& s, const float* sinks, const float* out, const float* dout,
                         const float* lse, double* terms, int threads) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for num_threads(threads > 0 ? threads : omp_get_max_threads()) schedule(static)
  for (int64_t h = 0; h < s.heads; ++h) {
    const float sink = sinks[h];
    double sum = 0.0;
    if (sink != kNegInf) {
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t n = 0; n < s.rows; ++n) {
          const float l = lse[(b * s.heads + h) * s.rows + n];
          const int64_t at = row_at(s, b, n, h);
          double dot = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d)
            dot += static_cast<double>(out[at + d]) * static_cast<double>(dout[at + d]);
          sum += std::exp(static_cast<double>(sink) - static_cast<double>(l)) * dot;
        }
    }
    terms[h] = sum;
  }
}

}  // namespace ringattn::kernels

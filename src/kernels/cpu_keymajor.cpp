// Key-major softmax steps (see cpu_keymajor.hpp).
#include "kernels/cpu_keymajor.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu_math.hpp"
#include "kernels/merge_lse.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12 reports its own intrinsics' deliberately undefined pass-through operand
// (_mm512_undefined_ps) as maybe-uninitialized when they inline here (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

namespace ringattn::kernels::km {

// Queries of a tile past a key's reach get -inf scores; tiles every query sees whole (the
// common case) are left alone. Row i sees the tile's keys [b_i, e_i), both nondecreasing in i
// (reach bounds grow with the query, so the first and last rows decide the common case), so
// key j is hidden from the rows [0, a_j) with e_i <= j and [c_j, bq) with b_i > j, where a_j
// and c_j grow with j: each key column is masked by two contiguous fills.
void mask_outside_reach(float* s, int64_t ld, const SubseqTask& t, bool causal, int64_t i0,
                        int64_t bq, int64_t j0, int64_t bk) {
  const KeyRange first = row_keys_in_tile(t, causal, i0, j0, bk);
  const KeyRange last = row_keys_in_tile(t, causal, i0 + bq - 1, j0, bk);
  if (first.end == bk && last.begin == 0) return;
  int64_t a = 0, c = 0;
  for (int64_t j = 0; j < bk; ++j) {
    while (a < bq && row_keys_in_tile(t, causal, i0 + a, j0, bk).end <= j) ++a;
    while (c < bq && row_keys_in_tile(t, causal, i0 + c, j0, bk).begin <= j) ++c;
    float* col = s + j * ld;
    std::fill(col, col + a, kNegInf);
    std::fill(col + c, col + bq, kNegInf);
  }
}

void finish_rows(const float* acc, int64_t ld, const float* m, const float* l, int64_t bq,
                 int64_t d, float* out, int64_t out_stride, float* lse, int64_t lse_stride,
                 bool accumulate, float out_scale, float* row) {
  for (int64_t i = 0; i < bq; ++i) {
    float* orow = out + i * out_stride;
    float* row_lse_out = lse + i * lse_stride;
    const bool empty = l[i] == 0.0f;
    const float row_lse = empty ? kNegInf : m[i] + std::log(l[i]);
    const float inv = empty ? 0.0f : 1.0f / l[i];
    if (accumulate) {
      for (int64_t c = 0; c < d; ++c) row[c] = acc[c * ld + i] * inv;
      merge_lse_row(orow, row_lse_out, row, row_lse, d);
    } else {
      const float f = inv * out_scale;
      for (int64_t c = 0; c < d; ++c) orow[c] = acc[c * ld + i] * f;
      *row_lse_out = row_lse;
    }
  }
}

void prefetch_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, bool for_write) {
  constexpr int64_t kLine = 16;  // floats per 64-byte line
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * stride;
    for (int64_t c = 0; c < cols; c += kLine) {
      if (for_write)
        __builtin_prefetch(row + c, 1, 2);
      else
        __builtin_prefetch(row + c, 0, 2);
    }
  }
}

void pack_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
               float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * stride;
    float* out = dst + r * cols;
    if (factor == 1.0f) {
      std::copy_n(in, cols, out);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = factor * in[c];
    }
  }
}

void add_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * cols;
    float* out = dst + r * stride;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] += in[c];
  }
}

namespace generic {

void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
                    float* dst, int64_t ld) {
  for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * ld + rows, dst + (c + 1) * ld, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = src + i * stride;
    for (int64_t c = 0; c < cols; ++c) dst[c * ld + i] = factor * r[c];
  }
}

void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l, float* acc,
                    int64_t ld_acc, int64_t d) {
  for (int64_t g = 0; g < bqp; g += kLanes) {
    float mx[kLanes], use[kLanes], alpha[kLanes], sum[kLanes] = {};
    for (int64_t x = 0; x < kLanes; ++x) mx[x] = m[g + x];
    for (int64_t j = 0; j < bk; ++j) {
      const float* col = s + j * ld + g;
#pragma omp simd
      for (int64_t x = 0; x < kLanes; ++x) mx[x] = col[x] > mx[x] ? col[x] : mx[x];
    }
#pragma omp simd
    for (int64_t x = 0; x < kLanes; ++x) {
      use[x] = mx[x] == kNegInf ? 0.0f : mx[x];
      alpha[x] = exp_approx(m[g + x] - use[x]);
    }
    for (int64_t j = 0; j < bk; ++j) {
      float* col = s + j * ld + g;
#pragma omp simd
      for (int64_t x = 0; x < kLanes; ++x) {
        col[x] = exp_approx(col[x] - use[x]);
        sum[x] += col[x];
      }
    }
    bool rescale = false;
    for (int64_t x = 0; x < kLanes; ++x) {
      l[g + x] = l[g + x] * alpha[x] + sum[x];
      m[g + x] = mx[x];
      rescale |= alpha[x] != 1.0f;
    }
    if (!rescale) continue;
    for (int64_t c = 0; c < d; ++c) {
      float* a = acc + c * ld_acc + g;
#pragma omp simd
      for (int64_t x = 0; x < kLanes; ++x) a[x] *= alpha[x];
    }
  }
}

void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  for (int64_t j = 0; j < bk; ++j) {
    float* col = s + j * ld;
#pragma omp simd
    for (int64_t i = 0; i < bqp; ++i) col[i] = lse[i] == kNegInf ? 0.0f : exp_approx(col[i] - lse[i]);
  }
}

void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                     const float* dd, float factor) {
  for (int64_t j = 0; j < bk; ++j) {
    float* col = dp + j * ld;
    const float* pc = p + j * ld;
#pragma omp simd
    for (int64_t i = 0; i < bqp; ++i) col[i] = factor * pc[i] * (col[i] - dd[i]);
  }
}

}  // namespace generic

#if defined(__AVX512F__)

namespace {

// exp(x) for 16 floats, as exp_approx computes it (range reduction to [-ln2/2, ln2/2], the
// same degree-6 polynomial), with the 2^n scaling by vscalefps; exactly 0 below -87.3
// (including -inf). Only for x <= 88.3, which every softmax argument here is (s - max <= 0,
// s - lse <= 0 up to rounding), so exp_approx's clamps are not needed: lanes below -87.3
// (where -inf makes r NaN) are zeroed by the mask, and no lane is above.
inline __m512 exp16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.3888889e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333333e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1666667e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666667e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// 16 rows of 16 lanes transposed in registers: four rounds of swapping the off-diagonal
// h×h blocks (h = 8, 4, 2, 1), each one two-source permute per row.
inline void transpose16(__m512 r[16]) {
  for (int h = 8; h >= 1; h /= 2) {
    alignas(64) int32_t lo[16], hi[16];
    for (int c = 0; c < 16; ++c) {
      lo[c] = (c & h) ? 16 + (c - h) : c;  // row i: its own low lanes, row i+h's low lanes
      hi[c] = (c & h) ? 16 + c : c + h;    // row i+h: row i's high lanes, its own high lanes
    }
    const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
    for (int i = 0; i < 16; ++i) {
      if (i & h) continue;
      const __m512 a = r[i], b = r[i + h];
      r[i] = _mm512_permutex2var_ps(a, ilo, b);
      r[i + h] = _mm512_permutex2var_ps(a, ihi, b);
    }
  }
}

void transpose_rows_avx512(const float* src, int64_t stride, int64_t rows, int64_t cols,
                           float factor, float* dst, int64_t ld) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t i0 = 0; i0 < ld; i0 += kLanes) {
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      const int64_t nc = std::min<int64_t>(kLanes, cols - c0);
      const auto cmask = static_cast<__mmask16>((1u << nc) - 1u);
      __m512 r[16];
      for (int64_t x = 0; x < kLanes; ++x)
        r[x] = i0 + x < rows ? _mm512_maskz_loadu_ps(cmask, src + (i0 + x) * stride + c0)
                             : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t x = 0; x < nc; ++x)
        _mm512_storeu_ps(dst + (c0 + x) * ld + i0, _mm512_mul_ps(r[x], f));
    }
  }
}

void online_softmax_avx512(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l,
                           float* acc, int64_t ld_acc, int64_t d) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int64_t g = 0; g < bqp; g += kLanes) {
    const __m512 m_old = _mm512_loadu_ps(m + g);
    __m512 mx0 = m_old, mx1 = neg_inf;
    int64_t j = 0;
    for (; j + 1 < bk; j += 2) {
      mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(s + j * ld + g));
      mx1 = _mm512_max_ps(mx1, _mm512_loadu_ps(s + (j + 1) * ld + g));
    }
    if (j < bk) mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(s + j * ld + g));
    const __m512 m_new = _mm512_max_ps(mx0, mx1);
    const __mmask16 none = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ);
    const __m512 use = _mm512_mask_mov_ps(m_new, none, _mm512_setzero_ps());
    const __m512 alpha = exp16(_mm512_sub_ps(m_old, use));
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (j = 0; j + 1 < bk; j += 2) {
      float* c0 = s + j * ld + g;
      float* c1 = c0 + ld;
      const __m512 p0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(c0), use));
      const __m512 p1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(c1), use));
      _mm512_storeu_ps(c0, p0);
      _mm512_storeu_ps(c1, p1);
      sum0 = _mm512_add_ps(sum0, p0);
      sum1 = _mm512_add_ps(sum1, p1);
    }
    if (j < bk) {
      float* c0 = s + j * ld + g;
      const __m512 p0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(c0), use));
      _mm512_storeu_ps(c0, p0);
      sum0 = _mm512_add_ps(sum0, p0);
    }
    _mm512_storeu_ps(l + g, _mm512_fmadd_ps(_mm512_loadu_ps(l + g), alpha, _mm512_add_ps(sum0, sum1)));
    _mm512_storeu_ps(m + g, m_new);
    if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) == 0) continue;
    for (int64_t c = 0; c < d; ++c) {
      float* a = acc + c * ld_acc + g;
      _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), alpha));
    }
  }
}

void probabilities_avx512(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int64_t g = 0; g < bqp; g += kLanes) {
    const __m512 shift = _mm512_loadu_ps(lse + g);
    const __mmask16 live = _mm512_cmp_ps_mask(shift, neg_inf, _CMP_NEQ_UQ);
    for (int64_t j = 0; j < bk; ++j) {
      float* col = s + j * ld + g;
      _mm512_storeu_ps(col, _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_loadu_ps(col), shift))));
    }
  }
}

void scores_gradient_avx512(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                            const float* dd, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t g = 0; g < bqp; g += kLanes) {
    const __m512 dg = _mm512_loadu_ps(dd + g);
    for (int64_t j = 0; j < bk; ++j) {
      float* col = dp + j * ld + g;
      const __m512 pf = _mm512_mul_ps(f, _mm512_loadu_ps(p + j * ld + g));
      _mm512_storeu_ps(col, _mm512_mul_ps(pf, _mm512_sub_ps(_mm512_loadu_ps(col), dg)));
    }
  }
}

}  // namespace

void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
                    float* dst, int64_t ld) {
  transpose_rows_avx512(src, stride, rows, cols, factor, dst, ld);
}
void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l, float* acc,
                    int64_t ld_acc, int64_t d) {
  online_softmax_avx512(s, ld, bqp, bk, m, l, acc, ld_acc, d);
}
void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  probabilities_avx512(s, ld, bqp, bk, lse);
}
void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                     const float* dd, float factor) {
  scores_gradient_avx512(dp, p, ld, bqp, bk, dd, factor);
}
bool uses_avx512() { return true; }

#else

void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
                    float* dst, int64_t ld) {
  generic::transpose_rows(src, stride, rows, cols, factor, dst, ld);
}
void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l, float* acc,
                    int64_t ld_acc, int64_t d) {
  generic::online_softmax(s, ld, bqp, bk, m, l, acc, ld_acc, d);
}
void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  generic::probabilities(s, ld, bqp, bk, lse);
}
void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                     const float* dd, float factor) {
  generic::scores_gradient(dp, p, ld, bqp, bk, dd, factor);
}
bool uses_avx512() { return false; }

#endif

}  // namespace ringattn::kernels::km

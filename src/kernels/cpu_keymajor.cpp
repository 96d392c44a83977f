// Key-major softmax steps (see cpu_keymajor.hpp).
#include "kernels/cpu_keymajor.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_math.hpp"
#include "kernels/merge_lse.hpp"

// The AVX2 and AVX-512 forms are compiled with function target attributes, whatever the
// build's -march, and chosen at run time (cpu_isa.hpp).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RINGATTN_KM_X86 1
#include <immintrin.h>
#define KM_AVX512 __attribute__((target("avx512f,avx512cd,avx512bw,avx512dq,avx512vl,avx2,fma")))
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
#define KM_TARGET
#include "kernels/cpu_keymajor_steps.inc"
#undef KM_TARGET
}  // namespace generic

#if defined(RINGATTN_KM_X86)

namespace avx2 {
#define KM_TARGET __attribute__((target("avx2,fma,no-avx512f")))
#define KM_HAND_WRITTEN
#include "kernels/cpu_keymajor_steps.inc"
#undef KM_HAND_WRITTEN
#undef KM_TARGET

#define KM_AVX2 __attribute__((target("avx2,fma")))

// exp(x) for 8 floats, x <= 0 or -inf (every softmax argument here: s - max, s - lse): the
// same reduction and degree-6 polynomial as exp_lane, in fewer instructions, which is what
// the AVX2 softmax's time is (15 per 8 lanes, against 18 with two variable blends and
// constants reloaded in the compiler's form; AVX-512 has vrndscaleps and vscalefps): n is
// rounded by adding 1.5·2^23 (whose low mantissa bits then hold n, shifted into the
// exponent field for 2^n), and lanes below -87.3 (and -inf, where r is NaN) are zeroed by
// one AND at the end.
[[gnu::always_inline]] KM_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 · 2^23
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
  __m256 p = _mm256_set1_ps(1.3888889e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3333333e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1666667e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666667e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(t), 23), _mm256_set1_epi32(127 << 23));
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

// As the portable form, 16 queries as two ymm per key column, two key columns per step.
KM_AVX2 void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l,
                            float* acc, int64_t ld_acc, int64_t d) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf), zero = _mm256_setzero_ps();
  for (int64_t g = 0; g < bqp; g += kLanes) {
    const __m256 m_old0 = _mm256_loadu_ps(m + g), m_old1 = _mm256_loadu_ps(m + g + 8);
    __m256 mx0 = m_old0, mx1 = m_old1, my0 = neg_inf, my1 = neg_inf;
    int64_t j = 0;
    for (; j + 1 < bk; j += 2) {
      const float* c0 = s + j * ld + g;
      const float* c1 = c0 + ld;
      mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(c0));
      mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(c0 + 8));
      my0 = _mm256_max_ps(my0, _mm256_loadu_ps(c1));
      my1 = _mm256_max_ps(my1, _mm256_loadu_ps(c1 + 8));
    }
    if (j < bk) {
      mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(s + j * ld + g));
      mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(s + j * ld + g + 8));
    }
    const __m256 m_new0 = _mm256_max_ps(mx0, my0), m_new1 = _mm256_max_ps(mx1, my1);
    // A query with nothing visible yet keeps max -inf; its scores are -inf, exp gives 0.
    const __m256 use0 = _mm256_andnot_ps(_mm256_cmp_ps(m_new0, neg_inf, _CMP_EQ_OQ), m_new0);
    const __m256 use1 = _mm256_andnot_ps(_mm256_cmp_ps(m_new1, neg_inf, _CMP_EQ_OQ), m_new1);
    const __m256 alpha0 = exp8(_mm256_sub_ps(m_old0, use0));
    const __m256 alpha1 = exp8(_mm256_sub_ps(m_old1, use1));
    __m256 sa0 = zero, sa1 = zero, sb0 = zero, sb1 = zero;
    for (j = 0; j + 1 < bk; j += 2) {
      float* c0 = s + j * ld + g;
      float* c1 = c0 + ld;
      const __m256 p00 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c0), use0));
      const __m256 p01 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c0 + 8), use1));
      const __m256 p10 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c1), use0));
      const __m256 p11 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c1 + 8), use1));
      _mm256_storeu_ps(c0, p00);
      _mm256_storeu_ps(c0 + 8, p01);
      _mm256_storeu_ps(c1, p10);
      _mm256_storeu_ps(c1 + 8, p11);
      sa0 = _mm256_add_ps(sa0, p00);
      sa1 = _mm256_add_ps(sa1, p01);
      sb0 = _mm256_add_ps(sb0, p10);
      sb1 = _mm256_add_ps(sb1, p11);
    }
    if (j < bk) {
      float* c0 = s + j * ld + g;
      const __m256 p00 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c0), use0));
      const __m256 p01 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c0 + 8), use1));
      _mm256_storeu_ps(c0, p00);
      _mm256_storeu_ps(c0 + 8, p01);
      sa0 = _mm256_add_ps(sa0, p00);
      sa1 = _mm256_add_ps(sa1, p01);
    }
    _mm256_storeu_ps(l + g,
                     _mm256_fmadd_ps(_mm256_loadu_ps(l + g), alpha0, _mm256_add_ps(sa0, sb0)));
    _mm256_storeu_ps(l + g + 8,
                     _mm256_fmadd_ps(_mm256_loadu_ps(l + g + 8), alpha1, _mm256_add_ps(sa1, sb1)));
    _mm256_storeu_ps(m + g, m_new0);
    _mm256_storeu_ps(m + g + 8, m_new1);
    const __m256 one = _mm256_set1_ps(1.0f);
    const int changed = _mm256_movemask_ps(_mm256_cmp_ps(alpha0, one, _CMP_NEQ_UQ)) |
                        _mm256_movemask_ps(_mm256_cmp_ps(alpha1, one, _CMP_NEQ_UQ));
    if (changed == 0) continue;
    for (int64_t c = 0; c < d; ++c) {
      float* a = acc + c * ld_acc + g;
      _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_loadu_ps(a), alpha0));
      _mm256_storeu_ps(a + 8, _mm256_mul_ps(_mm256_loadu_ps(a + 8), alpha1));
    }
  }
}

KM_AVX2 void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  for (int64_t g = 0; g < bqp; g += 8) {
    const __m256 shift = _mm256_loadu_ps(lse + g);
    const __m256 live = _mm256_cmp_ps(shift, neg_inf, _CMP_NEQ_UQ);
    for (int64_t j = 0; j < bk; ++j) {
      float* col = s + j * ld + g;
      _mm256_storeu_ps(col, _mm256_and_ps(live, exp8(_mm256_sub_ps(_mm256_loadu_ps(col), shift))));
    }
  }
}

// The query-tile transpose in 8 × 8 blocks of ymm registers (unpack, shuffle, 128-bit
// permute), as the AVX-512 form does in 16 × 16 (the portable form stores one float at a
// time). Intrinsics need the plain "avx2,fma" target: GCC does not inline them into a
// function whose target removes what the build's -march has.
KM_AVX2 void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols,
                            float factor, float* dst, int64_t ld) {
  const __m256 f = _mm256_set1_ps(factor);
  alignas(32) static constexpr int32_t kLaneIndex[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const __m256i lane = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLaneIndex));
  for (int64_t i0 = 0; i0 < ld; i0 += 8) {
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      const int64_t nc = std::min<int64_t>(8, cols - c0);
      const __m256i cmask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nc)), lane);
      __m256 r[8];
      for (int64_t x = 0; x < 8; ++x)
        r[x] = i0 + x < rows ? _mm256_maskload_ps(src + (i0 + x) * stride + c0, cmask)
                             : _mm256_setzero_ps();
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      const __m256 col[8] = {
          _mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
          _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
          _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
          _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      for (int64_t x = 0; x < nc; ++x)
        _mm256_storeu_ps(dst + (c0 + x) * ld + i0, _mm256_mul_ps(col[x], f));
    }
  }
}
#undef KM_AVX2
}  // namespace avx2

namespace avx512 {

// The soft-cap steps, as the portable source compiled for AVX-512 (16 lanes).
#define KM_TARGET KM_AVX512
#define KM_CAP_ONLY
#include "kernels/cpu_keymajor_steps.inc"
#undef KM_CAP_ONLY
#undef KM_TARGET

// exp(x) for 16 floats, as exp_lane (cpu_keymajor_steps.inc) computes it (range reduction to
// [-ln2/2, ln2/2], the same degree-6 polynomial), with the 2^n scaling by vscalefps; exactly 0
// below -87.3 (including -inf). Only for x <= 88.3, which every softmax argument here is (s - max
// <= 0, s - lse <= 0 up to rounding), so exp_lane's clamps are not needed: lanes below -87.3 (where
// -inf makes r NaN) are zeroed by the mask, and no lane is above.
KM_AVX512 inline __m512 exp16(__m512 x) {
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
KM_AVX512 inline void transpose16(__m512 r[16]) {
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

KM_AVX512 void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols,
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

KM_AVX512 void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l,
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
    _mm512_storeu_ps(l + g,
                     _mm512_fmadd_ps(_mm512_loadu_ps(l + g), alpha, _mm512_add_ps(sum0, sum1)));
    _mm512_storeu_ps(m + g, m_new);
    if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) == 0) continue;
    for (int64_t c = 0; c < d; ++c) {
      float* a = acc + c * ld_acc + g;
      _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), alpha));
    }
  }
}

KM_AVX512 void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int64_t g = 0; g < bqp; g += kLanes) {
    const __m512 shift = _mm512_loadu_ps(lse + g);
    const __mmask16 live = _mm512_cmp_ps_mask(shift, neg_inf, _CMP_NEQ_UQ);
    for (int64_t j = 0; j < bk; ++j) {
      float* col = s + j * ld + g;
      _mm512_storeu_ps(
          col, _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_loadu_ps(col), shift))));
    }
  }
}

KM_AVX512 void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
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

}  // namespace avx512

#endif

// The plain names run the variant cpu_isa() names (one relaxed load per tile step).
#if defined(RINGATTN_KM_X86)
#define KM_DISPATCH(fn, ...)          \
  switch (cpu_isa()) {                \
    case CpuIsa::avx512:              \
      return avx512::fn(__VA_ARGS__); \
    case CpuIsa::avx2:                \
      return avx2::fn(__VA_ARGS__);   \
    case CpuIsa::portable:            \
      break;                          \
  }                                   \
  return generic::fn(__VA_ARGS__)
#else
#define KM_DISPATCH(fn, ...) return generic::fn(__VA_ARGS__)
#endif

void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
                    float* dst, int64_t ld) {
  KM_DISPATCH(transpose_rows, src, stride, rows, cols, factor, dst, ld);
}
void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l, float* acc,
                    int64_t ld_acc, int64_t d) {
  KM_DISPATCH(online_softmax, s, ld, bqp, bk, m, l, acc, ld_acc, d);
}
void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse) {
  KM_DISPATCH(probabilities, s, ld, bqp, bk, lse);
}
void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                     const float* dd, float factor) {
  KM_DISPATCH(scores_gradient, dp, p, ld, bqp, bk, dd, factor);
}

void soft_cap(float* s, int64_t ld, int64_t bqp, int64_t bk, float cap, float* slope) {
  KM_DISPATCH(soft_cap, s, ld, bqp, bk, cap, slope);
}
void cap_gradient(float* ds, const float* slope, int64_t ld, int64_t bqp, int64_t bk) {
  KM_DISPATCH(cap_gradient, ds, slope, ld, bqp, bk);
}

}  // namespace ringattn::kernels::km

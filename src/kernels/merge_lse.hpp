// The numerically stable merge of two partial attention results over disjoint key sets:
// given (o_a, L_a) and (o_b, L_b), L = log(e^L_a + e^L_b) and o = e^(L_a-L) o_a + e^(L_b-L) o_b.
// It is what the ring does after every step; the kernels use the row form too.
#pragma once

#include <cmath>
#include <cstdint>

namespace ringattn::kernels {

// Merges (o_b, l_b) into (o_a, l_a) for one row of `d` floats. -inf means "no keys".
inline void merge_lse_row(float* o_a, float* l_a, const float* o_b, float l_b, int64_t d) {
  const float la = *l_a;
  if (std::isinf(l_b) && l_b < 0) return;
  if (std::isinf(la) && la < 0) {
    for (int64_t i = 0; i < d; ++i) o_a[i] = o_b[i];
    *l_a = l_b;
    return;
  }
  const float mx = la > l_b ? la : l_b;
  const float wa = std::exp(la - mx), wb = std::exp(l_b - mx);
  const float inv = 1.0f / (wa + wb);
  const float ca = wa * inv, cb = wb * inv;
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) o_a[i] = ca * o_a[i] + cb * o_b[i];
  *l_a = mx + std::log(wa + wb);
}

// Merges `rows` partial results into an accumulator; rows are `d` floats apart in both the
// outputs (row strides given in floats) and lse strides in floats.
struct MergeRows {
  float* acc_out = nullptr;
  float* acc_lse = nullptr;
  const float* part_out = nullptr;
  const float* part_lse = nullptr;
  int64_t rows = 0, d = 0;
  int64_t acc_out_stride = 0, acc_lse_stride = 1;
  int64_t part_out_stride = 0, part_lse_stride = 1;
  // A rank's shard: out rows are [B, n, heads] (row r = (b·n + i)·heads + h) while lse is
  // [B, heads, n]. With lse_heads = heads and lse_rows = n, row r's lse is at
  // (b·heads + h)·n + i in both lse tensors and the lse strides are unused.
  int64_t lse_heads = 0, lse_rows = 0;
};

// Where row r's lse sits (see MergeRows::lse_heads).
inline int64_t shard_lse_index(int64_t r, int64_t heads, int64_t n) {
  const int64_t h = r % heads, i = (r / heads) % n, b = r / (heads * n);
  return (b * heads + h) * n + i;
}
void merge_lse(const MergeRows& m);

}  // namespace ringattn::kernels

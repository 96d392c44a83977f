// Score tiles held key-major for the CPU kernels: element (query i, key j) of a tile at
// s[j * ld + i], queries contiguous, ld a multiple of 16. The tile products (cpu_small_gemm)
// then read Q, K, V, dO in place as column-major operands and only the query side of a tile is
// ever transposed (once per query tile); and every softmax step is a vertical vector
// operation over 16 queries at a time (a row max is an element-wise max over key columns), with
// no horizontal reductions. Queries past a tile's real rows (padding up to ld) are computed
// like the others and never stored.
//
// Each function has a portable form (generic::, vectorised by the compiler) and, where the
// build targets AVX-512, an intrinsics form that the plain names call; a test compares the two.
#pragma once

#include <cstdint>

#include "kernels/cpu_flash.hpp"

namespace ringattn::kernels::km {

inline constexpr int64_t kLanes = 16;

// One online-softmax step over a tile of scores (already scaled; -inf where a key is outside
// a query's reach), for queries i < bqp (a multiple of 16): m_new = max(m[i], max_j s[j][i]);
// s[j][i] = exp(s[j][i] - m_new); l[i] = l[i]·exp(m[i] - m_new) + Σ_j s[j][i]; acc[c][i] (c < d,
// leading dimension ld_acc) scaled by the same exp(m[i] - m_new); m[i] = m_new. A query with
// nothing visible yet keeps m = -inf, l = 0 and gets s = 0 (exp(-inf) is exactly 0 here).
void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l, float* acc,
                    int64_t ld_acc, int64_t d);

// P = exp(s - lse[i]) in place; exactly 0 where s = -inf or lse[i] = -inf.
void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse);

// dS = factor · P ∘ (dP - dd[i]), in place over dp.
void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                     const float* dd, float factor);

// Sets to -inf the scores of queries [0, bq) (task rows i0..) for keys [0, bk) of the tile at
// j0 that are outside their reach (causality, window); tiles every query sees whole are left
// alone. Reach bounds grow with the query, so the first and last rows decide that.
void mask_outside_reach(float* s, int64_t ld, const SubseqTask& t, bool causal, int64_t i0,
                        int64_t bq, int64_t j0, int64_t bk);

// dst (cols × ld, column-major) = factor · src rows [0, rows) (row-major, `stride` apart,
// `cols` each); rows [rows, ld) of dst are zeroed (ld a multiple of 16, rows <= ld).
void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
                    float* dst, int64_t ld);

namespace generic {
void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
                    float* dst, int64_t ld);
void online_softmax(float* s, int64_t ld, int64_t bqp, int64_t bk, float* m, float* l, float* acc,
                    int64_t ld_acc, int64_t d);
void probabilities(float* s, int64_t ld, int64_t bqp, int64_t bk, const float* lse);
void scores_gradient(float* dp, const float* p, int64_t ld, int64_t bqp, int64_t bk,
                     const float* dd, float factor);
}  // namespace generic

// Whether the plain names run the AVX-512 forms.
bool uses_avx512();

}  // namespace ringattn::kernels::km

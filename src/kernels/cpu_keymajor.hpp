// Score tiles held key-major for the CPU kernels: element (query i, key j) of a tile at
// s[j * ld + i], queries contiguous, ld a multiple of 16. The tile products (cpu_small_gemm)
// then read Q, K, V, dO in place as column-major operands and only the query side of a tile is
// ever transposed (once per query tile); and every softmax step is a vertical vector
// operation over 16 queries at a time (a row max is an element-wise max over key columns), with
// no horizontal reductions. Queries past a tile's real rows (padding up to ld) are computed
// like the others and never stored.
//
// The softmax steps and the query-tile transpose have a portable form (generic::, vectorised
// by the compiler for the build's target), the same source compiled for AVX2 + FMA (avx2::)
// and an AVX-512 intrinsics form (avx512::); the plain names call the variant cpu_isa()
// names, chosen at run time from CPUID (kernels/cpu_isa.hpp). Tests force each variant the
// host executes and compare it with the portable form and with float64.
#pragma once

#include <algorithm>
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

// Logit soft-capping: s = cap · tanh(s / cap) in place (queries i < bqp, bk key columns), and
// with `slope` (laid out as s) its derivative 1 - tanh²(s / cap), which cap_gradient then
// multiplies into dS (ds *= slope).
void soft_cap(float* s, int64_t ld, int64_t bqp, int64_t bk, float cap, float* slope);
void cap_gradient(float* ds, const float* slope, int64_t ld, int64_t bqp, int64_t bk);

// Sets to -inf the scores of queries [0, bq) (task rows i0..) for keys [0, bk) of the tile at
// j0 that are outside their reach (causality, window); tiles every query sees whole are left
// alone. Reach bounds grow with the query, so the first and last rows decide that.
void mask_outside_reach(float* s, int64_t ld, const SubseqTask& t, bool causal, int64_t i0,
                        int64_t bq, int64_t j0, int64_t bk);

// A part of a (query tile, key tile) pair that holds visible pairs: tile rows [r0, r1) and
// tile keys [c0, c1). r0, r1 and c0 are multiples of 16 (r1 <= ld may cover padding rows),
// c1 is a multiple of 16 or the tile's end.
struct TilePart {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};

inline constexpr int64_t kPartRows = 64;

// Calls f(TilePart) for the parts of the pair (task rows i0.. of which bq are real, padded to
// ld; keys j0.., bk of them) that cover every visible (query, key) pair, so that the products
// skip what causality or a window hides: the rows that see some key of the tile; and when
// some of those do not see the whole tile (the diagonal, a window's edge), those rows in
// blocks of kPartRows, each with only the keys its rows see. Under causality with 256 × 128
// tiles this computes 40 960 of a diagonal query tile's 65 536 pairs instead of all (32 896
// are visible). Hidden pairs inside a part are still masked (mask_outside_reach); the pairs
// skipped contribute exact zeros, so the result is what the whole tile would give.
template <class F>
void for_each_part(const SubseqTask& t, bool causal, int64_t i0, int64_t bq, int64_t ld,
                   int64_t j0, int64_t bk, F&& f) {
  const KeyRange seeing = seeing_query_range(t, causal, j0, bk);
  const int64_t lo = clamp_index(seeing.begin - i0, 0, bq);
  const int64_t hi = clamp_index(seeing.end - i0, 0, bq);
  if (lo >= hi) return;
  const auto up16 = [](int64_t x) { return (x + 15) / 16 * 16; };
  const int64_t r0 = lo / 16 * 16, r1 = std::min(ld, up16(hi));
  const KeyRange first = row_keys_in_tile(t, causal, i0 + lo, j0, bk);
  const KeyRange last = row_keys_in_tile(t, causal, i0 + hi - 1, j0, bk);
  if (first.begin == 0 && first.end == bk && last.begin == 0 && last.end == bk) {
    f(TilePart{r0, r1, 0, bk});
    return;
  }
  for (int64_t b0 = r0; b0 < r1; b0 += kPartRows) {
    const int64_t b1 = std::min(r1, b0 + kPartRows);
    const int64_t real0 = std::max(b0, lo), real1 = std::min(b1, hi);
    if (real0 >= real1) continue;
    const int64_t c0 = row_keys_in_tile(t, causal, i0 + real0, j0, bk).begin / 16 * 16;
    const int64_t c1 = std::min(bk, up16(row_keys_in_tile(t, causal, i0 + real1 - 1, j0, bk).end));
    if (c0 < c1) f(TilePart{b0, b1, c0, c1});
  }
}

// Finishes a query tile from its transposed accumulator (acc[c·ld + i], c < d) and the online
// softmax's m and l: row i of `out` (rows `out_stride` apart) = out_scale · acc[·][i] / l[i]
// and lse[i · lse_stride] = m[i] + ln l[i]; or, with `accumulate`, the row (without
// out_scale) merged into the (out, lse) already there by log-sum-exp weights, `row` being d
// floats of scratch. A row that saw nothing (l = 0) gives zeros and lse -inf.
void finish_rows(const float* acc, int64_t ld, const float* m, const float* l, int64_t bq,
                 int64_t d, float* out, int64_t out_stride, float* lse, int64_t lse_stride,
                 bool accumulate, float out_scale, float* row);

// Rows of one head among H heads sit H·D floats apart, so a key tile's 128 rows of 256 bytes
// span 256 KiB in 128 pieces, which the hardware prefetchers do not stream (head-major
// [H, N, D] rows run faster); the kernels move such tiles themselves: prefetched (forward) or
// packed (backward), which is faster (docs/PERFORMANCE.md). Unstrided rows are used in place.
//
// Hints the cache to fetch `rows` rows of `cols` floats, `stride` apart (a tile the kernel
// reads next), into L2; `for_write` when the kernel will also write them.
void prefetch_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, bool for_write);

// Copies `rows` rows of `cols` floats, `stride` apart, to dst back to back (times `factor`).
void pack_rows(const float* src, int64_t stride, int64_t rows, int64_t cols, float factor,
               float* dst);

// dst rows (`stride` apart) += src rows (back to back), `rows` rows of `cols` floats.
void add_rows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t stride);

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
void soft_cap(float* s, int64_t ld, int64_t bqp, int64_t bk, float cap, float* slope);
void cap_gradient(float* ds, const float* slope, int64_t ld, int64_t bqp, int64_t bk);
}  // namespace generic

}  // namespace ringattn::kernels::km

// The CPU block-sparse kernels: the flash-attention forward and FA2-style backward of
// cpu_flash_*.cpp, walking lists of key spans (or, for dK/dV, query spans) instead of one
// contiguous key range. sgemm on strided views throughout; one score tile per thread.
#include "kernels/cpu_block_sparse.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_math.hpp"
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels {

namespace {

struct Scratch {
  float* s;    // q_tile × k_tile: scores / probabilities
  float* ds;   // q_tile × k_tile: dP, then dS
  float* acc;  // q_tile × D: output or dQ accumulator
  float* dk;   // k_tile × D
  float* dv;   // k_tile × D
  float* m;    // q_tile: running max, or lse
  float* l;    // q_tile: running sum, or delta
};

Scratch carve(float* base, const TileConfig& t, int64_t d) {
  const auto st = round_up16(static_cast<std::size_t>(t.q_tile * t.k_tile));
  const auto qd = round_up16(static_cast<std::size_t>(t.q_tile * d));
  const auto kd = round_up16(static_cast<std::size_t>(t.k_tile * d));
  const auto q1 = round_up16(static_cast<std::size_t>(t.q_tile));
  Scratch s{};
  s.s = base;
  s.ds = s.s + st;
  s.acc = s.ds + st;
  s.dk = s.acc + qd;
  s.dv = s.dk + kd;
  s.m = s.dv + kd;
  s.l = s.m + q1;
  return s;
}

int sz(int64_t v) { return static_cast<int>(v); }

// A span as the dense kernels' task view: causality and the window in the span's index
// units, so the key-range rules (cpu_flash.hpp) are the dense kernels' own.
SubseqTask view_of(const SparseParams& p, int64_t n_q, int64_t n_k, int64_t causal_offset) {
  SubseqTask t;
  t.n_q = n_q;
  t.n_k = n_k;
  t.causal_offset = causal_offset;
  t.window_left = p.window_left;
  t.window_right = p.window_right;
  return t;
}

// Sets P = exp(S - lse) row by row on a bq × bk tile (rows i0.., keys j0.. of `t`), zero
// outside each row's keys. Rows with lse = -inf attend nothing: zeros.
void probabilities(float* p, int64_t ld, int64_t bq, int64_t bk, const float* lse,
                   const SubseqTask& t, bool causal, int64_t i0, int64_t j0) {
  for (int64_t i = 0; i < bq; ++i) {
    float* row = p + i * ld;
    if (lse[i] == kNegInf) {
      std::fill(row, row + bk, 0.0f);
      continue;
    }
    const KeyRange r = row_keys_in_tile(t, causal, i0 + i, j0, bk);
    exp_shift_sum(row + r.begin, r.end - r.begin, lse[i]);
    std::fill(row, row + r.begin, 0.0f);
    std::fill(row + r.end, row + bk, 0.0f);
  }
}

void forward_tile(const SparseParams& p, const SparseQueryTile& t, std::span<const KeySpan> spans,
                  int64_t i0, const TileConfig& tc, const Scratch& w) {
  const int64_t d = p.head_dim, ld = tc.k_tile;
  const int64_t bq = std::min(tc.q_tile, t.n_q - i0);
  const float* q = p.q + t.q_row0 + i0 * p.q_stride;
  std::fill(w.m, w.m + bq, kNegInf);
  std::fill(w.l, w.l + bq, 0.0f);
  std::fill(w.acc, w.acc + bq * d, 0.0f);

  for (int64_t s = t.first_span; s < t.first_span + t.n_spans; ++s) {
    const KeySpan& sp = spans[static_cast<std::size_t>(s)];
    const SubseqTask view = view_of(p, t.n_q, sp.n_k, sp.causal_offset);
    const KeyRange keys = visible_key_range(view, p.causal, i0, bq);
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += tc.k_tile) {
      const int64_t bk = std::min(tc.k_tile, keys.end - j0);
      const float* k = p.k + sp.k_row0 + j0 * sp.k_stride;
      const float* v = p.v + sp.k_row0 + j0 * sp.k_stride;
      sgemm(CblasNoTrans, CblasTrans, sz(bq), sz(bk), sz(d), p.scale, q, sz(p.q_stride), k,
            sz(sp.k_stride), 0.0f, w.s, sz(ld));
      for (int64_t i = 0; i < bq; ++i) {
        float* srow = w.s + i * ld;
        // Keys of this tile outside [a, b) are in the row's future or outside its window.
        const KeyRange row = row_keys_in_tile(view, p.causal, i0 + i, j0, bk);
        const int64_t a = row.begin, b = row.end;
        const float m_new = std::max(w.m[i], max_of(srow + a, b - a));
        if (m_new == kNegInf) {
          std::fill(srow, srow + bk, 0.0f);
          continue;
        }
        const float alpha = exp_approx(w.m[i] - m_new);
        const float row_sum = exp_shift_sum(srow + a, b - a, m_new);
        std::fill(srow, srow + a, 0.0f);
        std::fill(srow + b, srow + bk, 0.0f);
        w.l[i] = w.l[i] * alpha + row_sum;
        w.m[i] = m_new;
        if (alpha != 1.0f) {
          float* arow = w.acc + i * d;
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) arow[c] *= alpha;
        }
      }
      sgemm(CblasNoTrans, CblasNoTrans, sz(bq), sz(d), sz(bk), 1.0f, w.s, sz(ld), v,
            sz(sp.k_stride), 1.0f, w.acc, sz(d));
    }
  }

  for (int64_t i = 0; i < bq; ++i) {
    float* arow = w.acc + i * d;
    float* orow = p.out + t.q_row0 + (i0 + i) * p.q_stride;
    float* lse = p.lse + t.lse0 + (i0 + i) * p.lse_stride;
    const bool empty = w.l[i] == 0.0f;
    const float row_lse = empty ? kNegInf : w.m[i] + std::log(w.l[i]);
    const float inv = empty ? 0.0f : 1.0f / w.l[i];
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) arow[c] *= inv;
    if (p.accumulate) {
      merge_lse_row(orow, lse, arow, row_lse, d);
    } else {
      std::copy(arow, arow + d, orow);
      *lse = row_lse;
    }
  }
}

// The backward's unit of work is a (query chunk, key chunk) pair: a query chunk is q_tile rows
// of a query piece on the grid from its first row, a key chunk k_tile rows of a key piece on
// the grid from its first row. The dQ pass, the dK/dV pass and the fused backward visit the
// same pairs (those pair_visible admits) with the same calls, and every dQ element receives
// its terms in ascending key order: the fused result is the split one, bit for bit.
bool pair_visible(const SubseqTask& view, bool causal, int64_t i0, int64_t bq, int64_t j0,
                  int64_t bk) {
  const KeyRange r = visible_key_range(view, causal, i0, bq);
  return r.begin < r.end && j0 < r.end && j0 + bk > r.begin;
}

// lse and delta of rows [i0, i0 + bq) of a piece into w.m and w.l; false when no row attends
// anything.
bool load_rows(const SparseParams& p, int64_t lse0, int64_t i0, int64_t bq, const Scratch& w) {
  bool any = false;
  for (int64_t i = 0; i < bq; ++i) {
    w.m[i] = p.lse[lse0 + (i0 + i) * p.lse_stride];
    w.l[i] = p.delta[lse0 + (i0 + i) * p.lse_stride];
    any |= w.m[i] != kNegInf;
  }
  return any;
}

// P (into w.s) and dS = P ∘ (dP − delta) (into w.ds) of one pair: S and dP, two products.
void p_and_ds(const SparseParams& p, const SubseqTask& view, const float* q, const float* dout,
              const float* k, const float* v, int ldk, int64_t i0, int64_t bq, int64_t j0,
              int64_t bk, const TileConfig& tc, const Scratch& w) {
  const int64_t d = p.head_dim, ld = tc.k_tile;
  const int ldq = sz(p.q_stride);
  sgemm(CblasNoTrans, CblasTrans, sz(bq), sz(bk), sz(d), p.scale, q, ldq, k, ldk, 0.0f, w.s,
        sz(ld));
  probabilities(w.s, ld, bq, bk, w.m, view, p.causal, i0, j0);
  sgemm(CblasNoTrans, CblasTrans, sz(bq), sz(bk), sz(d), 1.0f, dout, ldq, v, ldk, 0.0f, w.ds,
        sz(ld));
  for (int64_t i = 0; i < bq; ++i) {
    float* dsrow = w.ds + i * ld;
    const float* prow = w.s + i * ld;
    const float di = w.l[i];
#pragma omp simd
    for (int64_t j = 0; j < bk; ++j) dsrow[j] = prow[j] * (dsrow[j] - di);
  }
}

// dQ rows [i0, i0 + bq) of query piece `t` += scale · dS K over the piece's key spans (one per
// key tile, ascending): the split backward's dQ pass.
void dq_tile(const SparseParams& p, const SparseQueryTile& t, std::span<const KeySpan> spans,
             int64_t i0, const TileConfig& tc, const Scratch& w) {
  const int64_t d = p.head_dim, ld = tc.k_tile;
  const int64_t bq = std::min(tc.q_tile, t.n_q - i0);
  if (!load_rows(p, t.lse0, i0, bq, w)) return;
  const float* q = p.q + t.q_row0 + i0 * p.q_stride;
  const float* dout = p.dout + t.q_row0 + i0 * p.q_stride;
  float* dq = p.dq + t.q_row0 + i0 * p.q_stride;
  for (int64_t s = t.first_span; s < t.first_span + t.n_spans; ++s) {
    const KeySpan& sp = spans[static_cast<std::size_t>(s)];
    const SubseqTask view = view_of(p, t.n_q, sp.n_k, sp.causal_offset);
    const KeyRange keys = visible_key_range(view, p.causal, i0, bq);
    if (keys.begin >= keys.end) continue;
    for (int64_t j0 = keys.begin / tc.k_tile * tc.k_tile; j0 < keys.end; j0 += tc.k_tile) {
      const int64_t bk = std::min(tc.k_tile, sp.n_k - j0);
      const float* k = p.k + sp.k_row0 + j0 * sp.k_stride;
      const float* v = p.v + sp.k_row0 + j0 * sp.k_stride;
      const int ldk = sz(sp.k_stride);
      p_and_ds(p, view, q, dout, k, v, ldk, i0, bq, j0, bk, tc, w);
      sgemm(CblasNoTrans, CblasNoTrans, sz(bq), sz(d), sz(bk), p.scale, w.ds, sz(ld), k, ldk, 1.0f,
            dq, sz(p.q_stride));
    }
  }
}

// Key chunk [j0, j0 + bk) of key piece `t` against its query spans: dK, dV of the chunk (in
// scratch, then added to the tensors), and with `with_dq` also dQ of the query rows.
void key_chunk(const SparseParams& p, const SparseKeyTile& t, std::span<const QuerySpan> spans,
               int64_t j0, const TileConfig& tc, const Scratch& w, bool with_dq) {
  const int64_t d = p.head_dim, ld = tc.k_tile;
  const int64_t bk = std::min(tc.k_tile, t.n_k - j0);
  const int ldk = sz(t.k_stride), ldq = sz(p.q_stride);
  const float* k = p.k + t.k_row0 + j0 * t.k_stride;
  const float* v = p.v + t.k_row0 + j0 * t.k_stride;
  std::fill(w.dk, w.dk + bk * d, 0.0f);
  std::fill(w.dv, w.dv + bk * d, 0.0f);
  for (int64_t s = t.first_span; s < t.first_span + t.n_spans; ++s) {
    const QuerySpan& sp = spans[static_cast<std::size_t>(s)];
    const SubseqTask view = view_of(p, sp.n_q, t.n_k, sp.causal_offset);
    const KeyRange rows = seeing_query_range(view, p.causal, j0, bk);
    for (int64_t i0 = rows.begin / tc.q_tile * tc.q_tile; i0 < rows.end; i0 += tc.q_tile) {
      const int64_t bq = std::min(tc.q_tile, sp.n_q - i0);
      if (!pair_visible(view, p.causal, i0, bq, j0, bk) || !load_rows(p, sp.lse0, i0, bq, w))
        continue;
      const float* q = p.q + sp.q_row0 + i0 * p.q_stride;
      const float* dout = p.dout + sp.q_row0 + i0 * p.q_stride;
      p_and_ds(p, view, q, dout, k, v, ldk, i0, bq, j0, bk, tc, w);
      // dV += Pᵀ dO ; dK += scale · dSᵀ Q ; (fused) dQ += scale · dS K
      sgemm(CblasTrans, CblasNoTrans, sz(bk), sz(d), sz(bq), 1.0f, w.s, sz(ld), dout, ldq, 1.0f,
            w.dv, sz(d));
      sgemm(CblasTrans, CblasNoTrans, sz(bk), sz(d), sz(bq), p.scale, w.ds, sz(ld), q, ldq, 1.0f,
            w.dk, sz(d));
      if (with_dq)
        sgemm(CblasNoTrans, CblasNoTrans, sz(bq), sz(d), sz(bk), p.scale, w.ds, sz(ld), k, ldk,
              1.0f, p.dq + sp.q_row0 + i0 * p.q_stride, ldq);
    }
  }
  for (int64_t j = 0; j < bk; ++j) {
    float* dkrow = p.dk + t.k_row0 + (j0 + j) * t.k_stride;
    float* dvrow = p.dv + t.k_row0 + (j0 + j) * t.k_stride;
    const float* a = w.dk + j * d;
    const float* b = w.dv + j * d;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) {
      dkrow[c] += a[c];
      dvrow[c] += b[c];
    }
  }
}

template <typename Tile, typename Fn>
void run_tiles(std::span<const Tile> tiles, int64_t rows_per_tile_step, const TileConfig& tc,
               int64_t d, int threads, float* workspace, Fn&& fn) {
  const std::size_t per_thread = sparse_workspace_floats(tc, d);
  const auto n = static_cast<int64_t>(tiles.size());
  const BlasSingleThreadScope one_thread_per_sgemm;
#pragma omp parallel num_threads(threads)
  {
    const Scratch w =
        carve(workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread, tc, d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) fn(tiles[static_cast<std::size_t>(i)], rows_per_tile_step, w);
  }
}

}  // namespace

std::size_t sparse_workspace_floats(const TileConfig& t, int64_t head_dim) {
  return 2 * round_up16(static_cast<std::size_t>(t.q_tile * t.k_tile)) +
         round_up16(static_cast<std::size_t>(t.q_tile * head_dim)) +
         2 * round_up16(static_cast<std::size_t>(t.k_tile * head_dim)) +
         2 * round_up16(static_cast<std::size_t>(t.q_tile));
}

void sparse_forward(const SparseParams& p, std::span<const SparseQueryTile> tiles,
                    std::span<const KeySpan> spans, const TileConfig& tc, int threads,
                    float* workspace) {
  run_tiles(tiles, tc.q_tile, tc, p.head_dim, threads, workspace,
            [&](const SparseQueryTile& t, int64_t step, const Scratch& w) {
              for (int64_t i0 = 0; i0 < t.n_q; i0 += step) forward_tile(p, t, spans, i0, tc, w);
            });
}

void sparse_backward_dq(const SparseParams& p, std::span<const SparseQueryTile> tiles,
                        std::span<const KeySpan> spans, const TileConfig& tc, int threads,
                        float* workspace) {
  run_tiles(tiles, tc.q_tile, tc, p.head_dim, threads, workspace,
            [&](const SparseQueryTile& t, int64_t step, const Scratch& w) {
              for (int64_t i0 = 0; i0 < t.n_q; i0 += step) dq_tile(p, t, spans, i0, tc, w);
            });
}

void sparse_backward_dkdv(const SparseParams& p, std::span<const SparseKeyTile> tiles,
                          std::span<const QuerySpan> spans, const TileConfig& tc, int threads,
                          float* workspace) {
  run_tiles(tiles, tc.k_tile, tc, p.head_dim, threads, workspace,
            [&](const SparseKeyTile& t, int64_t step, const Scratch& w) {
              for (int64_t j0 = 0; j0 < t.n_k; j0 += step) key_chunk(p, t, spans, j0, tc, w, false);
            });
}

void sparse_backward_fused(const SparseParams& p, std::span<const SparseKeyTile> tiles,
                           std::span<const QuerySpan> spans, std::span<const int64_t> task_ptr,
                           const TileConfig& tc, int threads, float* workspace) {
  const std::size_t per_thread = sparse_workspace_floats(tc, p.head_dim);
  const auto n_tasks = static_cast<int64_t>(task_ptr.size()) - 1;
  const BlasSingleThreadScope one_thread_per_sgemm;
#pragma omp parallel num_threads(threads)
  {
    const Scratch w = carve(workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread,
                            tc, p.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks; ++task)
      for (int64_t x = task_ptr[static_cast<std::size_t>(task)];
           x < task_ptr[static_cast<std::size_t>(task) + 1]; ++x) {
        const SparseKeyTile& t = tiles[static_cast<std::size_t>(x)];
        for (int64_t j0 = 0; j0 < t.n_k; j0 += tc.k_tile) key_chunk(p, t, spans, j0, tc, w, true);
      }
  }
}

}  // namespace ringattn::kernels

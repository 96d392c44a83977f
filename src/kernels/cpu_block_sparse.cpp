// The CPU block-sparse kernels: the flash-attention forward and FA2-style backward of
// cpu_flash_*.cpp, walking lists of key spans (or, for dK/dV, query spans) instead of one
// contiguous key range. Key-major score tiles and small products on the tensors in place, as
// there (cpu_keymajor.hpp, cpu_small_gemm.hpp); one score tile per thread.
#include "kernels/cpu_block_sparse.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_keymajor.hpp"
#include "kernels/cpu_math.hpp"
#include "kernels/cpu_small_gemm.hpp"
#include "kernels/merge_lse.hpp"

namespace ringattn::kernels {

namespace {

struct Scratch {
  int64_t ld;  // queries per key column: tile_ld(q_tile) (cpu_flash.hpp)
  float* qt;   // D × ld: scale · Qᵀ of the query chunk
  float* dot;  // D × ld: dOᵀ
  float* s;    // k_tile × ld: scores / probabilities
  float* ds;   // k_tile × ld: dP, then scale · dS
  float* acc;  // D × ld: output accumulator
  float* dk;   // k_tile × D rows (also one output row, for merging)
  float* dv;   // k_tile × D rows
  float* kp;   // k_tile × D rows: the key chunk's K, packed (when strided)
  float* vp;   // k_tile × D rows: its V
  float* m;    // ld: running max, or lse (-inf past the chunk's rows)
  float* l;    // ld: running sum, or delta (0 past the chunk's rows)
};

Scratch carve(float* base, const TileConfig& t, int64_t d) {
  Scratch s{};
  s.ld = static_cast<int64_t>(tile_ld(t.q_tile));
  const auto ld = static_cast<std::size_t>(s.ld);
  const auto side = round_up16(ld * static_cast<std::size_t>(d));
  const auto st = round_up16(ld * static_cast<std::size_t>(t.k_tile));
  const auto kd = round_up16(static_cast<std::size_t>(t.k_tile * d));
  s.qt = base;
  s.dot = s.qt + side;
  s.acc = s.dot + side;
  s.s = s.acc + side;
  s.ds = s.s + st;
  s.dk = s.ds + st;
  s.dv = s.dk + kd;
  s.kp = s.dv + kd;
  s.vp = s.kp + kd;
  s.m = s.vp + kd;
  s.l = s.m + ld;
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

void forward_tile(const SparseParams& p, const SparseQueryTile& t, std::span<const KeySpan> spans,
                  int64_t i0, const TileConfig& tc, const Scratch& w) {
  const int64_t d = p.head_dim, ld = w.ld;
  const int64_t bq = std::min(tc.q_tile, t.n_q - i0);
  const int ild = sz(ld), id = sz(d);
  km::transpose_rows(p.q + t.q_row0 + i0 * p.q_stride, p.q_stride, bq, d, p.scale, w.qt, ld);
  std::fill(w.m, w.m + ld, kNegInf);
  std::fill(w.l, w.l + ld, 0.0f);
  std::fill(w.acc, w.acc + ld * d, 0.0f);

  for (int64_t s = t.first_span; s < t.first_span + t.n_spans; ++s) {
    const KeySpan& sp = spans[static_cast<std::size_t>(s)];
    const SubseqTask view = view_of(p, t.n_q, sp.n_k, sp.causal_offset);
    const KeyRange keys = visible_key_range(view, p.causal, i0, bq);
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += tc.k_tile) {
      const int64_t bk = std::min(tc.k_tile, keys.end - j0);
      const float* k = p.k + sp.k_row0 + j0 * sp.k_stride;
      const float* v = p.v + sp.k_row0 + j0 * sp.k_stride;
      const int ldk = sz(sp.k_stride);
      if (sp.k_stride != d && j0 + tc.k_tile < keys.end) {  // the next tile's rows, strided
        const int64_t next = std::min(tc.k_tile, keys.end - j0 - tc.k_tile);
        km::prefetch_rows(k + tc.k_tile * sp.k_stride, sp.k_stride, next, d, false);
        km::prefetch_rows(v + tc.k_tile * sp.k_stride, sp.k_stride, next, d, false);
      }
      km::for_each_part(view, p.causal, i0, bq, ld, j0, bk, [&](const km::TilePart& b) {
        const int m = sz(b.r1 - b.r0), n = sz(b.c1 - b.c0);
        float* sc = w.s + b.c0 * ld + b.r0;
        float* acc = w.acc + b.r0;
        small_gemm(false, m, n, id, w.qt + b.r0, ild, k + b.c0 * sp.k_stride, ldk, 0.0f, sc, ild);
        km::mask_outside_reach(sc, ld, view, p.causal, i0 + b.r0, std::min(b.r1, bq) - b.r0,
                               j0 + b.c0, n);
        km::online_softmax(sc, ld, m, n, w.m + b.r0, w.l + b.r0, acc, ld, d);
        small_gemm(true, m, id, n, sc, ild, v + b.c0 * sp.k_stride, ldk, 1.0f, acc, ild);
      });
    }
  }

  km::finish_rows(w.acc, ld, w.m, w.l, bq, d, p.out + t.q_row0 + i0 * p.q_stride, p.q_stride,
                  p.lse + t.lse0 + i0 * p.lse_stride, p.lse_stride, p.accumulate, 1.0f, w.dk);
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

// lse and delta of rows [i0, i0 + bq) of a piece into w.m and w.l, and the chunk's
// scale · Qᵀ and dOᵀ; false when no row attends anything.
bool load_rows(const SparseParams& p, int64_t q_row0, int64_t lse0, int64_t i0, int64_t bq,
               const Scratch& w) {
  bool any = false;
  for (int64_t i = 0; i < bq; ++i) {
    w.m[i] = p.lse[lse0 + (i0 + i) * p.lse_stride];
    w.l[i] = p.delta[lse0 + (i0 + i) * p.lse_stride];
    any |= w.m[i] != kNegInf;
  }
  if (!any) return false;
  std::fill(w.m + bq, w.m + w.ld, kNegInf);
  std::fill(w.l + bq, w.l + w.ld, 0.0f);
  const int64_t row = q_row0 + i0 * p.q_stride;
  km::transpose_rows(p.q + row, p.q_stride, bq, p.head_dim, p.scale, w.qt, w.ld);
  km::transpose_rows(p.dout + row, p.q_stride, bq, p.head_dim, 1.0f, w.dot, w.ld);
  return true;
}

// One (query chunk, key chunk) pair, part by part (km::for_each_part skips what causality or
// a window hides): P (into w.s) and scale · dS = scale · P ∘ (dP − delta) (into w.ds), two
// products, from the chunk load_rows prepared; then, when given, dQ rows (row-major, q_stride
// apart) += scale · dS K, and with `dkdv` the chunk's dV += Pᵀ dO and dK += (scale · dS)ᵀ Q
// into scratch (column-major D × bk). A query row lies in one part of a pair, so dQ still
// receives its terms in ascending key order.
struct PairOut {
  float* dq = nullptr;         // dQ rows of the chunk, or none
  const float* q = nullptr;    // Q and dO rows of the chunk, with dkdv
  const float* dout = nullptr;
  bool dkdv = false;
};

void pair_parts(const SparseParams& p, const SubseqTask& view, const float* k, const float* v,
                int ldk, int64_t i0, int64_t bq, int64_t j0, int64_t bk, const Scratch& w,
                const PairOut& out) {
  const int ld = sz(w.ld), id = sz(p.head_dim), ldq = sz(p.q_stride);
  const int64_t ks = ldk;
  km::for_each_part(view, p.causal, i0, bq, w.ld, j0, bk, [&](const km::TilePart& b) {
    const int m = sz(b.r1 - b.r0), n = sz(b.c1 - b.c0);
    const int64_t real = std::min(b.r1, bq) - b.r0;  // rows of the part that exist
    float* sc = w.s + b.c0 * w.ld + b.r0;
    float* ds = w.ds + b.c0 * w.ld + b.r0;
    small_gemm(false, m, n, id, w.qt + b.r0, ld, k + b.c0 * ks, ldk, 0.0f, sc, ld);
    km::mask_outside_reach(sc, w.ld, view, p.causal, i0 + b.r0, real, j0 + b.c0, n);
    km::probabilities(sc, w.ld, m, n, w.m + b.r0);
    small_gemm(false, m, n, id, w.dot + b.r0, ld, v + b.c0 * ks, ldk, 0.0f, ds, ld);
    km::scores_gradient(ds, sc, w.ld, m, n, w.l + b.r0, p.scale);
    if (out.dkdv) {  // dV += Pᵀ dO ; dK += (scale · dS)ᵀ Q, as column-major D × bk
      small_gemm(false, id, n, sz(real), out.dout + b.r0 * p.q_stride, ldq, sc, ld, 1.0f,
                 w.dv + b.c0 * p.head_dim, id);
      small_gemm(false, id, n, sz(real), out.q + b.r0 * p.q_stride, ldq, ds, ld, 1.0f,
                 w.dk + b.c0 * p.head_dim, id);
    }
    if (out.dq)  // dQ rows (column-major D × rows) += K's rowsᵀ · (scale · dS)ᵀ
      small_gemm(true, id, sz(real), n, k + b.c0 * ks, ldk, ds, ld, 1.0f,
                 out.dq + b.r0 * p.q_stride, ldq);
  });
}

// dQ rows [i0, i0 + bq) of query piece `t` += scale · dS K over the piece's key spans (one per
// key tile, ascending): the split backward's dQ pass.
void dq_tile(const SparseParams& p, const SparseQueryTile& t, std::span<const KeySpan> spans,
             int64_t i0, const TileConfig& tc, const Scratch& w) {
  const int64_t bq = std::min(tc.q_tile, t.n_q - i0);
  if (!load_rows(p, t.q_row0, t.lse0, i0, bq, w)) return;
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
      int ldk = sz(sp.k_stride);
      if (sp.k_stride != p.head_dim) {  // strided rows: packed (see km::prefetch_rows)
        km::pack_rows(k, sp.k_stride, bk, p.head_dim, 1.0f, w.kp);
        km::pack_rows(v, sp.k_stride, bk, p.head_dim, 1.0f, w.vp);
        k = w.kp;
        v = w.vp;
        ldk = sz(p.head_dim);
      }
      pair_parts(p, view, k, v, ldk, i0, bq, j0, bk, w, PairOut{dq, nullptr, nullptr, false});
    }
  }
}

// Key chunk [j0, j0 + bk) of key piece `t` against its query spans: dK, dV of the chunk (in
// scratch, then added to the tensors), and with `with_dq` also dQ of the query rows.
void key_chunk(const SparseParams& p, const SparseKeyTile& t, std::span<const QuerySpan> spans,
               int64_t j0, const TileConfig& tc, const Scratch& w, bool with_dq) {
  const int64_t d = p.head_dim;
  const int64_t bk = std::min(tc.k_tile, t.n_k - j0);
  int ldk = sz(t.k_stride);
  const float* k = p.k + t.k_row0 + j0 * t.k_stride;
  const float* v = p.v + t.k_row0 + j0 * t.k_stride;
  if (t.k_stride != d) {  // strided rows: packed once for all the chunk's query spans
    km::pack_rows(k, t.k_stride, bk, d, 1.0f, w.kp);
    km::pack_rows(v, t.k_stride, bk, d, 1.0f, w.vp);
    k = w.kp;
    v = w.vp;
    ldk = sz(d);
  }
  std::fill(w.dk, w.dk + bk * d, 0.0f);
  std::fill(w.dv, w.dv + bk * d, 0.0f);
  for (int64_t s = t.first_span; s < t.first_span + t.n_spans; ++s) {
    const QuerySpan& sp = spans[static_cast<std::size_t>(s)];
    const SubseqTask view = view_of(p, sp.n_q, t.n_k, sp.causal_offset);
    const KeyRange rows = seeing_query_range(view, p.causal, j0, bk);
    for (int64_t i0 = rows.begin / tc.q_tile * tc.q_tile; i0 < rows.end; i0 += tc.q_tile) {
      const int64_t bq = std::min(tc.q_tile, sp.n_q - i0);
      if (!pair_visible(view, p.causal, i0, bq, j0, bk) ||
          !load_rows(p, sp.q_row0, sp.lse0, i0, bq, w))
        continue;
      const int64_t row = sp.q_row0 + i0 * p.q_stride;
      pair_parts(p, view, k, v, ldk, i0, bq, j0, bk, w,
                 PairOut{with_dq ? p.dq + row : nullptr, p.q + row, p.dout + row, true});
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
  const std::size_t ld = tile_ld(t.q_tile);
  return 3 * round_up16(ld * static_cast<std::size_t>(head_dim)) +
         2 * round_up16(ld * static_cast<std::size_t>(t.k_tile)) +
         4 * round_up16(static_cast<std::size_t>(t.k_tile * head_dim)) + 2 * ld;
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

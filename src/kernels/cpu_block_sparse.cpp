// The CPU block-sparse kernels: the flash-attention forward and FA2-style backward of
// cpu_flash_*.cpp, walking lists of key spans (or, for dK/dV, query spans) instead of one
// contiguous key range. Key-major score tiles and small products on the tensors in place, as
// there (cpu_keymajor.hpp, cpu_small_gemm.hpp); one score tile per thread. Values of their own
// head dim and soft-capped scores as there too: v/out rows at value_floats() of the q/k rows'
// offsets, the cap on each score tile before the mask, its slope multiplied into dS.
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

// D: head_dim, Dv: head_dim_v.
struct Scratch {
  int64_t ld;    // queries per key column: tile_ld(q_tile) (cpu_flash.hpp)
  float* qt;     // D × ld: scale · Qᵀ of the query chunk
  float* dot;    // Dv × ld: dOᵀ
  float* s;      // k_tile × ld: scores / probabilities
  float* ds;     // k_tile × ld: dP, then scale · dS
  float* slope;  // k_tile × ld: the soft-cap's derivative (with soft-capping)
  float* acc;    // Dv × ld: output accumulator
  float* dk;     // k_tile × D rows
  float* dv;     // k_tile × Dv rows (also one output row, for merging)
  float* kp;     // k_tile × D rows: the key chunk's K, packed (when strided)
  float* vp;     // k_tile × Dv rows: its V
  float* m;      // ld: running max, or lse (-inf past the chunk's rows)
  float* l;      // ld: running sum, or delta (0 past the chunk's rows)
};

Scratch carve(float* base, const TileConfig& t, int64_t d, int64_t dv) {
  Scratch s{};
  s.ld = static_cast<int64_t>(tile_ld(t.q_tile));
  const auto ld = static_cast<std::size_t>(s.ld);
  const auto side = round_up16(ld * static_cast<std::size_t>(d));
  const auto side_v = round_up16(ld * static_cast<std::size_t>(dv));
  const auto st = round_up16(ld * static_cast<std::size_t>(t.k_tile));
  const auto kd = round_up16(static_cast<std::size_t>(t.k_tile * d));
  const auto kdv = round_up16(static_cast<std::size_t>(t.k_tile * dv));
  s.qt = base;
  s.dot = s.qt + side;
  s.acc = s.dot + side_v;
  s.s = s.acc + side_v;
  s.ds = s.s + st;
  s.slope = s.ds + st;
  s.dk = s.slope + st;
  s.dv = s.dk + kd;
  s.kp = s.dv + kdv;
  s.vp = s.kp + kd;
  s.m = s.vp + kdv;
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

// The float offset (stride) into v, dv, out or dout of the rows at `floats` into q or k.
int64_t vf(const SparseParams& p, int64_t floats) {
  return value_floats(floats, p.head_dim, p.value_dim());
}

void forward_tile(const SparseParams& p, const SparseQueryTile& t, std::span<const KeySpan> spans,
                  int64_t i0, const TileConfig& tc, const Scratch& w) {
  const int64_t d = p.head_dim, dv = p.value_dim(), ld = w.ld;
  const int64_t bq = std::min(tc.q_tile, t.n_q - i0);
  const int ild = sz(ld), id = sz(d), idv = sz(dv);
  km::transpose_rows(p.q + t.q_row0 + i0 * p.q_stride, p.q_stride, bq, d, p.scale, w.qt, ld);
  std::fill(w.m, w.m + ld, kNegInf);
  std::fill(w.l, w.l + ld, 0.0f);
  std::fill(w.acc, w.acc + ld * dv, 0.0f);

  for (int64_t s = t.first_span; s < t.first_span + t.n_spans; ++s) {
    const KeySpan& sp = spans[static_cast<std::size_t>(s)];
    const SubseqTask view = view_of(p, t.n_q, sp.n_k, sp.causal_offset);
    const KeyRange keys = visible_key_range(view, p.causal, i0, bq);
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += tc.k_tile) {
      const int64_t bk = std::min(tc.k_tile, keys.end - j0);
      const int64_t vs = vf(p, sp.k_stride);
      const float* k = p.k + sp.k_row0 + j0 * sp.k_stride;
      const float* v = p.v + vf(p, sp.k_row0) + j0 * vs;
      const int ldk = sz(sp.k_stride), ldv = sz(vs);
      if (sp.k_stride != d && j0 + tc.k_tile < keys.end) {  // the next tile's rows, strided
        const int64_t next = std::min(tc.k_tile, keys.end - j0 - tc.k_tile);
        km::prefetch_rows(k + tc.k_tile * sp.k_stride, sp.k_stride, next, d, false);
        km::prefetch_rows(v + tc.k_tile * vs, vs, next, dv, false);
      }
      km::for_each_part(view, p.causal, i0, bq, ld, j0, bk, [&](const km::TilePart& b) {
        const int m = sz(b.r1 - b.r0), n = sz(b.c1 - b.c0);
        float* sc = w.s + b.c0 * ld + b.r0;
        float* acc = w.acc + b.r0;
        small_gemm(false, m, n, id, w.qt + b.r0, ild, k + b.c0 * sp.k_stride, ldk, 0.0f, sc, ild);
        if (p.softcap > 0.0f) km::soft_cap(sc, ld, m, n, p.softcap, nullptr);
        km::mask_outside_reach(sc, ld, view, p.causal, i0 + b.r0, std::min(b.r1, bq) - b.r0,
                               j0 + b.c0, n);
        km::online_softmax(sc, ld, m, n, w.m + b.r0, w.l + b.r0, acc, ld, dv);
        small_gemm(true, m, idv, n, sc, ild, v + b.c0 * vs, ldv, 1.0f, acc, ild);
      });
    }
  }

  const int64_t os = vf(p, p.q_stride);
  km::finish_rows(w.acc, ld, w.m, w.l, bq, dv, p.out + vf(p, t.q_row0) + i0 * os, os,
                  p.lse + t.lse0 + i0 * p.lse_stride, p.lse_stride, p.accumulate, 1.0f, w.dv);
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
  const int64_t os = vf(p, p.q_stride);
  km::transpose_rows(p.q + q_row0 + i0 * p.q_stride, p.q_stride, bq, p.head_dim, p.scale, w.qt,
                     w.ld);
  km::transpose_rows(p.dout + vf(p, q_row0) + i0 * os, os, bq, p.value_dim(), 1.0f, w.dot, w.ld);
  return true;
}

// One (query chunk, key chunk) pair, part by part (km::for_each_part skips what causality or
// a window hides): P (into w.s) and scale · dS = scale · P ∘ (dP − delta) (into w.ds), two
// products, from the chunk load_rows prepared (through the soft-cap's slope, with a cap); then,
// when given, dQ rows (row-major, q_stride apart) += scale · dS K, and with `dkdv` the chunk's
// dV += Pᵀ dO and dK += (scale · dS)ᵀ Q into scratch (column-major Dv × bk and D × bk). A
// query row lies in one part of a pair, so dQ still receives its terms in ascending key order.
struct PairOut {
  float* dq = nullptr;         // dQ rows of the chunk, or none
  const float* q = nullptr;    // Q and dO rows of the chunk, with dkdv
  const float* dout = nullptr;
  bool dkdv = false;
};

// A key chunk's K and V rows: ldk (ldv) floats apart.
struct KeyRows {
  const float* k = nullptr;
  const float* v = nullptr;
  int ldk = 0, ldv = 0;
};

void pair_parts(const SparseParams& p, const SubseqTask& view, const KeyRows& kv, int64_t i0,
                int64_t bq, int64_t j0, int64_t bk, const Scratch& w, const PairOut& out) {
  const int ld = sz(w.ld), id = sz(p.head_dim), idv = sz(p.value_dim());
  const int ldq = sz(p.q_stride), ldo = sz(vf(p, p.q_stride));
  const int64_t ks = kv.ldk, vs = kv.ldv;
  const bool capped = p.softcap > 0.0f;
  km::for_each_part(view, p.causal, i0, bq, w.ld, j0, bk, [&](const km::TilePart& b) {
    const int m = sz(b.r1 - b.r0), n = sz(b.c1 - b.c0);
    const int64_t real = std::min(b.r1, bq) - b.r0;  // rows of the part that exist
    float* sc = w.s + b.c0 * w.ld + b.r0;
    float* ds = w.ds + b.c0 * w.ld + b.r0;
    float* slope = w.slope + b.c0 * w.ld + b.r0;
    small_gemm(false, m, n, id, w.qt + b.r0, ld, kv.k + b.c0 * ks, kv.ldk, 0.0f, sc, ld);
    if (capped) km::soft_cap(sc, w.ld, m, n, p.softcap, slope);
    km::mask_outside_reach(sc, w.ld, view, p.causal, i0 + b.r0, real, j0 + b.c0, n);
    km::probabilities(sc, w.ld, m, n, w.m + b.r0);
    small_gemm(false, m, n, idv, w.dot + b.r0, ld, kv.v + b.c0 * vs, kv.ldv, 0.0f, ds, ld);
    km::scores_gradient(ds, sc, w.ld, m, n, w.l + b.r0, p.scale);
    if (capped) km::cap_gradient(ds, slope, w.ld, m, n);  // through the cap
    if (out.dkdv) {  // dV += Pᵀ dO ; dK += (scale · dS)ᵀ Q, as column-major Dv (D) × bk
      small_gemm(false, idv, n, sz(real), out.dout + b.r0 * ldo, ldo, sc, ld, 1.0f,
                 w.dv + b.c0 * idv, idv);
      small_gemm(false, id, n, sz(real), out.q + b.r0 * p.q_stride, ldq, ds, ld, 1.0f,
                 w.dk + b.c0 * p.head_dim, id);
    }
    if (out.dq)  // dQ rows (column-major D × rows) += K's rowsᵀ · (scale · dS)ᵀ
      small_gemm(true, id, sz(real), n, kv.k + b.c0 * ks, kv.ldk, ds, ld, 1.0f,
                 out.dq + b.r0 * p.q_stride, ldq);
  });
}

// K and V rows [j0, j0 + bk) of the key rows from k_row0 (k_stride apart): in place, or
// packed into scratch when strided (see km::prefetch_rows).
KeyRows key_rows(const SparseParams& p, int64_t k_row0, int64_t k_stride, int64_t j0, int64_t bk,
                 const Scratch& w) {
  const int64_t d = p.head_dim, dv = p.value_dim(), vs = vf(p, k_stride);
  KeyRows r{p.k + k_row0 + j0 * k_stride, p.v + vf(p, k_row0) + j0 * vs, sz(k_stride), sz(vs)};
  if (k_stride != d) {
    km::pack_rows(r.k, k_stride, bk, d, 1.0f, w.kp);
    km::pack_rows(r.v, vs, bk, dv, 1.0f, w.vp);
    r = {w.kp, w.vp, sz(d), sz(dv)};
  }
  return r;
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
      const KeyRows kv = key_rows(p, sp.k_row0, sp.k_stride, j0, bk, w);
      pair_parts(p, view, kv, i0, bq, j0, bk, w, PairOut{dq, nullptr, nullptr, false});
    }
  }
}

// Key chunk [j0, j0 + bk) of key piece `t` against its query spans: dK, dV of the chunk (in
// scratch, then added to the tensors), and with `with_dq` also dQ of the query rows.
void key_chunk(const SparseParams& p, const SparseKeyTile& t, std::span<const QuerySpan> spans,
               int64_t j0, const TileConfig& tc, const Scratch& w, bool with_dq) {
  const int64_t d = p.head_dim, dv = p.value_dim();
  const int64_t bk = std::min(tc.k_tile, t.n_k - j0);
  // Strided rows are packed once for all the chunk's query spans.
  const KeyRows kv = key_rows(p, t.k_row0, t.k_stride, j0, bk, w);
  std::fill(w.dk, w.dk + bk * d, 0.0f);
  std::fill(w.dv, w.dv + bk * dv, 0.0f);
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
      const float* dout = p.dout + vf(p, sp.q_row0) + i0 * vf(p, p.q_stride);
      pair_parts(p, view, kv, i0, bq, j0, bk, w,
                 PairOut{with_dq ? p.dq + row : nullptr, p.q + row, dout, true});
    }
  }
  if (dv == d) {  // one pass over both sums' rows
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
    return;
  }
  km::add_rows(w.dk, bk, d, p.dk + t.k_row0 + j0 * t.k_stride, t.k_stride);
  km::add_rows(w.dv, bk, dv, p.dv + vf(p, t.k_row0) + j0 * vf(p, t.k_stride), vf(p, t.k_stride));
}

template <typename Tile, typename Fn>
void run_tiles(std::span<const Tile> tiles, int64_t rows_per_tile_step, const TileConfig& tc,
               const SparseParams& p, int threads, float* workspace, Fn&& fn) {
  const std::size_t per_thread = sparse_workspace_floats(tc, p.head_dim, p.value_dim());
  const auto n = static_cast<int64_t>(tiles.size());
  const BlasSingleThreadScope one_thread_per_sgemm;
#pragma omp parallel num_threads(threads)
  {
    const Scratch w = carve(workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread,
                            tc, p.head_dim, p.value_dim());
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) fn(tiles[static_cast<std::size_t>(i)], rows_per_tile_step, w);
  }
}

}  // namespace

std::size_t sparse_workspace_floats(const TileConfig& t, int64_t head_dim, int64_t head_dim_v) {
  const std::size_t ld = tile_ld(t.q_tile);
  const int64_t dv = head_dim_v > 0 ? head_dim_v : head_dim;
  return round_up16(ld * static_cast<std::size_t>(head_dim)) +
         2 * round_up16(ld * static_cast<std::size_t>(dv)) +
         3 * round_up16(ld * static_cast<std::size_t>(t.k_tile)) +
         2 * round_up16(static_cast<std::size_t>(t.k_tile * head_dim)) +
         2 * round_up16(static_cast<std::size_t>(t.k_tile * dv)) + 2 * ld;
}

void sparse_forward(const SparseParams& p, std::span<const SparseQueryTile> tiles,
                    std::span<const KeySpan> spans, const TileConfig& tc, int threads,
                    float* workspace) {
  run_tiles(tiles, tc.q_tile, tc, p, threads, workspace,
            [&](const SparseQueryTile& t, int64_t step, const Scratch& w) {
              for (int64_t i0 = 0; i0 < t.n_q; i0 += step) forward_tile(p, t, spans, i0, tc, w);
            });
}

void sparse_backward_dq(const SparseParams& p, std::span<const SparseQueryTile> tiles,
                        std::span<const KeySpan> spans, const TileConfig& tc, int threads,
                        float* workspace) {
  run_tiles(tiles, tc.q_tile, tc, p, threads, workspace,
            [&](const SparseQueryTile& t, int64_t step, const Scratch& w) {
              for (int64_t i0 = 0; i0 < t.n_q; i0 += step) dq_tile(p, t, spans, i0, tc, w);
            });
}

void sparse_backward_dkdv(const SparseParams& p, std::span<const SparseKeyTile> tiles,
                          std::span<const QuerySpan> spans, const TileConfig& tc, int threads,
                          float* workspace) {
  run_tiles(tiles, tc.k_tile, tc, p, threads, workspace,
            [&](const SparseKeyTile& t, int64_t step, const Scratch& w) {
              for (int64_t j0 = 0; j0 < t.n_k; j0 += step) key_chunk(p, t, spans, j0, tc, w, false);
            });
}

void sparse_backward_fused(const SparseParams& p, std::span<const SparseKeyTile> tiles,
                           std::span<const QuerySpan> spans, std::span<const int64_t> task_ptr,
                           const TileConfig& tc, int threads, float* workspace) {
  const std::size_t per_thread = sparse_workspace_floats(tc, p.head_dim, p.value_dim());
  const auto n_tasks = static_cast<int64_t>(task_ptr.size()) - 1;
  const BlasSingleThreadScope one_thread_per_sgemm;
#pragma omp parallel num_threads(threads)
  {
    const Scratch w = carve(workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread,
                            tc, p.head_dim, p.value_dim());
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

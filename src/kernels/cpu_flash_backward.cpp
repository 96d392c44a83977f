// The CPU flash-attention backward in the FlashAttention-2 way: scores are recomputed tile
// by tile from the saved lse (P = exp(S - lse)), D = rowsum(dO ∘ O), dS = P ∘ (dP − D),
// and dQ, dK, dV are accumulated tile by tile. Tiles are key-major (cpu_keymajor.hpp): the
// query side (Q, dO, and the dQ accumulator) is transposed once per query tile, K, V, Q, dO,
// dK and dV are column-major operands of the small products (cpu_small_gemm.hpp), in place
// when their rows are contiguous and packed per tile when they are one head among others
// (km::pack_rows), and scale factors are folded into the prepared operands. One thread
// owns a task, so its dK/dV rows and its dQ rows have a single writer and the result is
// deterministic; with fewer tasks than threads, a query-tile pass (dQ) and a key-tile pass
// (dK, dV) keep every thread busy and give the same bits.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu_blas.hpp"
#include "kernels/cpu_flash.hpp"
#include "kernels/cpu_keymajor.hpp"
#include "kernels/cpu_math.hpp"
#include "kernels/cpu_small_gemm.hpp"

namespace ringattn::kernels {

namespace {

struct BackwardScratch {
  int64_t ld;   // queries per key column: tile_ld(q_tile) (cpu_flash.hpp)
  float* qt;    // head_dim × ld: scale · Qᵀ of the query tile
  float* dot;   // head_dim_v × ld: dout_scale · dOᵀ
  float* dos;   // q_tile × head_dim_v rows: dout_scale · dO, packed (unless in place will do)
  float* qs;    // q_tile × head_dim rows: Q, packed (when strided)
  float* kv;    // 2 × k_tile × (head_dim + head_dim_v): the key tile's K and V packed, its dK
                // and dV sums
  float* p;     // k_tile × ld probabilities
  float* ds;    // k_tile × ld dP, then scale · dS
  float* slope;  // k_tile × ld the soft-cap's derivative (with soft-capping)
  float* dqt;   // head_dim × ld dQ accumulator
  float* lse;   // ld row lse (-inf past the tile's rows)
  float* dd;    // ld D = rowsum(dO ∘ O) · dout_scale/out_scale
  const float* dout_rows = nullptr;  // dout_scale · dO rows: dos, or dO in place
  int64_t dout_ld = 0;
  const float* q_rows = nullptr;  // Q rows: qs, or Q in place
  int64_t q_ld = 0;
};

// The five query-side buffers hold max(head_dim, head_dim_v) columns each.
BackwardScratch carve(float* base, const TileConfig& t, int64_t d) {
  BackwardScratch s{};
  s.ld = static_cast<int64_t>(tile_ld(t.q_tile));
  const auto ld = static_cast<std::size_t>(s.ld);
  const auto ud = static_cast<std::size_t>(d);
  const std::size_t side = round_up16(ld * ud);
  const std::size_t tile = round_up16(ld * static_cast<std::size_t>(t.k_tile));
  s.qt = base;
  s.dot = base + side;
  s.dos = base + 2 * side;
  s.dqt = base + 3 * side;
  s.qs = base + 4 * side;
  base += 5 * side;
  s.p = base;
  s.ds = base + tile;
  s.slope = base + 2 * tile;
  base += 3 * tile;
  s.lse = base;
  s.dd = base + ld;
  s.kv = base + 2 * ld;
  return s;
}

// One query tile's rows: their lse and D, the transposed query side, and dO's rows scaled;
// false when every row is empty (lse −inf), so the tile contributes nothing.
bool load_query_rows(const BackwardParams& p, const SubseqTask& t, int64_t i0, int64_t bq,
                     BackwardScratch& w) {
  const int64_t d = p.head_dim, dv = p.value_dim();
  const float d_factor = p.dout_scale / p.out_scale;
  const int64_t o_stride = value_floats(t.q_stride, d, dv);
  const float* q = p.q + t.q_row0 + i0 * t.q_stride;
  const float* o = p.out + value_floats(t.q_row0, d, dv) + i0 * o_stride;
  const float* dout = p.dout + value_floats(t.q_row0, d, dv) + i0 * o_stride;
  bool any_row = false;
  for (int64_t i = 0; i < bq; ++i) {
    w.lse[i] = p.lse[t.lse0 + (i0 + i) * t.lse_stride];
    any_row |= w.lse[i] != kNegInf;
    float acc = 0.0f;
    const float* orow = o + i * o_stride;
    const float* grow = dout + i * o_stride;
#pragma omp simd reduction(+ : acc)
    for (int64_t c = 0; c < dv; ++c) acc += orow[c] * grow[c];
    w.dd[i] = acc * d_factor;
  }
  std::fill(w.lse + bq, w.lse + w.ld, kNegInf);
  std::fill(w.dd + bq, w.dd + w.ld, 0.0f);
  if (!any_row) return false;
  km::transpose_rows(q, t.q_stride, bq, d, p.scale, w.qt, w.ld);
  km::transpose_rows(dout, o_stride, bq, dv, p.dout_scale, w.dot, w.ld);
  // Q and dO rows are operands of every dK and dV product of the tile: packed once here
  // when they are strided (or dO needs its scale), read in place otherwise.
  const bool strided = t.q_stride != d;
  if (p.dout_scale == 1.0f && !strided) {
    w.dout_rows = dout;
    w.dout_ld = o_stride;
  } else {
    km::pack_rows(dout, o_stride, bq, dv, p.dout_scale, w.dos);
    w.dout_rows = w.dos;
    w.dout_ld = dv;
  }
  if (strided) {
    km::pack_rows(q, t.q_stride, bq, d, 1.0f, w.qs);
    w.q_rows = w.qs;
    w.q_ld = d;
  } else {
    w.q_rows = q;
    w.q_ld = t.q_stride;
  }
  return true;
}

// What a pass accumulates from a tile pair.
struct Want {
  bool dq = false, dkdv = false;
};

// The tile pair (query rows i0.., key rows j0..), part by part (km::for_each_part skips what
// causality or a window hides): P = exp(S − lse), then with `want.dkdv` dV += Pᵀ
// (dout_scale · dO); scale · dS = scale · P ∘ (dP − D); then with `want.dq` dQ += (scale · dS)
// K into the transposed accumulator, and with `want.dkdv` dK += (scale · dS)ᵀ Q in place.
// Every pass calls exactly this, so the fused and the split backward compute the same bits.
void tile_pair(const BackwardParams& p, const SubseqTask& t, int64_t i0, int64_t bq, int64_t j0,
               int64_t bk, Want want, const BackwardScratch& w) {
  const int ld = static_cast<int>(w.ld);
  const int64_t d = p.head_dim, dvd = p.value_dim();
  const int id = static_cast<int>(d), idv = static_cast<int>(dvd);
  const int64_t v_stride = value_floats(t.k_stride, d, dvd);
  const int64_t v_row0 = value_floats(t.k_row0, d, dvd) + j0 * v_stride;
  const float* k = p.k + t.k_row0 + j0 * t.k_stride;
  const float* v = p.v + v_row0;
  float* dk = p.dk + t.k_row0 + j0 * t.k_stride;
  float* dv = p.dv + v_row0;
  // K and V rows of one head among others are strided: the tile's rows are packed, and its
  // dK and dV summed in scratch and added to the tensors at the end.
  const bool strided = t.k_stride != d;
  int64_t ks = t.k_stride, vs = v_stride;
  if (strided) {
    float* kp = w.kv;
    float* vp = kp + bk * d;
    km::pack_rows(k, t.k_stride, bk, d, 1.0f, kp);
    km::pack_rows(v, v_stride, bk, dvd, 1.0f, vp);
    k = kp;
    v = vp;
    if (want.dkdv) {
      dk = vp + bk * dvd;
      dv = dk + bk * d;
      std::fill(dk, dk + bk * (d + dvd), 0.0f);
    }
    ks = d;
    vs = dvd;
  }
  const int ldk = static_cast<int>(ks), ldv = static_cast<int>(vs);
  const bool capped = p.softcap > 0.0f;
  km::for_each_part(t, p.causal, i0, bq, w.ld, j0, bk, [&](const km::TilePart& b) {
    const int m = static_cast<int>(b.r1 - b.r0), n = static_cast<int>(b.c1 - b.c0);
    const int64_t real = std::min(b.r1, bq) - b.r0;  // rows of the part that exist
    const int ireal = static_cast<int>(real);
    float* pt = w.p + b.c0 * w.ld + b.r0;
    float* ds = w.ds + b.c0 * w.ld + b.r0;
    float* slope = w.slope + b.c0 * w.ld + b.r0;
    small_gemm(false, m, n, id, w.qt + b.r0, ld, k + b.c0 * ks, ldk, 0.0f, pt, ld);  // S
    if (capped) km::soft_cap(pt, w.ld, m, n, p.softcap, slope);
    km::mask_outside_reach(pt, w.ld, t, p.causal, i0 + b.r0, real, j0 + b.c0, n);
    km::probabilities(pt, w.ld, m, n, w.lse + b.r0);
    if (want.dkdv)  // dVᵀ (column-major d × n) += dOᵀ·P
      small_gemm(false, idv, n, ireal, w.dout_rows + b.r0 * w.dout_ld,
                 static_cast<int>(w.dout_ld), pt, ld, 1.0f, dv + b.c0 * vs, ldv);
    small_gemm(false, m, n, idv, w.dot + b.r0, ld, v + b.c0 * vs, ldv, 0.0f, ds,
               ld);  // dP = (dout_scale·dO)·Vᵀ
    km::scores_gradient(ds, pt, w.ld, m, n, w.dd + b.r0, p.scale);
    if (capped) km::cap_gradient(ds, slope, w.ld, m, n);  // through the cap
    if (want.dq)
      small_gemm(true, m, id, n, ds, ld, k + b.c0 * ks, ldk, 1.0f, w.dqt + b.r0, ld);
    if (want.dkdv)
      small_gemm(false, id, n, ireal, w.q_rows + b.r0 * w.q_ld, static_cast<int>(w.q_ld), ds, ld,
                 1.0f, dk + b.c0 * ks, ldk);
  });
  if (strided && want.dkdv) {
    km::add_rows(dk, bk, d, p.dk + t.k_row0 + j0 * t.k_stride, t.k_stride);
    km::add_rows(dv, bk, dvd, p.dv + v_row0, v_stride);
  }
}

// dQ rows i0.. += the transposed accumulator.
void store_dq(const BackwardParams& p, const SubseqTask& t, int64_t i0, int64_t bq,
              const BackwardScratch& w) {
  for (int64_t i = 0; i < bq; ++i) {
    float* dqrow = p.dq + t.q_row0 + (i0 + i) * t.q_stride;
    for (int64_t c = 0; c < p.head_dim; ++c) dqrow[c] += w.dqt[c * w.ld + i];
  }
}

// One query tile against every key tile it sees, key tiles in order: dQ of the tile, and
// with `fused` also dK/dV of those key tiles. Fused, one thread owns a task and runs its
// query tiles in order, so dQ of a query tile sums over key tiles in order and dK/dV of a key
// tile over query tiles in order.
void query_tile(const BackwardParams& p, const SubseqTask& t, const TileConfig& tiles, int64_t i0,
                bool fused, BackwardScratch& w) {
  const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
  if (!load_query_rows(p, t, i0, bq, w)) return;
  const KeyRange keys = visible_key_range(t, p.causal, i0, bq);
  std::fill(w.dqt, w.dqt + w.ld * p.head_dim, 0.0f);
  for (int64_t j0 = first_key_tile(keys, tiles); j0 < keys.end; j0 += tiles.k_tile) {
    const int64_t bk = std::min(tiles.k_tile, keys.end - j0);
    const int64_t next = j0 + tiles.k_tile;
    if (t.k_stride != p.head_dim && next < keys.end) {  // the next pair's rows, strided
      const int64_t nk = std::min(tiles.k_tile, keys.end - next);
      const int64_t row = t.k_row0 + next * t.k_stride;
      const int64_t dv = p.value_dim(), vs = value_floats(t.k_stride, p.head_dim, dv);
      const int64_t vrow = value_floats(t.k_row0, p.head_dim, dv) + next * vs;
      km::prefetch_rows(p.k + row, t.k_stride, nk, p.head_dim, false);
      km::prefetch_rows(p.v + vrow, vs, nk, dv, false);
      if (fused) {
        km::prefetch_rows(p.dk + row, t.k_stride, nk, p.head_dim, true);
        km::prefetch_rows(p.dv + vrow, vs, nk, dv, true);
      }
    }
    tile_pair(p, t, i0, bq, j0, bk, Want{true, fused}, w);
  }
  store_dq(p, t, i0, bq, w);
}

void backward_task(const BackwardParams& p, const SubseqTask& t, const TileConfig& tiles,
                   BackwardScratch& w) {
  for (int64_t i0 = 0; i0 < t.n_q; i0 += tiles.q_tile) query_tile(p, t, tiles, i0, true, w);
}

// Split, for when there are fewer tasks than threads: query tiles (query_tile, not fused) own
// dQ rows and key tiles (dkdv_tile) own dK/dV rows; each recomputes P and dS (7 products per
// tile pair instead of 5). Both visit tile pairs in the fused order and make the same calls,
// so the result is the fused one, bit for bit, whatever the thread count.
void dkdv_tile(const BackwardParams& p, const SubseqTask& t, const TileConfig& tiles, int64_t j0,
               BackwardScratch& w) {
  for (int64_t i0 = 0; i0 < t.n_q; i0 += tiles.q_tile) {
    const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
    const KeyRange keys = visible_key_range(t, p.causal, i0, bq);
    // The pairs query_tile visits: key tiles from first_key_tile up to the range's end.
    if (j0 >= keys.end || j0 < first_key_tile(keys, tiles) || !load_query_rows(p, t, i0, bq, w))
      continue;
    const int64_t bk = std::min(tiles.k_tile, keys.end - j0);
    tile_pair(p, t, i0, bq, j0, bk, Want{false, true}, w);
  }
}

int64_t tiles_of(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

}  // namespace

std::size_t backward_workspace_floats(const TileConfig& t, int64_t head_dim, int64_t head_dim_v) {
  const std::size_t ld = tile_ld(t.q_tile);
  const int64_t dv = head_dim_v > 0 ? head_dim_v : head_dim;
  return 5 * round_up16(ld * static_cast<std::size_t>(std::max(head_dim, dv))) +
         3 * round_up16(ld * static_cast<std::size_t>(t.k_tile)) + 2 * ld +
         2 * static_cast<std::size_t>(t.k_tile * (head_dim + dv));
}

void flash_backward(const BackwardParams& p, std::span<const SubseqTask> tasks,
                    const TileConfig& tiles, int threads, float* workspace) {
  const std::size_t per_thread = backward_workspace_floats(tiles, p.head_dim, p.value_dim());
  const int64_t side_dim = std::max(p.head_dim, p.value_dim());
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  const BlasSingleThreadScope one_thread_per_sgemm;
  if (n_tasks >= threads) {
#pragma omp parallel num_threads(threads)
    {
      BackwardScratch w =
          carve(workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread, tiles,
                side_dim);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_tasks; ++i)
        backward_task(p, tasks[static_cast<std::size_t>(i)], tiles, w);
    }
    return;
  }
  // Fewer tasks than threads (small B·H): tiles of every task are the units of work, over
  // (task, tile) pairs up to the longest task (pairs past a task's end are skipped).
  int64_t q_tiles = 0, k_tiles = 0;
  for (const SubseqTask& t : tasks) {
    q_tiles = std::max(q_tiles, tiles_of(t.n_q, tiles.q_tile));
    k_tiles = std::max(k_tiles, tiles_of(t.n_k, tiles.k_tile));
  }
#pragma omp parallel num_threads(threads)
  {
    BackwardScratch w = carve(
        workspace + static_cast<std::size_t>(omp_get_thread_num()) * per_thread, tiles, side_dim);
#pragma omp for schedule(dynamic, 1) collapse(2) nowait
    for (int64_t i = 0; i < n_tasks; ++i)
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        const SubseqTask& t = tasks[static_cast<std::size_t>(i)];
        if (qt * tiles.q_tile < t.n_q) query_tile(p, t, tiles, qt * tiles.q_tile, false, w);
      }
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t i = 0; i < n_tasks; ++i)
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const SubseqTask& t = tasks[static_cast<std::size_t>(i)];
        if (kt * tiles.k_tile < t.n_k) dkdv_tile(p, t, tiles, kt * tiles.k_tile, w);
      }
  }
}

}  // namespace ringattn::kernels

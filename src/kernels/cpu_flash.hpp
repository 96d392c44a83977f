// The CPU flash-attention kernels' interface. A kernel call runs a list of subsequence
// tasks: each task is n_q query rows against n_k key rows, every one of them a strided view
// into [B, N, H, D] tensors (so a dilated pattern is read in place, no gathers). Kernels know
// nothing of patterns or ranks: the schedule that builds the tasks does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

// The key-range helpers below are shared with the CUDA kernels (kernels/cuda/): compiled by
// nvcc they are host and device functions.
#if defined(__CUDACC__)
#define RINGATTN_HOST_DEVICE __host__ __device__
#else
#define RINGATTN_HOST_DEVICE
#endif

namespace ringattn::kernels {

// Far beyond any index (and far from overflowing when offsets are added to it).
inline constexpr int64_t kNoWindow = INT64_MAX / 4;

struct SubseqTask {
  int64_t q_row0 = 0, q_stride = 0;  // floats; into q, out, dout, dq
  int64_t lse0 = 0, lse_stride = 0;  // floats; into lse
  int64_t k_row0 = 0, k_stride = 0;  // floats; into k, v, dk, dv
  int64_t n_q = 0, n_k = 0;
  // When causal, key j is allowed for query i iff j <= i + causal_offset (index units of
  // the two strided views). 0 for a subsequence attending to itself.
  int64_t causal_offset = 0;
  // Sliding window, in the same index units: key j is allowed for query i only when
  // i + causal_offset - window_left <= j <= i + causal_offset + window_right (kNoWindow: no
  // limit on that side). Key ranges are cut per query tile, so tiles wholly outside a
  // window are never visited; no mask is materialised.
  int64_t window_left = kNoWindow, window_right = kNoWindow;
};

// A task's offsets and strides count floats of q and k rows, always whole rows of head_dim;
// the same rows of v, dv, out and dout hold head_dim_v floats each, at this offset (stride).
RINGATTN_HOST_DEVICE inline int64_t value_floats(int64_t floats, int64_t head_dim,
                                                 int64_t head_dim_v) {
  return head_dim_v == head_dim ? floats : floats / head_dim * head_dim_v;
}

// One unit of forward work: query rows [q_begin, q_begin + q_tile) of one task.
struct ForwardItem {
  int64_t task = 0;
  int64_t q_begin = 0;
};

struct TileConfig {
  int64_t q_tile = 128;
  int64_t k_tile = 256;
};

struct ForwardParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  int64_t head_dim = 0;    // q and k
  int64_t head_dim_v = 0;  // v and out; 0: head_dim
  float scale = 1.0f;
  float softcap = 0.0f;  // s <- softcap · tanh(s / softcap) on the scaled scores; 0: none
  bool causal = false;
  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // false: write out = out_scale * softmax(S) V and lse (overwriting).
  // true: merge this result into the (out, lse) already there, by log-sum-exp weights.
  bool accumulate = false;
  float out_scale = 1.0f;
};

struct BackwardParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* out = nullptr;  // as written by the forward (including out_scale)
  const float* lse = nullptr;  // the final lse of each row
  const float* dout = nullptr;
  float* dq = nullptr;  // accumulated into (+=)
  float* dk = nullptr;  // accumulated into (+=)
  float* dv = nullptr;  // accumulated into (+=)
  int64_t head_dim = 0;    // q, k, dq, dk
  int64_t head_dim_v = 0;  // v, out, dout, dv; 0: head_dim
  float scale = 1.0f;
  float softcap = 0.0f;  // as the forward's
  bool causal = false;
  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  float out_scale = 1.0f;   // the forward's out_scale: true O = out / out_scale
  float dout_scale = 1.0f;  // true dO = dout * dout_scale
};

// Number of keys (a prefix of the key view) that query rows [i0, i0 + bq) can see at all,
// causality only.
RINGATTN_HOST_DEVICE inline int64_t visible_keys(const SubseqTask& t, bool causal, int64_t i0,
                                                 int64_t bq) {
  if (!causal) return t.n_k;
  const int64_t k = i0 + bq + t.causal_offset;
  return k < 0 ? 0 : (k > t.n_k ? t.n_k : k);
}

// A half-open range of key indices.
struct KeyRange {
  int64_t begin = 0, end = 0;
};

RINGATTN_HOST_DEVICE inline int64_t clamp_index(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Keys that query rows [i0, i0 + bq) can see at all: causality and the window (empty when
// begin >= end).
RINGATTN_HOST_DEVICE inline KeyRange visible_key_range(const SubseqTask& t, bool causal, int64_t i0,
                                                       int64_t bq) {
  int64_t end = visible_keys(t, causal, i0, bq);
  if (t.window_right != kNoWindow) {
    const int64_t w = clamp_index(i0 + bq + t.causal_offset + t.window_right, 0, t.n_k);
    end = w < end ? w : end;
  }
  const int64_t begin =
      t.window_left == kNoWindow ? 0 : clamp_index(i0 + t.causal_offset - t.window_left, 0, t.n_k);
  return {begin, end > begin ? end : begin};
}

// Queries (indices into the query view) that see some key of [j0, j0 + bk): causality and the
// window, the transpose of visible_key_range (empty when begin >= end).
RINGATTN_HOST_DEVICE inline KeyRange seeing_query_range(const SubseqTask& t, bool causal,
                                                        int64_t j0, int64_t bk) {
  // Query i sees key j iff j - window_right <= i + causal_offset (and j <= i + causal_offset
  // when causal) and i + causal_offset <= j + window_left.
  const int64_t right = causal ? 0 : t.window_right;
  const int64_t begin =
      right == kNoWindow ? 0 : clamp_index(j0 - right - t.causal_offset, 0, t.n_q);
  const int64_t end =
      t.window_left == kNoWindow
          ? t.n_q
          : clamp_index(j0 + bk - 1 + t.window_left - t.causal_offset + 1, 0, t.n_q);
  return {begin, end > begin ? end : begin};
}

// Whether query i may not attend key j of the view: past its end, in the query's future
// (causal) or outside its window.
RINGATTN_HOST_DEVICE inline bool outside_reach(const SubseqTask& t, bool causal, int64_t i,
                                               int64_t j) {
  const int64_t d = j - (i + t.causal_offset);  // the key relative to the query's position
  return j >= t.n_k || (causal && d > 0) || d > t.window_right || -d > t.window_left;
}

// The first key tile (on the k_tile grid from 0) holding a key of `keys`.
inline int64_t first_key_tile(const KeyRange& keys, const TileConfig& tiles) {
  return keys.begin / tiles.k_tile * tiles.k_tile;
}

// Keys of the tile [j0, j0 + bk) that query i sees, as offsets into the tile.
inline KeyRange row_keys_in_tile(const SubseqTask& t, bool causal, int64_t i, int64_t j0,
                                 int64_t bk) {
  const int64_t diag = i + t.causal_offset - j0;  // the query's own position, tile-relative
  int64_t end = causal ? clamp_index(diag + 1, 0, bk) : bk;
  if (t.window_right != kNoWindow)
    end = std::min(end, clamp_index(diag + t.window_right + 1, 0, bk));
  const int64_t begin = t.window_left == kNoWindow ? 0 : clamp_index(diag - t.window_left, 0, bk);
  return {begin, std::max(begin, end)};
}

// Scratch buffers start on 64-byte boundaries.
constexpr std::size_t round_up16(std::size_t n) { return (n + 15) / 16 * 16; }

// The leading dimension of a query tile's key-major scratch (scores, Qᵀ, the accumulators):
// q_tile rounded up to 16 floats, plus 16 more where that is a multiple of 128 floats. A
// stride of 2^k · 512 bytes puts the 64-byte pieces a product reads down one column of
// 16-query blocks (k steps, one stride apart) into a few cache sets, which evict each other
// and slow the AVX2 tile products (measured: docs/PERFORMANCE.md, bench/README.md "AVX2
// hosts").
constexpr std::size_t tile_ld(int64_t q_tile) {
  const std::size_t ld = round_up16(static_cast<std::size_t>(q_tile));
  return ld % 128 == 0 ? ld + 16 : ld;
}

// Floats of scratch one thread needs for the given tiles and head dims (head_dim_v 0: head_dim).
std::size_t forward_workspace_floats(const TileConfig& t, int64_t head_dim,
                                     int64_t head_dim_v = 0);
std::size_t backward_workspace_floats(const TileConfig& t, int64_t head_dim,
                                      int64_t head_dim_v = 0);

// Runs every item in parallel on `threads` OpenMP threads. `workspace` holds
// threads * forward_workspace_floats() floats, 64-byte aligned.
void flash_forward(const ForwardParams& p, std::span<const SubseqTask> tasks,
                   std::span<const ForwardItem> items, const TileConfig& tiles, int threads,
                   float* workspace);

// Runs every task in parallel (one task per thread at a time, so that a task's dK/dV rows
// and dQ rows have one writer). Tasks passed in one call must not share key rows or query
// rows. `workspace` holds threads * backward_workspace_floats() floats.
void flash_backward(const BackwardParams& p, std::span<const SubseqTask> tasks,
                    const TileConfig& tiles, int threads, float* workspace);

}  // namespace ringattn::kernels

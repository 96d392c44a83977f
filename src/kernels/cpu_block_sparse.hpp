// The CPU block-sparse kernels' interface. Work is described by lists, not masks: a query
// tile walks the key spans its block lists name (runs of consecutive key rows, each with its
// own base and stride, so local rows and rows received from other ranks mix freely), and
// skipped blocks cost nothing. The backward runs two passes so that every output row has one
// writer and the result is deterministic: one over query tiles (dQ), one over key tiles
// (dK, dV), each recomputing the probabilities from the saved lse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu_flash.hpp"

namespace ringattn::kernels {

// Offsets and strides below count floats of q and k rows (head_dim each); the same rows of v,
// dv, out and dout sit at value_floats() of them (cpu_flash.hpp), so every buffer they index
// holds its rows at the same row positions, head_dim_v floats each.
//
// n_k consecutive key rows from k_row0, k_stride floats apart (into k, dk; v, dv as above),
// at consecutive positions: key j sits causal_offset positions before query i = j of the
// tile, so when causal, key j is allowed for query i iff j <= i + causal_offset.
struct KeySpan {
  int64_t k_row0 = 0, k_stride = 0, n_k = 0, causal_offset = 0;
};

// One query tile: n_q rows from q_row0 (the call's q_stride apart), lse from lse0 (the
// call's lse_stride apart), attending spans [first_span, first_span + n_spans).
struct SparseQueryTile {
  int64_t q_row0 = 0, lse0 = 0, n_q = 0;
  int64_t first_span = 0, n_spans = 0;
};

// n_q consecutive query rows that attend one key tile; causal as for KeySpan.
struct QuerySpan {
  int64_t q_row0 = 0, lse0 = 0, n_q = 0, causal_offset = 0;
};

// One key tile (a block's rows) and the query spans that attend it.
struct SparseKeyTile {
  int64_t k_row0 = 0, k_stride = 0, n_k = 0;
  int64_t first_span = 0, n_spans = 0;
};

struct SparseParams {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;          // forward
  float* lse = nullptr;          // forward: written; backward: read (as const)
  const float* delta = nullptr;  // backward: rowsum(dO ∘ O), laid out like lse
  const float* dout = nullptr;   // backward
  float* dq = nullptr;           // backward, += (query-tile pass)
  float* dk = nullptr;           // backward, += (key-tile pass)
  float* dv = nullptr;           // backward, += (key-tile pass)
  int64_t head_dim = 0;          // q, k, dq, dk
  int64_t head_dim_v = 0;        // v, dv, out, dout; 0: head_dim
  int64_t q_stride = 0;  // floats between consecutive query rows (q, dq; out, dout as above)
  int64_t lse_stride = 1;
  float scale = 1.0f;
  float softcap = 0.0f;  // s <- softcap · tanh(s / softcap) on the scaled scores; 0: none
  bool causal = false;
  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // Sliding window in the spans' index units: key j is allowed for query i only when
  // i + causal_offset - window_left <= j <= i + causal_offset + window_right (kNoWindow: no
  // limit). Documents of packed sequences need nothing here: the lists cut tiles and spans at
  // document bounds, so a (tile, span) pair never crosses one.
  int64_t window_left = kNoWindow, window_right = kNoWindow;
  // Forward: false overwrites out/lse; true merges into them by log-sum-exp weights.
  bool accumulate = false;
};

// Floats of scratch one thread needs for any of the three calls (head_dim_v 0: head_dim).
std::size_t sparse_workspace_floats(const TileConfig& t, int64_t head_dim, int64_t head_dim_v = 0);

// Forward over query tiles (most expensive first is best), in parallel.
void sparse_forward(const SparseParams& p, std::span<const SparseQueryTile> tiles,
                    std::span<const KeySpan> spans, const TileConfig& tc, int threads,
                    float* workspace);

// dQ += over the query tiles' key spans. Tiles must not share query rows.
void sparse_backward_dq(const SparseParams& p, std::span<const SparseQueryTile> tiles,
                        std::span<const KeySpan> spans, const TileConfig& tc, int threads,
                        float* workspace);

// dK, dV += over the key tiles' query spans. Tiles must not share key rows.
void sparse_backward_dkdv(const SparseParams& p, std::span<const SparseKeyTile> tiles,
                          std::span<const QuerySpan> spans, const TileConfig& tc, int threads,
                          float* workspace);

// The fused backward: dQ, dK and dV in one pass, 5 products per tile pair instead of the split
// form's 7 (dQ pass 3, dK/dV pass 4). Task t owns key tiles [task_ptr[t], task_ptr[t + 1]) and
// is one thread's, so the tasks must not share key rows nor the query rows their spans name
// (one task per (batch, K/V head)). Bit for bit the result of sparse_backward_dq over the
// same pairs (query tiles with one key span per key tile, ascending) then
// sparse_backward_dkdv, when the key tiles of a task are in ascending key position.
void sparse_backward_fused(const SparseParams& p, std::span<const SparseKeyTile> tiles,
                           std::span<const QuerySpan> spans, std::span<const int64_t> task_ptr,
                           const TileConfig& tc, int threads, float* workspace);

}  // namespace ringattn::kernels

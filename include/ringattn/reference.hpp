// The float64 reference: every attention mode computed straight from the definitions in
// docs/SEMANTICS.md, with no tiling and no tricks. Used by the tests and by `--check`.
// Inputs are float32 [B, N, H, D] (k [B, N, HKV, D] with cfg.kv_heads, v [B, N, HKV, Dv] with
// cfg.head_dim_v); results are float64 in the same layouts as the fast path (dq [B, N, H, D],
// out [B, N, H, Dv], dk [B, N, HKV, D], dv [B, N, HKV, Dv], lse [B, H, N]).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ringattn/config.hpp"

namespace ringattn {

struct ReferenceForward {
  std::vector<double> out;
  std::vector<double> lse;  // -inf where a row attends to nothing
};

struct ReferenceGradients {
  std::vector<double> dq, dk, dv;
  std::vector<double> dsinks;  // [H], with sinks
};

// `sinks` ([H], or null): attention sinks (docs/SEMANTICS.md), a logit per head in every row's
// softmax normaliser that attends no value; lse includes it. Dilated configs take none.
ReferenceForward reference_forward(const AttentionConfig& cfg, const float* q, const float* k,
                                   const float* v, const float* sinks = nullptr);

// Gradients of sum(out * dout) with respect to q, k and v (and the sinks).
ReferenceGradients reference_backward(const AttentionConfig& cfg, const float* q, const float* k,
                                      const float* v, const float* dout,
                                      const float* sinks = nullptr);

// Block-sparse attention (docs/SEMANTICS.md): query p of head h attends key t when key block
// t / bs is among key_blocks(h, p / bs) and the dense rule allows the pair: t <= p when
// causal, t in p's document, p - window_left <= t <= p + window_right; one softmax per row over
// every allowed key; rows with none output 0 and lse -inf. The callback is the caller's
// statement of the mask (tests read it straight from a bool mask). K and V have kv_heads
// heads; query head h reads K/V head h / (heads / kv_heads).
struct BlockReferenceProblem {
  Shape4 shape;
  int64_t block_size = 0;
  bool causal = false;
  double scale = 0;                             // 0: 1/sqrt(D)
  int64_t kv_heads = 0;                         // 0: shape.heads
  std::vector<int64_t> cu_seqlens;              // document starts then N; empty: one document
  int64_t window_left = -1, window_right = -1;  // -1: no limit on that side
  std::function<std::vector<int64_t>(int64_t head, int64_t qblock)> key_blocks;
  std::vector<float> sinks;  // [H] attention sinks, or empty
  int64_t head_dim_v = 0;    // v, dv, out and dout's head dim; 0: shape.head_dim
  double softcap = 0;        // s <- softcap · tanh(s / softcap) on the scaled score; 0: none
};

// The problem for cfg's shape, block size, causality, scale, K/V heads, documents, window,
// value head dim and soft-cap; the caller states the mask (key_blocks).
BlockReferenceProblem block_problem_of(const AttentionConfig& cfg);

ReferenceForward reference_forward_blocks(const BlockReferenceProblem& pb, const float* q,
                                          const float* k, const float* v);
ReferenceGradients reference_backward_blocks(const BlockReferenceProblem& pb, const float* q,
                                             const float* k, const float* v, const float* dout);
// One query row (head h, position p) from rows the caller fetches: key_row(t) and
// value_row(t) return the D (head_dim_v) floats at position t of the K/V head that h reads.
// Writes out [head_dim_v] and *lse. This is how a huge run is checked on sampled rows without
// the full tensors.
void reference_row_blocks(const BlockReferenceProblem& pb, int64_t h, int64_t p, const float* q_row,
                          const std::function<const float*(int64_t)>& key_row,
                          const std::function<const float*(int64_t)>& value_row, double* out,
                          double* lse);

// ||got - want||_F / ||want||_F (0 when both are zero); infinite entries must match exactly
// in position and sign, else the result is +inf.
double relative_error(const float* got, const double* want, std::size_t n);
double relative_error(const float* got, const float* want, std::size_t n);

}  // namespace ringattn

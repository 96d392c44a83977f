// Block-sparse attention over ranks. Each rank owns N/P tokens (whole blocks; zigzag for
// causal runs when the halves are whole blocks, so causal work is balanced) and works out
// from the block lists exactly which remote K/V blocks its queries need. One grouped
// point-to-point exchange brings them (a local pattern talks to its neighbours only, never a
// full ring) while the rank computes with its own blocks; the remote blocks are merged in by
// log-sum-exp when they land. The backward exchanges K/V the same way, computes dQ on the
// query's rank and dK/dV partials for remote blocks there too, and returns the partials to
// their owners. With one rank it is the single-process block-sparse plan.
#pragma once

#include <cstdint>
#include <memory>

#include "ring/communicator.hpp"
#include "ring/ring_engine.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"
#include "single/plan.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

// The shard layout for block-sparse runs: zigzag (2P chunks) for causal runs when each half
// shard is whole blocks, else one contiguous chunk per rank. Throws InputError naming
// config.shape.seq_len or config.block_size when N/P tokens are not whole blocks.
ring::ShardLayout sparse_layout(const AttentionConfig& cfg, int world);

// The fewest K/V bytes `rank` must send in the forward: for each of its (K/V head, key block)
// pairs, K and V (fp32, every batch; K rows of head_dim floats, V rows of head_dim_v) once to
// every other rank that owns a query block attending it through a query head sharing that K/V
// head, with a token pair the dense rule (documents, causality, window: token_rule.hpp)
// allows. Computed from the transposed lists, independently of the plan's exchange.
int64_t minimum_bytes_sent(const AttentionConfig& cfg, const BlockLists& lists,
                           const ring::ShardLayout& layout, int rank);

// Attended (query, key) token pairs of each rank's query blocks under `layout` (every batch
// row counted once: multiply by B), for the imbalance a run reports.
std::vector<double> attended_pairs_by_rank(const BlockLists& lists, const ring::ShardLayout& layout,
                                           const AttentionConfig& cfg);

class SparsePlan {
 public:
  // `cfg.attention` must be block_sparse; `lists` must match its heads, N and block size.
  // `ring_opts`: the watchdog's timeout and test fault injection, as for the ring (step 0 is
  // the local compute, step 1 the exchange and the remote compute).
  SparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
             ring::Communicator& comm, PlanOptions opts = {}, ring::RingOptions ring_opts = {});
  ~SparsePlan();

  const ring::ShardLayout& layout() const noexcept;
  int threads() const noexcept;
  const BlockLists& lists() const noexcept;

  // Local shards in layout() order: q, dq [B, N/P, H, D]; out, dout [B, N/P, H, Dv]; k, dk
  // [B, N/P, kv_heads, D]; v, dv [B, N/P, kv_heads, Dv]; lse [B, H, N/P] (Dv: head_dim_v).
  // dq, dk, dv are overwritten.
  void forward(const float* q, const float* k, const float* v, float* out, float* lse);
  void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv);

  const ring::RingTimings& last_forward() const noexcept;
  const ring::RingTimings& last_backward() const noexcept;
  std::size_t workspace_bytes() const noexcept;
  // Peers this rank exchanges with (0 on one rank).
  int peers() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::sparse

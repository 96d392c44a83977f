// One rank's share of distributed block-sparse attention, derived once from the block lists
// and the shard layout, for the CPU plan (sparse_plan.cpp) and the CUDA plan
// (cuda_sparse_plan.cpp) alike: which (head, key block) K/V rows travel to and from which
// peer, the query tiles with their key spans over local rows and over received rows, the key
// tiles with their query spans for dK/dV, and the order in which returned dK/dV partials are
// added (fixed, so the sum is reproducible). Received and sent rows live in slabs: entry e,
// batch b starts at row (e·B + b)·bs of a [rows, D] buffer for K (and [rows, Dv] for V). The
// lists' offsets and strides count K's floats; V's are kernels::value_floats of them.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "kernels/cpu_block_sparse.hpp"
#include "kernels/cpu_flash.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

struct Owner {
  int rank = 0;
  int64_t local_row = 0;  // first local row of the block on its owner
};

// The owner of every block under `layout` (blocks of `bs` tokens).
std::vector<Owner> block_owners(const ring::ShardLayout& layout, int64_t blocks, int64_t bs);

// One (head, key block) whose K/V rows (every batch) travel between two ranks.
struct Entry {
  int peer = 0;
  int32_t head = 0, block = 0;
  auto operator<=>(const Entry&) const = default;
};

// A peer's entries: [first, first + count) of a sorted entry list.
struct PeerRange {
  int peer = 0;
  int64_t first = 0, count = 0;
};

struct RankSparseWork {
  std::vector<Owner> owners;
  // Forward and dQ: every local query tile with its local key spans (rows of the local shard,
  // G·D apart for [B, N, H, D] tensors, D for [B, H, N, D]); the tiles that also attend received
  // blocks again, with those spans (rows of the receive slabs, D apart).
  std::vector<kernels::SparseQueryTile> local_tiles, remote_tiles;
  std::vector<kernels::KeySpan> local_spans, remote_spans;
  // dK/dV: local key tiles with local query spans; received key tiles (rows of the slabs, into
  // same-shaped partial buffers) with local query spans. One span per query block piece; key
  // tiles grouped per backward task t = b·kv_heads + g, [task_ptr[t], task_ptr[t + 1]), in
  // ascending key position within a task.
  std::vector<kernels::SparseKeyTile> local_ktiles, remote_ktiles;
  std::vector<kernels::QuerySpan> local_qspans, remote_qspans;
  std::vector<int64_t> local_task_ptr, remote_task_ptr;
  // dQ: the query tiles again, with one key span per key tile (never merged, in ascending key
  // position), so that the split backward cuts tile pairs exactly as the fused one does. Only
  // tiles with spans.
  std::vector<kernels::SparseQueryTile> bwd_local_tiles, bwd_remote_tiles;
  std::vector<kernels::KeySpan> bwd_local_spans, bwd_remote_spans;
  // What travels, sorted by (peer, head, block), and each peer's range of it.
  std::vector<Entry> recv_entries, send_entries;
  std::vector<PeerRange> recv_ranges, send_ranges;
  // Returned partials: send entries ordered by the local (head, block) they add into, peers
  // ascending within one; group g is ret_order[ret_group_ptr[g] .. ret_group_ptr[g + 1]).
  std::vector<int64_t> ret_order, ret_group_ptr;

  bool exchanges() const { return !send_entries.empty() || !recv_entries.empty(); }
  // Ranks this rank exchanges with, either way.
  int peers() const;
};

// `layout` from sparse_layout(); `lists` for cfg's heads, N and block size.
RankSparseWork build_rank_sparse_work(const AttentionConfig& cfg, const BlockLists& lists,
                                      const ring::ShardLayout& layout, int rank);

// Appends a key span to the spans of the tile starting at `tile_first`, extending the previous
// span when the rows continue it in memory and in causal offset.
void add_key_span(std::vector<kernels::KeySpan>& spans, int64_t tile_first, kernels::KeySpan s);
// Device work items of at most `rows_per_item` rows over query tiles (key tiles), longest
// first by the keys (queries) the item's rows can see; ties keep tile order.
std::vector<kernels::ForwardItem> sparse_query_items(
    const std::vector<kernels::SparseQueryTile>& tiles, const std::vector<kernels::KeySpan>& spans,
    bool causal, int64_t rows_per_item);
std::vector<kernels::ForwardItem> sparse_key_items(const std::vector<kernels::SparseKeyTile>& tiles,
                                                   const std::vector<kernels::QuerySpan>& spans,
                                                   bool causal, int64_t rows_per_item);

}  // namespace ringattn::sparse

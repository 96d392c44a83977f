// Shard layouts (contiguous or zigzag) and the copies between full and local tensors.
#include "ring/sharding.hpp"

#include <algorithm>
#include <string>

#include "ringattn/errors.hpp"

namespace ringattn::ring {

std::vector<Chunk> ShardLayout::chunks(int rank) const {
  if (!zigzag) return {{rank * local_len, local_len, 0}};
  const int64_t c = local_len / 2;
  return {{rank * c, c, 0}, {(2 * world - 1 - rank) * c, c, c}};
}

int64_t ShardLayout::global_position(int rank, int64_t row) const {
  for (const Chunk& ch : chunks(rank))
    if (row >= ch.local_begin && row < ch.local_begin + ch.length)
      return ch.begin + (row - ch.local_begin);
  return -1;
}

ShardLayout make_layout(const AttentionConfig& cfg, int world) {
  ShardLayout l;
  l.world = world;
  l.seq_len = cfg.shape.seq_len;
  l.zigzag = cfg.causal && world > 1;
  const int64_t parts = l.zigzag ? 2 * static_cast<int64_t>(world) : world;
  if (world < 1) throw InputError("ranks", "world size must be at least 1");
  if (l.seq_len % parts != 0)
    throw InputError("--seq-len",
                     std::to_string(l.seq_len) + " tokens cannot be split evenly over " +
                         std::to_string(world) + " ranks" +
                         (l.zigzag ? " (causal runs use the balanced zigzag layout: N must be "
                                     "divisible by 2*P = " +
                                         std::to_string(parts) + ")"
                                   : " (N must be divisible by the number of ranks)"));
  l.local_len = l.seq_len / world;
  return l;
}

void extract_rows(const ShardLayout& l, int rank, int64_t batch, int64_t inner, const float* full,
                  float* local) {
  for (int64_t b = 0; b < batch; ++b)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(full + (b * l.seq_len + c.begin) * inner, c.length * inner,
                  local + (b * l.local_len + c.local_begin) * inner);
}

void insert_rows(const ShardLayout& l, int rank, int64_t batch, int64_t inner, const float* local,
                 float* full) {
  for (int64_t b = 0; b < batch; ++b)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(local + (b * l.local_len + c.local_begin) * inner, c.length * inner,
                  full + (b * l.seq_len + c.begin) * inner);
}

void insert_lse(const ShardLayout& l, int rank, int64_t batch, int64_t heads, const float* local,
                float* full) {
  for (int64_t bh = 0; bh < batch * heads; ++bh)
    for (const Chunk& c : l.chunks(rank))
      std::copy_n(local + bh * l.local_len + c.local_begin, c.length,
                  full + bh * l.seq_len + c.begin);
}

}  // namespace ringattn::ring

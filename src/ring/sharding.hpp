// How the sequence is split over ranks. Each rank owns N/P tokens as chunks of consecutive
// positions, stored back to back in its local [B, N/P, H, D] tensors. Causal runs use the
// zigzag layout (2P chunks; rank r holds chunks r and 2P-1-r) so that every rank has the same
// amount of causal work; other runs use one contiguous chunk per rank. Where neither
// balances the work (packed documents of mixed lengths; causal runs whose N is not a
// multiple of 2P) the layout is `balanced`: the sequence is cut into bands of P equal
// pieces and each band's pieces are dealt to the ranks, heaviest piece to the least loaded
// rank, so every rank still holds exactly N/P rows.
#pragma once

#include <cstdint>
#include <vector>

#include "core/head_slice.hpp"
#include "ringattn/config.hpp"

namespace ringattn::ring {

struct Chunk {
  int64_t begin = 0;        // first global position
  int64_t length = 0;       // positions
  int64_t local_begin = 0;  // first local row
};

struct ShardLayout {
  int world = 1;
  int64_t seq_len = 0;
  int64_t local_len = 0;  // N / P
  bool zigzag = false;
  // Balanced layouts list each rank's chunks (ascending positions); empty otherwise.
  std::vector<std::vector<Chunk>> balanced;

  std::vector<Chunk> chunks(int rank) const;
  const char* name() const;  // "contiguous", "zigzag" or "balanced"
  // Global position of local row `row` on `rank`.
  int64_t global_position(int rank, int64_t row) const;
};

// Throws InputError("config.shape.seq_len", ...) when P ranks cannot split N evenly (N % P).
// Contiguous for non-causal runs, zigzag for causal ones when N % 2P == 0, else balanced;
// packed runs take the balanced layout unless the usual one is within 5 % of the mean work.
// `slice`: the job's heads the config computes (default: all of them).
ShardLayout make_layout(const AttentionConfig& cfg, int world, const HeadSlice& slice = {});

// Attended (query, key) pairs of each rank's queries under `l`, summed over batch and heads
// (dense and dilated configs). imbalance() is max / mean (1 for a perfect split).
std::vector<double> attended_pairs_by_rank(const AttentionConfig& cfg, const ShardLayout& l);
double imbalance(const std::vector<double>& pairs_by_rank);

// Copies `rank`'s rows between a full tensor and its local one. `inner` is the number of
// floats per (batch, position): H*D for [B, N, H, D] tensors. For lse [B, H, N] use the
// _lse variants (positions are the last axis there).
void extract_rows(const ShardLayout& l, int rank, int64_t batch, int64_t inner, const float* full,
                  float* local);
void insert_rows(const ShardLayout& l, int rank, int64_t batch, int64_t inner, const float* local,
                 float* full);
void insert_lse(const ShardLayout& l, int rank, int64_t batch, int64_t heads, const float* local,
                float* full);

}  // namespace ringattn::ring

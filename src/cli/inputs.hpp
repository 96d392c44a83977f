// Where a run's tensors come from and go: the shape and documents read from .npy headers
// (each problem named by the option and the file), this rank's shard read from the files or
// synthesised from a counter-based generator (the same tensor for any number of ranks), and
// the shards gathered back into whole tensors on rank 0.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringattn/config.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/ringattn.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn::cli {

// How a message names an input file: with the option that brought it in, "--q (q.npy)".
std::string file_subject(const std::string& option, const std::string& path);

// Runs `f`, which reads the file `path` given with `option`; the reader's errors name the
// path alone, so they are re-aimed at file_subject(option, path).
template <typename F>
auto reading(const std::string& option, const std::string& path, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    if (e.subject() != path) throw;
    throw InputError(file_subject(option, path), e.problem());
  }
}

// The shape of a [B, N, H, D] file, each dimension checked with a message naming the file.
Shape4 shape_of(const std::string& option, const std::string& path);

// The document offsets of a --cu-seqlens file: int32/int64, [n_docs + 1], 0 first, strictly
// increasing, `seq_len` last.
std::vector<int64_t> read_cu_seqlens(const std::string& path, int64_t seq_len);

// The bool block mask of a --block-mask file, its dimensions in `dims`.
std::vector<uint8_t> read_block_mask(const std::string& path, std::vector<int64_t>& dims);

// The attention sinks of a --sinks file: float32 [heads], each finite or -inf (no sink for
// that head).
std::vector<float> read_sinks(const std::string& path, int64_t heads);

// This rank's rows (global positions, local order) of a [B, N, heads, D] tensor of `full`
// shape `s`: read from `path` (every element checked finite) or synthesised.
void load_shard(const std::string& option, const std::string& path,
                const std::vector<int64_t>& rows, const Shape4& s, HostTensor& t);
void fill_synthetic(HostTensor& t, const std::vector<int64_t>& rows, const Shape4& s, uint64_t seed,
                    uint64_t stream);
// One element of the synthetic tensor `stream` (1 q, 2 k, 3 v, 4 dout): uniform with unit
// variance, from a hash of the seed and the global element index.
float synthetic_value(uint64_t seed, uint64_t stream, uint64_t index);

// Gathers each rank's local tensor into the whole one on rank 0 (empty elsewhere).
// `rows_of(r)` gives rank r's positions; `inner` is heads * D for [B, N, heads, D] tensors,
// or, with `is_lse`, the heads of a [B, heads, N] tensor.
template <typename RowsOf>
std::vector<float> gather_full(Comm& comm, const HostTensor& t, int64_t batch, int64_t seq_len,
                               int64_t inner, bool is_lse, RowsOf&& rows_of);
void insert_local(const std::vector<int64_t>& rows, int64_t batch, int64_t seq_len, int64_t inner,
                  bool is_lse, const float* local, float* full);

template <typename RowsOf>
std::vector<float> gather_full(Comm& comm, const HostTensor& t, int64_t batch, int64_t seq_len,
                               int64_t inner, bool is_lse, RowsOf&& rows_of) {
  const auto world = static_cast<std::size_t>(comm.size());
  std::vector<float> all(comm.rank() == 0 ? t.size() * world : 0);
  comm.gather(t.data(), t.size() * sizeof(float), all.data());
  std::vector<float> full;
  if (comm.rank() != 0) return full;
  full.resize(t.size() * world);
  for (int r = 0; r < comm.size(); ++r)
    insert_local(rows_of(r), batch, seq_len, inner, is_lse,
                 all.data() + static_cast<std::size_t>(r) * t.size(), full.data());
  return full;
}

}  // namespace ringattn::cli

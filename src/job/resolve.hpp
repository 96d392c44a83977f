// JobSpec -> ResolvedJob (engine_impl.hpp): every `auto` decided, the fields checked against
// each other and validated, the block lists built and the shard layout made. Collective-free:
// make_engine agrees on its errors across ranks.
#pragma once

#include "job/engine_impl.hpp"

namespace ringattn::job {

// Who will run the job: `world` ranks, threads of this process or not; without lists, only
// the config and the layout are resolved (block-sparse lists are not built, BLAS not opened).
struct Ranks {
  int world = 1;
  bool in_process = false;
  bool with_lists = true;
  int per_node = 1;  // ranks per node (Ulysses auto keeps a group inside one)
};

ResolvedJob resolve(const JobSpec& spec, const Ranks& ranks);

// The global positions `rank` holds under a resolved job, in local order.
std::vector<int64_t> rows_of(const ResolvedJob& r, int rank);

// The global positions `rank` holds when `spec` runs on `world` ranks.
std::vector<int64_t> shard_rows_of(const JobSpec& spec, int world, int rank);

}  // namespace ringattn::job

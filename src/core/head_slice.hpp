// A config's query heads as a slice of a larger job's (Ulysses: each rank of a group computes
// some of the heads). Internal: the engines below the job layer take it beside the config.
#pragma once

#include <cstdint>

#include "ringattn/config.hpp"

namespace ringattn {

// The config's heads are the job's [base, base + cfg.shape.heads) of `total`, so that a
// dilated head keeps its job head's group and offset (group_heads_of, pattern_offset) on
// whichever rank computes it. The default is the whole job.
struct HeadSlice {
  int64_t base = 0;
  int64_t total = 0;  // the job's query heads; 0: the config's own

  int64_t total_of(const AttentionConfig& cfg) const { return total > 0 ? total : cfg.shape.heads; }
  bool whole() const { return base == 0 && total == 0; }
};

// validate(cfg) for a config that computes the slice `heads` of a job's heads: the slice
// lies inside the job, and a grouped dilated job has a head per group of the job's heads.
void validate(const AttentionConfig& cfg, const HeadSlice& heads);

}  // namespace ringattn

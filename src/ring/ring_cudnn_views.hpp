// A GPU ring step as cuDNN views (kernels/cuda/cudnn/graphs.hpp): the tasks of one step of the
// ring schedule (ring_schedule.hpp), read back as strided 4-D windows onto the rank's q/out
// and the step's K/V (its own [B, N/P, HKV, D] shard at step 0, the packed receive buffer
// after), so that cuDNN's fused attention can run each step: the forward into a partial
// merged by lse, the backward from the global out and lse (TransformerEngine's scheme). Host
// code, no cuDNN types: the views are checked task by task here and validated by cuDNN in
// test_cudnn_graphs.
#pragma once

#include <string>
#include <vector>

#include "kernels/cuda/cudnn/graphs.hpp"
#include "ring/ring_schedule.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"

namespace ringattn::ring {

// The views of step `step` (every wave's tasks, each (query chunk, key chunk, document) one
// view over all batches and heads, causality and a sliding window as cuDNN's band). Each
// view's q_offset indexes q, out and dout (elements of the [B, N/P, H, D] shard), its
// kv_offset the step's K and V; row_offset is its first query position in the shard (the
// epilogues' place, segment = N/P; the ring merges every view into out/lse by lse). Every
// view row sees at least one key (rows and keys outside the band are trimmed off, so bounds
// are right >= 0, left >= 1), and views adjacent in their query or key rows are joined
// where one band sees exactly what both did. Empty, with `why`, where a step's tasks are
// not such grids (dilated attention, [B,H,N,D] tensors); a step with no tasks gives no views
// and no reason.
std::vector<kernels::cuda::SdpaView> ring_step_views(const AttentionConfig& cfg,
                                                     const ShardLayout& layout,
                                                     const RingStep& step, std::string* why);

// Whether ring_step_views can map this configuration at all (the per-task checks aside):
// "" or why not, naming the feature.
std::string ring_cudnn_unsupported(const AttentionConfig& cfg);

}  // namespace ringattn::ring

// One configured attention problem for the Python package: the keywords of
// ringattn.attention() turned into an AttentionConfig by the CLI's own option parser (so
// every bad option is the CLI's InputError, message and all), validated, and the engine
// built once for it: Plan on one rank, RingPlan over several, SparsePlan for block-sparse.
// Python caches one AttentionOp per configuration; forward/backward then allocate nothing.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm_handle.hpp"
#include "ring/ring_engine.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"
#include "ringattn/plan.hpp"
#include "sparse/sparse_plan.hpp"

namespace ringattn::python {

// The keywords of ringattn.attention(), as Python hands them over.
struct AttentionOptions {
  std::string attention = "dense";
  std::optional<std::vector<int64_t>> segments, dilations, seqlens;
  std::string combine = "grouped";
  bool causal = false;
  std::optional<double> scale;
  std::optional<std::vector<int64_t>> window;  // [L] or [L, R]
  std::optional<std::string> pattern;
  bool has_block_mask = false;
  int64_t block_size = 128;
  // "bnhd": q, k, v, out and the gradients are C-contiguous [B, N, H, D]; "bhnd": they are
  // [B, N, H, D] views of C-contiguous [B, H, N, D] tensors (x.transpose(1, 2) of PyTorch
  // SDPA's convention), read in place, on any number of ranks.
  std::string layout = "bnhd";
};

// An explicit block mask: bool (as bytes), [mask_heads, nb, nb], C order.
struct BlockMask {
  const uint8_t* data = nullptr;
  std::vector<int64_t> dims;
};

// The layout over `world` ranks that the engine gives a problem of `full` shape with these
// options (zigzag for causal runs, whole blocks for block-sparse, and whatever the core
// decides for the others), so that ringattn.shard() places rows where attention() expects
// them. Block-sparse needs no pattern here: the layout depends only on N and the block size.
ring::ShardLayout layout_for(AttentionOptions o, const Shape4& full, int world);

class AttentionOp {
 public:
  // `local_q`: this rank's [B, N/P, H, D]. With several ranks, a setup error on any rank is
  // raised on every rank (the lowest failing rank's message), so no rank is left waiting.
  AttentionOp(const AttentionOptions& o, const Shape4& local_q, int64_t kv_heads,
              const CommHandle& comm, const std::optional<BlockMask>& mask);
  ~AttentionOp();

  const AttentionConfig& config() const { return cfg_; }
  const ring::ShardLayout& layout() const { return layout_; }
  std::string engine() const;

  // Local shards, float32, C order: q, out [B, N/P, H, D]; k, v [B, N/P, HKV, D];
  // lse [B, H, N/P]. Sizes are checked by the caller.
  void forward(const float* q, const float* k, const float* v, float* out, float* lse);
  void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv);

 private:
  template <typename F>
  void run_engine(F&& f);

  // One call at a time: the plan's workspace is shared by its calls, and Python threads may
  // reach one cached plan together (the GIL is released while the engine runs).
  std::mutex running_;
  CommHandle comm_;
  AttentionConfig cfg_;
  ring::ShardLayout layout_;
  std::optional<Plan> plan_;
  std::optional<ring::RingPlan> ring_;
  std::optional<sparse::SparsePlan> sparse_;
};

}  // namespace ringattn::python

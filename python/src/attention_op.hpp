// One configured attention problem for the Python package: the keywords of
// ringattn.attention() turned into the library's JobSpec (each bad keyword an InputError
// naming it), and the Engine made once for it by make_engine, which resolves, validates and
// plans as for every front end; its errors are re-aimed at the keywords. Python caches one
// AttentionOp per configuration; forward/backward then allocate nothing.
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm_handle.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn::python {

// The keyword that sets JobSpec field `subject` ("config.shape.seq_len" -> "seq_len",
// "transport" -> "comm"); any other subject unchanged. With keyword_words, the one place the
// package translates the library's field names.
std::string keyword_of(const std::string& subject);
// A library text with its field words (ringattn/field_words.hpp) in the keywords':
// "config.attention=dilated" -> attention="dilated", "config.causal=true" -> causal=True,
// "attention_auto=true" -> attention="auto", "sinks=false" -> sinks=None, "timeout_s" ->
// timeout. Fields no keyword sets (device, kernel, dtype, threads, transport's values) keep
// the library's words.
std::string keyword_words(std::string_view text);
// What Python raises for `e`: an InputError's subject said as keyword_of says it, and the
// text of any error as keyword_words says it.
std::string keyword_message(const std::exception& e);

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
  // k, v and their gradients, when they are laid out unlike q (a head-major KV cache).
  std::string kv_layout = "bnhd";
  int ulysses = 1;             // Ulysses x ring: U ranks per all-to-all group (0: auto)
  bool deterministic = false;  // bitwise-reproducible kernel choices (JobSpec::deterministic)
  bool sinks = false;          // attention sinks given to every call (JobSpec::sinks)
  // v's head dim where it is not q's (multi-head latent attention): v, dv, out and dout have
  // it. Taken from v's shape, so no keyword sets it.
  std::optional<int64_t> head_dim_v;
  double softcap = 0;  // logit soft-capping (config.softcap; 0: none)
  // Where q's tensors live: "cpu", or "cuda" (device_index, and the dtype the GPU kernels
  // read: "bf16", "fp16" or "fp32").
  std::string device = "cpu";
  int device_index = -1;
  std::string dtype = "fp32";
};

// An explicit block mask: bool (as bytes), [mask_heads, nb, nb], C order.
struct BlockMask {
  const uint8_t* data = nullptr;
  std::vector<int64_t> dims;
};

// The global positions each of `world` ranks holds for a problem of `full` shape with these
// options (ringattn::shard_rows: zigzag for causal runs, whole blocks for block-sparse), so
// that ringattn.shard() places rows where attention() expects them. Block-sparse needs no
// pattern here: the layout depends only on N and the block size.
std::vector<std::vector<int64_t>> rows_for(const AttentionOptions& o, const Shape4& full,
                                           int world);

class AttentionOp {
 public:
  // `local_q`: this rank's [B, N/P, H, D]. With several ranks, a setup error on any rank is
  // raised on every rank (the lowest failing rank's message), so no rank is left waiting.
  AttentionOp(const AttentionOptions& o, const Shape4& local_q, int64_t kv_heads,
              const CommHandle& comm, const std::optional<BlockMask>& mask);
  ~AttentionOp();

  const AttentionConfig& config() const { return engine_->config(); }
  int64_t local_len() const { return engine_->local_len(); }
  std::string engine() const { return engine_->stats().engine; }

  // Local shards, float32, C order: q [B, N/P, H, D]; k [B, N/P, HKV, D]; v [B, N/P, HKV,
  // Dv]; out [B, N/P, H, Dv]; lse [B, H, N/P]. Sizes are checked by the caller.
  // With sinks: sinks and dsinks [H] float32 (null otherwise).
  void forward(const float* q, const float* k, const float* v, float* out, float* lse,
               const float* sinks);
  void backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv, const float* sinks,
                float* dsinks);
  // Device tensors (CUDA engines): q, k, v, dout in the engine's dtype, the rest fp32, each
  // TensorRef carrying the caller's stream.
  void forward(const TensorRef& q, const TensorRef& k, const TensorRef& v, const TensorRef& out,
               const TensorRef& lse, const TensorRef& sinks);
  void backward(const TensorRef& q, const TensorRef& k, const TensorRef& v, const TensorRef& out,
                const TensorRef& lse, const TensorRef& dout, const TensorRef& dq,
                const TensorRef& dk, const TensorRef& dv, const TensorRef& sinks,
                const TensorRef& dsinks);
  bool on_gpu() const { return engine_->device() == Device::cuda; }
  DeviceDType dtype() const { return engine_->dtype(); }

 private:
  template <typename F>
  void run_engine(F&& f);

  // One call at a time: the plan's workspace is shared by its calls, and Python threads may
  // reach one cached plan together (the GIL is released while the engine runs).
  std::mutex running_;
  CommHandle comm_;
  std::optional<Engine> engine_;
};

}  // namespace ringattn::python

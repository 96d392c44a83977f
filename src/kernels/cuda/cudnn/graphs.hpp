// cuDNN's fused attention through NVIDIA's cudnn-frontend graph API: the strided 4-D views a
// configuration runs as (each a [batch', heads, rows, D] window onto q, k, v and out read in
// place, with causality and sliding windows as cuDNN's diagonal band), and the graphs built
// on them: the forward with its softmax stats (the natural-log lse), and the backward from
// O, dO and the stats. This header is free of the frontend's types: its checks run on any
// machine with cuDNN loadable, no GPU needed (the graphs are validated for a stated compute
// capability instead of the device's).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ringattn/config.hpp"
#include "ringattn/types.hpp"

namespace ringattn::kernels::cuda {

// One view: element strides and offsets into the [B, N, H, D] tensors (q and out share
// theirs; k and v theirs), dimensions in cuDNN's [batch, head, row, dim] order.
struct SdpaView {
  int64_t batch = 1, heads = 1, kv_heads = 1, rows = 0, head_dim = 0;
  int64_t kv_rows = 0;  // key rows, where they differ from `rows` (a ring step); 0: rows
  std::array<int64_t, 4> q_stride{}, kv_stride{};
  int64_t q_offset = 0, kv_offset = 0;
  float scale = 1;
  // cuDNN's diagonal band (top-left aligned): key j is seen by row i when
  // i - left_bound < j (left) and j <= i + right_bound (right); causal is right_bound 0.
  std::optional<int64_t> left_bound, right_bound;
  // Where the view's rows land in out/lse and how they combine (grouped output is scaled by
  // 1/G, mixture views merge by lse), for the epilogue that writes them.
  float out_scale = 1;
  bool accumulate = false;
  // The view's rows in [B, N, H, D] terms, for those epilogues: segments of `segment` rows,
  // `rows` of each selected at row_offset + i·dilation; heads first_head + j·head_step.
  int64_t segment = 0, dilation = 1, row_offset = 0, first_head = 0, head_step = 1;
  // Values of their own head dim (v, out, dout, dv: head_dim_v columns; 0: head_dim), and
  // the logit soft-cap c·tanh(s/c) on the scaled scores (0: none), as cuDNN's score modifier.
  int64_t head_dim_v = 0;
  float softcap = 0;

  int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // The offsets and strides above count q and k elements (whole rows of head_dim); v and out
  // rows sit at the same row positions, value_dim() wide (kernels/cpu_flash.hpp's
  // value_floats).
  int64_t value_elems(int64_t x) const { return x / head_dim * value_dim(); }
  std::array<int64_t, 4> value_strides(const std::array<int64_t, 4>& s) const {
    return {value_elems(s[0]), value_elems(s[1]), value_elems(s[2]), s[3]};
  }
  std::array<int64_t, 4> o_stride() const { return value_strides(q_stride); }
  std::array<int64_t, 4> v_stride() const { return value_strides(kv_stride); }
  int64_t o_offset() const { return value_elems(q_offset); }
  int64_t v_offset() const { return value_elems(kv_offset); }
};

// The view rows that see at least one key under the view's band: [begin, end) within
// [0, rows) (rows of a band wholly left or right of the keys see none).
inline std::pair<int64_t, int64_t> rows_with_keys(const SdpaView& v) {
  const int64_t keys = v.kv_rows > 0 ? v.kv_rows : v.rows;
  // Row i sees key j when i - left < j <= i + right and 0 <= j < keys: some j exists when
  // i >= -right and i - left + 1 <= keys - 1.
  int64_t begin = v.right_bound ? std::max<int64_t>(0, -*v.right_bound) : 0;
  int64_t end = v.left_bound ? std::min(v.rows, keys + *v.left_bound - 1) : v.rows;
  if (keys <= 0) begin = end = 0;
  return {std::min(begin, v.rows), std::max(std::min(begin, v.rows), end)};
}

// The views of a configuration (docs/SEMANTICS.md): dense is one (GQA through kv_heads; a
// packed sequence one per document); grouped dilated one per head group; mixture one per
// (pattern, offset class of heads). Empty, with `why` set, where cuDNN cannot read the
// problem in place (head-major tensors, dilated GQA whose head groups split K/V heads).
std::vector<SdpaView> sdpa_views(const AttentionConfig& cfg, std::string* why);
// sdpa_views, or std::runtime_error with `why` where there are none (CudnnGraphPlan's).
std::vector<SdpaView> sdpa_views_or_throw(const AttentionConfig& cfg);

enum class SdpaGraphKind { forward, backward };

struct SdpaGraphCheck {
  SdpaGraphKind kind = SdpaGraphKind::forward;
  std::size_t view = 0;
  std::string status;  // "" when cuDNN's validate() accepts the graph
};

// Builds every view's forward and backward graph for `dtype` (bf16 or fp16) and runs the
// frontend's validate() for compute capability `sm_version` (90: Hopper) against the cuDNN
// this process loads (its version decides which features validate). Throws RuntimeFailure
// when cuDNN cannot be loaded or this build has no cudnn-frontend.
std::vector<SdpaGraphCheck> validate_sdpa_graphs(const AttentionConfig& cfg, DeviceDType dtype,
                                                 int sm_version);

// validate() of one view's graph: "" or cuDNN's reason. Throws as validate_sdpa_graphs.
std::string validate_sdpa_view(const SdpaView& view, SdpaGraphKind kind, DeviceDType dtype,
                               int sm_version);

// The cuDNN library this process loads, e.g. "cuDNN 9.19.0", or why none can be loaded.
bool cudnn_loadable(std::string* description);

#if RINGATTN_CUDA_EMULATION
// Whether tests asked for cuDNN's stand-in on the emulated GPU (RINGATTN_EMU_CUDNN_STANDIN=1;
// cudnn/graphs_emulated.cpp): CudnnGraphPlan's view constructor refuses otherwise.
bool cudnn_standin_enabled();
#endif

// A configuration's view graphs built for one GPU and run there: the forward with stats and,
// when asked, the backward. Each graph is built once, in the constructor (cuDNN's heuristics
// mode A; build_ms() says how long that took), with one workspace for all of them. Tensors
// are device pointers: q, dq [B, N, H, D], out, dout [B, N, H, Dv], k, dk [B, N, HKV, D] and
// v, dv [B, N, HKV, Dv] in `dtype` (bf16 or fp16), read and written through each view's
// strides (SdpaView::o_stride, v_stride for the Dv-wide ones); stats fp32, the views' back
// to back (view i at stats_offset(i), [batch', heads, rows] each). Rows no view selects are
// left as they are (zero dq, dk, dv first). Work runs on `stream` (a cudaStream_t).
class CudnnGraphPlan {
 public:
  // Throws std::runtime_error naming why cuDNN cannot run the configuration here: no views
  // (sdpa_views' reason), cuDNN not loadable, or a graph this device and cuDNN version do
  // not support (the caller falls back to the native kernels with that note).
  CudnnGraphPlan(const AttentionConfig& cfg, DeviceDType dtype, int device, void* stream,
                 bool with_backward);
  // The given views' graphs (a ring step's, ring_cudnn_views.hpp), throwing as above.
  CudnnGraphPlan(std::vector<SdpaView> views, DeviceDType dtype, int device, void* stream,
                 bool with_backward);
  ~CudnnGraphPlan();
  CudnnGraphPlan(const CudnnGraphPlan&) = delete;
  CudnnGraphPlan& operator=(const CudnnGraphPlan&) = delete;

  const std::vector<SdpaView>& views() const;
  int64_t stats_offset(std::size_t view) const;
  int64_t stats_floats() const;
  void forward(const void* q, const void* k, const void* v, void* out, float* stats);
  // One view's forward (stats at that view's offset). Views of a dilated mixture overlap in
  // `out`: a caller that moves each view's result elsewhere runs them one at a time.
  void forward_view(std::size_t view, const void* q, const void* k, const void* v, void* out,
                    float* stats);
  void backward(const void* q, const void* k, const void* v, const void* out, const void* dout,
                const float* stats, void* dq, void* dk, void* dv);
  // One view's backward (stats at that view's offset); it writes dq, dk, dv at the view's rows.
  void backward_view(std::size_t view, const void* q, const void* k, const void* v, const void* out,
                     const void* dout, const float* stats, void* dq, void* dk, void* dv);
  double build_ms() const;
  std::size_t workspace_bytes() const;  // cuDNN's own, shared by the graphs
  std::string description() const;      // "cuDNN 9.19.0: 1 view, composite forward + backward"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::kernels::cuda

// The views and the cudnn-frontend graphs of cudnn/graphs.hpp. The frontend is used in its
// dynamic-loading mode: cuDNN is opened with dlopen here, once, so a binary without cuDNN
// still starts (and the engines fall back to the native kernels).
#include "kernels/cuda/cudnn/graphs.hpp"

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "ringattn/device.hpp"
#include "ringattn/errors.hpp"

// The handle the frontend's dynamic-loading mode resolves every cuDNN call through.
void* cudnn_frontend::cudnn_dlhandle = nullptr;

namespace ringattn::kernels::cuda {

namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

// Opens cuDNN once; "" or why it cannot be opened.
const std::string& open_cudnn() {
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"})
      if ((fe::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_LOCAL))) return;
    const char* why = dlerror();
    error = std::string("cannot load libcudnn.so.9: ") + (why ? why : "not found");
  });
  return error;
}

std::vector<int64_t> dims(const SdpaView& v, int64_t heads) {
  return {v.batch, heads, v.rows, v.head_dim};
}
std::vector<int64_t> kv_dims(const SdpaView& v) {
  return {v.batch, v.kv_heads, v.kv_rows > 0 ? v.kv_rows : v.rows, v.head_dim};
}
// O and dO; V and dV (value_dim() columns).
std::vector<int64_t> o_dims(const SdpaView& v) {
  return {v.batch, v.heads, v.rows, v.value_dim()};
}
std::vector<int64_t> v_dims(const SdpaView& v) {
  return {v.batch, v.kv_heads, v.kv_rows > 0 ? v.kv_rows : v.rows, v.value_dim()};
}
std::vector<int64_t> strides(const std::array<int64_t, 4>& s) { return {s[0], s[1], s[2], s[3]}; }

fe::DataType_t io_type(DeviceDType t) {
  return t == DeviceDType::fp16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// The soft-cap as cuDNN's score modifier: c·tanh(s/c) on the scaled score, then the view's
// band as a mask inside the same modifier (a graph with a score modifier takes no diagonal
// band of its own). One Softcap per graph: its backward reuses the forward's s/c.
using ScoreMod = std::function<Tensor(std::shared_ptr<Graph>, Tensor)>;
using Softcap = fe::graph::attn::score_modifiers::Softcap;
ScoreMod capped_scores(const SdpaView& v, std::shared_ptr<Softcap> cap) {
  const float c = v.softcap;
  const std::optional<int64_t> left = v.left_bound, right = v.right_bound;
  return [=](std::shared_ptr<Graph> g, Tensor score) {
    Tensor out = cap->forward(g, score, g->tensor(c, fe::graph::ScalarType::COMPILE_TIME_CONST));
    if (left || right)
      out = fe::graph::attn::score_modifiers::sliding_window_mask(
          g, out, fe::DiagonalAlignment_t::TOP_LEFT, left, right, 0, 0, nullptr, nullptr, nullptr,
          nullptr);
    return out;
  };
}
ScoreMod capped_scores_bprop(const SdpaView& v,
                             std::shared_ptr<Softcap> cap) {
  const float c = v.softcap;
  return [=](std::shared_ptr<Graph> g, Tensor d_score) {
    return cap->backward(g, d_score, g->tensor(c, fe::graph::ScalarType::COMPILE_TIME_CONST));
  };
}

// The band of a view, set on either attribute set (forward or backward); with a soft-cap the
// score modifier carries it (capped_scores).
template <typename Attributes>
void set_band(const SdpaView& v, Attributes& a) {
  if (v.softcap > 0) return;
  if (!v.left_bound && !v.right_bound) return;
  a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT);
  if (v.left_bound) a.set_diagonal_band_left_bound(static_cast<int>(*v.left_bound));
  if (v.right_bound) a.set_diagonal_band_right_bound(static_cast<int>(*v.right_bound));
}

struct Inputs {
  Tensor q, k, v;
};

Inputs inputs(Graph& g, const SdpaView& v) {
  auto t = [&](const char* name, const std::vector<int64_t>& d, const std::array<int64_t, 4>& s) {
    return g.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim(d).set_stride(strides(s)));
  };
  return {t("Q", dims(v, v.heads), v.q_stride), t("K", kv_dims(v), v.kv_stride),
          t("V", v_dims(v), v.v_stride())};
}

// Stats (lse) [batch, heads, rows, 1], fp32, contiguous per view.
std::vector<int64_t> stats_stride(const SdpaView& v) { return {v.heads * v.rows, v.rows, 1, 1}; }

std::shared_ptr<Graph> new_graph(DeviceDType dtype, int sm_version) {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(io_type(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  g->set_sm_version(sm_version);
  return g;
}

// A view's graph and the tensors a variant pack binds.
struct ViewGraph {
  std::shared_ptr<Graph> graph;
  Tensor q, k, v, o, dout, stats, dq, dk, dv;
};

// Forward with stats: O in the io type through the view's strides (into a scratch tensor
// shaped like q), the lse in fp32.
ViewGraph forward_graph(const SdpaView& v, DeviceDType dtype, int sm_version) {
  ViewGraph vg;
  vg.graph = new_graph(dtype, sm_version);
  const Inputs in = inputs(*vg.graph, v);
  // The composite graph: the one whose masks (causal, windows) every cuDNN 9 runs; the
  // unified operation takes masks only from 9.21 on.
  auto a = fe::graph::SDPA_attributes()
               .set_name("sdpa")
               .set_generate_stats(true)
               .set_attn_scale(v.scale)
               .set_implementation(fe::AttentionImplementation_t::COMPOSITE);
  set_band(v, a);
  if (v.softcap > 0)
    a.set_score_mod(capped_scores(v, std::make_shared<Softcap>()));
  auto [o, stats] = vg.graph->sdpa(in.q, in.k, in.v, a);
  o->set_output(true).set_dim(o_dims(v)).set_stride(strides(v.o_stride()));
  stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_stride(stats_stride(v));
  vg.q = in.q, vg.k = in.k, vg.v = in.v, vg.o = o, vg.stats = stats;
  return vg;
}

// Backward from O, dO and the stats: dQ, dK, dV in the io type (the engines add them into
// their fp32 gradients).
ViewGraph backward_graph(const SdpaView& v, DeviceDType dtype, int sm_version) {
  ViewGraph vg;
  vg.graph = new_graph(dtype, sm_version);
  Graph& g = *vg.graph;
  const Inputs in = inputs(g, v);
  auto t = [&](const char* name, const std::vector<int64_t>& d, const std::vector<int64_t>& s) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(d).set_stride(s));
  };
  Tensor o = t("O", o_dims(v), strides(v.o_stride()));
  Tensor dout = t("dO", o_dims(v), strides(v.o_stride()));
  Tensor stats = t("Stats", {v.batch, v.heads, v.rows, 1}, stats_stride(v));
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto a = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(v.scale);
  set_band(v, a);
  if (v.softcap > 0) {
    auto cap = std::make_shared<Softcap>();
    a.set_score_mod(capped_scores(v, cap)).set_score_mod_bprop(capped_scores_bprop(v, cap));
  }
  auto [dq, dk, dv] = g.sdpa_backward(in.q, in.k, in.v, o, dout, stats, a);
  dq->set_output(true).set_dim(dims(v, v.heads)).set_stride(strides(v.q_stride));
  dk->set_output(true).set_dim(kv_dims(v)).set_stride(strides(v.kv_stride));
  dv->set_output(true).set_dim(v_dims(v)).set_stride(strides(v.v_stride()));
  vg.q = in.q, vg.k = in.k, vg.v = in.v, vg.o = o, vg.dout = dout, vg.stats = stats;
  vg.dq = dq, vg.dk = dk, vg.dv = dv;
  return vg;
}

}  // namespace

bool cudnn_loadable(std::string* description) {
  const std::string& error = open_cudnn();
  if (!error.empty()) {
    if (description) *description = error;
    return false;
  }
  const std::size_t v = fe::detail::get_backend_version();
  if (description)
    *description = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) +
                   "." + std::to_string(v % 100);
  return true;
}

std::string validate_sdpa_view(const SdpaView& view, SdpaGraphKind kind, DeviceDType dtype,
                               int sm_version) {
  if (const std::string& error = open_cudnn(); !error.empty()) throw RuntimeFailure(error);
  const ViewGraph vg = kind == SdpaGraphKind::forward ? forward_graph(view, dtype, sm_version)
                                                      : backward_graph(view, dtype, sm_version);
  fe::error_t status = vg.graph->validate();
  return status.is_good() ? "" : status.get_message();
}

std::vector<SdpaGraphCheck> validate_sdpa_graphs(const AttentionConfig& cfg, DeviceDType dtype,
                                                 int sm_version) {
  std::string why;
  const std::vector<SdpaView> views = sdpa_views(cfg, &why);
  if (views.empty()) throw RuntimeFailure("no cuDNN views: " + why);
  std::vector<SdpaGraphCheck> checks;
  for (std::size_t i = 0; i < views.size(); ++i)
    for (const SdpaGraphKind kind : {SdpaGraphKind::forward, SdpaGraphKind::backward})
      checks.push_back({kind, i, validate_sdpa_view(views[i], kind, dtype, sm_version)});
  return checks;
}

// --- CudnnGraphPlan -----------------------------------------------------------------------

struct CudnnGraphPlan::Impl {
  std::vector<SdpaView> views;
  std::vector<ViewGraph> forward, backward;
  std::vector<int64_t> stats_offsets;
  int64_t stats_floats = 0;
  std::size_t elem_bytes = 2;
  cudnnHandle_t handle = nullptr;
  DeviceBuffer workspace;
  double build_ms = 0;
  std::string description;

  ~Impl() {
    if (handle) (void)fe::detail::destroy_handle(handle);
  }
  // Builds one graph for this device: validate, operation graph, heuristics mode A, check
  // support, plans. Throws naming the view and cuDNN's reason.
  void build(ViewGraph& vg, std::size_t view, const char* kind, int64_t& workspace_bytes) {
    fe::error_t status = vg.graph->build(handle, {fe::HeurMode_t::A});
    if (status.is_bad())
      throw std::runtime_error(std::string("cuDNN cannot run the ") + kind + " of view " +
                               std::to_string(view) + ": " + status.get_message());
    int64_t ws = 0;
    if (vg.graph->get_workspace_size(ws).is_bad()) ws = 0;
    workspace_bytes = std::max(workspace_bytes, ws);
  }
  void execute(const ViewGraph& vg, std::unordered_map<Tensor, void*>& pack) {
    fe::error_t status = vg.graph->execute(handle, pack, workspace.data());
    if (status.is_bad())
      throw RuntimeFailure("cuDNN SDPA execution failed: " + status.get_message());
  }
  const char* at(const void* base, int64_t elements) const {
    return static_cast<const char*>(base) + elements * static_cast<int64_t>(elem_bytes);
  }
};

CudnnGraphPlan::CudnnGraphPlan(const AttentionConfig& cfg, DeviceDType dtype, int device,
                               void* stream, bool with_backward)
    : CudnnGraphPlan(sdpa_views_or_throw(cfg), dtype, device, stream, with_backward) {}

CudnnGraphPlan::CudnnGraphPlan(std::vector<SdpaView> views, DeviceDType dtype, int device,
                               void* stream, bool with_backward)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (dtype == DeviceDType::fp32)
    throw std::runtime_error("cuDNN's fused attention takes bf16 or fp16 inputs, not fp32");
  if (views.empty()) throw std::runtime_error("no cuDNN views");
  m.views = std::move(views);
  if (const std::string& error = open_cudnn(); !error.empty()) throw std::runtime_error(error);
  const CudaDeviceStatus d = probe_cuda_device(device);
  if (!d.usable) throw std::runtime_error(d.reason);
  const int sm = d.cc_major * 10 + d.cc_minor;
  const auto t0 = std::chrono::steady_clock::now();
  if (fe::detail::create_handle(&m.handle) != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error("cudnnCreate failed");
  (void)fe::detail::set_stream(m.handle, static_cast<cudaStream_t>(stream));
  int64_t ws = 0;
  for (std::size_t i = 0; i < m.views.size(); ++i) {
    const SdpaView& v = m.views[i];
    m.stats_offsets.push_back(m.stats_floats);
    m.stats_floats += v.batch * v.heads * v.rows;
    m.forward.push_back(forward_graph(v, dtype, sm));
    m.build(m.forward.back(), i, "forward", ws);
    if (with_backward) {
      m.backward.push_back(backward_graph(v, dtype, sm));
      m.build(m.backward.back(), i, "backward", ws);
    }
  }
  m.workspace = DeviceBuffer(static_cast<std::size_t>(std::max<int64_t>(ws, 1)),
                             "the cuDNN workspace", device);
  m.build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string version;
  (void)cudnn_loadable(&version);
  m.description = version + ": " + std::to_string(m.views.size()) +
                  (m.views.size() == 1 ? " view" : " views") + ", composite forward" +
                  (with_backward ? " + backward" : "");
}

CudnnGraphPlan::~CudnnGraphPlan() = default;

const std::vector<SdpaView>& CudnnGraphPlan::views() const { return impl_->views; }
int64_t CudnnGraphPlan::stats_offset(std::size_t view) const { return impl_->stats_offsets[view]; }
int64_t CudnnGraphPlan::stats_floats() const { return impl_->stats_floats; }
double CudnnGraphPlan::build_ms() const { return impl_->build_ms; }
std::size_t CudnnGraphPlan::workspace_bytes() const { return impl_->workspace.bytes(); }
std::string CudnnGraphPlan::description() const { return impl_->description; }

void CudnnGraphPlan::forward(const void* q, const void* k, const void* v, void* out, float* stats) {
  for (std::size_t i = 0; i < impl_->views.size(); ++i) forward_view(i, q, k, v, out, stats);
}

void CudnnGraphPlan::forward_view(std::size_t i, const void* q, const void* k, const void* v,
                                  void* out, float* stats) {
  Impl& m = *impl_;
  const SdpaView& w = m.views.at(i);
  const ViewGraph& g = m.forward[i];
  std::unordered_map<Tensor, void*> pack = {{g.q, const_cast<char*>(m.at(q, w.q_offset))},
                                            {g.k, const_cast<char*>(m.at(k, w.kv_offset))},
                                            {g.v, const_cast<char*>(m.at(v, w.v_offset()))},
                                            {g.o, const_cast<char*>(m.at(out, w.o_offset()))},
                                            {g.stats, stats + m.stats_offsets[i]}};
  m.execute(g, pack);
}

void CudnnGraphPlan::backward(const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const float* stats, void* dq, void* dk, void* dv) {
  for (std::size_t i = 0; i < impl_->views.size(); ++i)
    backward_view(i, q, k, v, out, dout, stats, dq, dk, dv);
}

void CudnnGraphPlan::backward_view(std::size_t i, const void* q, const void* k, const void* v,
                                   const void* out, const void* dout, const float* stats, void* dq,
                                   void* dk, void* dv) {
  Impl& m = *impl_;
  if (m.backward.empty()) throw std::logic_error("CudnnGraphPlan: built without the backward");
  const SdpaView& w = m.views.at(i);
  const ViewGraph& g = m.backward[i];
  auto p = [&](const void* base, int64_t offset) { return const_cast<char*>(m.at(base, offset)); };
  std::unordered_map<Tensor, void*> pack = {
      {g.q, p(q, w.q_offset)},          {g.k, p(k, w.kv_offset)},
      {g.v, p(v, w.v_offset())},        {g.o, p(out, w.o_offset())},
      {g.dout, p(dout, w.o_offset())},  {g.stats, const_cast<float*>(stats + m.stats_offsets[i])},
      {g.dq, p(dq, w.q_offset)},        {g.dk, p(dk, w.kv_offset)},
      {g.dv, p(dv, w.v_offset())}};
  m.execute(g, pack);
}

}  // namespace ringattn::kernels::cuda

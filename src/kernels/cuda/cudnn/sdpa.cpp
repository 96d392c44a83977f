// CudnnSdpa over CudnnGraphPlan (see cudnn/sdpa.hpp): scratch tensors, the epilogues, and
// which views the backward can take.
#include "kernels/cuda/cudnn/sdpa.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "kernels/cuda/cudnn/graphs.hpp"
#include "kernels/cuda/cudnn/view_results.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

namespace {

// Which backward the views take: each view writing its own rows once (dense, packed, grouped
// head groups: `disjoint`, their outputs sharing one out_scale), or views merged by lse
// (mixture: `merged`, each view's gradients added in turn), else none.
enum class BackwardViews { none, disjoint, merged };
BackwardViews backward_views(const std::vector<SdpaView>& views) {
  const SdpaView& v0 = views.front();
  const bool same = std::all_of(views.begin(), views.end(), [&](const SdpaView& v) {
    return v.accumulate == v0.accumulate && v.out_scale == v0.out_scale;
  });
  if (!same || (v0.accumulate && v0.out_scale != 1.0f)) return BackwardViews::none;
  return v0.accumulate ? BackwardViews::merged : BackwardViews::disjoint;
}

StridedView strided(int64_t offset, int64_t batch, int64_t heads, int64_t rows, int64_t dim,
                    const std::array<int64_t, 4>& strides) {
  StridedView v{offset, {batch, heads, rows, dim}, {}};
  for (std::size_t a = 0; a < 4; ++a) v.strides[a] = strides[a];
  return v;
}

}  // namespace

struct CudnnSdpa::Impl {
  AttentionConfig cfg;
  Elem elem = Elem::bf16;
  std::unique_ptr<CudnnGraphPlan> plan;
  std::vector<SdpaView> views;
  std::vector<ViewResultParams> places;
  // The backward's views merge by lse (mixture: added view by view), and the factor every
  // view's output carries (grouped: 1/G; the backward reads O as out / out_scale and scales
  // the gradients by out_scale, dO's factor).
  bool merged = false;
  float out_scale = 1.0f;
  // Whether one view is all of lse in its own order ([B, H, N]): the stats are lse itself.
  bool stats_are_lse = false;
  // Whether the views leave rows or heads out (dilated): the gradient scratch is zeroed.
  bool partial_cover = false;
  DeviceAllocation o_scratch, stats, dq_scratch, dk_scratch, dv_scratch;
  std::string backward_refusal;  // why the backward is not cuDNN's, when it was asked for
};

CudnnSdpa::CudnnSdpa(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnSdpa::~CudnnSdpa() = default;

std::unique_ptr<CudnnSdpa> CudnnSdpa::create(const AttentionConfig& cfg, Elem e, int device,
                                             cudaStream_t stream, bool with_backward) {
  if (e == Elem::fp32)
    throw CudnnUnavailable("cuDNN's fused attention takes bf16 or fp16, not fp32");
  std::string why;
  const std::vector<SdpaView> views = sdpa_views(cfg, &why);
  if (views.empty()) throw CudnnUnavailable(why);
  auto m = std::make_unique<Impl>();
  m->cfg = cfg;
  m->elem = e;
  const BackwardViews kind = backward_views(views);
  bool backward = with_backward && kind != BackwardViews::none;
  if (with_backward && !backward)
    m->backward_refusal = "views that neither merge by lse nor share one output scale";
  m->views = views;
  m->merged = kind == BackwardViews::merged;
  m->out_scale = views.front().out_scale;
  auto build = [&](bool with_bwd) {
    m->plan = std::make_unique<CudnnGraphPlan>(cfg, dtype_of(e), device, stream, with_bwd);
  };
  try {
    try {
      build(backward);
    } catch (const DeviceOutOfMemory&) {
      throw;
    } catch (const std::exception& err) {
      if (!backward) throw;
      // A backward graph cuDNN refuses (e.g. a one-token document) leaves the forward.
      m->backward_refusal = err.what();
      backward = false;
      build(false);
    }
  } catch (const DeviceOutOfMemory&) {
    throw;  // the caller decides (CudaPlan falls back to native with a note)
  } catch (const std::exception& err) {
    throw CudnnUnavailable(err.what());  // a graph cuDNN refuses, or no cuDNN: use native
  }
  const Shape4& s = cfg.shape;
  for (const SdpaView& v : views) m->places.push_back(view_place(v, s));
  const ViewResultParams& p0 = m->places.front();
  m->stats_are_lse = views.size() == 1 && p0.segment == s.seq_len && p0.dilation == 1 &&
                     p0.offset == 0 && p0.rows == s.seq_len && p0.first_head == 0 &&
                     p0.head_step == 1 && p0.head_count == s.heads;
  m->partial_cover = cfg.attention == AttentionKind::dilated;
  const auto eb = static_cast<std::size_t>(elem_bytes(e));
  const auto n_q = static_cast<std::size_t>(s.numel());
  const auto n_kv = static_cast<std::size_t>(cfg.kv_shape().numel());
  const auto n_v = static_cast<std::size_t>(cfg.v_shape().numel());
  const auto n_o = static_cast<std::size_t>(cfg.out_shape().numel());
  m->o_scratch = DeviceAllocation(n_o * eb, "cuDNN's output scratch", device, stream);
  m->stats = DeviceAllocation(
      static_cast<std::size_t>(std::max<int64_t>(m->plan->stats_floats(), 1)) * sizeof(float),
      "cuDNN's softmax stats", device, stream);
  if (backward) {
    m->dq_scratch = DeviceAllocation(n_q * eb, "cuDNN's dQ scratch", device, stream);
    m->dk_scratch = DeviceAllocation(n_kv * eb, "cuDNN's dK scratch", device, stream);
    m->dv_scratch = DeviceAllocation(n_v * eb, "cuDNN's dV scratch", device, stream);
  }
  return std::unique_ptr<CudnnSdpa>(new CudnnSdpa(std::move(m)));
}

void CudnnSdpa::forward(const void* q, const void* k, const void* v, float* out, float* lse,
                        cudaStream_t stream) {
  Impl& m = *impl_;
  // View by view, each stored before the next runs: a mixture's views overlap in the
  // scratch (two patterns select one row of one head), and a later view would overwrite an
  // earlier one's O before its epilogue read it (a lent H200 caught that as 38 % errors).
  for (std::size_t i = 0; i < m.places.size(); ++i) {
    m.plan->forward_view(i, q, k, v, m.o_scratch.get(), m.stats.as<float>());
    ViewResultParams r = m.places[i];
    r.o_scratch = m.o_scratch.get();
    r.stats = m.stats.as<float>() + m.plan->stats_offset(i);
    r.out = out;
    r.lse = lse;
    launch_store_view_result(m.elem, r, stream);
  }
}

bool CudnnSdpa::has_backward() const { return impl_->dq_scratch.get() != nullptr; }

void CudnnSdpa::backward(const void* q, const void* k, const void* v, const float* out,
                         const float* lse, const void* dout, float* dq, float* dk, float* dv,
                         bool add, cudaStream_t stream) {
  Impl& m = *impl_;
  if (!has_backward()) throw std::logic_error("CudnnSdpa: built without the backward");
  const int64_t n_q = m.cfg.shape.numel(), n_kv = m.cfg.kv_shape().numel();
  const int64_t n_v = m.cfg.v_shape().numel(), n_o = m.cfg.out_shape().numel();
  // Each view's backward from the job's out and lse: a merged view's softmax is the merged
  // one restricted to its pairs, so its P = exp(s - lse) and D = rowsum(dO ∘ out) are the
  // merged softmax's, and its gradients are its pairs' part of the job's.
  launch_floats_to_elem(m.elem, out, m.o_scratch.get(), n_o, stream, 1.0f / m.out_scale);
  const float* stats = lse;
  if (!m.stats_are_lse) {
    for (std::size_t i = 0; i < m.places.size(); ++i) {
      ViewResultParams r = m.places[i];
      r.lse = const_cast<float*>(lse);
      launch_gather_view_stats(r, m.stats.as<float>() + m.plan->stats_offset(i), stream);
    }
    stats = m.stats.as<float>();
  }
  if (m.merged) {  // views share rows: each view's gradients added into the job's in turn
    if (!add) {
      RINGATTN_CUDA_CHECK(cudaMemsetAsync(dq, 0, static_cast<std::size_t>(n_q) * 4, stream));
      RINGATTN_CUDA_CHECK(cudaMemsetAsync(dk, 0, static_cast<std::size_t>(n_kv) * 4, stream));
      RINGATTN_CUDA_CHECK(cudaMemsetAsync(dv, 0, static_cast<std::size_t>(n_v) * 4, stream));
    }
    for (std::size_t i = 0; i < m.views.size(); ++i) {
      const SdpaView& w = m.views[i];
      m.plan->backward_view(i, q, k, v, m.o_scratch.get(), dout, stats, m.dq_scratch.get(),
                            m.dk_scratch.get(), m.dv_scratch.get());
      const int64_t kv_rows = w.kv_rows > 0 ? w.kv_rows : w.rows;
      launch_add_view(m.elem, m.dq_scratch.get(), dq,
                      strided(w.q_offset, w.batch, w.heads, w.rows, w.head_dim, w.q_stride),
                      stream);
      launch_add_view(m.elem, m.dk_scratch.get(), dk,
                      strided(w.kv_offset, w.batch, w.kv_heads, kv_rows, w.head_dim, w.kv_stride),
                      stream);
      launch_add_view(
          m.elem, m.dv_scratch.get(), dv,
          strided(w.v_offset(), w.batch, w.kv_heads, kv_rows, w.value_dim(), w.v_stride()), stream);
    }
    return;
  }
  if (m.partial_cover) {
    const auto eb = static_cast<std::size_t>(elem_bytes(m.elem));
    RINGATTN_CUDA_CHECK(
        cudaMemsetAsync(m.dq_scratch.get(), 0, static_cast<std::size_t>(n_q) * eb, stream));
    RINGATTN_CUDA_CHECK(
        cudaMemsetAsync(m.dk_scratch.get(), 0, static_cast<std::size_t>(n_kv) * eb, stream));
    RINGATTN_CUDA_CHECK(
        cudaMemsetAsync(m.dv_scratch.get(), 0, static_cast<std::size_t>(n_v) * eb, stream));
  }
  m.plan->backward(q, k, v, m.o_scratch.get(), dout, stats, m.dq_scratch.get(), m.dk_scratch.get(),
                   m.dv_scratch.get());
  launch_elem_to_floats(m.elem, m.dq_scratch.get(), dq, n_q, add, stream, m.out_scale);
  launch_elem_to_floats(m.elem, m.dk_scratch.get(), dk, n_kv, add, stream, m.out_scale);
  launch_elem_to_floats(m.elem, m.dv_scratch.get(), dv, n_v, add, stream, m.out_scale);
}

std::size_t CudnnSdpa::workspace_bytes() const {
  const Impl& m = *impl_;
  return m.o_scratch.bytes() + m.stats.bytes() + m.dq_scratch.bytes() + m.dk_scratch.bytes() +
         m.dv_scratch.bytes() + m.plan->workspace_bytes();
}

double CudnnSdpa::build_ms() const { return impl_->plan->build_ms(); }
const std::string& CudnnSdpa::backward_refusal() const { return impl_->backward_refusal; }
std::string CudnnSdpa::description() const { return impl_->plan->description(); }

}  // namespace ringattn::kernels::cuda

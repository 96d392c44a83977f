// The GPU ring's steps on cuDNN (ring_cudnn_steps.hpp).
#include "ring/ring_cudnn_steps.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "core/patterns.hpp"
#include "kernels/cuda/choice/verified_forms.hpp"
#include "ring/ring_cudnn_views.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

RingCudnnSteps::RingCudnnSteps(const AttentionConfig& cfg, const ShardLayout& layout,
                               const RingSchedule& sched, kc::Elem elem, DeviceDType dtype,
                               int device, cudaStream_t stream)
    : cfg_(cfg),
      layout_(layout),
      sched_(&sched),
      elem_(elem),
      dtype_(dtype),
      device_(device),
      stream_(stream),
      step_(sched.steps.size(), 0),
      step_backward_(sched.steps.size(), 0) {}

RingCudnnSteps::~RingCudnnSteps() { release(); }

std::size_t RingCudnnSteps::eb() const { return static_cast<std::size_t>(kc::elem_bytes(elem_)); }

bool RingCudnnSteps::any_backward() const {
  return std::any_of(step_backward_.begin(), step_backward_.end(), [](char c) { return c != 0; });
}

// A step cuDNN cannot run (no views for its tasks, a graph this cuDNN refuses for a head dim,
// band or version, view rows not 16-byte aligned) runs on ringattn's kernels, the reason
// recorded in refused_; where only a view's backward graph is refused (cuDNN 9.19's one-token
// document), the step's forward stays on cuDNN and its backward is ours (refused_backward_).
int RingCudnnSteps::prepare(bool with_backward) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n_steps = static_cast<int>(sched_->steps.size());
  const int64_t d = cfg_.shape.head_dim;
  step_.assign(sched_->steps.size(), 0);
  step_backward_.assign(sched_->steps.size(), 0);
  refused_.clear();
  refused_backward_.clear();
  auto refuse_all = [&](const std::string& why) {
    for (int t = 0; t < n_steps; ++t) refused_[why].push_back(t);
    return 0;
  };
  if (elem_ == kc::Elem::fp32)
    return refuse_all("cuDNN's fused attention takes bf16 or fp16, not fp32");
  std::map<std::string, std::size_t> by_shape;
  std::map<std::string, std::string> refused_shape;     // a graph cuDNN would not build
  std::map<std::string, std::string> refused_backward;  // built forward only
  int on_cudnn = 0;
  for (int t = 0; t < n_steps; ++t) {
    std::string why;
    std::vector<kc::SdpaView> views =
        ring_step_views(cfg_, layout_, sched_->steps[static_cast<std::size_t>(t)], &why);
    std::vector<std::size_t> graph_of;
    std::string why_backward = with_backward ? "" : "not asked";
    for (const kc::SdpaView& v : views) {
      if (!why.empty()) break;
      // The views' pointers are the tensors' plus their offsets: cuDNN reads 16-byte
      // aligned tensors only.
      const auto bytes = static_cast<int64_t>(eb());
      if ((v.q_offset * bytes) % 16 != 0 || (v.kv_offset * bytes) % 16 != 0 ||
          (v.o_offset() * bytes) % 16 != 0 || (v.v_offset() * bytes) % 16 != 0) {
        why = "a view's rows start off the 16-byte alignment cuDNN reads (head dim " +
              std::to_string(d) + ")";
        break;
      }
      kc::SdpaView shape = v;  // the graph's view: offsets are applied to the pointers
      shape.q_offset = shape.kv_offset = shape.row_offset = 0;
      std::ostringstream key;
      key << shape.batch << ' ' << shape.heads << ' ' << shape.kv_heads << ' ' << shape.rows << ' '
          << shape.kv_rows << ' ' << shape.head_dim << ' ' << shape.value_dim() << ' '
          << shape.softcap << ' '
          << (shape.right_bound ? std::to_string(*shape.right_bound) : "-") << ' '
          << (shape.left_bound ? std::to_string(*shape.left_bound) : "-");
      for (int i = 0; i < 4; ++i) key << ' ' << shape.q_stride[i] << ' ' << shape.kv_stride[i];
      if (auto r = refused_shape.find(key.str()); r != refused_shape.end()) {
        why = r->second;
        break;
      }
      auto it = by_shape.find(key.str());
      if (it == by_shape.end()) {
        auto build = [&](bool backward) {
          graphs_.push_back(std::make_unique<kc::CudnnGraphPlan>(
              std::vector<kc::SdpaView>{shape}, dtype_, device_, stream_, backward));
        };
        try {
          build(with_backward);
        } catch (const std::runtime_error& e) {
          if (!with_backward) {
            why = refused_shape[key.str()] = e.what();
            break;
          }
          try {  // the forward alone, as one GPU keeps it where the backward is refused
            build(false);
            refused_backward[key.str()] = e.what();
          } catch (const std::runtime_error& e_forward) {
            why = refused_shape[key.str()] = e_forward.what();
            break;
          }
        }
        it = by_shape.emplace(key.str(), graphs_.size() - 1).first;
      }
      if (auto r = refused_backward.find(key.str());
          r != refused_backward.end() && why_backward.empty())
        why_backward = r->second;
      graph_of.push_back(it->second);
    }
    if (!why.empty()) {
      refused_[why].push_back(t);
      views.clear(), graph_of.clear();
    } else {
      step_[static_cast<std::size_t>(t)] = 1;
      on_cudnn += views.empty() ? 0 : 1;
      if (why_backward.empty())
        step_backward_[static_cast<std::size_t>(t)] = 1;
      else if (with_backward)
        refused_backward_[why_backward].push_back(t);
    }
    views_.push_back(std::move(views));
    graph_of_.push_back(std::move(graph_of));
  }
  if (on_cudnn == 0) {
    release();
    if (refused_.empty()) refused_["no ring step has attention to run"] = {};
    return 0;
  }
  const Shape4& s = cfg_.shape;
  const int64_t dv = cfg_.effective_head_dim_v();
  const auto q_elems = static_cast<std::size_t>(s.batch * layout_.local_len * s.heads * d);
  const auto o_elems = static_cast<std::size_t>(s.batch * layout_.local_len * s.heads * dv);
  const int64_t kv_rows =
      std::max(s.batch * layout_.local_len * cfg_.effective_kv_heads(), sched_->max_recv_rows);
  const auto kv_elems = static_cast<std::size_t>(kv_rows * d);
  const auto v_elems = static_cast<std::size_t>(kv_rows * dv);
  try {
    o_ = kc::DeviceAllocation(o_elems * eb(), "the ring's cuDNN output scratch", device_, stream_);
    stats_ = kc::DeviceAllocation(
        static_cast<std::size_t>(s.batch * layout_.local_len * s.heads) * sizeof(float),
        "the ring's cuDNN stats", device_, stream_);
    if (with_backward) {
      dq_ = kc::DeviceAllocation(q_elems * eb(), "the ring's cuDNN dQ scratch", device_, stream_);
      dk_ = kc::DeviceAllocation(kv_elems * eb(), "the ring's cuDNN dK scratch", device_, stream_);
      dv_ = kc::DeviceAllocation(v_elems * eb(), "the ring's cuDNN dV scratch", device_, stream_);
    }
  } catch (const kc::DeviceOutOfMemory& e) {
    // cuDNN's scratch comes on top of what ours need: a ring ours can run must not fail for it.
    release();
    refused_.clear();
    refused_backward_.clear();
    return refuse_all(std::string("no device memory for cuDNN's scratch: ") + e.what());
  }
  build_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return on_cudnn;
}

void RingCudnnSteps::release() {
  graphs_.clear();
  views_.clear();
  graph_of_.clear();
  step_.assign(sched_->steps.size(), 0);
  step_backward_.assign(sched_->steps.size(), 0);
  for (kc::DeviceAllocation* a : {&o_, &stats_, &dq_, &dk_, &dv_}) a->reset();
}

// Where view `v`'s rows go in out/lse (the rank's [B, N/P, H, D] and [B, H, N/P]), merged by
// lse.
kc::ViewResultParams RingCudnnSteps::place_of(const kc::SdpaView& v, float* out, float* lse) const {
  const Shape4& s = cfg_.shape;
  kc::ViewResultParams r = kc::view_place(v, {s.batch, layout_.local_len, s.heads, s.head_dim});
  r.o_scratch = o_.get();
  r.stats = stats_.as<float>();
  r.out = out;
  r.lse = lse;
  r.accumulate = true;
  return r;
}

namespace {
const char* at(const void* base, int64_t elements, std::size_t eb) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(eb);
}
void* at(void* base, int64_t elements, std::size_t eb) {
  return static_cast<char*>(base) + elements * static_cast<int64_t>(eb);
}
}  // namespace

void RingCudnnSteps::forward(int t, const void* q, const void* k, const void* v, float* out,
                             float* lse) {
  const auto& views = views_[static_cast<std::size_t>(t)];
  for (std::size_t i = 0; i < views.size(); ++i) {
    const kc::SdpaView& w = views[i];
    graphs_[graph_of_[static_cast<std::size_t>(t)][i]]->forward_view(
        0, at(q, w.q_offset, eb()), at(k, w.kv_offset, eb()), at(v, w.v_offset(), eb()),
        at(o_.get(), w.o_offset(), eb()), stats_.as<float>());
    kc::launch_store_view_result(elem_, place_of(w, out, lse), stream_);
  }
}

void RingCudnnSteps::load_out(const float* out) {
  const Shape4& s = cfg_.shape;
  kc::launch_floats_to_elem(elem_, out, o_.get(),
                            s.batch * layout_.local_len * s.heads * cfg_.effective_head_dim_v(),
                            stream_);
}

void RingCudnnSteps::backward(int t, const void* q, const void* k, const void* v, const void* dout,
                              const float* lse, float* dq, float* dk, float* dv) {
  const auto& views = views_[static_cast<std::size_t>(t)];
  for (std::size_t i = 0; i < views.size(); ++i) {
    const kc::SdpaView& w = views[i];
    kc::launch_gather_view_stats(place_of(w, nullptr, const_cast<float*>(lse)), stats_.as<float>(),
                                 stream_);
    graphs_[graph_of_[static_cast<std::size_t>(t)][i]]->backward_view(
        0, at(q, w.q_offset, eb()), at(k, w.kv_offset, eb()), at(v, w.v_offset(), eb()),
        at(o_.get(), w.o_offset(), eb()), at(dout, w.o_offset(), eb()), stats_.as<float>(),
        at(dq_.get(), w.q_offset, eb()), at(dk_.get(), w.kv_offset, eb()),
        at(dv_.get(), w.v_offset(), eb()));
    kc::StridedView qv{w.q_offset, {w.batch, w.heads, w.rows, w.head_dim}, {}};
    kc::StridedView kv{w.kv_offset, {w.batch, w.kv_heads, w.kv_rows, w.head_dim}, {}};
    kc::StridedView vv{w.v_offset(), {w.batch, w.kv_heads, w.kv_rows, w.value_dim()}, {}};
    const std::array<int64_t, 4> v_stride = w.v_stride();
    for (int a = 0; a < 4; ++a) {
      const auto axis = static_cast<std::size_t>(a);
      qv.strides[a] = w.q_stride[axis];
      kv.strides[a] = w.kv_stride[axis];
      vv.strides[a] = v_stride[axis];
    }
    // dQ of the rows that see a key only: cuDNN's values for the others are its own.
    const auto [keyed_begin, keyed_end] = kc::rows_with_keys(w);
    qv.offset += keyed_begin * w.q_stride[2];
    qv.dims[2] = keyed_end - keyed_begin;
    kc::launch_add_view(elem_, dq_.get(), dq, qv, stream_);
    kc::launch_add_view(elem_, dk_.get(), dk, kv, stream_);
    kc::launch_add_view(elem_, dv_.get(), dv, vv, stream_);
  }
}

std::string RingCudnnSteps::description(int steps_on_cudnn) const {
  const int n_steps = static_cast<int>(sched_->steps.size());
  const std::string d = graphs_.front()->description();
  const bool every = steps_on_cudnn == n_steps || refused_.empty();
  std::size_t n_views = 0;
  for (const auto& v : views_) n_views += v.size();
  std::ostringstream os;
  os << std::fixed << std::setprecision(0) << d.substr(0, d.find(':')) << "; " << n_views
     << " views over " << steps_on_cudnn << (every ? "" : " of " + std::to_string(n_steps))
     << " steps, " << graphs_.size() << (graphs_.size() == 1 ? " graph" : " graphs") << " built in "
     << build_ms_ << " ms";
  return os.str();
}

namespace {
void list_steps(std::ostream& os, const std::vector<int>& which) {
  for (std::size_t i = 0; i < which.size(); ++i) os << (i ? ", " : "") << which[i];
}
}  // namespace

void RingCudnnSteps::refusal_notes(const std::string& flag, const char* ours,
                                   const char* ours_backward, bool backward_notes,
                                   bool backward_on_cudnn, std::vector<std::string>& notes) const {
  const int n_steps = static_cast<int>(sched_->steps.size());
  for (const auto& [reason, which] : refused_) {
    const bool all = static_cast<int>(which.size()) == n_steps;
    std::ostringstream os;
    os << flag << "cuDNN cannot run ";
    if (all) {
      os << "this ring's steps";
    } else {
      os << (which.size() == 1 ? "ring step " : "ring steps ");
      list_steps(os, which);
      os << " of " << n_steps;
    }
    os << " (" << reason << "); " << (all ? "using" : "those run on") << " the " << ours
       << " kernels";
    notes.push_back(os.str());
  }
  if (!backward_notes) return;
  for (const auto& [reason, which] : refused_backward_) {
    std::ostringstream os;
    os << flag << "cuDNN cannot run the backward of ring "
       << (which.size() == 1 ? "step " : "steps ");
    list_steps(os, which);
    os << " of " << n_steps << " (" << reason << "); "
       << (backward_on_cudnn ? "their forward runs on cuDNN, their backward on the "
                             : "their forward runs on cuDNN; the backward is all on the ")
       << ours_backward << " kernels";
    notes.push_back(os.str());
  }
}

std::size_t RingCudnnSteps::bytes() const {
  std::size_t b = 0;
  for (const kc::DeviceAllocation* a : {&o_, &stats_, &dq_, &dk_, &dv_}) b += a->bytes();
  for (const auto& g : graphs_) b += g->workspace_bytes();
  return b;
}

RingCudnnChoice choose_ring_cudnn(const AttentionConfig& cfg, const ShardLayout& layout,
                                  const RingSchedule& sched, kc::Elem elem,
                                  const CudaPlanOptions& opts, bool asked, bool auto_tries,
                                  const std::string& flag, cudaStream_t stream,
                                  std::vector<std::string>& notes) {
  RingCudnnChoice c;
  // Values of their own head dim and the soft-cap are a form of cuDNN's graphs of their own.
  const bool mla_or_cap = !value_dim_and_cap_words(cfg).empty();
  const kc::GpuForm form =
      mla_or_cap ? kc::GpuForm::cudnn_value_dim_softcap : kc::GpuForm::cudnn_ring_steps;
  const bool verified = kc::verified_on_gpu(kc::GpuForm::cudnn_ring_steps, kc::GpuPath::ring) &&
                        (!mla_or_cap || kc::verified_on_gpu(form, kc::GpuPath::ring));
  const std::string how = field_is("kernel", "cudnn");
  if (auto_tries && !verified)
    notes.push_back(kc::unverified_by_auto_note(
        kc::verified_on_gpu(kc::GpuForm::cudnn_ring_steps, kc::GpuPath::ring)
            ? form
            : kc::GpuForm::cudnn_ring_steps,
        how));
  if (asked && !verified) {
    notes.push_back(kc::forced_unverified_note(kc::GpuForm::cudnn_ring_steps, how));
    if (mla_or_cap) notes.push_back(kc::forced_unverified_note(form, how));
  }
  if (!asked && !(auto_tries && verified)) return c;
  c.steps =
      std::make_unique<RingCudnnSteps>(cfg, layout, sched, elem, opts.dtype, opts.device, stream);
  const int on_cudnn = c.steps->prepare(asked ? !opts.deterministic : true);
  const bool any_backward = c.steps->any_backward();
  c.forward = asked && on_cudnn > 0;
  c.backward = c.forward && !opts.deterministic && any_backward;
  c.decide_forward = !asked && on_cudnn > 0;
  c.decide_backward = c.decide_forward && any_backward;
  if (on_cudnn == 0) return c;
  const bool every = c.steps->refused().empty() || on_cudnn == static_cast<int>(sched.steps.size());
  const std::string what =
      asked ? std::string(every ? "every ring step's forward" : "the ring steps' forward") +
                  (c.backward ? " and backward" : "") + " on cuDNN"
            : "cuDNN's ring steps are a candidate, timed against ringattn's kernels on the first "
              "forward and backward";
  notes.push_back(flag + what + " (" + c.steps->description(on_cudnn) + ")" +
                  (asked && !c.backward
                       ? "; the backward is ringattn's (" + field_is("deterministic", true) +
                             ": cuDNN's backward adds dQ with atomics)"
                       : std::string()));
  return c;
}

}  // namespace ringattn::ring

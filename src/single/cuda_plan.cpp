// CudaPlan (see include/single/cuda_plan.hpp): the CPU Plan's schedule, flattened and
// uploaded once, run by the CUDA kernels on one device and one stream. The kernel choice
// (native, sm_90a or cuDNN) is made here; the kernels know nothing of patterns or ranks.
#include "single/cuda_plan.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <span>
#include <sstream>
#include <utility>

#include "core/patterns.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "kernels/cuda/device_wait.hpp"
#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/form_choice.hpp"
#include "kernels/cuda/hopper_bwd.hpp"
#include "kernels/cuda/hopper_fwd.hpp"
#include "kernels/cuda/hopper_task_bwd.hpp"
#include "kernels/cuda/hopper_task_fwd.hpp"
#include "kernels/cuda/host_convert.hpp"
#include "kernels/cuda/median_time.hpp"
#include "kernels/cuda/verified_forms.hpp"
#include "ringattn/errors.hpp"
#include "single/device_schedule.hpp"
#include "single/schedule.hpp"
#if RINGATTN_HAVE_CUDNN
#include "kernels/cuda/cudnn_sdpa.hpp"
#endif

namespace ringattn {

namespace kc = kernels::cuda;
using kc::aligned16;  // 16-byte copies, TMA and bulk adds need 16-byte aligned base pointers

namespace {

#if RINGATTN_HAVE_CUDNN
constexpr bool kCudnnBuilt = true;
#else
constexpr bool kCudnnBuilt = false;
#endif

}  // namespace

// ---- CudaPlan -----------------------------------------------------------------------------
struct CudaPlan::Impl {
  AttentionConfig cfg;
  CudaPlanOptions opts;
  kc::Elem elem = kc::Elem::bf16;
  cudaStream_t stream = nullptr;
  CudaDeviceStatus device;
  single::FlatSchedule sched;
  kc::DeviceAllocation tasks, q_items, k_items, delta;
  kc::DeviceAllocation cu_seqlens;  // the Hopper forward's packed documents (int32)
  std::vector<int> cu_host;
  bool vector_loads = false;
  bool use_cudnn = false;
  bool use_cudnn_backward = false;
  bool use_hopper = false;
  // --kernel hopper on a dilated configuration: the sm_90a forward over the schedule's own
  // tasks, each pass's items ordered into groups of one (query view, key view) each.
  bool use_hopper_tasks = false;
  kc::DeviceAllocation hopper_items;
  std::vector<kernels::ForwardItem> hopper_items_host;          // the upload's source (as cu_host)
  std::vector<int64_t> hopper_item0;                            // per pass, into hopper_items
  std::vector<std::vector<kc::HopperTaskGroup>> hopper_groups;  // per pass
  // Its backward's dK/dV items: each pass's k_ranges, each range's items grouped as above.
  kc::DeviceAllocation hopper_k_items;
  std::vector<kernels::ForwardItem> hopper_k_items_host;
  std::vector<std::vector<int64_t>> hopper_k_item0;                            // per pass, range
  std::vector<std::vector<std::vector<kc::HopperTaskGroup>>> hopper_k_groups;  // per pass, range
  // The same ranges' 128-key items for the wide fused kernel (hopper_wide_key_items), in
  // hopper_k_items after each range's own, where D = 128 and every range's items pair up.
  std::vector<std::vector<int64_t>> hopper_wide_k_item0;
  std::vector<std::vector<std::vector<kc::HopperTaskGroup>>> hopper_wide_k_groups;
  bool wide_tasks = false;
  bool use_hopper_backward = false;
  // The sm_90a backward as the fused kernel (not deterministic), and whether the first
  // backward times it against the two passes (hopper_fused_backward_rule).
  bool fused_backward = false;
  bool time_fused_backward = false;
  // With fused_backward, the wide fused kernel (D = 128, where the path has it: wide_ok()).
  bool wide_backward = false;
  // The sm_90a forward's form (plain, overlap, Q in registers, ping-pong), and whether the
  // first forward times the forms and keeps the fastest (hopper_forward_forms_timed).
  kc::HopperForwardForm forward_form = kc::HopperForwardForm::rule;
  bool time_forward_forms = false;
  bool decide_on_first_forward = false;
  bool decide_on_first_backward = false;
  bool noted_unaligned = false;
  bool noted_unaligned_backward = false;
  bool noted_unaligned_hopper_backward = false;
  bool noted_unaligned_dq = false;
#if RINGATTN_HAVE_CUDNN
  std::unique_ptr<kc::CudnnSdpa> cudnn;
  bool has_cudnn() const { return cudnn != nullptr; }
#else
  bool has_cudnn() const { return false; }
#endif
  std::vector<std::string> notes;

  ~Impl() {
    const kc::ScopedDevice on(opts.device, std::nothrow);
    // Device memory goes back to the pool, ordered after the plan's work; then the stream.
    tasks.reset();
    q_items.reset();
    k_items.reset();
    delta.reset();
    cu_seqlens.reset();
    hopper_items.reset();
    hopper_k_items.reset();
#if RINGATTN_HAVE_CUDNN
    cudnn.reset();
#endif
    if (stream) {
      // Not after the watchdog fired: the device still runs the hung kernel.
      if (!kc::device_stuck()) (void)cudaStreamSynchronize(stream);
      kc::forget_stream(stream);
      (void)cudaStreamDestroy(stream);
    }
    kc::release_unused_device_memory(opts.device);
  }

  void native_forward(const void* q, const void* k, const void* v, float* out, float* lse) {
    kc::FlashForwardParams p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    p.lse = lse;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(cfg.shape.head_dim);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    p.vector_loads = vector_loads && aligned16(q) && aligned16(k) && aligned16(v);
    for (const single::DevicePass& pass : sched.passes) {
      p.items = q_items.as<kernels::ForwardItem>() + pass.q_item0;
      p.n_items = pass.n_q_items;
      p.accumulate = pass.accumulate;
      p.out_scale = pass.out_scale;
      kc::flash_forward(elem, p, stream);
    }
  }

  // What the sm_90a kernels attend over, for this plan's configuration.
  kc::HopperAttention hopper_attention() const {
    const Shape4& s = cfg.shape;
    kc::HopperAttention p;
    p.batch = static_cast<int>(s.batch), p.seq_len = static_cast<int>(s.seq_len);
    p.heads = static_cast<int>(s.heads), p.kv_heads = static_cast<int>(cfg.effective_kv_heads());
    p.head_dim = static_cast<int>(s.head_dim);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    if (cfg.windowed()) {
      const AttentionConfig::WindowReach w = cfg.window_reach();
      p.window_left = w.left, p.window_right = w.right;
    }
    if (cfg.packed()) {
      p.cu_seqlens = cu_seqlens.as<int>();
      p.n_docs = static_cast<int>(cfg.cu_seqlens.size()) - 1;
    }
    p.elem = elem;
    return p;
  }

  kc::HopperTaskShape hopper_task_shape() const {
    const Shape4& s = cfg.shape;
    return {static_cast<int>(s.batch), static_cast<int>(s.seq_len), static_cast<int>(s.heads),
            static_cast<int>(cfg.effective_kv_heads()), static_cast<int>(s.head_dim)};
  }

  // "" and the task path ready (items grouped and uploaded), or why it cannot run.
  std::string prepare_hopper_tasks() {
    const Shape4& s = cfg.shape;
    if (s.seq_len > std::numeric_limits<int>::max() / 2 ||
        s.batch * s.seq_len > std::numeric_limits<int>::max() / 2)
      return "a sequence of " + std::to_string(s.seq_len) + " (tensor map coordinates are int)";
    const kc::HopperTaskShape shape = hopper_task_shape();
    if (std::string why = kc::hopper_task_forward_unsupported(elem, shape, opts.device);
        !why.empty())
      return why;
    std::vector<kernels::ForwardItem>& all = hopper_items_host;
    std::vector<kernels::ForwardItem> ordered;
    for (const single::DevicePass& pass : sched.passes) {
      std::vector<kc::HopperTaskGroup> groups;
      const std::span<const kernels::ForwardItem> items(sched.q_items.data() + pass.q_item0,
                                                        static_cast<std::size_t>(pass.n_q_items));
      if (std::string why = kc::hopper_task_groups(sched.tasks, items, shape, ordered, groups);
          !why.empty())
        return why;
      hopper_item0.push_back(static_cast<int64_t>(all.size()));
      all.insert(all.end(), ordered.begin(), ordered.end());
      hopper_groups.push_back(std::move(groups));
    }
    hopper_items = kc::upload_vector(all, "the Hopper forward's work items", opts.device, stream);
    return "";
  }

  // "" and the task backward's dK/dV items grouped and uploaded (range by range, so that
  // query heads sharing a K/V head still add into it in turn), or why it cannot run.
  std::string prepare_hopper_task_backward() {
    const kc::HopperTaskShape shape = hopper_task_shape();
    if (std::string why = kc::hopper_task_backward_unsupported(elem, shape, opts.device);
        !why.empty())
      return why;
    std::vector<kernels::ForwardItem>& all = hopper_k_items_host;
    std::vector<kernels::ForwardItem> ordered, wide;
    wide_tasks = shape.head_dim == 128;
    for (const single::DevicePass& pass : sched.passes) {
      std::vector<int64_t>& item0 = hopper_k_item0.emplace_back();
      std::vector<std::vector<kc::HopperTaskGroup>>& ranges = hopper_k_groups.emplace_back();
      std::vector<int64_t>& wide_item0 = hopper_wide_k_item0.emplace_back();
      auto& wide_ranges = hopper_wide_k_groups.emplace_back();
      for (const single::ItemRange& r : pass.k_ranges) {
        std::vector<kc::HopperTaskGroup> groups, wide_groups;
        const std::span<const kernels::ForwardItem> items(sched.k_items.data() + r.first,
                                                          static_cast<std::size_t>(r.count));
        if (std::string why = kc::hopper_task_groups(sched.tasks, items, shape, ordered, groups);
            !why.empty())
          return why;
        item0.push_back(static_cast<int64_t>(all.size()));
        all.insert(all.end(), ordered.begin(), ordered.end());
        if (wide_tasks)
          wide_tasks = kc::hopper_wide_key_items(ordered, groups, wide, wide_groups).empty();
        wide_item0.push_back(static_cast<int64_t>(all.size()));
        if (wide_tasks) all.insert(all.end(), wide.begin(), wide.end());
        ranges.push_back(std::move(groups));
        wide_ranges.push_back(std::move(wide_groups));
      }
    }
    hopper_k_items =
        kc::upload_vector(all, "the Hopper backward's key work items", opts.device, stream);
    return "";
  }

  void hopper_task_forward(const void* q, const void* k, const void* v, float* out, float* lse) {
    kc::FlashForwardParams p;
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(cfg.shape.head_dim);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    for (std::size_t i = 0; i < sched.passes.size(); ++i) {
      p.items = hopper_items.as<kernels::ForwardItem>() + hopper_item0[i];
      p.accumulate = sched.passes[i].accumulate;
      p.out_scale = sched.passes[i].out_scale;
      kc::HopperTaskShape shape = hopper_task_shape();
      shape.form = forward_form;
      kc::hopper_task_forward(elem, p, shape, hopper_groups[i], stream);
    }
  }

  kc::HopperForwardParams hopper_params(const void* q, const void* k, const void* v, float* out,
                                        float* lse) const {
    kc::HopperForwardParams p;
    static_cast<kc::HopperAttention&>(p) = hopper_attention();
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.form = forward_form;
    return p;
  }

  kc::HopperBackwardParams hopper_backward_params(const void* q, const void* k, const void* v,
                                                  const float* lse, const void* dout, float* dq,
                                                  float* dk, float* dv) const {
    kc::HopperBackwardParams p;
    static_cast<kc::HopperAttention&>(p) = hopper_attention();
    p.q = q, p.k = k, p.v = v, p.dout = dout, p.lse = lse, p.delta = delta.as<float>();
    p.dq = dq, p.dk = dk, p.dv = dv;
    p.fused = fused_backward;
    p.wide = wide_backward;
    return p;
  }

  // Sets use_hopper or use_hopper_tasks, and use_hopper_backward, where the sm_90a kernels
  // can run this configuration on this device; returns why the forward cannot ("" where it
  // can) and why the backward cannot.
  std::pair<std::string, std::string> choose_hopper() {
    std::string why;
    if (cfg.attention == AttentionKind::dilated) {
      why = prepare_hopper_tasks();
      use_hopper_tasks = why.empty();
    } else if (cfg.attention != AttentionKind::dense) {
      why = "it takes dense and dilated attention only";
    } else {
      why = kc::hopper_forward_unsupported(
          hopper_params(nullptr, nullptr, nullptr, nullptr, nullptr), opts.device);
      use_hopper = why.empty();
    }
    std::string why_backward = why;
    if (use_hopper)
      why_backward = kc::hopper_backward_unsupported(
          hopper_backward_params(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr),
          opts.device);
    else if (use_hopper_tasks)
      why_backward = prepare_hopper_task_backward();
    const int head_dim = static_cast<int>(cfg.shape.head_dim);
    // auto times only the forms a GPU has passed on this path (verified_forms.hpp).
    if (hopper_forward() &&
        kc::hopper_forward_forms_timed(opts.deterministic, opts.kernel == KernelChoice::automatic)) {
      time_forward_forms = kc::auto_forward_forms(head_dim, path()).size() > 1;
      kc::note_unverified_forward_forms(head_dim, path(), notes);
    }
    use_hopper_backward = hopper_forward() && why_backward.empty();
    if (use_hopper_backward) {
      const kc::FusedBackwardRule rule = kc::hopper_fused_backward_rule(
          opts.deterministic, head_dim, opts.kernel == KernelChoice::automatic);
      fused_backward = rule == kc::FusedBackwardRule::fused;
      wide_backward = fused_backward && wide_ok() &&
                      kc::hopper_wide_backward_chosen(opts.deterministic, head_dim);
      if (rule == kc::FusedBackwardRule::timed) {
        time_fused_backward = kc::auto_backward_forms(path(), wide_ok()).size() > 1;
        kc::note_unverified_backward_forms(path(), wide_ok(), notes);
      }
    }
    if (hopper_forward())
      kc::note_forced_unverified(path(), fused_backward, wide_backward,
                                 kc::hopper_qregs_forced() && head_dim <= 128, notes);
    if (use_hopper && cfg.packed()) {
      // Kept with the plan: the emulated runtime reads an async copy's host source when the
      // copy runs, not at the call (a GPU stages pageable memory at the call).
      cu_host.assign(cfg.cu_seqlens.begin(), cfg.cu_seqlens.end());
      cu_seqlens = kc::upload_vector(cu_host, "the packed documents' offsets", opts.device, stream);
    }
    return {why, why_backward};
  }

  bool hopper_forward() const { return use_hopper || use_hopper_tasks; }
  // The path the verified-forms table knows the sm_90a kernels by here.
  kc::GpuPath path() const { return use_hopper ? kc::GpuPath::dense : kc::GpuPath::tasks; }
  // cuDNN's forms here: a dilated configuration's views are the task path's.
  kc::GpuPath cudnn_path() const {
    return cfg.attention == AttentionKind::dilated ? kc::GpuPath::tasks : kc::GpuPath::dense;
  }
  kc::GpuForm cudnn_backward_form() const {
    return cfg.attention == AttentionKind::dilated ? kc::GpuForm::cudnn_dilated_backward
                                                   : kc::GpuForm::cudnn_backward;
  }
  // Whether the sm_90a backward has the wide fused kernel here: D = 128, dense or tasks whose
  // key items pair up into 128 keys.
  bool wide_ok() const {
    return cfg.shape.head_dim == 128 && (use_hopper || (use_hopper_tasks && wide_tasks));
  }
  // What runs where cuDNN does not: the sm_90a kernels where they can, else the native ones.
  const char* forward_fallback() const { return hopper_forward() ? "hopper" : "native"; }
  const char* backward_fallback() const { return use_hopper_backward ? "hopper" : "native"; }
  std::string fallback_kernels() const {
    return hopper_forward() ? "the sm_90a kernels" : "the native kernels";
  }

  void run_forward(bool cudnn_path, const void* q, const void* k, const void* v, float* out,
                   float* lse) {
    const Shape4& s = cfg.shape;
    if (use_hopper && !cudnn_path) {  // writes every row of out and lse
      kc::hopper_forward(hopper_params(q, k, v, out, lse), stream);
      return;
    }
    if (sched.clear_outputs_first) {
      RINGATTN_CUDA_CHECK(
          cudaMemsetAsync(out, 0, static_cast<std::size_t>(s.numel()) * sizeof(float), stream));
      kc::fill_floats(lse, s.batch * s.heads * s.seq_len, -std::numeric_limits<float>::infinity(),
                      stream);
    }
    if (use_hopper_tasks && !cudnn_path) {
      hopper_task_forward(q, k, v, out, lse);
      return;
    }
#if RINGATTN_HAVE_CUDNN
    if (cudnn_path) {
      cudnn->forward(q, k, v, out, lse, stream);
      return;
    }
#else
    (void)cudnn_path;
#endif
    native_forward(q, k, v, out, lse);
  }

  // dq, dk, dv zeroed and the row sums D, as every backward here starts.
  void start_backward(const float* out, const void* dout, float* dq, float* dk, float* dv) {
    const Shape4& s = cfg.shape;
    kc::start_backward(elem,
                       {out, dout, delta.as<float>(), s.batch, s.seq_len, s.heads, s.head_dim},
                       cfg.effective_kv_heads(), dq, dk, dv, stream);
  }

  void hopper_backward(const void* q, const void* k, const void* v, const float* out,
                       const float* lse, const void* dout, float* dq, float* dk, float* dv) {
    start_backward(out, dout, dq, dk, dv);
    if (use_hopper_tasks) return hopper_task_backward(q, k, v, out, lse, dout, dq, dk, dv);
    kc::hopper_backward(hopper_backward_params(q, k, v, lse, dout, dq, dk, dv), stream);
  }

  // native_backward's passes and ranges in its order, each on the task kernels.
  void hopper_task_backward(const void* q, const void* k, const void* v, const float* out,
                            const float* lse, const void* dout, float* dq, float* dk, float* dv) {
    kc::FlashBackwardParams p;
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse, p.dout = dout;
    p.delta = delta.as<float>();
    p.dq = dq, p.dk = dk, p.dv = dv;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(cfg.shape.head_dim);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    const bool fused = fused_backward, wide = fused && wide_backward;
    for (std::size_t i = 0; i < sched.passes.size(); ++i) {
      p.q_items = hopper_items.as<kernels::ForwardItem>() + hopper_item0[i];
      p.out_scale = sched.passes[i].out_scale;
      p.dout_scale = sched.passes[i].out_scale;
      std::span<const kc::HopperTaskGroup> q_groups = hopper_groups[i];
      for (std::size_t r = 0; r < hopper_k_groups[i].size(); ++r) {
        p.k_items = hopper_k_items.as<kernels::ForwardItem>() +
                    (wide ? hopper_wide_k_item0[i][r] : hopper_k_item0[i][r]);
        kc::hopper_task_backward(elem, p, hopper_task_shape(), q_groups,
                                 wide ? hopper_wide_k_groups[i][r] : hopper_k_groups[i][r],
                                 stream, fused, wide);
        q_groups = {};
      }
      if (hopper_k_groups[i].empty())
        kc::hopper_task_backward(elem, p, hopper_task_shape(), q_groups, {}, stream);
    }
  }

  void native_backward(const void* q, const void* k, const void* v, const float* out,
                       const float* lse, const void* dout, float* dq, float* dk, float* dv) {
    const Shape4& s = cfg.shape;
    start_backward(out, dout, dq, dk, dv);
    kc::FlashBackwardParams p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    p.lse = lse;
    p.dout = dout;
    p.delta = delta.as<float>();
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(s.head_dim);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    p.vector_loads =
        vector_loads && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
    for (const single::DevicePass& pass : sched.passes) {
      p.q_items = q_items.as<kernels::ForwardItem>() + pass.q_item0;
      p.n_q_items = pass.n_q_items;
      p.out_scale = pass.out_scale;
      p.dout_scale = pass.out_scale;
      // dQ with the first range's dK/dV, then one launch per further range (query heads that
      // share a K/V head add into its dK/dV in turn).
      for (const single::ItemRange& r : pass.k_ranges) {
        p.k_items = k_items.as<kernels::ForwardItem>() + r.first;
        p.n_k_items = r.count;
        kc::flash_backward(elem, p, stream);
        p.n_q_items = 0;
      }
    }
  }

  void run_backward(bool cudnn_path, const void* q, const void* k, const void* v, const float* out,
                    const float* lse, const void* dout, float* dq, float* dk, float* dv) {
#if RINGATTN_HAVE_CUDNN
    if (cudnn_path) {
      cudnn->backward(q, k, v, out, lse, dout, dq, dk, dv, false, stream);
      return;
    }
#else
    (void)cudnn_path;
#endif
    if (use_hopper_backward) return hopper_backward(q, k, v, out, lse, dout, dq, dk, dv);
    native_backward(q, k, v, out, lse, dout, dq, dk, dv);
  }

  // --kernel auto on the first forward: each of the sm_90a forward's forms at this head dim
  // (the dense kernel's, or the task kernels') that a GPU has passed, timed and the fastest
  // kept (form_choice.hpp).
  void choose_forward_form(const void* q, const void* k, const void* v, float* out, float* lse) {
    const std::vector<kc::HopperForwardForm> forms =
        kc::auto_forward_forms(static_cast<int>(cfg.shape.head_dim), path());
    forward_form = kc::fastest_forward_form(
        stream, "the sm_90a forward", false, forms,
        [&](kc::HopperForwardForm f) {
          forward_form = f;
          run_forward(false, q, k, v, out, lse);
        },
        [](double ms) { return ms; }, notes);
  }

  // Median of 5 timed runs of `run`, after one warm-up run, on the plan's stream.
  template <class Run>
  double median_ms(Run&& run) {
    return kc::median_ms(stream, std::forward<Run>(run));
  }
};

CudaPlan::CudaPlan(const AttentionConfig& cfg, CudaPlanOptions opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg, opts.heads);
  require_bnhd(cfg, "--device cuda (use --device cpu)");
  Impl& m = *impl_;
  m.cfg = cfg;
  m.opts = opts;
  m.elem = kc::elem_of(opts.dtype);
  m.device = probe_cuda_device(opts.device);
  if (!m.device.usable) throw InputError("device", "'cuda' cannot be used: " + m.device.reason);
  const kc::ScopedDevice on(opts.device);
  // The tensor-core kernels' shared memory against this device's opt-in limit; where they do
  // not fit, the fp32 kernels (little shared memory) run instead.
  if (m.elem != kc::Elem::fp32) {
    const std::string why = kc::native_kernels_fit(cfg.shape.head_dim, m.elem, opts.device);
    if (!why.empty()) {
      m.notes.push_back(why + "; running the fp32 kernels instead");
      m.opts.dtype = DeviceDType::fp32;
      m.elem = kc::Elem::fp32;
    }
  }
  // A blocking stream: work on the legacy default stream (DeviceBuffer's copies) orders
  // against it.
  RINGATTN_CUDA_CHECK(cudaStreamCreate(&m.stream));
  kc::register_stream(m.stream, opts.timeout_s);

  const kernels::TileConfig tiles{kc::kQueryTile, kc::kKeyTile};
  m.sched = single::flatten_schedule(single::build_local_schedule(cfg, tiles, opts.heads),
                                     cfg.causal, kc::kKeyTile);
  m.tasks = kc::upload_vector(m.sched.tasks, "the task list", opts.device, m.stream);
  m.q_items = kc::upload_vector(m.sched.q_items, "the query work items", opts.device, m.stream);
  m.k_items = kc::upload_vector(m.sched.k_items, "the key work items", opts.device, m.stream);
  const Shape4& s = cfg.shape;
  m.delta =
      kc::DeviceAllocation(static_cast<std::size_t>(s.batch * s.heads * s.seq_len) * sizeof(float),
                           "the backward's row sums D = rowsum(out * dout)", opts.device, m.stream);
  // 16-byte copies need 8-element aligned rows of exactly the instantiated head dim.
  m.vector_loads = m.elem != kc::Elem::fp32 && s.head_dim == kc::padded_head_dim(s.head_dim) &&
                   single::rows_aligned(m.sched, 8);

  const bool automatic = opts.kernel == KernelChoice::automatic;
  std::string hopper_why_backward;
  if (opts.kernel == KernelChoice::hopper || automatic) {
    const auto [why, why_backward] = m.choose_hopper();
    hopper_why_backward = why_backward;
    const std::string experimental = kernels::cuda::kHopperStatus;
    const bool hopper = m.hopper_forward();
    const std::string over = m.use_hopper_tasks
                                 ? " (TMA + wgmma, over the dilated pattern's strided views)"
                                 : " (TMA + wgmma)";
    if (automatic) {
      // Quiet where the sm_90a kernels cannot run (every GPU but compute capability 9.0);
      // without cuDNN in the build, its own note says what runs.
      if (hopper && kCudnnBuilt)
        m.notes.push_back(
            m.use_hopper_backward
                ? "--kernel auto: the sm_90a forward and backward" + over +
                      " stand in for the native kernels wherever cuDNN does not run or is slower"
                : "--kernel auto: the sm_90a forward" + over +
                      " stands in for the native kernels wherever cuDNN does not run or is "
                      "slower; the backward's fallback is native (" +
                      why_backward + ")");
    } else if (!hopper) {
      m.notes.push_back("--kernel hopper: " + why + "; using the native kernels");
    } else if (m.use_hopper_backward) {
      m.notes.push_back("--kernel hopper: the sm_90a forward and backward" + over + "; " +
                        experimental);
    } else {
      m.notes.push_back("--kernel hopper: the sm_90a forward" + over + ", the native backward (" +
                        why_backward + "); " + experimental);
    }
  }
  if (opts.kernel == KernelChoice::cudnn || automatic) {
#if RINGATTN_HAVE_CUDNN
    try {
      // cuDNN's views number heads from 0 of this config's; a slice's dilated heads keep
      // the job's groups and offsets, which the views do not carry.
      if (m.elem != kc::Elem::fp32 && cfg.attention == AttentionKind::dilated &&
          !opts.heads.whole())
        throw kc::CudnnUnavailable(
            "a head slice of a dilated job (Ulysses) runs on the native kernels");
      // cuDNN's backward adds dQ with atomics (run-to-run differences within the dtype's
      // tolerance): a deterministic plan keeps the native (or sm_90a) backward, whose
      // every element has one writer.
      m.cudnn = kc::CudnnSdpa::create(cfg, m.elem, opts.device, m.stream, !opts.deterministic);
      // Deterministic runs choose by rule: timing could pick either kernel on another run.
      // auto takes only what a GPU has passed (verified_forms.hpp); --kernel cudnn runs the
      // rest with a note.
      const bool forward_verified = kc::verified_on_gpu(kc::GpuForm::cudnn_forward, m.cudnn_path());
      const bool backward_verified = kc::verified_on_gpu(m.cudnn_backward_form(), m.cudnn_path());
      const bool cudnn_asked = opts.kernel == KernelChoice::cudnn;
      m.use_cudnn = cudnn_asked || (automatic && opts.deterministic && forward_verified);
      m.decide_on_first_forward = automatic && !opts.deterministic && forward_verified;
      m.use_cudnn_backward = m.cudnn->has_backward() && cudnn_asked;
      m.decide_on_first_backward = m.cudnn->has_backward() && automatic && backward_verified;
      if (automatic && !forward_verified)
        m.notes.push_back(kc::unverified_by_auto_note(kc::GpuForm::cudnn_forward, "--kernel cudnn"));
      if (automatic && m.cudnn->has_backward() && !backward_verified)
        m.notes.push_back(kc::unverified_by_auto_note(m.cudnn_backward_form(), "--kernel cudnn"));
      if (cudnn_asked && !forward_verified)
        m.notes.push_back(kc::forced_unverified_note(kc::GpuForm::cudnn_forward, "--kernel cudnn"));
      if (m.use_cudnn_backward && !backward_verified)
        m.notes.push_back(kc::forced_unverified_note(m.cudnn_backward_form(), "--kernel cudnn"));
      std::ostringstream os;
      os << std::fixed << std::setprecision(0) << m.cudnn->description() << ", graphs built in "
         << m.cudnn->build_ms() << " ms";
      if (!m.cudnn->has_backward())
        os << "; the backward runs "
           << (m.use_hopper_backward ? "on the sm_90a kernels" : "natively") << " ("
           << (opts.deterministic ? "--deterministic: cuDNN's backward adds dQ with atomics"
                                  : m.cudnn->backward_refusal())
           << ")";
      m.notes.push_back(os.str());
    } catch (const kc::CudnnUnavailable& e) {
      if (opts.kernel == KernelChoice::cudnn)
        m.notes.push_back(std::string("--kernel cudnn: cuDNN cannot run this configuration (") +
                          e.what() + "); using the native kernels");
    } catch (const kc::DeviceOutOfMemory& e) {
      // cuDNN's scratch and workspace come on top of what native needs: a configuration
      // native can run must not fail for them.
      m.cudnn.reset();
      m.notes.push_back(std::string("--kernel ") + to_string(opts.kernel) +
                        ": no device memory for cuDNN's scratch and workspace (" + e.what() +
                        "); using " + m.fallback_kernels());
    }
#else
#if RINGATTN_CUDA_EMULATION
    const char* why = "the GPU is emulated, and cuDNN is not";
#else
    const char* why = "cudnn.h was not found at configure time";
#endif
    if (opts.kernel == KernelChoice::cudnn)
      throw InputError("kernel", std::string("'cudnn' is not available in this build (") + why +
                                     "); use --kernel native or auto");
    m.notes.push_back("--kernel auto: " + m.fallback_kernels() + " (no cuDNN: " + why + ")" +
                      (m.use_hopper_backward || !m.hopper_forward()
                           ? ""
                           : "; the native backward (" + hopper_why_backward + ")"));
#endif
  }
  kc::wait_for_stream(m.stream, "the plan's uploads");
}

CudaPlan::~CudaPlan() = default;
CudaPlan::CudaPlan(CudaPlan&&) noexcept = default;
CudaPlan& CudaPlan::operator=(CudaPlan&&) noexcept = default;

const AttentionConfig& CudaPlan::config() const noexcept { return impl_->cfg; }
DeviceDType CudaPlan::dtype() const noexcept { return impl_->opts.dtype; }
const std::vector<std::string>& CudaPlan::notes() const noexcept { return impl_->notes; }
std::string CudaPlan::kernel_name() const {
  return impl_->use_cudnn ? "cudnn" : impl_->forward_fallback();
}
std::string CudaPlan::backward_kernel_name() const {
  const Impl& m = *impl_;
  if (m.use_cudnn_backward) return "cudnn";
  if (m.use_hopper_backward && m.fused_backward)
    return m.wide_backward ? "hopper-fused-wide" : "hopper-fused";
  return m.backward_fallback();
}

std::size_t CudaPlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t b = m.tasks.bytes() + m.q_items.bytes() + m.k_items.bytes() + m.delta.bytes() +
                  m.hopper_items.bytes();
#if RINGATTN_HAVE_CUDNN
  if (m.cudnn) b += m.cudnn->workspace_bytes();
#endif
  return b;
}

std::string CudaPlan::device_description() const {
  const CudaDeviceStatus& d = impl_->device;
  return d.name + " (sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) + ")";
}

void* CudaPlan::stream() const noexcept { return impl_->stream; }

void CudaPlan::synchronize() {
  const kc::ScopedDevice on(impl_->opts.device);
  kc::wait_for_stream(impl_->stream, "the plan's work");
}

void CudaPlan::forward(const void* q, const void* k, const void* v, float* out, float* lse) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  kc::plant_hang_if_asked(m.stream);  // the watchdog's tests only (RINGATTN_TEST_PLANT_HANG)
  // cuDNN's tensors are declared 16-byte aligned; other pointers (offset views) run native.
  const bool cudnn_can_read = aligned16(q) && aligned16(k) && aligned16(v);
  const bool cudnn_next = m.has_cudnn() && (m.use_cudnn || m.decide_on_first_forward);
  if (!cudnn_can_read && (cudnn_next || m.hopper_forward())) {  // TMA too
    if (!m.noted_unaligned)
      m.notes.push_back(cudnn_next ? "cuDNN needs 16-byte aligned q/k/v; these are not, so the "
                                     "native kernels ran"
                                   : "the Hopper forward needs 16-byte aligned q/k/v; these are "
                                     "not, so the native kernels ran");
    m.noted_unaligned = true;
    const bool dense = m.use_hopper, tasks = m.use_hopper_tasks;
    m.use_hopper = m.use_hopper_tasks = false;
    m.run_forward(false, q, k, v, out, lse);
    m.use_hopper = dense, m.use_hopper_tasks = tasks;
    return;
  }
  if (m.time_forward_forms) {  // ours first: cuDNN (below) is timed against the fastest form
    m.time_forward_forms = false;
    m.choose_forward_form(q, k, v, out, lse);
  }
  if (m.decide_on_first_forward) {
    m.decide_on_first_forward = false;
#if RINGATTN_HAVE_CUDNN
    // cuDNN against what runs where it does not (the sm_90a kernels or the native ones).
    const double other_ms = m.median_ms([&] { m.run_forward(false, q, k, v, out, lse); });
    double cudnn_ms = std::numeric_limits<double>::infinity();
    try {
      cudnn_ms = m.median_ms([&] { m.run_forward(true, q, k, v, out, lse); });
    } catch (const RuntimeFailure& e) {
      m.notes.push_back(std::string("--kernel auto: cuDNN failed when run (") + e.what() +
                        "); using " + m.fallback_kernels());
      (void)cudaGetLastError();
    }
    m.use_cudnn = cudnn_ms < other_ms;
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << "--kernel auto: forward " << m.forward_fallback()
       << " " << other_ms << " ms, cudnn " << cudnn_ms << " ms (median of 5); using "
       << (m.use_cudnn ? "cudnn" : m.forward_fallback());
    m.notes.push_back(os.str());
    if (!m.use_cudnn && !m.decide_on_first_backward && !m.use_cudnn_backward) m.cudnn.reset();
#endif
  }
  m.run_forward(m.use_cudnn, q, k, v, out, lse);
}

void CudaPlan::backward(const void* q, const void* k, const void* v, const float* out,
                        const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  const bool cudnn_can_read = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
  if (!cudnn_can_read) {  // TMA needs 16-byte aligned tensors too
    if (m.use_cudnn_backward || m.decide_on_first_backward) {
      if (!m.noted_unaligned_backward)
        m.notes.push_back(
            "cuDNN needs 16-byte aligned q/k/v/dout; these are not, so the native backward ran");
      m.noted_unaligned_backward = true;
    } else if (m.use_hopper_backward) {
      if (!m.noted_unaligned_hopper_backward)
        m.notes.push_back(
            "the Hopper backward needs 16-byte aligned q/k/v/dout; these are not, so the native "
            "backward ran");
      m.noted_unaligned_hopper_backward = true;
    }
    return m.native_backward(q, k, v, out, lse, dout, dq, dk, dv);
  }
  // The fused kernels' bulk adds need a 16-byte aligned dq: a caller's offset view runs the
  // two passes (and leaves the timing for an aligned call).
  if (m.use_hopper_backward && (m.fused_backward || m.time_fused_backward) && !aligned16(dq) &&
      !m.use_cudnn_backward) {
    if (!m.noted_unaligned_dq) m.notes.push_back(kc::kUnalignedDqNote);
    m.noted_unaligned_dq = true;
    const bool fused = m.fused_backward, time = m.time_fused_backward,
               decide = m.decide_on_first_backward;
    m.fused_backward = m.time_fused_backward = m.decide_on_first_backward = false;
    m.run_backward(false, q, k, v, out, lse, dout, dq, dk, dv);
    m.fused_backward = fused, m.time_fused_backward = time, m.decide_on_first_backward = decide;
    return;
  }
  if (m.time_fused_backward) {  // the sm_90a backward's two passes against its fused kernel
    m.time_fused_backward = false;
    using Form = kc::BackwardForm;
    const std::vector<Form> forms = kc::auto_backward_forms(m.path(), m.wide_ok());
    const Form chosen = kc::fastest_backward_form(
        m.stream, "the sm_90a backward", false, forms,
        [&](Form f) {
          m.fused_backward = f != Form::two_pass;
          m.wide_backward = f == Form::fused_wide;
          m.run_backward(false, q, k, v, out, lse, dout, dq, dk, dv);
        },
        [](double ms) { return ms; }, m.notes);
    m.fused_backward = chosen != Form::two_pass;
    m.wide_backward = chosen == Form::fused_wide;
  }
  if (m.decide_on_first_backward) {
    m.decide_on_first_backward = false;
#if RINGATTN_HAVE_CUDNN
    const double other_ms =
        m.median_ms([&] { m.run_backward(false, q, k, v, out, lse, dout, dq, dk, dv); });
    double cudnn_ms = std::numeric_limits<double>::infinity();
    try {
      cudnn_ms = m.median_ms([&] { m.run_backward(true, q, k, v, out, lse, dout, dq, dk, dv); });
    } catch (const RuntimeFailure& e) {
      m.notes.push_back(std::string("--kernel auto: cuDNN's backward failed when run (") +
                        e.what() + "); using the " + m.backward_fallback() + " backward");
      (void)cudaGetLastError();
    }
    m.use_cudnn_backward = cudnn_ms < other_ms;
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << "--kernel auto: backward " << m.backward_fallback()
       << " " << other_ms << " ms, cudnn " << cudnn_ms << " ms (median of 5); using "
       << (m.use_cudnn_backward ? "cudnn" : m.backward_fallback());
    m.notes.push_back(os.str());
    if (!m.use_cudnn && !m.use_cudnn_backward) m.cudnn.reset();
#endif
  }
  m.run_backward(m.use_cudnn_backward, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace ringattn

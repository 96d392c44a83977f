// CudaPlan (see include/single/cuda_plan.hpp): the CPU Plan's schedule, flattened and
// uploaded once, run by the CUDA kernels on one device and one stream. The kernel choice
// (native, sm_90a or cuDNN) is made here; the kernels know nothing of patterns or ranks.
#include "single/cuda_plan.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <iomanip>
#include <limits>
#include <span>
#include <sstream>
#include <utility>

#include "core/patterns.hpp"
#include "kernels/cuda/choice/form_chooser.hpp"
#include "kernels/cuda/choice/verified_forms.hpp"
#include "kernels/cuda/hopper/task_backward.hpp"
#include "kernels/cuda/native/flash.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"
#include "kernels/cuda/runtime/host_convert.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"
#include "single/device_schedule.hpp"
#include "single/hopper_task_lists.hpp"
#include "single/schedule.hpp"
#if RINGATTN_HAVE_CUDNN
#include "kernels/cuda/cudnn/sdpa.hpp"
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
  // The sm_90a kernels' choice (form_chooser.hpp): the dense kernels, or on a dilated
  // configuration the task kernels over the schedule's own tasks, each pass's items in groups
  // of one (query view, key view) each (hopper_task_lists.hpp).
  kc::FormChooser hopper;
  bool hopper_tasks = false;
  single::HopperTaskLists task_lists;
  std::vector<single::HopperTaskWave> task_waves;  // per pass
  bool decide_on_first_forward = false;
  bool decide_on_first_backward = false;
  bool noted_unaligned = false;
  bool noted_unaligned_backward = false;
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
    task_lists.reset();
#if RINGATTN_HAVE_CUDNN
    cudnn.reset();
#endif
    kc::close_plan_stream(stream, opts.device);
  }

  void native_forward(const void* q, const void* k, const void* v, float* out, float* lse) {
    kc::FlashForwardParams p;
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(cfg.shape.head_dim);
    p.head_dim_v = static_cast<int>(cfg.effective_head_dim_v());
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
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
    p.head_dim_v = static_cast<int>(cfg.effective_head_dim_v());
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
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
    kc::HopperTaskShape h{static_cast<int>(s.batch), static_cast<int>(s.seq_len),
                          static_cast<int>(s.heads), static_cast<int>(cfg.effective_kv_heads()),
                          static_cast<int>(s.head_dim)};
    h.head_dim_v = static_cast<int>(cfg.effective_head_dim_v());
    h.form = hopper.forward_form();
    return h;
  }

  // "" and the task path's forward lists built, or why it cannot run.
  std::string prepare_hopper_tasks() {
    const Shape4& s = cfg.shape;
    if (s.seq_len > std::numeric_limits<int>::max() / 2 ||
        s.batch * s.seq_len > std::numeric_limits<int>::max() / 2)
      return "a sequence of " + std::to_string(s.seq_len) + " (tensor map coordinates are int)";
    if (std::string why =
            kc::hopper_task_forward_unsupported(elem, hopper_task_shape(), opts.device);
        !why.empty())
      return why;
    for (const single::DevicePass& pass : sched.passes) {
      const std::span<const kernels::ForwardItem> items(sched.q_items.data() + pass.q_item0,
                                                        static_cast<std::size_t>(pass.n_q_items));
      if (std::string why = task_lists.add_forward(sched.tasks, items, hopper_task_shape(),
                                                   task_waves.emplace_back());
          !why.empty())
        return why;
    }
    return "";
  }

  // "" and the task backward's dK/dV lists built, or why it cannot run.
  std::string prepare_hopper_task_backward() {
    if (std::string why =
            kc::hopper_task_backward_unsupported(elem, hopper_task_shape(), opts.device);
        !why.empty())
      return why;
    for (std::size_t i = 0; i < sched.passes.size(); ++i)
      if (std::string why =
              task_lists.add_backward(sched.tasks, sched.k_items, sched.passes[i].k_ranges,
                                      hopper_task_shape(), task_waves[i]);
          !why.empty())
        return why;
    return "";
  }

  void hopper_task_forward(const void* q, const void* k, const void* v, float* out, float* lse) {
    kc::FlashForwardParams p;
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(cfg.shape.head_dim);
    p.head_dim_v = static_cast<int>(cfg.effective_head_dim_v());
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
    p.causal = cfg.causal;
    for (std::size_t i = 0; i < sched.passes.size(); ++i) {
      p.items = task_lists.items() + task_waves[i].item0;
      p.accumulate = sched.passes[i].accumulate;
      p.out_scale = sched.passes[i].out_scale;
      kc::hopper_task_forward(elem, p, hopper_task_shape(), task_waves[i].groups, stream);
    }
  }

  kc::HopperForwardParams hopper_params(const void* q, const void* k, const void* v, float* out,
                                        float* lse) const {
    kc::HopperForwardParams p;
    static_cast<kc::HopperAttention&>(p) = hopper_attention();
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
    p.form = hopper.forward_form();
    return p;
  }

  kc::HopperBackwardParams hopper_backward_params(const void* q, const void* k, const void* v,
                                                  const float* lse, const void* dout, float* dq,
                                                  float* dk, float* dv) const {
    kc::HopperBackwardParams p;
    static_cast<kc::HopperAttention&>(p) = hopper_attention();
    p.q = q, p.k = k, p.v = v, p.dout = dout, p.lse = lse, p.delta = delta.as<float>();
    p.dq = dq, p.dk = dk, p.dv = dv;
    p.fused = hopper.fused();
    p.wide = hopper.wide();
    return p;
  }

  // The sm_90a kernels' choice for this configuration on this device; returns why the
  // forward cannot run ("" where it can) and why the backward cannot.
  std::pair<std::string, std::string> choose_hopper() {
    hopper_tasks = cfg.attention == AttentionKind::dilated;
    const int head_dim = static_cast<int>(cfg.shape.head_dim);
    kc::FormChooser::Path path;
    path.path = hopper_tasks ? kc::GpuPath::tasks : kc::GpuPath::dense;
    hopper = kc::FormChooser(path, opts.deterministic, opts.kernel == KernelChoice::automatic,
                             head_dim, static_cast<int>(cfg.effective_head_dim_v()));
    std::string why, why_backward;
    if (const std::string f = kc::hopper_feature_refusal(
            cfg, path.path, opts.kernel == KernelChoice::automatic);
        !f.empty()) {
      why = why_backward = f;
      hopper_tasks = false;
    } else if (hopper_tasks) {
      why = prepare_hopper_tasks();
      why_backward = why.empty() ? prepare_hopper_task_backward() : why;
      if (why.empty()) task_lists.upload(opts.device, stream);
    } else if (cfg.attention != AttentionKind::dense) {
      why = why_backward = "it takes dense and dilated attention only";
    } else {
      why = kc::hopper_forward_unsupported(
          hopper_params(nullptr, nullptr, nullptr, nullptr, nullptr), opts.device);
      why_backward = why.empty() ? kc::hopper_backward_unsupported(
                                       hopper_backward_params(nullptr, nullptr, nullptr, nullptr,
                                                              nullptr, nullptr, nullptr, nullptr),
                                       opts.device)
                                 : why;
    }
    // The wide fused kernel: D = 64 or 128, dense, or tasks whose key items pair up into 128
    // keys.
    const bool wide_ok = kc::hopper_wide_head_dim(head_dim) &&
                         (!hopper_tasks || task_lists.wide_ok(head_dim));
    hopper.decide(why, why_backward, wide_ok, notes);
    if (hopper.forward()) kc::hopper_feature_forced_notes(cfg, path.path, notes);
    if (hopper.forward() && !hopper_tasks && cfg.packed()) {
      // Kept with the plan: the emulated runtime reads an async copy's host source when the
      // copy runs, not at the call (a GPU stages pageable memory at the call).
      cu_host.assign(cfg.cu_seqlens.begin(), cfg.cu_seqlens.end());
      cu_seqlens = kc::upload_vector(cu_host, "the packed documents' offsets", opts.device, stream);
    }
    return {why, why_backward};
  }

  // cuDNN's forms here: a dilated configuration's views are the task path's.
  kc::GpuPath cudnn_path() const {
    return cfg.attention == AttentionKind::dilated ? kc::GpuPath::tasks : kc::GpuPath::dense;
  }
  // Values of their own head dim and the soft-cap make cuDNN's graphs a form of their own (its
  // score modifier, V and O tensors of another width), both passes.
  bool cudnn_value_dim_or_cap() const { return !value_dim_and_cap_words(cfg).empty(); }
  kc::GpuForm cudnn_forward_form() const {
    return cudnn_value_dim_or_cap() ? kc::GpuForm::cudnn_value_dim_softcap
                                    : kc::GpuForm::cudnn_forward;
  }
  kc::GpuForm cudnn_backward_form() const {
    return cudnn_value_dim_or_cap()                  ? kc::GpuForm::cudnn_value_dim_softcap
           : cfg.attention == AttentionKind::dilated ? kc::GpuForm::cudnn_dilated_backward
                                                     : kc::GpuForm::cudnn_backward;
  }
  // What runs where cuDNN does not: the sm_90a kernels where they can, else the native ones.
  const char* forward_fallback() const { return hopper.forward_name(); }
  const char* backward_fallback() const { return hopper.backward() ? "hopper" : "native"; }
  std::string fallback_kernels() const {
    return hopper.forward() ? "the sm_90a kernels" : "the native kernels";
  }

  // Which kernels run a pass: cuDNN's, ours (the sm_90a kernels where they run, else the
  // native ones), or the native ones (pointers the others cannot read).
  enum class Run { cudnn, ours, native };

  void run_forward(Run run, const void* q, const void* k, const void* v, float* out, float* lse) {
    const Shape4& s = cfg.shape;
    const bool ours_hopper = hopper.forward() && run == Run::ours;
    if (ours_hopper && !hopper_tasks) {  // writes every row of out and lse
      kc::hopper_forward(hopper_params(q, k, v, out, lse), stream);
      return;
    }
    if (sched.clear_outputs_first) {
      RINGATTN_CUDA_CHECK(cudaMemsetAsync(
          out, 0, static_cast<std::size_t>(cfg.out_shape().numel()) * sizeof(float), stream));
      kc::fill_floats(lse, s.batch * s.heads * s.seq_len, -std::numeric_limits<float>::infinity(),
                      stream);
    }
    if (ours_hopper) {
      hopper_task_forward(q, k, v, out, lse);
      return;
    }
#if RINGATTN_HAVE_CUDNN
    if (run == Run::cudnn) {
      cudnn->forward(q, k, v, out, lse, stream);
      return;
    }
#endif
    native_forward(q, k, v, out, lse);
  }

  // The native and task kernels' backward parameters, before the passes' items and scales.
  kc::FlashBackwardParams backward_params(const void* q, const void* k, const void* v,
                                          const float* out, const float* lse, const void* dout,
                                          float* dq, float* dk, float* dv) const {
    kc::FlashBackwardParams p;
    p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse, p.dout = dout;
    p.delta = delta.as<float>();
    p.dq = dq, p.dk = dk, p.dv = dv;
    p.tasks = tasks.as<kernels::SubseqTask>();
    p.head_dim = static_cast<int>(cfg.shape.head_dim);
    p.head_dim_v = static_cast<int>(cfg.effective_head_dim_v());
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
    p.causal = cfg.causal;
    return p;
  }

  // Every backward here starts with dq, dk, dv zeroed and the row sums D; then each pass runs
  // on the sm_90a kernels (the dense kernel, or the task kernels wave by wave) or the native
  // ones: dQ with the first key range's dK/dV, then one launch per further range (query heads
  // that share a K/V head add into its dK/dV in turn).
  void run_backward(Run run, const void* q, const void* k, const void* v, const float* out,
                    const float* lse, const void* dout, float* dq, float* dk, float* dv) {
#if RINGATTN_HAVE_CUDNN
    if (run == Run::cudnn) {
      cudnn->backward(q, k, v, out, lse, dout, dq, dk, dv, false, stream);
      return;
    }
#endif
    const bool ours_hopper = hopper.backward() && run == Run::ours;
    const Shape4& s = cfg.shape;
    const kc::RowDotParams rows{out,     dout,      delta.as<float>(),
                                s.batch, s.seq_len, s.heads,
                                cfg.effective_head_dim_v()};
    kc::start_backward(elem, rows, cfg.effective_kv_heads(), dq, dk, dv, stream, s.head_dim);
    if (ours_hopper && !hopper_tasks) {
      kc::hopper_backward(hopper_backward_params(q, k, v, lse, dout, dq, dk, dv), stream);
      return;
    }
    kc::FlashBackwardParams p = backward_params(q, k, v, out, lse, dout, dq, dk, dv);
    p.vector_loads =
        vector_loads && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
    for (std::size_t i = 0; i < sched.passes.size(); ++i) {
      const single::DevicePass& pass = sched.passes[i];
      p.out_scale = p.dout_scale = pass.out_scale;
      if (ours_hopper) {
        single::hopper_task_backward_wave(elem, p, hopper_task_shape(), task_waves[i], task_lists,
                                          stream, hopper.fused(), hopper.wide());
        continue;
      }
      p.q_items = q_items.as<kernels::ForwardItem>() + pass.q_item0;
      p.n_q_items = pass.n_q_items;
      for (const single::ItemRange& r : pass.k_ranges) {
        p.k_items = k_items.as<kernels::ForwardItem>() + r.first;
        p.n_k_items = r.count;
        kc::flash_backward(elem, p, stream);
        p.n_q_items = 0;
      }
    }
  }
};

CudaPlan::CudaPlan(const AttentionConfig& cfg, CudaPlanOptions opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg, opts.heads);
  const std::string on_gpu =
      field_is("device", "cuda") + " (use " + field_is("device", "cpu") + ")";
  require_bnhd(cfg, on_gpu);
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
    const std::string why = kc::native_kernels_fit(
        std::max(cfg.shape.head_dim, cfg.effective_head_dim_v()), m.elem, opts.device);
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
  // 16-byte copies need 8-element aligned rows of exactly the instantiated head dim (v's too).
  m.vector_loads = m.elem != kc::Elem::fp32 && s.head_dim == kc::padded_head_dim(s.head_dim) &&
                   cfg.effective_head_dim_v() == s.head_dim && single::rows_aligned(m.sched, 8);

  const bool automatic = opts.kernel == KernelChoice::automatic;
  std::string hopper_why_backward;
  if (opts.kernel == KernelChoice::hopper || automatic) {
    const auto [why, why_backward] = m.choose_hopper();
    hopper_why_backward = why_backward;
    const std::string over = m.hopper_tasks
                                 ? " (TMA + wgmma, over the dilated pattern's strided views)"
                                 : " (TMA + wgmma)";
    // A job feature the sm_90a kernels leave to the native ones, said where this device could
    // otherwise run them (quiet on the others, as below).
    const std::string feature =
        kc::hopper_feature_refusal(cfg, m.hopper_tasks ? kc::GpuPath::tasks : kc::GpuPath::dense,
                                   automatic);
    if (!automatic) {
      m.notes.push_back(m.hopper.asked_note(why, why_backward, "", over));
    } else if (!feature.empty() && why == feature &&
               kc::hopper_forward_unsupported(m.hopper_params(nullptr, nullptr, nullptr, nullptr,
                                                              nullptr),
                                              opts.device)
                   .empty()) {
      m.notes.push_back(field_is("kernel", "auto") +
                        ": the native kernels stand in for the sm_90a ones (" + feature + ")");
    } else if (m.hopper.forward() && kCudnnBuilt) {
      // Quiet where the sm_90a kernels cannot run (every GPU but compute capability 9.0);
      // without cuDNN in the build, its own note says what runs.
      m.notes.push_back(
          field_is("kernel", "auto") + ": " +
          (m.hopper.backward()
               ? "the sm_90a forward and backward" + over +
                     " stand in for the native kernels wherever cuDNN does not run or is slower"
               : "the sm_90a forward" + over +
                     " stands in for the native kernels wherever cuDNN does not run or is "
                     "slower; the backward's fallback is native (" +
                     why_backward + ")"));
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
      // auto takes only what a GPU has passed (verified_forms.hpp); kernel=cudnn runs the
      // rest with a note.
      const bool forward_verified = kc::verified_on_gpu(m.cudnn_forward_form(), m.cudnn_path());
      const bool backward_verified = kc::verified_on_gpu(m.cudnn_backward_form(), m.cudnn_path());
      const bool cudnn_asked = opts.kernel == KernelChoice::cudnn;
      m.use_cudnn = cudnn_asked || (automatic && opts.deterministic && forward_verified);
      m.decide_on_first_forward = automatic && !opts.deterministic && forward_verified;
      m.use_cudnn_backward = m.cudnn->has_backward() && cudnn_asked;
      m.decide_on_first_backward = m.cudnn->has_backward() && automatic && backward_verified;
      const std::string how = field_is("kernel", "cudnn");
      if (automatic && !forward_verified)
        m.notes.push_back(kc::unverified_by_auto_note(m.cudnn_forward_form(), how));
      const bool one_form = m.cudnn_backward_form() == m.cudnn_forward_form();
      if (automatic && m.cudnn->has_backward() && !backward_verified &&
          !(one_form && !forward_verified))
        m.notes.push_back(kc::unverified_by_auto_note(m.cudnn_backward_form(), how));
      if (cudnn_asked && !forward_verified)
        m.notes.push_back(kc::forced_unverified_note(m.cudnn_forward_form(), how));
      if (m.use_cudnn_backward && !backward_verified && !(one_form && cudnn_asked))
        m.notes.push_back(kc::forced_unverified_note(m.cudnn_backward_form(), how));
      std::ostringstream os;
      os << std::fixed << std::setprecision(0) << m.cudnn->description() << ", graphs built in "
         << m.cudnn->build_ms() << " ms";
      if (!m.cudnn->has_backward())
        os << "; the backward runs " << (m.hopper.backward() ? "on the sm_90a kernels" : "natively")
           << " ("
           << (opts.deterministic
                   ? field_is("deterministic", true) + ": cuDNN's backward adds dQ with atomics"
                   : m.cudnn->backward_refusal())
           << ")";
      m.notes.push_back(os.str());
    } catch (const kc::CudnnUnavailable& e) {
      if (opts.kernel == KernelChoice::cudnn)
        m.notes.push_back(field_is("kernel", "cudnn") + ": cuDNN cannot run this configuration (" +
                          e.what() + "); using the native kernels");
    } catch (const kc::DeviceOutOfMemory& e) {
      // cuDNN's scratch and workspace come on top of what native needs: a configuration
      // native can run must not fail for them.
      m.cudnn.reset();
      m.notes.push_back(field_is("kernel", to_string(opts.kernel)) +
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
                                     "); use " + field_is("kernel", "native") + " or auto");
    m.notes.push_back(field_is("kernel", "auto") + ": " + m.fallback_kernels() +
                      " (no cuDNN: " + why + ")" +
                      (m.hopper.backward() || !m.hopper.forward()
                           ? ""
                           : "; the native backward (" + hopper_why_backward + ")"));
#endif
  }
  // The native kernels' caveat where they may run the job's features: not where the sm_90a
  // kernels or cuDNN take both passes (the choice above).
  const bool native_may_run = (!m.use_cudnn && !m.hopper.forward()) ||
                              (!m.use_cudnn_backward && !m.hopper.backward());
  if (std::string n = native_unverified_note(cfg, "the native kernels");
      !n.empty() && native_may_run)
    m.notes.push_back(std::move(n));
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
  return impl_->use_cudnn_backward ? "cudnn" : impl_->hopper.backward_name();
}

std::size_t CudaPlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t b = m.tasks.bytes() + m.q_items.bytes() + m.k_items.bytes() + m.delta.bytes() +
                  m.task_lists.bytes();
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
  using Run = Impl::Run;
  const kc::ScopedDevice on(m.opts.device);
  kc::plant_hang_if_asked(m.stream);  // the watchdog's tests only (RINGATTN_TEST_PLANT_HANG)
  // cuDNN's tensors are declared 16-byte aligned; other pointers (offset views) run native.
  const bool cudnn_next = m.has_cudnn() && (m.use_cudnn || m.decide_on_first_forward);
  if (!(aligned16(q) && aligned16(k) && aligned16(v)) && (cudnn_next || m.hopper.forward())) {
    if (!cudnn_next) {
      m.hopper.forward_reads(q, k, v, m.notes);  // TMA too
    } else if (!m.noted_unaligned) {
      m.notes.push_back(kc::unaligned_note("cuDNN", "q/k/v", false));
      m.noted_unaligned = true;
    }
    return m.run_forward(Run::native, q, k, v, out, lse);
  }
  // Ours first: cuDNN (below) is timed against the fastest form.
  m.hopper.time_forward(
      m.stream, [&] { m.run_forward(Run::ours, q, k, v, out, lse); }, m.notes);
  if (m.decide_on_first_forward) {
    m.decide_on_first_forward = false;
#if RINGATTN_HAVE_CUDNN
    // cuDNN against what runs where it does not (the sm_90a kernels or the native ones).
    m.use_cudnn = kc::cudnn_is_faster(
        m.stream, "forward", m.forward_fallback(),
        [&](bool cudnn) { m.run_forward(cudnn ? Run::cudnn : Run::ours, q, k, v, out, lse); },
        m.notes);
    if (!m.use_cudnn && !m.decide_on_first_backward && !m.use_cudnn_backward) m.cudnn.reset();
#endif
  }
  m.run_forward(m.use_cudnn ? Run::cudnn : Run::ours, q, k, v, out, lse);
}

void CudaPlan::backward(const void* q, const void* k, const void* v, const float* out,
                        const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  using Run = Impl::Run;
  const kc::ScopedDevice on(m.opts.device);
  if (!(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout))) {  // TMA too
    if (m.use_cudnn_backward || m.decide_on_first_backward) {
      if (!m.noted_unaligned_backward)
        m.notes.push_back(kc::unaligned_note("cuDNN", "q/k/v/dout", true));
      m.noted_unaligned_backward = true;
    } else if (m.hopper.backward()) {
      m.hopper.backward_reads(q, k, v, dout, m.notes);
    }
    return m.run_backward(Run::native, q, k, v, out, lse, dout, dq, dk, dv);
  }
  // The sm_90a backward's form for this call (its two passes against the fused kernels on
  // the first aligned call under auto); cuDNN (below) is timed against the form chosen.
  const kc::FormChooser::Call call = m.hopper.backward_call(
      m.stream, dq, !m.use_cudnn_backward,
      [&] { m.run_backward(Run::ours, q, k, v, out, lse, dout, dq, dk, dv); }, m.notes);
  if (m.decide_on_first_backward && !m.hopper.backward_timing_pending() && !call.fell_back()) {
    m.decide_on_first_backward = false;
#if RINGATTN_HAVE_CUDNN
    m.use_cudnn_backward = kc::cudnn_is_faster(
        m.stream, "backward", m.backward_fallback(),
        [&](bool cudnn) {
          m.run_backward(cudnn ? Run::cudnn : Run::ours, q, k, v, out, lse, dout, dq, dk, dv);
        },
        m.notes);
    if (!m.use_cudnn && !m.use_cudnn_backward) m.cudnn.reset();
#endif
  }
  m.run_backward(m.use_cudnn_backward ? Run::cudnn : Run::ours, q, k, v, out, lse, dout, dq, dk,
                 dv);
}

}  // namespace ringattn

// CudaRingPlan: the ring protocol (ring_protocol.hpp) on a device. Its backend packs and adds
// rows with kernels on the compute stream, posts exchanges to start after that stream's
// event, waits for them on the device (StreamExchanges), and launches the flash kernels.
#include "ring/cuda_ring_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/choice/form_chooser.hpp"
#include "kernels/cuda/choice/verified_forms.hpp"
#include "kernels/cuda/hopper/task_backward.hpp"
#include "kernels/cuda/hopper/task_forward.hpp"
#include "kernels/cuda/native/flash.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"
#include "single/device_schedule.hpp"
#include "single/hopper_task_lists.hpp"
#if RINGATTN_RING_CUDNN
#include "ring/ring_cudnn_steps.hpp"
#endif
#include "core/patterns.hpp"
#include "ring/ring_device_steps.hpp"
#include "ring/ring_kernel_choice.hpp"
#include "ring/ring_protocol.hpp"
#include "ring/stream_exchanges.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

using kc::aligned16;  // 16-byte copies, TMA and bulk adds need 16-byte aligned base pointers

struct CudaRingPlan::Impl {
  AttentionConfig cfg;
  CudaPlanOptions opts;
  kc::Elem elem = kc::Elem::bf16;
  ShardLayout layout;
  RingSchedule sched;
  RingProtocol protocol;
  double timeout_s = kDefaultTimeoutSeconds;
  float grouped_scale = 1.0f;
  bool vector_loads = false;
  cudaStream_t stream = nullptr;
  std::vector<DeviceStep> steps;
  kc::DeviceAllocation tasks, q_items, k_items, runs, delta;
  // RingOptions::StepResults::partials: one step's out [B, n, H, D] and lse [B, H, n], fp32.
  bool partials = false;
  kc::DeviceAllocation part_out, part_lse;
  RingBuffers<kc::DeviceAllocation> buf;
  std::unique_ptr<StreamExchanges> ex;  // before the stream in ~Impl
  RingTimings fwd, bwd;
  // The sm_90a task kernels' choice (form_chooser.hpp) for every step's forward and backward,
  // over the rank's own K/V at step 0 and the packed receive buffer after (the step's dK/dV
  // partial, laid out as that buffer, for the backward); their lists per [step][wave].
  kc::FormChooser hopper;
  single::HopperTaskLists task_lists;
  std::vector<std::vector<single::HopperTaskWave>> task_waves;
  // cuDNN's steps (ring_cudnn_steps.hpp): --kernel cudnn, or auto deciding on the first
  // forward and backward (decide_*).
  bool use_cudnn = false, use_cudnn_backward = false;
  bool decide_forward = false, decide_backward = false;
  bool noted_unaligned = false, noted_unaligned_backward = false;
  Communicator* comm = nullptr;
#if RINGATTN_RING_CUDNN
  std::unique_ptr<RingCudnnSteps> cudnn;
#endif
  std::vector<std::string> notes;

  int64_t d() const { return cfg.shape.head_dim; }
  int64_t dv() const { return cfg.effective_head_dim_v(); }  // v, out, dout, dv rows
  std::size_t eb() const { return static_cast<std::size_t>(kc::elem_bytes(elem)); }

  ~Impl() {
    const kc::ScopedDevice on(opts.device, std::nothrow);
    ex.reset();
    for (kc::DeviceAllocation* a :
         {&tasks, &q_items, &k_items, &runs, &delta, &part_out, &part_lse})
      a->reset();
    task_lists.reset();
#if RINGATTN_RING_CUDNN
    cudnn.reset();
#endif
    for (int i = 0; i < 2; ++i)
      for (kc::DeviceAllocation* a :
           {&buf.send[i], &buf.receive[i], &buf.partial[i], &buf.returned[i]})
        a->reset();
    kc::close_plan_stream(stream, opts.device);
  }

  kc::PackParams pack_params(int t) const {
    const RingStep& st = sched.steps[static_cast<std::size_t>(t)];
    const DeviceStep& ds = steps[static_cast<std::size_t>(t)];
    kc::PackParams p;
    p.runs = runs.as<kc::PackedRun>() + ds.run0, p.n_runs = ds.n_runs;
    p.total_rows = p.buffer_rows = st.send_rows;
    p.head_dim = d();
    p.head_dim_v = dv();
    return p;
  }

  int64_t shard_rows() const { return cfg.shape.batch * layout.local_len * cfg.shape.heads; }

  // Step t's tensors as the Hopper task kernel reads them: q [B, N/P, H, D]; K/V the shard's
  // [B, N/P, HKV, D] at step 0, else the step's packed receive rows [recv_rows, D].
  kc::HopperTaskShape hopper_shape(int t) const {
    const Shape4& s = cfg.shape;
    kc::HopperTaskShape h{static_cast<int>(s.batch), static_cast<int>(layout.local_len),
                          static_cast<int>(s.heads), static_cast<int>(cfg.effective_kv_heads()),
                          static_cast<int>(s.head_dim)};
    h.head_dim_v = static_cast<int>(dv());
    if (t > 0) {
      h.kv_heads = 1;
      h.kv_rows = static_cast<int>(sched.steps[static_cast<std::size_t>(t)].recv_rows);
    }
    h.form = hopper.forward_form();
    return h;
  }

  void clear_partial() {
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(part_out.get(), 0, part_out.bytes(), stream));
    kc::fill_floats(part_lse.as<float>(), shard_rows(), -std::numeric_limits<float>::infinity(),
                    stream);
  }

  // out/lse ← the lse merge of themselves and the step's partial, row by row.
  void merge_partial(float* out, float* lse) {
    kernels::MergeRows mr;
    mr.acc_out = out, mr.acc_lse = lse;
    mr.part_out = part_out.as<float>(), mr.part_lse = part_lse.as<float>();
    mr.rows = shard_rows(), mr.d = dv();
    mr.acc_out_stride = mr.part_out_stride = dv();
    mr.lse_heads = cfg.shape.heads, mr.lse_rows = layout.local_len;
    kc::launch_merge_lse(mr, stream);
  }

  struct Device;
  void run_forward(const void* q, const void* k, const void* v, float* out, float* lse);
  void run_backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                    const void* dout, float* dq, float* dk, float* dv);
  void choose_hopper(bool automatic, const std::string& flag,
                     const std::vector<kernels::ForwardItem>& key_items);

  // --kernel auto: whether a pass takes cuDNN's steps, by ring_kernel_choice.hpp's rule on the
  // slowest rank's median times of `run(false)` (ringattn's kernels) and `run(true)` (cuDNN's
  // steps), or on RINGATTN_TEST_RING_AUTO_MS's; the choice and the times become a note.
  template <class Run>
  bool auto_takes_cudnn(bool backward, Run&& run) {
    const std::string ours =
        backward ? (hopper.backward() ? "hopper" : "native") : hopper.forward_name();
    const std::optional<RingPassTiming> stub = ring_auto_stubbed_timing(backward);
    RingPassTiming t;
    if (stub) {
      t = *stub;
    } else {
      t.ours_ms = comm->max(kc::median_ms(stream, [&] { run(false); }));
      t.cudnn_ms = comm->max(kc::median_ms(stream, [&] { run(true); }));
    }
    const bool take = ring_auto_takes_cudnn(t, opts.deterministic);
    notes.push_back(
        ring_auto_note(backward ? "backward" : "forward", ours, t, take, stub.has_value()));
    return take;
  }

  // Once neither pass can still take cuDNN, its graphs and scratch are given back.
  void release_unchosen_cudnn() {
#if RINGATTN_RING_CUDNN
    if (!use_cudnn && !use_cudnn_backward && !decide_forward && !decide_backward && cudnn)
      cudnn->release();
#endif
  }
};

// The protocol's backend for one call: the plan's device buffers and lists, the call's
// kernel parameters. Everything is enqueued on the plan's stream; the call's timings come
// from StreamExchanges::finish_call.
struct CudaRingPlan::Impl::Device {
  Impl& m;
  kc::FlashForwardParams fwd;   // forward calls
  kc::FlashBackwardParams bwd;  // backward calls

  int64_t head_dim() const { return m.d(); }
  int64_t head_dim_v() const { return m.dv(); }
  std::size_t kv_elem_bytes() const { return m.eb(); }

  void* buffer(RingBuffer which, int t) const { return m.buf.at(which, t).get(); }

  void pack(int t, const void* k, const void* v) {
    kc::launch_pack_rows(m.elem, m.pack_params(t), k, v, m.buf.send[t % 2].get(), m.stream);
  }

  // Starts once the stream's work so far is done: the pack, and every read of the buffers
  // the exchange overwrites.
  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag, int step,
           const char* what) {
    return m.ex->post(std::move(sends), std::move(recvs), tag, step, what);
  }

  void wait(int ticket) { m.ex->device_wait(ticket); }

  void compute_forward(int t, const void* k, const void* v) {
    kc::FlashForwardParams p = fwd;
    p.k = k, p.v = v;
    if (m.partials) {  // the step whole into the partial, then merged in
      p.out = m.part_out.as<float>(), p.lse = m.part_lse.as<float>();
      m.clear_partial();
    }
#if RINGATTN_RING_CUDNN
    if (m.use_cudnn && m.cudnn->runs(t)) {
      if (aligned16(p.q) && aligned16(k) && aligned16(v)) {
        m.cudnn->forward(t, p.q, k, v, p.out, p.lse);
        if (m.partials) m.merge_partial(fwd.out, fwd.lse);
        return;
      }
      if (!m.noted_unaligned) m.notes.push_back(kc::unaligned_note("cuDNN", "q/k/v", false));
      m.noted_unaligned = true;
    }
#endif
    const bool hopper = m.hopper.forward() && m.hopper.forward_reads(p.q, k, v, m.notes);
    const auto& waves = m.steps[static_cast<std::size_t>(t)].waves;
    for (std::size_t i = 0; i < waves.size(); ++i) {
      const DeviceWave& w = waves[i];
      p.tasks = m.tasks.as<kernels::SubseqTask>() + w.task0;
      if (hopper) {
        const single::HopperTaskWave& hw = m.task_waves[static_cast<std::size_t>(t)][i];
        p.items = m.task_lists.items() + hw.item0;
        kc::hopper_task_forward(m.elem, p, m.hopper_shape(t), hw.groups, m.stream);
        continue;
      }
      p.items = m.q_items.as<kernels::ForwardItem>() + w.q_item0;
      p.n_items = w.n_q_items;
      kc::flash_forward(m.elem, p, m.stream);
    }
    if (m.partials) m.merge_partial(fwd.out, fwd.lse);
  }

  void compute_backward(int t, const void* k, const void* v, float* dk, float* dv) {
    kc::FlashBackwardParams p = bwd;
    p.k = k, p.v = v, p.dk = dk, p.dv = dv;
#if RINGATTN_RING_CUDNN
    if (m.use_cudnn_backward && m.cudnn->runs_backward(t)) {
      if (aligned16(p.q) && aligned16(p.dout) && aligned16(k) && aligned16(v)) {
        m.cudnn->backward(t, p.q, k, v, p.dout, p.lse, p.dq, dk, dv);
        return;
      }
      if (!m.noted_unaligned_backward)
        m.notes.push_back(kc::unaligned_note("cuDNN", "q/k/v/dout", true));
      m.noted_unaligned_backward = true;
    }
#endif
    const bool hopper = m.hopper.backward() && m.hopper.backward_reads(p.q, k, v, p.dout, m.notes);
    const auto& waves = m.steps[static_cast<std::size_t>(t)].waves;
    for (std::size_t i = 0; i < waves.size(); ++i) {
      const DeviceWave& w = waves[i];
      p.tasks = m.tasks.as<kernels::SubseqTask>() + w.task0;
      if (hopper) {
        single::hopper_task_backward_wave(
            m.elem, p, m.hopper_shape(t), m.task_waves[static_cast<std::size_t>(t)][i],
            m.task_lists, m.stream, m.hopper.fused(), m.hopper.wide());
        continue;
      }
      p.q_items = m.q_items.as<kernels::ForwardItem>() + w.q_item0;
      p.n_q_items = w.n_q_items;
      for (const single::ItemRange& r : w.k_ranges) {  // as CudaPlan's ours_backward
        p.k_items = m.k_items.as<kernels::ForwardItem>() + r.first;
        p.n_k_items = r.count;
        kc::flash_backward(m.elem, p, m.stream);
        p.n_q_items = 0;
      }
    }
  }

  void clear(float* p, int64_t floats) const {
    RINGATTN_CUDA_CHECK(
        cudaMemsetAsync(p, 0, static_cast<std::size_t>(floats) * sizeof(float), m.stream));
  }

  void add_returned(int t, float* dk, float* dv) {
    kc::launch_unpack_add_rows(m.pack_params(t), m.buf.returned[t % 2].as<float>(), dk, dv,
                               m.steps[static_cast<std::size_t>(t)].rows_repeat, m.stream);
  }
};

CudaRingPlan::CudaRingPlan(const AttentionConfig& cfg, Communicator& comm, CudaPlanOptions opts,
                           RingOptions ring_opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg, opts.heads);
  require_bnhd(cfg, "the GPU ring");
  Impl& m = *impl_;
  m.cfg = cfg;
  m.opts = opts;
  m.elem = kc::elem_of(opts.dtype);
  if (comm.size() > 1 && comm.memory_space() != MemorySpace::device)
    throw InputError("device", "'cuda' with several ranks needs a device communicator (NCCL)");
  const CudaDeviceStatus dev = probe_cuda_device(opts.device);
  if (!dev.usable) throw InputError("device", "'cuda' cannot be used: " + dev.reason);
  const kc::ScopedDevice on(opts.device);
  if (m.elem != kc::Elem::fp32 &&
      !kc::native_kernels_fit(std::max(m.d(), m.dv()), m.elem, opts.device).empty()) {
    m.opts.dtype = DeviceDType::fp32;
    m.elem = kc::Elem::fp32;
  }
  RINGATTN_CUDA_CHECK(cudaStreamCreate(&m.stream));
  kc::register_stream(m.stream, opts.timeout_s);
  m.layout = make_layout(cfg, comm.size(), opts.heads);
  const kernels::TileConfig tiles{kc::kQueryTile, kc::kKeyTile};
  m.sched = build_ring_schedule(cfg, m.layout, comm.rank(), tiles, opts.heads);
  m.protocol = RingProtocol(m.sched, comm, ring_opts);
  m.timeout_s = ring_opts.timeout_s;
  m.grouped_scale = grouped_scale(cfg);

  // Every step's waves and runs in one set of device lists, uploaded once.
  single::FlatSchedule all;
  std::vector<kc::PackedRun> runs;
  m.steps = flatten_ring_steps(m.sched, cfg.causal, all, runs);
  // 16-byte copies need 8-element aligned rows of exactly the instantiated head dim (v's too).
  m.vector_loads = m.elem != kc::Elem::fp32 && cfg.shape.head_dim == kc::padded_head_dim(m.d()) &&
                   m.dv() == m.d() && single::rows_aligned(all, 8);
  m.tasks = kc::upload_vector(all.tasks, "the ring's task lists", opts.device, m.stream);
  m.q_items = kc::upload_vector(all.q_items, "the ring's query work items", opts.device, m.stream);
  m.k_items = kc::upload_vector(all.k_items, "the ring's key work items", opts.device, m.stream);
  m.runs = kc::upload_vector(runs, "the ring's packed-row lists", opts.device, m.stream);
  const Shape4& s = cfg.shape;
  m.partials = ring_opts.step_results == RingOptions::StepResults::partials;
  if (m.partials) {
    m.part_out =
        kc::DeviceAllocation(static_cast<std::size_t>(m.shard_rows() * m.dv()) * sizeof(float),
                             "the ring's partial output", opts.device, m.stream);
    m.part_lse = kc::DeviceAllocation(static_cast<std::size_t>(m.shard_rows()) * sizeof(float),
                                      "the ring's partial lse", opts.device, m.stream);
  }
  m.delta = kc::DeviceAllocation(
      static_cast<std::size_t>(s.batch * s.heads * m.layout.local_len) * sizeof(float),
      "the backward's row sums D", opts.device, m.stream);
  // Two of each (double buffers), sized once from the schedule's largest step: K rows of D
  // then V rows of Dv.
  const auto kv_send = static_cast<std::size_t>(m.sched.max_send_rows * (m.d() + m.dv()));
  const auto kv_recv = static_cast<std::size_t>(m.sched.max_recv_rows * (m.d() + m.dv()));
  for (int i = 0; i < 2; ++i) {
    m.buf.send[i] =
        kc::DeviceAllocation(kv_send * m.eb(), "a ring send buffer", opts.device, m.stream);
    m.buf.receive[i] =
        kc::DeviceAllocation(kv_recv * m.eb(), "a ring receive buffer", opts.device, m.stream);
    m.buf.partial[i] = kc::DeviceAllocation(kv_recv * sizeof(float), "a ring dK/dV partial buffer",
                                            opts.device, m.stream);
    m.buf.returned[i] = kc::DeviceAllocation(kv_send * sizeof(float), "a ring dK/dV return buffer",
                                             opts.device, m.stream);
  }
  // --kernel cudnn: every step's views on cuDNN (the backward too unless --deterministic, as
  // cuDNN's backward adds dQ with atomics); a step cuDNN refuses runs on ringattn's kernels,
  // with a note naming why. --kernel auto (not --deterministic): the same steps are a
  // candidate, timed against ringattn's kernels on the first forward and the first backward
  // (ring_kernel_choice.hpp).
  m.comm = &comm;
  const bool cudnn_asked = opts.kernel == KernelChoice::cudnn;
  bool auto_tries_cudnn = opts.kernel == KernelChoice::automatic && !opts.deterministic;
  if (cudnn_asked) {
#if RINGATTN_CUDA_EMULATION  // cuDNN's stand-in runs for tests only (cudnn/graphs_emulated.cpp)
    if (!kc::cudnn_standin_enabled())
      throw InputError("kernel",
                       "'cudnn' is not available in this build (the emulated GPU has "
                       "no cuDNN)");
#endif
#if !RINGATTN_RING_CUDNN
    throw InputError("kernel",
                     "'cudnn' is not available in this build (no cuDNN headers or cudnn-frontend "
                     "at configure time)");
#endif
  }
#if RINGATTN_CUDA_EMULATION
  auto_tries_cudnn = auto_tries_cudnn && kc::cudnn_standin_enabled();
#endif
  const char* noted = cudnn_asked                              ? "cudnn"
                      : opts.kernel == KernelChoice::automatic ? "auto"
                                                               : "hopper";
  const std::string flag = field_is("kernel", noted) + ": ";
#if RINGATTN_RING_CUDNN
  if (RingCudnnChoice c = choose_ring_cudnn(cfg, m.layout, m.sched, m.elem, opts, cudnn_asked,
                                            auto_tries_cudnn, flag, m.stream, m.notes);
      c.steps) {
    m.cudnn = std::move(c.steps);
    m.use_cudnn = c.forward, m.use_cudnn_backward = c.backward;
    m.decide_forward = c.decide_forward, m.decide_backward = c.decide_backward;
  }
#endif
  // ringattn's own kernels: the sm_90a task kernels where they run (the faster ones,
  // docs/PERFORMANCE.md), else the native ones; for --kernel cudnn they run what cuDNN does
  // not (refused steps, the --deterministic backward).
#if RINGATTN_RING_CUDNN
  const bool refusals =
      m.cudnn && (!m.cudnn->refused().empty() || !m.cudnn->refused_backward().empty());
#else
  const bool refusals = false;
#endif
  const bool ours_needed = opts.kernel == KernelChoice::hopper ||
                           opts.kernel == KernelChoice::automatic || !m.use_cudnn_backward ||
                           refusals;
  if (ours_needed && opts.kernel != KernelChoice::native)
    m.choose_hopper(opts.kernel != KernelChoice::hopper, flag, all.k_items);
#if RINGATTN_RING_CUDNN
  // What cuDNN refused, step by step (auto: only where cuDNN could have been chosen).
  if (m.cudnn && (cudnn_asked || m.use_cudnn || m.decide_forward))
    m.cudnn->refusal_notes(
        flag, m.hopper.forward() ? "sm_90a" : "native", m.hopper.backward() ? "sm_90a" : "native",
        m.use_cudnn || m.decide_forward ? (cudnn_asked ? !opts.deterministic : true) : false,
        m.use_cudnn_backward || m.decide_backward, m.notes);
#endif
  // The native kernels' caveat where they may run the job's features: not where the sm_90a
  // kernels or cuDNN (refusing no step) take both passes.
  const bool cudnn_all = m.use_cudnn && m.use_cudnn_backward && !refusals;
  if (std::string n = native_unverified_note(cfg, "the native kernels");
      !n.empty() && !cudnn_all && !(m.hopper.forward() && m.hopper.backward()))
    m.notes.push_back(std::move(n));
  m.ex = std::make_unique<StreamExchanges>(comm, m.stream, opts.device, m.timeout_s,
                                           ring_opts.skip_buffer_ordering_for_tests);
  kc::wait_for_stream(m.stream, "the ring plan's uploads");
}

// The sm_90a task kernels for every step, where they run (`automatic`: auto's choice, else
// --kernel hopper's), with the note that says what runs.
void CudaRingPlan::Impl::choose_hopper(bool automatic, const std::string& flag,
                                       const std::vector<kernels::ForwardItem>& key_items) {
  const auto shape = [this](int t) { return hopper_shape(t); };
  const std::string f = kc::hopper_feature_refusal(cfg, kc::GpuPath::ring, automatic);
  const std::string why = !f.empty() ? f
                                     : build_ring_hopper_forward(
                                           sched, cfg.shape.batch * layout.local_len, shape, elem,
                                           opts.device, task_lists, task_waves);
  const std::string why_backward =
      why.empty() ? build_ring_hopper_backward(sched, steps, key_items, shape, elem, opts.device,
                                               task_lists, task_waves)
                  : why;
  task_lists.upload(opts.device, stream);
  kc::FormChooser::Path path;
  path.path = kc::GpuPath::ring;
  path.forward_what = "the ring's sm_90a forward";
  path.backward_what = "the ring's sm_90a backward";
  path.collective = true;
  path.slowest = [this](double ms) { return comm->max(ms); };
  hopper = kc::FormChooser(std::move(path), opts.deterministic,
                           opts.kernel == KernelChoice::automatic, static_cast<int>(d()),
                           static_cast<int>(dv()));
  hopper.decide(why, why_backward, task_lists.wide_ok(d()), notes);
  if (hopper.forward()) kc::hopper_feature_forced_notes(cfg, kc::GpuPath::ring, notes);
  const std::string status =
      automatic ? "the fastest ring kernels on this GPU" : kernels::cuda::kHopperStatus;
#if RINGATTN_RING_CUDNN
  const bool refusals = use_cudnn && !cudnn->refused().empty();
#else
  const bool refusals = false;
#endif
  const std::string which = !use_cudnn           ? "forward and backward"
                            : use_cudnn_backward ? "forward and backward that cuDNN refuses"
                            : refusals           ? "backward, and forward that cuDNN refuses,"
                                                 : "backward";
  const char* over = " (TMA + wgmma; the rank's K/V, then each received block); ";
  notes.push_back(
      !hopper.forward()
          ? (automatic ? flag + "the native kernels (the sm_90a ones cannot run: " + why + ")"
                       : field_is("kernel", "hopper") + ": " + why + "; using the native kernels")
      : hopper.backward()
          ? flag + "every ring step's " + which + " on the sm_90a kernels" + over + status
          : flag + "every ring step's forward on the sm_90a kernel" + over +
                "the native backward (the Hopper one cannot run: " + why_backward + "); " + status);
}

std::string CudaRingPlan::kernel_name() const {
  return impl_->use_cudnn ? "cudnn" : impl_->hopper.forward_name();
}
std::string CudaRingPlan::backward_kernel_name() const {
  return impl_->use_cudnn_backward ? "cudnn" : impl_->hopper.backward_name();
}
const std::vector<std::string>& CudaRingPlan::notes() const noexcept { return impl_->notes; }

CudaRingPlan::~CudaRingPlan() = default;

const ShardLayout& CudaRingPlan::layout() const noexcept { return impl_->layout; }
const RingSchedule& CudaRingPlan::schedule() const noexcept { return impl_->sched; }
DeviceDType CudaRingPlan::dtype() const noexcept { return impl_->opts.dtype; }
const RingTimings& CudaRingPlan::last_forward() const noexcept { return impl_->fwd; }
const RingTimings& CudaRingPlan::last_backward() const noexcept { return impl_->bwd; }

std::size_t CudaRingPlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t b = m.task_lists.bytes();
  for (const kc::DeviceAllocation* a :
       {&m.tasks, &m.q_items, &m.k_items, &m.runs, &m.delta, &m.part_out, &m.part_lse})
    b += a->bytes();
#if RINGATTN_RING_CUDNN
  if (m.cudnn) b += m.cudnn->bytes();
#endif
  for (int i = 0; i < 2; ++i)
    b += m.buf.send[i].bytes() + m.buf.receive[i].bytes() + m.buf.partial[i].bytes() +
         m.buf.returned[i].bytes();
  return b;
}

void* CudaRingPlan::stream() const noexcept { return impl_->stream; }

void CudaRingPlan::synchronize() {
  const kc::ScopedDevice on(impl_->opts.device);
  kc::wait_for_stream(impl_->stream, "the ring's work");
}

void CudaRingPlan::forward(const void* q, const void* k, const void* v, float* out, float* lse) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  // Ours first: cuDNN (below) is timed against the fastest form.
  m.hopper.time_forward(
      m.stream,
      [&] {
        const bool cudnn = m.use_cudnn;
        m.use_cudnn = false;
        m.run_forward(q, k, v, out, lse);
        m.use_cudnn = cudnn;
      },
      m.notes);
  if (m.decide_forward) {
    m.decide_forward = false;
    m.use_cudnn = m.auto_takes_cudnn(false, [&](bool cudnn) {
      m.use_cudnn = cudnn;
      m.run_forward(q, k, v, out, lse);
    });
    m.release_unchosen_cudnn();
  }
  m.run_forward(q, k, v, out, lse);
}

void CudaRingPlan::Impl::run_forward(const void* q, const void* k, const void* v, float* out,
                                     float* lse) {
  Impl& m = *this;
  m.fwd = {};
  const Shape4& s = m.cfg.shape;
  const int64_t n_out = s.batch * m.layout.local_len * s.heads * m.dv();
  m.ex->start_call();
  RINGATTN_CUDA_CHECK(
      cudaMemsetAsync(out, 0, static_cast<std::size_t>(n_out) * sizeof(float), m.stream));
  kc::fill_floats(lse, s.batch * s.heads * m.layout.local_len,
                  -std::numeric_limits<float>::infinity(), m.stream);
  Impl::Device device{m, {}, {}};
  kc::FlashForwardParams& p = device.fwd;
  p.q = q, p.out = out, p.lse = lse;
  p.head_dim = static_cast<int>(d());
  p.head_dim_v = static_cast<int>(dv());
  p.scale = static_cast<float>(cfg.effective_scale());
  p.softcap = static_cast<float>(cfg.softcap);
  p.causal = cfg.causal;
  p.accumulate = true;
  p.vector_loads = m.vector_loads;
  m.protocol.forward(device, k, v, m.fwd);
  if (m.grouped_scale != 1.0f) kc::scale_floats(out, n_out, m.grouped_scale, m.stream);
  m.ex->finish_call(m.fwd);
}

void CudaRingPlan::backward(const void* q, const void* k, const void* v, const float* out,
                            const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  // Ours' form first (the same on every rank): cuDNN (below) is timed against it.
  const kc::FormChooser::Call call = m.hopper.backward_call(
      m.stream, dq, true,
      [&] {
        const bool cudnn = m.use_cudnn_backward;
        m.use_cudnn_backward = false;
        m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
        m.use_cudnn_backward = cudnn;
      },
      m.notes);
  if (m.decide_backward && !m.hopper.backward_timing_pending()) {
    m.decide_backward = false;
    m.use_cudnn_backward = m.auto_takes_cudnn(true, [&](bool cudnn) {
      m.use_cudnn_backward = cudnn;
      m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
    });
    m.release_unchosen_cudnn();
  }
  m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
}

void CudaRingPlan::Impl::run_backward(const void* q, const void* k, const void* v, const float* out,
                                      const float* lse, const void* dout, float* dq, float* dk,
                                      float* dv) {
  Impl& m = *this;
  m.bwd = {};
  const Shape4& s = m.cfg.shape;
  const int64_t dd = m.d();
  m.ex->start_call();
  kc::start_backward(m.elem,
                     {out, dout, m.delta.as<float>(), s.batch, m.layout.local_len, s.heads, m.dv()},
                     m.cfg.effective_kv_heads(), dq, dk, dv, m.stream, dd);
#if RINGATTN_RING_CUDNN
  if (m.use_cudnn_backward) m.cudnn->load_out(out);  // cuDNN's backward reads it in the io type
#endif
  Impl::Device device{m, {}, {}};
  kc::FlashBackwardParams& p = device.bwd;
  p.q = q, p.out = out, p.lse = lse, p.dout = dout;
  p.delta = m.delta.as<float>();
  p.dq = dq;
  p.head_dim = static_cast<int>(dd);
  p.head_dim_v = static_cast<int>(m.dv());
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.softcap = static_cast<float>(m.cfg.softcap);
  p.causal = m.cfg.causal;
  p.out_scale = p.dout_scale = m.grouped_scale;
  p.vector_loads = m.vector_loads;
  m.protocol.backward(device, k, v, dk, dv, m.bwd);
  m.ex->finish_call(m.bwd);
}

}  // namespace ringattn::ring

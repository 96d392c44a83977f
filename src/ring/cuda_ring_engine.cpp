// CudaRingPlan: the ring protocol (ring_protocol.hpp) on a device. Its backend packs and adds
// rows with kernels on the compute stream, posts exchanges to start after that stream's
// event, waits for them on the device (StreamExchanges), and launches the flash kernels.
#include "ring/cuda_ring_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/hopper_fwd.hpp"  // kHopperStatus
#include "kernels/cuda/hopper_task_bwd.hpp"
#include "kernels/cuda/hopper_task_fwd.hpp"
#include "single/device_schedule.hpp"
#if RINGATTN_RING_CUDNN
#include "kernels/cuda/cudnn_graphs.hpp"
#include "ring/ring_cudnn_views.hpp"
#endif
#include "core/patterns.hpp"
#include "ring/progress_thread.hpp"
#include "ring/ring_protocol.hpp"
#include "ring/stream_exchanges.hpp"
#include "ringattn/errors.hpp"
#include "single/schedule.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
kc::DeviceAllocation upload(const std::vector<T>& v, const char* what, int device,
                            cudaStream_t stream) {
  kc::DeviceAllocation a(std::max<std::size_t>(v.size(), 1) * sizeof(T), what, device, stream);
  if (!v.empty())
    RINGATTN_CUDA_CHECK(
        cudaMemcpyAsync(a.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return a;
}

// One wave's slices of the plan's device lists.
struct DeviceWave {
  int64_t task0 = 0, q_item0 = 0, n_q_items = 0;
  std::vector<single::ItemRange> k_ranges;  // key items of each backward range (one for MHA)
};
struct DeviceStep {
  std::vector<DeviceWave> waves;
  int64_t run0 = 0, n_runs = 0;  // the rows this rank sends, into the run list
  bool rows_repeat = false;  // runs_repeat_a_row(): dK/dV rows are added serially
};
// A wave's items for the Hopper forward (and the backward's dQ pass), ordered into groups of
// one (query view, key view); and its backward's key items, range by range, grouped alike.
struct HopperWave {
  int64_t item0 = 0;  // into the plan's Hopper item list
  std::vector<kc::HopperTaskGroup> groups;
  std::vector<int64_t> k_item0;  // per k_range, into the plan's Hopper key item list
  std::vector<std::vector<kc::HopperTaskGroup>> k_groups;  // per k_range
};

}  // namespace

struct CudaRingPlan::Impl {
  AttentionConfig cfg;
  CudaPlanOptions opts;
  kc::Elem elem = kc::Elem::bf16;
  ShardLayout layout;
  RingSchedule sched;
  RingProtocol protocol;
  double timeout_s = kDefaultTimeoutSeconds;
  float grouped_scale = 1.0f;
  bool mixture = false;
  bool vector_loads = false;
  bool skip_ordering = false;  // RingOptions::skip_buffer_ordering_for_tests
  cudaStream_t stream = nullptr;
  std::vector<DeviceStep> steps;
  kc::DeviceAllocation tasks, q_items, k_items, runs, delta;
  // RingOptions::StepResults::partials: one step's out [B, n, H, D] and lse [B, H, n], fp32.
  bool partials = false;
  kc::DeviceAllocation part_out, part_lse;
  RingBuffers<kc::DeviceAllocation> buf;
  std::unique_ptr<StreamExchanges> ex;  // before the stream in ~Impl
  RingTimings fwd, bwd;
  // --kernel hopper: every step's forward and backward on the sm_90a task kernels, over the
  // rank's own K/V at step 0 and the packed receive buffer after (the step's dK/dV partial,
  // laid out as that buffer, for the backward).
  bool use_hopper = false, noted_unaligned = false;
  bool use_hopper_backward = false, noted_unaligned_backward = false;
  std::vector<std::vector<HopperWave>> hopper_waves;  // [step][wave]
  std::vector<kernels::ForwardItem> hopper_items_host;  // the upload's source
  kc::DeviceAllocation hopper_items;
  std::vector<kernels::ForwardItem> hopper_k_items_host;
  kc::DeviceAllocation hopper_k_items;
  // --kernel cudnn: each step's tasks as cuDNN views (ring_cudnn_views.hpp), every view's
  // forward into a scratch O and its stats, merged into out/lse by lse; the backward from the
  // global out (rounded to the io type) and lse, each view's dQ, dK, dV added into the fp32
  // gradients. One graph per distinct view shape, shared by the steps.
  bool use_cudnn = false, use_cudnn_backward = false;
#if RINGATTN_RING_CUDNN
  std::vector<std::vector<kc::SdpaView>> cudnn_views;       // [step][view]
  std::vector<std::vector<std::size_t>> cudnn_graph_of;     // [step][view] into cudnn_graphs
  std::vector<std::unique_ptr<kc::CudnnGraphPlan>> cudnn_graphs;
  kc::DeviceAllocation c_o, c_stats, c_dq, c_dk, c_dv;
  double cudnn_build_ms = 0;
#endif
  std::vector<std::string> notes;

  int64_t d() const { return cfg.shape.head_dim; }
  std::size_t eb() const { return static_cast<std::size_t>(kc::elem_bytes(elem)); }

  ~Impl() {
    const kc::ScopedDevice on(opts.device, std::nothrow);
    ex.reset();
    tasks.reset();
    q_items.reset();
    k_items.reset();
    runs.reset();
    delta.reset();
    part_out.reset();
    part_lse.reset();
    hopper_items.reset();
    hopper_k_items.reset();
#if RINGATTN_RING_CUDNN
    cudnn_graphs.clear();
    c_o.reset();
    c_stats.reset();
    c_dq.reset();
    c_dk.reset();
    c_dv.reset();
#endif
    for (int i = 0; i < 2; ++i) {
      buf.send[i].reset();
      buf.receive[i].reset();
      buf.partial[i].reset();
      buf.returned[i].reset();
    }
    if (stream) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
    }
    kc::release_unused_device_memory(opts.device);
  }

  kc::PackParams pack_params(int t) const {
    const RingStep& st = sched.steps[static_cast<std::size_t>(t)];
    const DeviceStep& ds = steps[static_cast<std::size_t>(t)];
    kc::PackParams p;
    p.runs = runs.as<kc::PackedRun>() + ds.run0;
    p.n_runs = ds.n_runs;
    p.total_rows = st.send_rows;
    p.buffer_rows = st.send_rows;
    p.head_dim = d();
    return p;
  }

  kc::FlashForwardParams forward_params(const void* q, float* out, float* lse) const {
    kc::FlashForwardParams p;
    p.q = q;
    p.out = out;
    p.lse = lse;
    p.head_dim = static_cast<int>(d());
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    p.accumulate = true;
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
    if (t > 0) {
      h.kv_heads = 1;
      h.kv_rows = static_cast<int>(sched.steps[static_cast<std::size_t>(t)].recv_rows);
    }
    return h;
  }

  // "" and every wave's items grouped and uploaded, or why the Hopper forward cannot run.
  std::string prepare_hopper() {
    const Shape4& s = cfg.shape;
    if (s.batch * layout.local_len > std::numeric_limits<int>::max() / 2 ||
        sched.max_recv_rows > std::numeric_limits<int>::max() / 2)
      return "a shard past int positions (tensor map coordinates)";
    if (std::string why = kc::hopper_task_forward_unsupported(elem, hopper_shape(0), opts.device);
        !why.empty())
      return why;
    std::vector<kernels::ForwardItem> ordered;
    for (std::size_t t = 0; t < sched.steps.size(); ++t) {
      std::vector<HopperWave> waves;
      for (const Wave& w : sched.steps[t].waves) {
        HopperWave hw;
        hw.item0 = static_cast<int64_t>(hopper_items_host.size());
        if (std::string why = kc::hopper_task_groups(w.tasks, w.items,
                                                     hopper_shape(static_cast<int>(t)), ordered,
                                                     hw.groups);
            !why.empty())
          return why;
        hopper_items_host.insert(hopper_items_host.end(), ordered.begin(), ordered.end());
        waves.push_back(std::move(hw));
      }
      hopper_waves.push_back(std::move(waves));
    }
    hopper_items = upload(hopper_items_host, "the Hopper forward's ring work items", opts.device,
                          stream);
    return "";
  }

  // "" and every wave's key items (`key_items`, the native backward's list on the host)
  // grouped range by range and uploaded, or why the Hopper backward cannot run. After
  // prepare_hopper.
  std::string prepare_hopper_backward(const std::vector<kernels::ForwardItem>& key_items) {
    for (std::size_t t = 0; t < sched.steps.size(); ++t)
      if (std::string why = kc::hopper_task_backward_unsupported(
              elem, hopper_shape(static_cast<int>(t)), opts.device);
          !why.empty())
        return why;
    std::vector<kernels::ForwardItem> ordered;
    for (std::size_t t = 0; t < sched.steps.size(); ++t) {
      const std::vector<Wave>& waves = sched.steps[t].waves;
      for (std::size_t i = 0; i < waves.size(); ++i) {
        HopperWave& hw = hopper_waves[t][i];
        for (const single::ItemRange& r : steps[t].waves[i].k_ranges) {
          std::vector<kc::HopperTaskGroup> groups;
          const std::span<const kernels::ForwardItem> items(
              key_items.data() + r.first, static_cast<std::size_t>(r.count));
          if (std::string why = kc::hopper_task_groups(waves[i].tasks, items,
                                                       hopper_shape(static_cast<int>(t)),
                                                       ordered, groups);
              !why.empty())
            return why;
          hw.k_item0.push_back(static_cast<int64_t>(hopper_k_items_host.size()));
          hopper_k_items_host.insert(hopper_k_items_host.end(), ordered.begin(), ordered.end());
          hw.k_groups.push_back(std::move(groups));
        }
      }
    }
    hopper_k_items = upload(hopper_k_items_host, "the Hopper backward's ring key work items",
                            opts.device, stream);
    return "";
  }

#if RINGATTN_RING_CUDNN
  // "" and every step's views with their graphs built (with the backward's when asked) and the
  // scratch allocated, or why cuDNN cannot run this ring's steps.
  std::string prepare_cudnn(bool with_backward) {
    if (elem == kc::Elem::fp32) return "cuDNN's fused attention takes bf16 or fp16, not fp32";
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, std::size_t> by_shape;
    for (const RingStep& st : sched.steps) {
      std::string why;
      std::vector<kc::SdpaView> views = ring_step_views(cfg, layout, st, &why);
      if (views.empty() && !why.empty()) return why;
      std::vector<std::size_t> graph_of;
      for (const kc::SdpaView& v : views) {
        kc::SdpaView shape = v;  // the graph's view: offsets are applied to the pointers
        shape.q_offset = shape.kv_offset = shape.row_offset = 0;
        std::ostringstream key;
        key << shape.batch << ' ' << shape.heads << ' ' << shape.kv_heads << ' ' << shape.rows
            << ' ' << shape.kv_rows << ' ' << shape.head_dim << ' ' << shape.right_bound.value_or(-1)
            << ' ' << (shape.right_bound ? 1 : 0);
        for (int i = 0; i < 4; ++i) key << ' ' << shape.q_stride[i] << ' ' << shape.kv_stride[i];
        auto [it, fresh] = by_shape.try_emplace(key.str(), cudnn_graphs.size());
        if (fresh) {
          try {
            cudnn_graphs.push_back(std::make_unique<kc::CudnnGraphPlan>(
                std::vector<kc::SdpaView>{shape}, opts.dtype, opts.device, stream,
                with_backward));
          } catch (const std::runtime_error& e) {
            return e.what();
          }
        }
        graph_of.push_back(it->second);
      }
      cudnn_views.push_back(std::move(views));
      cudnn_graph_of.push_back(std::move(graph_of));
    }
    const Shape4& s = cfg.shape;
    const auto q_elems = static_cast<std::size_t>(s.batch * layout.local_len * s.heads * d());
    const auto kv_elems = static_cast<std::size_t>(
        std::max(s.batch * layout.local_len * cfg.effective_kv_heads(), sched.max_recv_rows) *
        d());
    c_o = kc::DeviceAllocation(q_elems * eb(), "the ring's cuDNN output scratch", opts.device,
                               stream);
    c_stats = kc::DeviceAllocation(static_cast<std::size_t>(shard_rows()) * sizeof(float),
                                   "the ring's cuDNN stats", opts.device, stream);
    if (with_backward) {
      c_dq = kc::DeviceAllocation(q_elems * eb(), "the ring's cuDNN dQ scratch", opts.device,
                                  stream);
      c_dk = kc::DeviceAllocation(kv_elems * eb(), "the ring's cuDNN dK scratch", opts.device,
                                  stream);
      c_dv = kc::DeviceAllocation(kv_elems * eb(), "the ring's cuDNN dV scratch", opts.device,
                                  stream);
    }
    cudnn_build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return "";
  }

  std::size_t cudnn_view_count() const {
    std::size_t n = 0;
    for (const auto& v : cudnn_views) n += v.size();
    return n;
  }

  // Where view `v`'s rows go in out/lse (the rank's [B, N/P, H, D] and [B, H, N/P]), merged
  // by lse.
  kc::ViewResultParams place_of(const kc::SdpaView& v, float* out, float* lse) const {
    const Shape4& s = cfg.shape;
    kc::ViewResultParams r =
        kc::view_place(v, {s.batch, layout.local_len, s.heads, s.head_dim});
    r.o_scratch = c_o.get();
    r.stats = c_stats.as<float>();
    r.out = out;
    r.lse = lse;
    r.accumulate = true;
    return r;
  }

  const char* at(const void* base, int64_t elements) const {
    return static_cast<const char*>(base) + elements * static_cast<int64_t>(eb());
  }
  void* at(void* base, int64_t elements) const {
    return static_cast<char*>(base) + elements * static_cast<int64_t>(eb());
  }

  // Step t's views into out/lse (merged by lse).
  void cudnn_forward(int t, const void* q, const void* k, const void* v, float* out, float* lse) {
    const auto& views = cudnn_views[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < views.size(); ++i) {
      const kc::SdpaView& w = views[i];
      cudnn_graphs[cudnn_graph_of[static_cast<std::size_t>(t)][i]]->forward_view(
          0, at(q, w.q_offset), at(k, w.kv_offset), at(v, w.kv_offset), at(c_o.get(), w.q_offset),
          c_stats.as<float>());
      kc::launch_store_view_result(elem, place_of(w, out, lse), stream);
    }
  }

  // Step t's views' gradients added into dq (the rank's) and dk, dv (laid out as k, v). c_o
  // holds the call's out in the io type.
  void cudnn_backward(int t, const void* q, const void* k, const void* v, const void* dout,
                      const float* lse, float* dq, float* dk, float* dv) {
    const auto& views = cudnn_views[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < views.size(); ++i) {
      const kc::SdpaView& w = views[i];
      kc::launch_gather_view_stats(place_of(w, nullptr, const_cast<float*>(lse)),
                                   c_stats.as<float>(), stream);
      cudnn_graphs[cudnn_graph_of[static_cast<std::size_t>(t)][i]]->backward_view(
          0, at(q, w.q_offset), at(k, w.kv_offset), at(v, w.kv_offset), at(c_o.get(), w.q_offset),
          at(dout, w.q_offset), c_stats.as<float>(), at(c_dq.get(), w.q_offset),
          at(c_dk.get(), w.kv_offset), at(c_dv.get(), w.kv_offset));
      kc::StridedView qv{w.q_offset, {w.batch, w.heads, w.rows, w.head_dim}, {}};
      kc::StridedView kv{w.kv_offset, {w.batch, w.kv_heads, w.kv_rows, w.head_dim}, {}};
      for (int a = 0; a < 4; ++a) {
        qv.strides[a] = w.q_stride[static_cast<std::size_t>(a)];
        kv.strides[a] = w.kv_stride[static_cast<std::size_t>(a)];
      }
      kc::launch_add_view(elem, c_dq.get(), dq, qv, stream);
      kc::launch_add_view(elem, c_dk.get(), dk, kv, stream);
      kc::launch_add_view(elem, c_dv.get(), dv, kv, stream);
    }
  }
#endif

  void clear_partial() {
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(part_out.get(), 0, part_out.bytes(), stream));
    kc::fill_floats(part_lse.as<float>(), shard_rows(), -std::numeric_limits<float>::infinity(),
                    stream);
  }

  // out/lse ← the lse merge of themselves and the step's partial, row by row.
  void merge_partial(float* out, float* lse) {
    kernels::MergeRows mr;
    mr.acc_out = out;
    mr.acc_lse = lse;
    mr.part_out = part_out.as<float>();
    mr.part_lse = part_lse.as<float>();
    mr.rows = shard_rows();
    mr.d = d();
    mr.acc_out_stride = mr.part_out_stride = d();
    mr.lse_heads = cfg.shape.heads;
    mr.lse_rows = layout.local_len;
    kc::launch_merge_lse(mr, stream);
  }

  struct Device;
};

// The protocol's backend for one call: the plan's device buffers and lists, the call's
// kernel parameters. Everything is enqueued on the plan's stream; the call's timings come
// from StreamExchanges::finish_call.
struct CudaRingPlan::Impl::Device {
  Impl& m;
  kc::FlashForwardParams fwd;   // forward calls
  kc::FlashBackwardParams bwd;  // backward calls

  int64_t head_dim() const { return m.d(); }
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
    p.k = k;
    p.v = v;
    if (m.partials) {  // the step whole into the partial, then merged in
      p.out = m.part_out.as<float>();
      p.lse = m.part_lse.as<float>();
      m.clear_partial();
    }
#if RINGATTN_RING_CUDNN
    if (m.use_cudnn && aligned16(p.q) && aligned16(k) && aligned16(v)) {
      m.cudnn_forward(t, p.q, k, v, p.out, p.lse);
      if (m.partials) m.merge_partial(fwd.out, fwd.lse);
      return;
    }
    if (m.use_cudnn && !m.noted_unaligned) {
      m.notes.push_back("cuDNN needs 16-byte aligned q/k/v; these are not, so the native kernels "
                        "ran");
      m.noted_unaligned = true;
    }
#endif
    const bool hopper = m.use_hopper && aligned16(p.q) && aligned16(k) && aligned16(v);
    if (m.use_hopper && !hopper && !m.noted_unaligned) {
      m.notes.push_back(
          "the Hopper forward needs 16-byte aligned q/k/v; these are not, so the native kernels "
          "ran");
      m.noted_unaligned = true;
    }
    const auto& waves = m.steps[static_cast<std::size_t>(t)].waves;
    for (std::size_t i = 0; i < waves.size(); ++i) {
      const DeviceWave& w = waves[i];
      p.tasks = m.tasks.as<kernels::SubseqTask>() + w.task0;
      if (hopper) {
        const HopperWave& hw = m.hopper_waves[static_cast<std::size_t>(t)][i];
        p.items = m.hopper_items.as<kernels::ForwardItem>() + hw.item0;
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
    p.k = k;
    p.v = v;
    p.dk = dk;
    p.dv = dv;
#if RINGATTN_RING_CUDNN
    if (m.use_cudnn_backward && aligned16(p.q) && aligned16(p.dout) && aligned16(k) &&
        aligned16(v)) {
      m.cudnn_backward(t, p.q, k, v, p.dout, p.lse, p.dq, dk, dv);
      return;
    }
    if (m.use_cudnn_backward && !m.noted_unaligned_backward) {
      m.notes.push_back("cuDNN needs 16-byte aligned q/k/v/dout; these are not, so the native "
                        "kernels ran");
      m.noted_unaligned_backward = true;
    }
#endif
    const bool hopper = m.use_hopper_backward && aligned16(p.q) && aligned16(p.dout) &&
                        aligned16(k) && aligned16(v);
    if (m.use_hopper_backward && !hopper && !m.noted_unaligned_backward) {
      m.notes.push_back(
          "the Hopper backward needs 16-byte aligned q/k/v/dout; these are not, so the native "
          "kernels ran");
      m.noted_unaligned_backward = true;
    }
    const auto& waves = m.steps[static_cast<std::size_t>(t)].waves;
    for (std::size_t i = 0; hopper && i < waves.size(); ++i) {  // as CudaPlan's task backward
      const HopperWave& hw = m.hopper_waves[static_cast<std::size_t>(t)][i];
      p.tasks = m.tasks.as<kernels::SubseqTask>() + waves[i].task0;
      p.q_items = m.hopper_items.as<kernels::ForwardItem>() + hw.item0;
      std::span<const kc::HopperTaskGroup> q_groups = hw.groups;
      for (std::size_t r = 0; r < hw.k_groups.size(); ++r) {
        p.k_items = m.hopper_k_items.as<kernels::ForwardItem>() + hw.k_item0[r];
        kc::hopper_task_backward(m.elem, p, m.hopper_shape(t), q_groups, hw.k_groups[r],
                                 m.stream);
        q_groups = {};
      }
      if (hw.k_groups.empty())
        kc::hopper_task_backward(m.elem, p, m.hopper_shape(t), q_groups, {}, m.stream);
    }
    if (hopper) return;
    for (const DeviceWave& w : waves) {
      p.tasks = m.tasks.as<kernels::SubseqTask>() + w.task0;
      p.q_items = m.q_items.as<kernels::ForwardItem>() + w.q_item0;
      p.n_q_items = w.n_q_items;
      for (const single::ItemRange& r : w.k_ranges) {  // see CudaPlan::backward
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
      !kc::native_kernels_fit(cfg.shape.head_dim, m.elem, opts.device).empty()) {
    m.opts.dtype = DeviceDType::fp32;
    m.elem = kc::Elem::fp32;
  }
  RINGATTN_CUDA_CHECK(cudaStreamCreate(&m.stream));
  m.layout = make_layout(cfg, comm.size(), opts.heads);
  const kernels::TileConfig tiles{kc::kQueryTile, kc::kKeyTile};
  m.sched = build_ring_schedule(cfg, m.layout, comm.rank(), tiles, opts.heads);
  m.protocol = RingProtocol(m.sched, comm, ring_opts);
  m.timeout_s = ring_opts.timeout_s;
  m.skip_ordering = ring_opts.skip_buffer_ordering_for_tests;
  m.mixture = cfg.attention == AttentionKind::dilated && cfg.combine == Combine::mixture;
  m.grouped_scale = m.mixture ? 1.0f : 1.0f / static_cast<float>(patterns_of(cfg).size());

  // Every step's waves and runs in one set of device lists, uploaded once.
  single::FlatSchedule all;
  std::vector<kc::PackedRun> runs;
  for (const RingStep& st : m.sched.steps) {
    DeviceStep ds;
    for (const Wave& w : st.waves) {
      DeviceWave dw;
      dw.task0 = static_cast<int64_t>(all.tasks.size());
      dw.q_item0 = static_cast<int64_t>(all.q_items.size());
      dw.n_q_items = static_cast<int64_t>(w.items.size());
      // Task indices are relative to the wave's task0 (the launch's task pointer).
      dw.k_ranges = single::append_key_items_by_range(w.tasks, w.backward_ends, cfg.causal,
                                                      kc::kKeyTile, 0, all.k_items);
      all.tasks.insert(all.tasks.end(), w.tasks.begin(), w.tasks.end());
      all.q_items.insert(all.q_items.end(), w.items.begin(), w.items.end());
      ds.waves.push_back(dw);
    }
    ds.run0 = static_cast<int64_t>(runs.size());
    int64_t base = 0;
    for (const Run& r : st.send_runs) {
      runs.push_back({r.row0, r.stride, r.rows(), base, base});
      base += r.rows();
    }
    ds.n_runs = static_cast<int64_t>(st.send_runs.size());
    ds.rows_repeat = runs_repeat_a_row(st.send_runs);
    m.steps.push_back(std::move(ds));
  }
  m.vector_loads = m.elem != kc::Elem::fp32 && cfg.shape.head_dim == kc::padded_head_dim(m.d()) &&
                   single::rows_aligned(all, 8);
  m.tasks = upload(all.tasks, "the ring's task lists", opts.device, m.stream);
  m.q_items = upload(all.q_items, "the ring's query work items", opts.device, m.stream);
  m.k_items = upload(all.k_items, "the ring's key work items", opts.device, m.stream);
  m.runs = upload(runs, "the ring's packed-row lists", opts.device, m.stream);
  const Shape4& s = cfg.shape;
  m.partials = ring_opts.step_results == RingOptions::StepResults::partials;
  if (m.partials) {
    m.part_out =
        kc::DeviceAllocation(static_cast<std::size_t>(m.shard_rows() * m.d()) * sizeof(float),
                             "the ring's partial output", opts.device, m.stream);
    m.part_lse = kc::DeviceAllocation(static_cast<std::size_t>(m.shard_rows()) * sizeof(float),
                                      "the ring's partial lse", opts.device, m.stream);
  }
  m.delta = kc::DeviceAllocation(
      static_cast<std::size_t>(s.batch * s.heads * m.layout.local_len) * sizeof(float),
      "the backward's row sums D", opts.device, m.stream);
  // Two of each (double buffers), sized once from the schedule's largest step.
  const auto kv_send = static_cast<std::size_t>(m.sched.max_send_rows * 2 * m.d());
  const auto kv_recv = static_cast<std::size_t>(m.sched.max_recv_rows * 2 * m.d());
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
  // --kernel cudnn: every step's views on cuDNN (dense attention; the backward too unless
  // --deterministic, as cuDNN's backward adds dQ with atomics). Where it cannot run, a note
  // says why and the choice falls to auto's.
  bool hopper_or_auto =
      opts.kernel == KernelChoice::hopper || opts.kernel == KernelChoice::automatic;
  if (opts.kernel == KernelChoice::cudnn) {
#if RINGATTN_CUDA_EMULATION  // cuDNN's stand-in runs for tests only (cudnn_graphs_emulated.cpp)
    if (!kc::cudnn_standin_enabled())
      throw InputError("kernel",
                       "'cudnn' is not available in this build (the emulated GPU has "
                       "no cuDNN)");
#endif
#if RINGATTN_RING_CUDNN
    const std::string why = m.prepare_cudnn(!opts.deterministic);
    m.use_cudnn = why.empty();
    if (!m.use_cudnn) {  // what was built before the refusal
      m.cudnn_graphs.clear();
      m.cudnn_views.clear();
      m.cudnn_graph_of.clear();
    }
    m.use_cudnn_backward = m.use_cudnn && !opts.deterministic;
    if (m.use_cudnn) {
      const std::string library = m.cudnn_graphs.empty()
                                      ? std::string("cuDNN")
                                      : m.cudnn_graphs.front()->description().substr(
                                            0, m.cudnn_graphs.front()->description().find(':'));
      std::ostringstream os;
      os << std::fixed << std::setprecision(0) << "--kernel cudnn: every ring step's forward"
         << (m.use_cudnn_backward ? " and backward" : "") << " on cuDNN (" << library << "; " << m.cudnn_view_count() << " views over " << m.sched.steps.size() << " steps, "
         << m.cudnn_graphs.size() << (m.cudnn_graphs.size() == 1 ? " graph" : " graphs")
         << " built in " << m.cudnn_build_ms << " ms)";
      if (!m.use_cudnn_backward)
        os << "; the backward is ringattn's (--deterministic: cuDNN's backward adds dQ with "
              "atomics)";
      m.notes.push_back(os.str());
    } else {
      m.notes.push_back("--kernel cudnn: cuDNN cannot run this ring's steps (" + why +
                        "); using what --kernel auto picks");
    }
#else
    throw InputError("kernel",
                     "'cudnn' is not available in this build (no cuDNN headers or cudnn-frontend "
                     "at configure time)");
#endif
    hopper_or_auto = !m.use_cudnn_backward;
  }
  // --kernel hopper, and auto: the sm_90a task kernels, where they run, are the faster ring
  // kernels of ringattn's own (docs/PERFORMANCE.md). auto does not take cuDNN on the ring
  // until a GPU has measured it there.
  if (hopper_or_auto) {
    const bool automatic = opts.kernel != KernelChoice::hopper;
    const std::string why = m.prepare_hopper();
    m.use_hopper = why.empty();
    const std::string why_backward = m.use_hopper ? m.prepare_hopper_backward(all.k_items) : why;
    m.use_hopper_backward = m.use_hopper && why_backward.empty();
    const std::string status =
        automatic ? "the fastest ring kernels on this GPU" : kernels::cuda::kHopperStatus;
    const std::string flag = opts.kernel == KernelChoice::cudnn ? "--kernel cudnn: "
                             : automatic                         ? "--kernel auto: "
                                                                 : "--kernel hopper: ";
    const char* steps = m.use_cudnn ? "backward" : "forward and backward";
    m.notes.push_back(
        !m.use_hopper
            ? (automatic ? flag + "the native kernels (the sm_90a ones cannot run: " + why + ")"
                         : "--kernel hopper: " + why + "; using the native kernels")
        : m.use_hopper_backward
            ? flag + "every ring step's " + steps +
                  " on the sm_90a kernels (TMA + wgmma; the rank's K/V, then each received "
                  "block); " +
                  status
            : flag +
                  "every ring step's forward on the sm_90a kernel (TMA + wgmma; the rank's K/V, "
                  "then each received block), the native backward (the Hopper one cannot run: " +
                  why_backward + "); " + status);
  }
  m.ex =
      std::make_unique<StreamExchanges>(comm, m.stream, opts.device, m.timeout_s, m.skip_ordering);
  RINGATTN_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

std::string CudaRingPlan::kernel_name() const {
  return impl_->use_cudnn ? "cudnn" : impl_->use_hopper ? "hopper" : "native";
}
std::string CudaRingPlan::backward_kernel_name() const {
  return impl_->use_cudnn_backward ? "cudnn" : impl_->use_hopper_backward ? "hopper" : "native";
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
  std::size_t b = m.tasks.bytes() + m.q_items.bytes() + m.k_items.bytes() + m.runs.bytes() +
                  m.delta.bytes() + m.part_out.bytes() + m.part_lse.bytes() +
                  m.hopper_items.bytes() + m.hopper_k_items.bytes();
#if RINGATTN_RING_CUDNN
  b += m.c_o.bytes() + m.c_stats.bytes() + m.c_dq.bytes() + m.c_dk.bytes() + m.c_dv.bytes();
  for (const auto& g : m.cudnn_graphs) b += g->workspace_bytes();
#endif
  for (int i = 0; i < 2; ++i)
    b += m.buf.send[i].bytes() + m.buf.receive[i].bytes() + m.buf.partial[i].bytes() +
         m.buf.returned[i].bytes();
  return b;
}

void* CudaRingPlan::stream() const noexcept { return impl_->stream; }

void CudaRingPlan::synchronize() {
  const kc::ScopedDevice on(impl_->opts.device);
  RINGATTN_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void CudaRingPlan::forward(const void* q, const void* k, const void* v, float* out, float* lse) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  m.fwd = {};
  const Shape4& s = m.cfg.shape;
  const int64_t n_out = s.batch * m.layout.local_len * s.heads * s.head_dim;
  m.ex->start_call();
  RINGATTN_CUDA_CHECK(
      cudaMemsetAsync(out, 0, static_cast<std::size_t>(n_out) * sizeof(float), m.stream));
  kc::fill_floats(lse, s.batch * s.heads * m.layout.local_len,
                  -std::numeric_limits<float>::infinity(), m.stream);
  Impl::Device device{m, m.forward_params(q, out, lse), {}};
  device.fwd.vector_loads = m.vector_loads;
  m.protocol.forward(device, k, v, m.fwd);
  if (m.grouped_scale != 1.0f) kc::scale_floats(out, n_out, m.grouped_scale, m.stream);
  m.ex->finish_call(m.fwd);
}

void CudaRingPlan::backward(const void* q, const void* k, const void* v, const float* out,
                            const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  m.bwd = {};
  const Shape4& s = m.cfg.shape;
  const int64_t dd = m.d();
  m.ex->start_call();
  kc::start_backward(m.elem,
                     {out, dout, m.delta.as<float>(), s.batch, m.layout.local_len, s.heads, dd},
                     m.cfg.effective_kv_heads(), dq, dk, dv, m.stream);

#if RINGATTN_RING_CUDNN
  if (m.use_cudnn_backward)  // cuDNN's backward reads the global out in the io type
    kc::launch_floats_to_elem(m.elem, out, m.c_o.get(),
                              s.batch * m.layout.local_len * s.heads * dd, m.stream);
#endif
  Impl::Device device{m, {}, {}};
  kc::FlashBackwardParams& p = device.bwd;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.dout = dout;
  p.delta = m.delta.as<float>();
  p.dq = dq;
  p.head_dim = static_cast<int>(dd);
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.causal = m.cfg.causal;
  p.out_scale = p.dout_scale = m.grouped_scale;
  p.vector_loads = m.vector_loads;
  m.protocol.backward(device, k, v, dk, dv, m.bwd);
  m.ex->finish_call(m.bwd);
}

}  // namespace ringattn::ring

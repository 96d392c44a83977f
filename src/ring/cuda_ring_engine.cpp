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
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "kernels/cuda/device_wait.hpp"
#include "kernels/cuda/flash_params.hpp"
#include "kernels/cuda/form_choice.hpp"
#include "kernels/cuda/hopper_bwd.hpp"  // hopper_fused_backward_rule
#include "kernels/cuda/hopper_fwd.hpp"  // kHopperStatus
#include "kernels/cuda/hopper_task_bwd.hpp"
#include "kernels/cuda/hopper_task_fwd.hpp"
#include "kernels/cuda/median_time.hpp"
#include "kernels/cuda/verified_forms.hpp"
#include "single/device_schedule.hpp"
#if RINGATTN_RING_CUDNN
#include "kernels/cuda/cudnn_graphs.hpp"
#include "ring/ring_cudnn_views.hpp"
#endif
#include "core/patterns.hpp"
#include "ring/progress_thread.hpp"
#include "ring/ring_kernel_choice.hpp"
#include "ring/ring_protocol.hpp"
#include "ring/stream_exchanges.hpp"
#include "ringattn/errors.hpp"
#include "single/schedule.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

using kc::aligned16;  // 16-byte copies, TMA and bulk adds need 16-byte aligned base pointers

namespace {

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
  // The same k_ranges' 128-key items for the wide fused kernel (hopper_wide_key_items).
  std::vector<int64_t> wide_k_item0;
  std::vector<std::vector<kc::HopperTaskGroup>> wide_k_groups;
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
  // The sm_90a backward's form (hopper_fused_backward_rule): the fused kernel, and whether the
  // first backward times it against the two passes (form_choice.hpp).
  bool fused_backward = false, time_fused_backward = false;
  // With fused_backward, the wide fused kernel: where D = 128 and the rank's key items pair
  // up into 128 keys (wide_ok; auto times it where every rank has it).
  bool wide_backward = false, wide_ok = false;
  bool noted_unaligned_dq = false;
  // The sm_90a forward's form (plain, overlap, Q in registers), and whether the first forward
  // times the forms on the slowest rank and keeps the fastest (hopper_forward_forms_timed).
  kc::HopperForwardForm forward_form = kc::HopperForwardForm::rule;
  bool time_forward_forms = false;
  std::vector<std::vector<HopperWave>> hopper_waves;  // [step][wave]
  std::vector<kernels::ForwardItem> hopper_items_host;  // the upload's source
  kc::DeviceAllocation hopper_items;
  std::vector<kernels::ForwardItem> hopper_k_items_host;
  kc::DeviceAllocation hopper_k_items;
  // --kernel cudnn (and auto where it times faster): each step's tasks as cuDNN views
  // (ring_cudnn_views.hpp), every view's forward into a scratch O and its stats, merged into
  // out/lse by lse; the backward from the global out (rounded to the io type) and lse, each
  // view's dQ, dK, dV added into the fp32 gradients. One graph per distinct view shape, shared
  // by the steps. A step cuDNN refuses runs on ringattn's kernels (cudnn_step[t] false), the
  // reason in cudnn_refused; a step whose backward graphs alone are refused keeps its forward
  // on cuDNN (cudnn_step_backward[t] false, cudnn_refused_backward); auto decides on the
  // first forward and backward.
  bool use_cudnn = false, use_cudnn_backward = false;
  bool decide_forward = false, decide_backward = false;
  std::vector<char> cudnn_step, cudnn_step_backward;     // [step]
  std::map<std::string, std::vector<int>> cudnn_refused;  // reason -> steps
  std::map<std::string, std::vector<int>> cudnn_refused_backward;
  Communicator* comm = nullptr;
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
      // Not after the watchdog fired: the device still runs the hung kernel.
      if (!kc::device_stuck()) (void)cudaStreamSynchronize(stream);
      kc::forget_stream(stream);
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
    h.form = forward_form;
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
    std::vector<kernels::ForwardItem> ordered, wide;
    wide_ok = d() == 128;
    for (std::size_t t = 0; t < sched.steps.size(); ++t) {
      const std::vector<Wave>& waves = sched.steps[t].waves;
      for (std::size_t i = 0; i < waves.size(); ++i) {
        HopperWave& hw = hopper_waves[t][i];
        for (const single::ItemRange& r : steps[t].waves[i].k_ranges) {
          std::vector<kc::HopperTaskGroup> groups, wide_groups;
          const std::span<const kernels::ForwardItem> items(
              key_items.data() + r.first, static_cast<std::size_t>(r.count));
          if (std::string why = kc::hopper_task_groups(waves[i].tasks, items,
                                                       hopper_shape(static_cast<int>(t)),
                                                       ordered, groups);
              !why.empty())
            return why;
          hw.k_item0.push_back(static_cast<int64_t>(hopper_k_items_host.size()));
          hopper_k_items_host.insert(hopper_k_items_host.end(), ordered.begin(), ordered.end());
          if (wide_ok)
            wide_ok = kc::hopper_wide_key_items(ordered, groups, wide, wide_groups).empty();
          hw.wide_k_item0.push_back(static_cast<int64_t>(hopper_k_items_host.size()));
          if (wide_ok) hopper_k_items_host.insert(hopper_k_items_host.end(), wide.begin(), wide.end());
          hw.k_groups.push_back(std::move(groups));
          hw.wide_k_groups.push_back(std::move(wide_groups));
        }
      }
    }
    hopper_k_items = upload(hopper_k_items_host, "the Hopper backward's ring key work items",
                            opts.device, stream);
    return "";
  }

#if RINGATTN_RING_CUDNN
  // Every step's views with their graphs built (with the backward's when asked) and, where
  // any step runs, the scratch allocated. A step cuDNN cannot run (no views for its tasks, a
  // graph this cuDNN refuses for a head dim, band or version, view rows not 16-byte aligned)
  // runs on ringattn's kernels, the reason recorded in cudnn_refused; where only a view's
  // backward graph is refused (cuDNN 9.19's one-token document), the step's forward stays on
  // cuDNN and its backward is ours (cudnn_refused_backward). Returns the number of steps with
  // views on cuDNN.
  int prepare_cudnn(bool with_backward) {
    const auto t0 = std::chrono::steady_clock::now();
    const int n_steps = static_cast<int>(sched.steps.size());
    cudnn_step.assign(sched.steps.size(), 0);
    cudnn_step_backward.assign(sched.steps.size(), 0);
    cudnn_refused.clear();
    cudnn_refused_backward.clear();
    auto refuse_all = [&](const std::string& why) {
      for (int t = 0; t < n_steps; ++t) cudnn_refused[why].push_back(t);
      return 0;
    };
    if (elem == kc::Elem::fp32)
      return refuse_all("cuDNN's fused attention takes bf16 or fp16, not fp32");
    std::map<std::string, std::size_t> by_shape;
    std::map<std::string, std::string> refused_shape;  // a graph cuDNN would not build
    std::map<std::string, std::string> refused_backward;  // built forward only
    int on_cudnn = 0;
    for (int t = 0; t < n_steps; ++t) {
      std::string why;
      std::vector<kc::SdpaView> views =
          ring_step_views(cfg, layout, sched.steps[static_cast<std::size_t>(t)], &why);
      std::vector<std::size_t> graph_of;
      std::string why_backward = with_backward ? "" : "not asked";
      for (const kc::SdpaView& v : views) {
        if (!why.empty()) break;
        // The views' pointers are the tensors' plus their offsets: cuDNN reads 16-byte
        // aligned tensors only.
        if ((v.q_offset * static_cast<int64_t>(eb())) % 16 != 0 ||
            (v.kv_offset * static_cast<int64_t>(eb())) % 16 != 0) {
          why = "a view's rows start off the 16-byte alignment cuDNN reads (head dim " +
                std::to_string(d()) + ")";
          break;
        }
        kc::SdpaView shape = v;  // the graph's view: offsets are applied to the pointers
        shape.q_offset = shape.kv_offset = shape.row_offset = 0;
        std::ostringstream key;
        key << shape.batch << ' ' << shape.heads << ' ' << shape.kv_heads << ' ' << shape.rows
            << ' ' << shape.kv_rows << ' ' << shape.head_dim << ' '
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
            cudnn_graphs.push_back(std::make_unique<kc::CudnnGraphPlan>(
                std::vector<kc::SdpaView>{shape}, opts.dtype, opts.device, stream, backward));
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
          it = by_shape.emplace(key.str(), cudnn_graphs.size() - 1).first;
        }
        if (auto r = refused_backward.find(key.str());
            r != refused_backward.end() && why_backward.empty())
          why_backward = r->second;
        graph_of.push_back(it->second);
      }
      if (!why.empty()) {
        cudnn_refused[why].push_back(t);
        views.clear(), graph_of.clear();
      } else {
        cudnn_step[static_cast<std::size_t>(t)] = 1;
        on_cudnn += views.empty() ? 0 : 1;
        if (why_backward.empty())
          cudnn_step_backward[static_cast<std::size_t>(t)] = 1;
        else if (with_backward)
          cudnn_refused_backward[why_backward].push_back(t);
      }
      cudnn_views.push_back(std::move(views));
      cudnn_graph_of.push_back(std::move(graph_of));
    }
    if (on_cudnn == 0) {
      release_cudnn();
      if (cudnn_refused.empty()) cudnn_refused["no ring step has attention to run"] = {};
      return 0;
    }
    const Shape4& s = cfg.shape;
    const auto q_elems = static_cast<std::size_t>(s.batch * layout.local_len * s.heads * d());
    const auto kv_elems = static_cast<std::size_t>(
        std::max(s.batch * layout.local_len * cfg.effective_kv_heads(), sched.max_recv_rows) *
        d());
    try {
      c_o = kc::DeviceAllocation(q_elems * eb(), "the ring's cuDNN output scratch",
                                 opts.device, stream);
      c_stats = kc::DeviceAllocation(static_cast<std::size_t>(shard_rows()) * sizeof(float),
                                     "the ring's cuDNN stats", opts.device, stream);
      if (with_backward) {
        c_dq = kc::DeviceAllocation(q_elems * eb(), "the ring's cuDNN dQ scratch", opts.device,
                                    stream);
        c_dk = kc::DeviceAllocation(kv_elems * eb(), "the ring's cuDNN dK scratch",
                                    opts.device, stream);
        c_dv = kc::DeviceAllocation(kv_elems * eb(), "the ring's cuDNN dV scratch",
                                    opts.device, stream);
      }
    } catch (const kc::DeviceOutOfMemory& e) {
      // cuDNN's scratch comes on top of what ours need: a ring ours can run must not fail
      // for it.
      release_cudnn();
      cudnn_refused.clear();
      cudnn_refused_backward.clear();
      return refuse_all(std::string("no device memory for cuDNN's scratch: ") + e.what());
    }
    cudnn_build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return on_cudnn;
  }

  // cuDNN's graphs and scratch given back (auto chose ringattn's kernels for both passes).
  void release_cudnn() {
    cudnn_graphs.clear();
    cudnn_views.clear();
    cudnn_graph_of.clear();
    cudnn_step.assign(sched.steps.size(), 0);
    cudnn_step_backward.assign(sched.steps.size(), 0);
    c_o.reset();
    c_stats.reset();
    c_dq.reset();
    c_dk.reset();
    c_dv.reset();
  }

  bool cudnn_runs(int t) const { return cudnn_step[static_cast<std::size_t>(t)] != 0; }
  bool cudnn_runs_backward(int t) const {
    return cudnn_step_backward[static_cast<std::size_t>(t)] != 0;
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
      // dQ of the rows that see a key only: cuDNN's values for the others are its own.
      const auto [keyed_begin, keyed_end] = kc::rows_with_keys(w);
      qv.offset += keyed_begin * w.q_stride[2];
      qv.dims[2] = keyed_end - keyed_begin;
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
  void run_forward(const void* q, const void* k, const void* v, float* out, float* lse);
  void run_backward(const void* q, const void* k, const void* v, const float* out,
                    const float* lse, const void* dout, float* dq, float* dk, float* dv);

  // --kernel auto: whether a pass takes cuDNN's steps, by ring_kernel_choice.hpp's rule on the
  // slowest rank's median times of `run(false)` (ringattn's kernels) and `run(true)` (cuDNN's
  // steps), or on RINGATTN_TEST_RING_AUTO_MS's; the choice and the times become a note.
  template <class Run>
  bool auto_takes_cudnn(bool backward, Run&& run) {
    const std::string ours = (backward ? use_hopper_backward : use_hopper) ? "hopper" : "native";
    const std::optional<RingPassTiming> stub = ring_auto_stubbed_timing(backward);
    RingPassTiming t;
    if (stub) {
      t = *stub;
    } else {
      t.ours_ms = comm->max(kc::median_ms(stream, [&] { run(false); }));
      t.cudnn_ms = comm->max(kc::median_ms(stream, [&] { run(true); }));
    }
    const bool take = ring_auto_takes_cudnn(t, opts.deterministic);
    notes.push_back(ring_auto_note(backward ? "backward" : "forward", ours, t, take, stub.has_value()));
    return take;
  }

  // Once neither pass can still take cuDNN, its graphs and scratch are given back.
  void release_unchosen_cudnn() {
#if RINGATTN_RING_CUDNN
    if (!use_cudnn && !use_cudnn_backward && !decide_forward && !decide_backward) release_cudnn();
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
    const bool cudnn = m.use_cudnn && m.cudnn_runs(t);
    if (cudnn && aligned16(p.q) && aligned16(k) && aligned16(v)) {
      m.cudnn_forward(t, p.q, k, v, p.out, p.lse);
      if (m.partials) m.merge_partial(fwd.out, fwd.lse);
      return;
    }
    if (cudnn && !m.noted_unaligned) {
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
    const bool cudnn = m.use_cudnn_backward && m.cudnn_runs_backward(t);
    if (cudnn && aligned16(p.q) && aligned16(p.dout) && aligned16(k) && aligned16(v)) {
      m.cudnn_backward(t, p.q, k, v, p.dout, p.lse, p.dq, dk, dv);
      return;
    }
    if (cudnn && !m.noted_unaligned_backward) {
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
    const bool fused = m.fused_backward, wide = fused && m.wide_backward;
    for (std::size_t i = 0; hopper && i < waves.size(); ++i) {  // as CudaPlan's task backward
      const HopperWave& hw = m.hopper_waves[static_cast<std::size_t>(t)][i];
      p.tasks = m.tasks.as<kernels::SubseqTask>() + waves[i].task0;
      p.q_items = m.hopper_items.as<kernels::ForwardItem>() + hw.item0;
      std::span<const kc::HopperTaskGroup> q_groups = hw.groups;
      for (std::size_t r = 0; r < hw.k_groups.size(); ++r) {
        p.k_items = m.hopper_k_items.as<kernels::ForwardItem>() +
                    (wide ? hw.wide_k_item0[r] : hw.k_item0[r]);
        kc::hopper_task_backward(m.elem, p, m.hopper_shape(t), q_groups,
                                 wide ? hw.wide_k_groups[r] : hw.k_groups[r], m.stream, fused,
                                 wide);
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
  kc::register_stream(m.stream, opts.timeout_s);
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
  // --kernel cudnn: every step's views on cuDNN (the backward too unless --deterministic, as
  // cuDNN's backward adds dQ with atomics); a step cuDNN refuses runs on ringattn's kernels,
  // with a note naming why. --kernel auto (not --deterministic): the same steps are a
  // candidate, timed against ringattn's kernels on the first forward and the first backward
  // (ring_kernel_choice.hpp).
  m.comm = &comm;
  const bool cudnn_asked = opts.kernel == KernelChoice::cudnn;
  bool auto_tries_cudnn = opts.kernel == KernelChoice::automatic && !opts.deterministic;
  if (cudnn_asked) {
#if RINGATTN_CUDA_EMULATION  // cuDNN's stand-in runs for tests only (cudnn_graphs_emulated.cpp)
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
  // auto takes cuDNN's steps only once a GPU has passed them (verified_forms.hpp); --kernel
  // cudnn runs them with a note.
  const bool cudnn_verified = kc::verified_on_gpu(kc::GpuForm::cudnn_ring_steps, kc::GpuPath::ring);
#if RINGATTN_RING_CUDNN
  if (auto_tries_cudnn && !cudnn_verified)
    m.notes.push_back(kc::unverified_by_auto_note(kc::GpuForm::cudnn_ring_steps, "--kernel cudnn"));
  if (cudnn_asked && !cudnn_verified)
    m.notes.push_back(kc::forced_unverified_note(kc::GpuForm::cudnn_ring_steps, "--kernel cudnn"));
#endif
  auto_tries_cudnn = auto_tries_cudnn && cudnn_verified;
  m.cudnn_step.assign(m.sched.steps.size(), 0);
  m.cudnn_step_backward.assign(m.sched.steps.size(), 0);
  int cudnn_steps = 0;
#if RINGATTN_RING_CUDNN
  if (cudnn_asked || auto_tries_cudnn) {
    cudnn_steps = m.prepare_cudnn(cudnn_asked ? !opts.deterministic : true);
    m.use_cudnn = cudnn_asked && cudnn_steps > 0;
    const bool any_backward = std::any_of(m.cudnn_step_backward.begin(),
                                          m.cudnn_step_backward.end(), [](char c) { return c; });
    m.use_cudnn_backward = m.use_cudnn && !opts.deterministic && any_backward;
    m.decide_forward = !cudnn_asked && cudnn_steps > 0;
    m.decide_backward = m.decide_forward && any_backward;
  }
#endif
  const int n_steps = static_cast<int>(m.sched.steps.size());
  const std::string flag = cudnn_asked                                 ? "--kernel cudnn: "
                           : opts.kernel == KernelChoice::automatic ? "--kernel auto: "
                                                                       : "--kernel hopper: ";
#if RINGATTN_RING_CUDNN
  if (cudnn_steps > 0) {
    const std::string description = m.cudnn_graphs.front()->description();
    const std::string library = description.substr(0, description.find(':'));
    const bool every = cudnn_steps == n_steps || m.cudnn_refused.empty();
    std::ostringstream os;
    os << std::fixed << std::setprecision(0) << flag;
    if (cudnn_asked)
      os << (every ? "every ring step's forward" : "the ring steps' forward")
         << (m.use_cudnn_backward ? " and backward" : "") << " on cuDNN";
    else
      os << "cuDNN's ring steps are a candidate, timed against ringattn's kernels on the first "
            "forward and backward";
    os << " (" << library << "; " << m.cudnn_view_count() << " views over " << cudnn_steps
       << (every ? "" : " of " + std::to_string(n_steps)) << " steps, " << m.cudnn_graphs.size()
       << (m.cudnn_graphs.size() == 1 ? " graph" : " graphs") << " built in " << m.cudnn_build_ms
       << " ms)";
    if (cudnn_asked && !m.use_cudnn_backward)
      os << "; the backward is ringattn's (--deterministic: cuDNN's backward adds dQ with "
            "atomics)";
    m.notes.push_back(os.str());
  }
#endif
  // ringattn's own kernels: the sm_90a task kernels where they run (the faster ones,
  // docs/PERFORMANCE.md), else the native ones; for --kernel cudnn they run what cuDNN does
  // not (refused steps, the --deterministic backward).
  const bool ours_needed = opts.kernel == KernelChoice::hopper ||
                           opts.kernel == KernelChoice::automatic || !m.use_cudnn_backward ||
                           !m.cudnn_refused.empty() || !m.cudnn_refused_backward.empty();
  if (ours_needed && opts.kernel != KernelChoice::native) {
    const bool automatic = opts.kernel != KernelChoice::hopper;
    const std::string why = m.prepare_hopper();
    m.use_hopper = why.empty();
    const std::string why_backward = m.use_hopper ? m.prepare_hopper_backward(all.k_items) : why;
    const int head_dim = static_cast<int>(m.d());
    constexpr kc::GpuPath path = kc::GpuPath::ring;
    // auto times only the forms a GPU has passed on the ring (verified_forms.hpp); the rules
    // depend on nothing a rank alone knows, so every rank times the same forms.
    if (m.use_hopper &&
        kc::hopper_forward_forms_timed(opts.deterministic, opts.kernel == KernelChoice::automatic)) {
      m.time_forward_forms = kc::auto_forward_forms(head_dim, path).size() > 1;
      kc::note_unverified_forward_forms(head_dim, path, m.notes);
    }
    m.use_hopper_backward = m.use_hopper && why_backward.empty();
    if (m.use_hopper_backward) {
      const kc::FusedBackwardRule rule = kc::hopper_fused_backward_rule(
          opts.deterministic, head_dim, opts.kernel == KernelChoice::automatic);
      m.fused_backward = rule == kc::FusedBackwardRule::fused;
      m.wide_backward = m.fused_backward && m.wide_ok &&
                        kc::hopper_wide_backward_chosen(opts.deterministic, head_dim);
      if (rule == kc::FusedBackwardRule::timed) {
        m.time_fused_backward = kc::auto_backward_forms(path, true).size() > 1;
        kc::note_unverified_backward_forms(path, m.wide_ok, m.notes);
      }
    }
    if (m.use_hopper)
      kc::note_forced_unverified(path, m.fused_backward, m.wide_backward,
                                 kc::hopper_qregs_forced() && head_dim <= 128, m.notes);
    const std::string status =
        automatic ? "the fastest ring kernels on this GPU" : kernels::cuda::kHopperStatus;
    const bool refusals = m.use_cudnn && !m.cudnn_refused.empty();
    const std::string steps = !m.use_cudnn           ? "forward and backward"
                              : m.use_cudnn_backward ? "forward and backward that cuDNN refuses"
                              : refusals             ? "backward, and forward that cuDNN refuses,"
                                                     : "backward";
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
  // What cuDNN refused, step by step (auto: only where cuDNN could have been chosen).
  const bool backward_on_cudnn = m.use_cudnn_backward || m.decide_backward;
  if (cudnn_asked || cudnn_steps > 0)
    for (const auto& [reason, which] : m.cudnn_refused) {
      std::ostringstream os;
      os << flag << "cuDNN cannot run ";
      if (static_cast<int>(which.size()) == n_steps) {
        os << "this ring's steps";
      } else {
        os << (which.size() == 1 ? "ring step " : "ring steps ");
        for (std::size_t i = 0; i < which.size(); ++i) os << (i ? ", " : "") << which[i];
        os << " of " << n_steps;
      }
      os << " (" << reason << "); "
         << (static_cast<int>(which.size()) == n_steps ? "using" : "those run on") << " the "
         << (m.use_hopper ? "sm_90a" : "native") << " kernels";
      m.notes.push_back(os.str());
    }
  if (cudnn_steps > 0 && (cudnn_asked ? !opts.deterministic : true))
    for (const auto& [reason, which] : m.cudnn_refused_backward) {
      std::ostringstream os;
      os << flag << "cuDNN cannot run the backward of ring " << (which.size() == 1 ? "step " : "steps ");
      for (std::size_t i = 0; i < which.size(); ++i) os << (i ? ", " : "") << which[i];
      os << " of " << n_steps << " (" << reason << "); "
         << (backward_on_cudnn ? "their forward runs on cuDNN, their backward on the "
                               : "their forward runs on cuDNN; the backward is all on the ")
         << (m.use_hopper_backward ? "sm_90a" : "native") << " kernels";
      m.notes.push_back(os.str());
    }
  m.ex =
      std::make_unique<StreamExchanges>(comm, m.stream, opts.device, m.timeout_s, m.skip_ordering);
  kc::wait_for_stream(m.stream, "the ring plan's uploads");
}

std::string CudaRingPlan::kernel_name() const {
  return impl_->use_cudnn ? "cudnn" : impl_->use_hopper ? "hopper" : "native";
}
std::string CudaRingPlan::backward_kernel_name() const {
  const Impl& m = *impl_;
  return m.use_cudnn_backward    ? "cudnn"
         : !m.use_hopper_backward ? "native"
         : m.wide_backward        ? "hopper-fused-wide"
         : m.fused_backward       ? "hopper-fused"
                                  : "hopper";
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
  kc::wait_for_stream(impl_->stream, "the ring's work");
}

void CudaRingPlan::forward(const void* q, const void* k, const void* v, float* out, float* lse) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  if (m.time_forward_forms) {  // ours first: cuDNN (below) is timed against the fastest form
    m.time_forward_forms = false;
    const std::vector<kc::HopperForwardForm> forms =
        kc::auto_forward_forms(static_cast<int>(m.d()), kc::GpuPath::ring);
    m.forward_form = kc::fastest_forward_form(
        m.stream, "the ring's sm_90a forward", true, forms,
        [&](kc::HopperForwardForm f) {
          const bool cudnn = m.use_cudnn;
          m.forward_form = f;
          m.use_cudnn = false;
          m.run_forward(q, k, v, out, lse);
          m.use_cudnn = cudnn;
        },
        [&](double ms) { return m.comm->max(ms); }, m.notes);
  }
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
  // The fused kernels' bulk adds need a 16-byte aligned dq. Timing them needs every rank's
  // (the times are collectives), so an offset view anywhere leaves it for a later call; a
  // rank that runs a fused form alone falls back alone (the form is the rank's own compute).
  const bool dq_aligned = aligned16(dq);
  const bool time_now =
      m.time_fused_backward && m.comm->max(int64_t{dq_aligned ? 0 : 1}) == 0;
  if ((m.fused_backward || (m.time_fused_backward && !time_now)) && !dq_aligned) {
    if (!m.noted_unaligned_dq) m.notes.push_back(kc::kUnalignedDqNote);
    m.noted_unaligned_dq = true;
  }
  const bool fused = m.fused_backward;
  if (!dq_aligned) m.fused_backward = false;
  if (time_now) {  // ours first: cuDNN (below) is timed against the faster form
    m.time_fused_backward = false;
    using Form = kc::BackwardForm;
    // The wide kernel where every rank has it, so that all time the same forms (each time is
    // a collective max).
    const bool wide_everywhere = m.comm->max(int64_t{m.wide_ok ? 0 : 1}) == 0;
    const std::vector<Form> forms = kc::auto_backward_forms(kc::GpuPath::ring, wide_everywhere);
    const Form chosen = forms.size() < 2 ? Form::two_pass : kc::fastest_backward_form(
        m.stream, "the ring's sm_90a backward", true, forms,
        [&](Form f) {
          const bool cudnn = m.use_cudnn_backward;
          m.fused_backward = f != Form::two_pass;
          m.wide_backward = f == Form::fused_wide;
          m.use_cudnn_backward = false;
          m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
          m.use_cudnn_backward = cudnn;
        },
        [&](double ms) { return m.comm->max(ms); }, m.notes);
    m.fused_backward = chosen != Form::two_pass;
    m.wide_backward = chosen == Form::fused_wide;
  }
  if (m.decide_backward && !m.time_fused_backward) {  // after ours' form (the same on every rank)
    m.decide_backward = false;
    m.use_cudnn_backward = m.auto_takes_cudnn(true, [&](bool cudnn) {
      m.use_cudnn_backward = cudnn;
      m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
    });
    m.release_unchosen_cudnn();
  }
  m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
  if (!dq_aligned) m.fused_backward = fused;  // this call's fallback only
}

void CudaRingPlan::Impl::run_backward(const void* q, const void* k, const void* v,
                                      const float* out, const float* lse, const void* dout,
                                      float* dq, float* dk, float* dv) {
  Impl& m = *this;
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

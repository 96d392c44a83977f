// The GPU ring loop (see cuda_ring_engine.hpp). The same steps as RingPlan's, with device
// work instead of host work: step t+1's rows are packed on the compute stream and posted
// (through the communication thread) before step t computes; an event recorded after the
// pack is what the exchange waits for on the communication stream, and the compute stream
// waits for the exchange's own event before it reads the received rows.
#include "ring/cuda_ring_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_ops.hpp"
#include "kernels/cuda/flash_params.hpp"
#include "ring/device_schedule.hpp"
#include "ring/progress_thread.hpp"
#include "ring/schedule.hpp"
#include "ring/stream_exchanges.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::ring {

namespace kc = kernels::cuda;

namespace {

enum Tag { kKvForward = 0, kKvBackward = 1, kGradReturn = 2 };
int tag_of(int step, Tag kind) { return step * 4 + kind; }

kc::Elem elem_of(DeviceDType t) {
  switch (t) {
    case DeviceDType::fp16:
      return kc::Elem::fp16;
    case DeviceDType::fp32:
      return kc::Elem::fp32;
    case DeviceDType::bf16:
      break;
  }
  return kc::Elem::bf16;
}

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
  std::vector<ItemRange> k_ranges;  // key items of each backward range (one for MHA)
};
struct DeviceStep {
  std::vector<DeviceWave> waves;
  int64_t run0 = 0, n_runs = 0;  // the rows this rank sends, into the run list
};

}  // namespace

struct CudaRingPlan::Impl {
  AttentionConfig cfg;
  Communicator* comm = nullptr;
  CudaPlanOptions opts;
  kc::Elem elem = kc::Elem::bf16;
  ShardLayout layout;
  RingSchedule sched;
  FaultInjection fault;
  double timeout_s = kDefaultTimeoutSeconds;
  float grouped_scale = 1.0f;
  bool mixture = false;
  bool vector_loads = false;
  bool skip_ordering = false;  // RingOptions::skip_buffer_ordering_for_tests
  cudaStream_t stream = nullptr;
  std::vector<DeviceStep> steps;
  kc::DeviceAllocation tasks, q_items, k_items, runs, delta;
  kc::DeviceAllocation send_buf[2], recv_buf[2], part_buf[2], ret_buf[2];
  std::unique_ptr<StreamExchanges> ex;    // before the stream in ~Impl
  std::function<void(int, int)> on_step;  // RingOptions::on_step, at enqueue time
  void step_done(int done, int total) const {
    if (on_step) on_step(done, total);
  }
  RingTimings fwd, bwd;

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
    for (int i = 0; i < 2; ++i) {
      send_buf[i].reset();
      recv_buf[i].reset();
      part_buf[i].reset();
      ret_buf[i].reset();
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

  // Packs step t's rows and posts its K/V exchange, to start once the pack (and every
  // earlier read of the receive buffer it overwrites) is done.
  int post_kv(int t, const void* k, const void* v, Tag tag, RingTimings& tm) {
    fault.stall_if_due(comm->rank(), t, *comm);
    const RingStep& st = sched.steps[static_cast<std::size_t>(t)];
    std::vector<Transfer> sends, recvs;
    const auto bytes = [&](int64_t rows) {
      return static_cast<std::size_t>(rows * 2 * d()) * eb();
    };
    if (st.send_to >= 0) {
      kc::launch_pack_rows(elem, pack_params(t), k, v, send_buf[t % 2].get(), stream);
      sends.push_back({st.send_to, send_buf[t % 2].get(), bytes(st.send_rows)});
      tm.bytes_sent += static_cast<int64_t>(bytes(st.send_rows));
    }
    if (st.recv_from >= 0)
      recvs.push_back({st.recv_from, recv_buf[t % 2].get(), bytes(st.recv_rows)});
    return ex->post(std::move(sends), std::move(recvs), tag_of(t, tag), t,
                    tag == kKvForward ? "forward K/V" : "backward K/V");
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

  void compute_forward(int t, kc::FlashForwardParams p, const void* k, const void* v) {
    p.k = k;
    p.v = v;
    for (const DeviceWave& w : steps[static_cast<std::size_t>(t)].waves) {
      p.tasks = tasks.as<kernels::SubseqTask>() + w.task0;
      p.items = q_items.as<kernels::ForwardItem>() + w.q_item0;
      p.n_items = w.n_q_items;
      kc::flash_forward(elem, p, stream);
    }
  }

  void compute_backward(int t, kc::FlashBackwardParams p, const void* k, const void* v, float* dk,
                        float* dv) {
    p.k = k;
    p.v = v;
    p.dk = dk;
    p.dv = dv;
    for (const DeviceWave& w : steps[static_cast<std::size_t>(t)].waves) {
      p.tasks = tasks.as<kernels::SubseqTask>() + w.task0;
      p.q_items = q_items.as<kernels::ForwardItem>() + w.q_item0;
      p.n_q_items = w.n_q_items;
      for (const ItemRange& r : w.k_ranges) {  // see CudaPlan::backward
        p.k_items = k_items.as<kernels::ForwardItem>() + r.first;
        p.n_k_items = r.count;
        kc::flash_backward(elem, p, stream);
        p.n_q_items = 0;
      }
    }
  }
};

CudaRingPlan::CudaRingPlan(const AttentionConfig& cfg, Communicator& comm, CudaPlanOptions opts,
                           RingOptions ring_opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg);
  require_bnhd(cfg, "the GPU ring");
  Impl& m = *impl_;
  m.cfg = cfg;
  m.comm = &comm;
  m.opts = opts;
  m.elem = elem_of(opts.dtype);
  if (comm.size() > 1 && comm.memory_space() != MemorySpace::device)
    throw InputError("--device", "'cuda' with several ranks needs a device communicator (NCCL)");
  const CudaDeviceStatus dev = probe_cuda_device(opts.device);
  if (!dev.usable) throw InputError("--device", "'cuda' cannot be used: " + dev.reason);
  const kc::ScopedDevice on(opts.device);
  if (m.elem != kc::Elem::fp32 &&
      !kc::native_kernels_fit(cfg.shape.head_dim, m.elem, opts.device).empty()) {
    m.opts.dtype = DeviceDType::fp32;
    m.elem = kc::Elem::fp32;
  }
  RINGATTN_CUDA_CHECK(cudaStreamCreate(&m.stream));
  m.layout = make_layout(cfg, comm.size());
  const kernels::TileConfig tiles{kc::kQueryTile, kc::kKeyTile};
  m.sched = build_ring_schedule(cfg, m.layout, comm.rank(), tiles);
  m.fault = ring_opts.fault;
  m.timeout_s = ring_opts.timeout_s;
  m.skip_ordering = ring_opts.skip_buffer_ordering_for_tests;
  m.on_step = std::move(ring_opts.on_step);
  m.mixture = cfg.attention == AttentionKind::dilated && cfg.combine == Combine::mixture;
  m.grouped_scale = m.mixture ? 1.0f : 1.0f / static_cast<float>(patterns_of(cfg).size());

  // Every step's waves and runs in one set of device lists, uploaded once.
  FlatSchedule all;
  std::vector<kc::PackedRun> runs;
  for (const RingStep& st : m.sched.steps) {
    DeviceStep ds;
    for (const Wave& w : st.waves) {
      DeviceWave dw;
      dw.task0 = static_cast<int64_t>(all.tasks.size());
      dw.q_item0 = static_cast<int64_t>(all.q_items.size());
      dw.n_q_items = static_cast<int64_t>(w.items.size());
      // Task indices are relative to the wave's task0 (the launch's task pointer).
      dw.k_ranges = append_key_items_by_range(w.tasks, w.backward_ends, cfg.causal, kc::kKeyTile, 0,
                                              all.k_items);
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
    m.steps.push_back(std::move(ds));
  }
  m.vector_loads = m.elem != kc::Elem::fp32 && cfg.shape.head_dim == kc::padded_head_dim(m.d()) &&
                   rows_aligned(all, 8);
  m.tasks = upload(all.tasks, "the ring's task lists", opts.device, m.stream);
  m.q_items = upload(all.q_items, "the ring's query work items", opts.device, m.stream);
  m.k_items = upload(all.k_items, "the ring's key work items", opts.device, m.stream);
  m.runs = upload(runs, "the ring's packed-row lists", opts.device, m.stream);
  const Shape4& s = cfg.shape;
  m.delta = kc::DeviceAllocation(
      static_cast<std::size_t>(s.batch * s.heads * m.layout.local_len) * sizeof(float),
      "the backward's row sums D", opts.device, m.stream);
  // Two of each (double buffers), sized once from the schedule's largest step.
  const auto kv_send = static_cast<std::size_t>(m.sched.max_send_rows * 2 * m.d());
  const auto kv_recv = static_cast<std::size_t>(m.sched.max_recv_rows * 2 * m.d());
  for (int i = 0; i < 2; ++i) {
    m.send_buf[i] =
        kc::DeviceAllocation(kv_send * m.eb(), "a ring send buffer", opts.device, m.stream);
    m.recv_buf[i] =
        kc::DeviceAllocation(kv_recv * m.eb(), "a ring receive buffer", opts.device, m.stream);
    m.part_buf[i] = kc::DeviceAllocation(kv_recv * sizeof(float), "a ring dK/dV partial buffer",
                                         opts.device, m.stream);
    m.ret_buf[i] = kc::DeviceAllocation(kv_send * sizeof(float), "a ring dK/dV return buffer",
                                        opts.device, m.stream);
  }
  m.ex =
      std::make_unique<StreamExchanges>(comm, m.stream, opts.device, m.timeout_s, m.skip_ordering);
  RINGATTN_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

CudaRingPlan::~CudaRingPlan() = default;

const ShardLayout& CudaRingPlan::layout() const noexcept { return impl_->layout; }
const RingSchedule& CudaRingPlan::schedule() const noexcept { return impl_->sched; }
DeviceDType CudaRingPlan::dtype() const noexcept { return impl_->opts.dtype; }
const RingTimings& CudaRingPlan::last_forward() const noexcept { return impl_->fwd; }
const RingTimings& CudaRingPlan::last_backward() const noexcept { return impl_->bwd; }

std::size_t CudaRingPlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t b =
      m.tasks.bytes() + m.q_items.bytes() + m.k_items.bytes() + m.runs.bytes() + m.delta.bytes();
  for (int i = 0; i < 2; ++i)
    b += m.send_buf[i].bytes() + m.recv_buf[i].bytes() + m.part_buf[i].bytes() +
         m.ret_buf[i].bytes();
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
  const int rank = m.comm->rank(), world = m.comm->size();
  const int64_t n_out = s.batch * m.layout.local_len * s.heads * s.head_dim;
  m.ex->start_call();
  RINGATTN_CUDA_CHECK(
      cudaMemsetAsync(out, 0, static_cast<std::size_t>(n_out) * sizeof(float), m.stream));
  kc::fill_floats(lse, s.batch * s.heads * m.layout.local_len,
                  -std::numeric_limits<float>::infinity(), m.stream);
  kc::FlashForwardParams p = m.forward_params(q, out, lse);
  p.vector_loads = m.vector_loads;

  m.step_done(0, world);
  int ticket = world > 1 ? m.post_kv(1, k, v, kKvForward, m.fwd) : -1;
  m.fault.fail_if_due(rank, 0);
  m.compute_forward(0, p, k, v);
  m.step_done(1, world);
  for (int t = 1; t < world; ++t) {
    m.ex->device_wait(ticket);
    ticket = t + 1 < world ? m.post_kv(t + 1, k, v, kKvForward, m.fwd) : -1;
    m.fault.fail_if_due(rank, t);
    const RingStep& st = m.sched.steps[static_cast<std::size_t>(t)];
    if (st.recv_from >= 0) {
      const auto* buf = static_cast<const char*>(m.recv_buf[t % 2].get());
      m.compute_forward(t, p, buf, buf + static_cast<std::size_t>(st.recv_rows * m.d()) * m.eb());
    }
    m.step_done(t + 1, world);
  }
  if (m.grouped_scale != 1.0f) kc::scale_floats(out, n_out, m.grouped_scale, m.stream);
  m.ex->finish_call(m.fwd);
}

void CudaRingPlan::backward(const void* q, const void* k, const void* v, const float* out,
                            const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  m.bwd = {};
  const Shape4& s = m.cfg.shape;
  const int rank = m.comm->rank(), world = m.comm->size();
  const int64_t dd = m.d();
  const auto bytes =
      static_cast<std::size_t>(s.batch * m.layout.local_len * s.heads * dd) * sizeof(float);
  const auto kv_bytes =
      static_cast<std::size_t>(s.batch * m.layout.local_len * m.cfg.effective_kv_heads() * dd) *
      sizeof(float);
  m.ex->start_call();
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dq, 0, bytes, m.stream));
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dk, 0, kv_bytes, m.stream));
  RINGATTN_CUDA_CHECK(cudaMemsetAsync(dv, 0, kv_bytes, m.stream));
  kc::RowDotParams rd;
  rd.out = out;
  rd.dout = dout;
  rd.delta = m.delta.as<float>();
  rd.batch = s.batch;
  rd.seq_len = m.layout.local_len;
  rd.heads = s.heads;
  rd.head_dim = dd;
  kc::launch_row_dot(m.elem, rd, m.stream);

  kc::FlashBackwardParams p;
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

  // Gradient partials for the rows this rank sent at step t come back from rank r+t; they
  // are added in step order.
  std::vector<int> ret_ticket(static_cast<std::size_t>(world), -1);
  auto finish_return = [&](int t) {
    if (t < 1 || ret_ticket[static_cast<std::size_t>(t)] < 0) return;
    m.ex->device_wait(ret_ticket[static_cast<std::size_t>(t)]);
    ret_ticket[static_cast<std::size_t>(t)] = -1;
    if (m.sched.steps[static_cast<std::size_t>(t)].send_to >= 0)
      kc::launch_unpack_add_rows(m.pack_params(t), m.ret_buf[t % 2].as<float>(), dk, dv, m.mixture,
                                 m.stream);
  };

  m.step_done(0, world);
  int ticket = world > 1 ? m.post_kv(1, k, v, kKvBackward, m.bwd) : -1;
  m.fault.fail_if_due(rank, 0);
  m.compute_backward(0, p, k, v, dk, dv);
  m.step_done(1, world);
  for (int t = 1; t < world; ++t) {
    m.ex->device_wait(ticket);
    ticket = t + 1 < world ? m.post_kv(t + 1, k, v, kKvBackward, m.bwd) : -1;
    finish_return(t - 2);  // frees part_buf/ret_buf[t % 2] for this step
    m.fault.fail_if_due(rank, t);
    const RingStep& st = m.sched.steps[static_cast<std::size_t>(t)];
    float* part = m.part_buf[t % 2].as<float>();
    std::vector<Transfer> sends, recvs;
    if (st.recv_from >= 0) {
      const auto part_bytes = static_cast<std::size_t>(st.recv_rows * 2 * dd) * sizeof(float);
      RINGATTN_CUDA_CHECK(cudaMemsetAsync(part, 0, part_bytes, m.stream));
      const auto* buf = static_cast<const char*>(m.recv_buf[t % 2].get());
      m.compute_backward(t, p, buf, buf + static_cast<std::size_t>(st.recv_rows * dd) * m.eb(),
                         part, part + st.recv_rows * dd);
      sends.push_back({st.recv_from, part, part_bytes});
      m.bwd.bytes_sent += static_cast<int64_t>(part_bytes);
    }
    if (st.send_to >= 0)
      recvs.push_back({st.send_to, m.ret_buf[t % 2].get(),
                       static_cast<std::size_t>(st.send_rows * 2 * dd) * sizeof(float)});
    ret_ticket[static_cast<std::size_t>(t)] =
        m.ex->post(std::move(sends), std::move(recvs), tag_of(t, kGradReturn), t, "dK/dV return");
    m.step_done(t + 1, world);
  }
  for (int t = std::max(1, world - 2); t < world; ++t) finish_return(t);
  m.ex->finish_call(m.bwd);
}

}  // namespace ringattn::ring

// The ring loop. Step t's rows are posted (through the communication thread) before step
// t-1 computes, into the other half of a double buffer; the compute threads only wait when a
// transfer is slower than the compute it hides behind, and that wait is what we report as
// exposed communication.
#include "ring/ring_engine.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "kernels/cpu_flash.hpp"
#include "ring/progress_thread.hpp"
#include "ring/schedule.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn::ring {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
enum Tag { kKvForward = 0, kKvBackward = 1, kGradReturn = 2 };
int tag_of(int step, Tag kind) { return step * 4 + kind; }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct RingPlan::Impl {
  AttentionConfig cfg;
  Communicator* comm = nullptr;
  int threads = 1;
  kernels::TileConfig tiles;
  ShardLayout layout;
  RingSchedule sched;
  FaultInjection fault;
  double timeout_s = kDefaultTimeoutSeconds;
  std::function<void(int, int)> on_step;
  void step_done(int done, int steps) const {
    if (on_step) on_step(done, steps);
  }
  float grouped_scale = 1.0f;  // 1/G for grouped (and dense: G = 1), 1 for mixture
  std::unique_ptr<float[], AlignedFree> workspace;
  std::size_t workspace_floats = 0;
  // Double buffers, each [rows, 2, D]-sized: K rows then V rows (or dK then dV).
  std::unique_ptr<float[], AlignedFree> send_buf[2], recv_buf[2], part_buf[2], ret_buf[2];
  std::unique_ptr<ProgressThread> progress;
  RingTimings fwd, bwd;

  int64_t d() const { return cfg.shape.head_dim; }

  void pack(const RingStep& st, const float* k, const float* v, float* buf) const {
    const int64_t dd = d();
    float* kb = buf;
    float* vb = buf + st.send_rows * dd;
    std::vector<int64_t> base(st.send_runs.size());
    int64_t acc = 0;
    for (std::size_t i = 0; i < st.send_runs.size(); ++i)
      base[i] = acc, acc += st.send_runs[i].rows();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
    for (std::size_t i = 0; i < st.send_runs.size(); ++i) {
      const Run& r = st.send_runs[i];
      for (int64_t j = 0; j < r.rows(); ++j) {
        std::memcpy(kb + (base[i] + j) * dd, k + r.row0 + j * r.stride, sizeof(float) * dd);
        std::memcpy(vb + (base[i] + j) * dd, v + r.row0 + j * r.stride, sizeof(float) * dd);
      }
    }
  }

  // Adds returned dK/dV partials (packed like the rows this rank sent) into dk/dv.
  void unpack_add(const RingStep& st, const float* buf, float* dk, float* dv) const {
    const int64_t dd = d();
    const float* kb = buf;
    const float* vb = buf + st.send_rows * dd;
    std::vector<int64_t> base(st.send_runs.size());
    int64_t acc = 0;
    for (std::size_t i = 0; i < st.send_runs.size(); ++i)
      base[i] = acc, acc += st.send_runs[i].rows();
    // Runs of one step never share rows (one pattern's selection per (head, segment, chunk)
    // for grouped; under mixture two patterns' runs may share a row, and so may two
    // patterns' runs of one K/V head under grouped-query attention: stay serial there).
    const bool may_share =
        cfg.combine == Combine::mixture ||
        (cfg.effective_kv_heads() != cfg.shape.heads && patterns_of(cfg).size() > 1);
#pragma omp parallel for num_threads(may_share ? 1 : threads) schedule(dynamic, 16)
    for (std::size_t i = 0; i < st.send_runs.size(); ++i) {
      const Run& r = st.send_runs[i];
      for (int64_t j = 0; j < r.rows(); ++j) {
        float* dkr = dk + r.row0 + j * r.stride;
        float* dvr = dv + r.row0 + j * r.stride;
        const float* pk = kb + (base[i] + j) * dd;
        const float* pv = vb + (base[i] + j) * dd;
        for (int64_t c = 0; c < dd; ++c) dkr[c] += pk[c], dvr[c] += pv[c];
      }
    }
  }

  int post_kv(int t, const float* k, const float* v, Tag tag, RingTimings& tm) {
    fault.stall_if_due(comm->rank(), t, *comm);
    const RingStep& st = sched.steps[static_cast<std::size_t>(t)];
    std::vector<Transfer> sends, recvs;
    const auto bytes = [&](int64_t rows) {
      return static_cast<std::size_t>(rows * 2 * d()) * sizeof(float);
    };
    if (st.send_to >= 0) {
      const auto t0 = std::chrono::steady_clock::now();
      pack(st, k, v, send_buf[t % 2].get());
      tm.compute_ms += ms_since(t0);
      sends.push_back({st.send_to, send_buf[t % 2].get(), bytes(st.send_rows)});
      tm.bytes_sent += static_cast<int64_t>(bytes(st.send_rows));
    }
    if (st.recv_from >= 0)
      recvs.push_back({st.recv_from, recv_buf[t % 2].get(), bytes(st.recv_rows)});
    return progress->post(std::move(sends), std::move(recvs), tag_of(t, tag), t,
                          tag == kKvForward ? "forward K/V" : "backward K/V");
  }

  void wait(int ticket, RingTimings& tm) {
    const auto t0 = std::chrono::steady_clock::now();
    tm.comm_ms += progress->wait(ticket);
    tm.exposed_ms += ms_since(t0);
  }
};

RingPlan::RingPlan(const AttentionConfig& cfg, Communicator& comm, PlanOptions opts,
                   RingOptions ring_opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg);
  Impl& m = *impl_;
  m.cfg = cfg;
  m.comm = &comm;
  m.threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
  m.tiles = choose_tiles(cfg.shape.head_dim, opts.q_tile, opts.k_tile);
  m.layout = make_layout(cfg, comm.size());
  m.sched = build_ring_schedule(cfg, m.layout, comm.rank(), m.tiles);
  m.fault = ring_opts.fault;
  m.timeout_s = ring_opts.timeout_s;
  m.on_step = std::move(ring_opts.on_step);
  const bool mixture = cfg.attention == AttentionKind::dilated && cfg.combine == Combine::mixture;
  m.grouped_scale = mixture ? 1.0f : 1.0f / static_cast<float>(patterns_of(cfg).size());
  m.workspace_floats = std::max(kernels::forward_workspace_floats(m.tiles, m.d()),
                                kernels::backward_workspace_floats(m.tiles, m.d()));
  m.workspace = aligned_floats(m.workspace_floats * static_cast<std::size_t>(m.threads),
                               "ring kernel workspace");
  const auto rows_send = static_cast<std::size_t>(m.sched.max_send_rows * 2 * m.d());
  const auto rows_recv = static_cast<std::size_t>(m.sched.max_recv_rows * 2 * m.d());
  for (int i = 0; i < 2; ++i) {
    m.send_buf[i] = aligned_floats(rows_send, "ring send buffer");
    m.ret_buf[i] = aligned_floats(rows_send, "ring gradient return buffer");
    m.recv_buf[i] = aligned_floats(rows_recv, "ring receive buffer");
    m.part_buf[i] = aligned_floats(rows_recv, "ring gradient partial buffer");
  }
  if (comm.size() > 1) m.progress = std::make_unique<ProgressThread>(comm, m.timeout_s);
}

RingPlan::~RingPlan() = default;

const ShardLayout& RingPlan::layout() const noexcept { return impl_->layout; }
const RingSchedule& RingPlan::schedule() const noexcept { return impl_->sched; }
int RingPlan::threads() const noexcept { return impl_->threads; }
const RingTimings& RingPlan::last_forward() const noexcept { return impl_->fwd; }
const RingTimings& RingPlan::last_backward() const noexcept { return impl_->bwd; }

std::size_t RingPlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  return sizeof(float) * (m.workspace_floats * static_cast<std::size_t>(m.threads) +
                          4 * static_cast<std::size_t>(
                                  (m.sched.max_send_rows + m.sched.max_recv_rows) * 2 * m.d()));
}

void RingPlan::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  Impl& m = *impl_;
  m.fwd = {};
  const Shape4& s = m.cfg.shape;
  const int rank = m.comm->rank(), world = m.comm->size();
  const auto n_out = static_cast<std::size_t>(s.batch * m.layout.local_len * s.heads * s.head_dim);
  const auto n_lse = static_cast<std::size_t>(s.batch * s.heads * m.layout.local_len);
  std::fill(out, out + n_out, 0.0f);
  std::fill(lse, lse + n_lse, kNegInf);

  kernels::ForwardParams p;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.head_dim = s.head_dim;
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.causal = m.cfg.causal;
  p.accumulate = true;
  auto compute = [&](int t, const float* kk, const float* vv) {
    const auto t0 = std::chrono::steady_clock::now();
    p.k = kk;
    p.v = vv;
    for (const Wave& w : m.sched.steps[static_cast<std::size_t>(t)].waves)
      kernels::flash_forward(p, w.tasks, w.items, m.tiles, m.threads, m.workspace.get());
    m.fwd.compute_ms += ms_since(t0);
  };

  m.step_done(0, world);
  int ticket = world > 1 ? m.post_kv(1, k, v, kKvForward, m.fwd) : -1;
  m.fault.fail_if_due(rank, 0);
  compute(0, k, v);
  m.step_done(1, world);
  for (int t = 1; t < world; ++t) {
    m.wait(ticket, m.fwd);
    ticket = t + 1 < world ? m.post_kv(t + 1, k, v, kKvForward, m.fwd) : -1;
    m.fault.fail_if_due(rank, t);
    const RingStep& st = m.sched.steps[static_cast<std::size_t>(t)];
    if (st.recv_from >= 0) {
      const float* buf = m.recv_buf[t % 2].get();
      compute(t, buf, buf + st.recv_rows * m.d());
    }
    m.step_done(t + 1, world);
  }
  if (m.grouped_scale != 1.0f) {
    const float g = m.grouped_scale;
#pragma omp parallel for num_threads(m.threads) schedule(static)
    for (std::size_t i = 0; i < n_out; ++i) out[i] *= g;
  }
}

void RingPlan::backward(const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  m.bwd = {};
  const Shape4& s = m.cfg.shape;
  const int rank = m.comm->rank(), world = m.comm->size();
  const int64_t dd = m.d();
  const auto n = static_cast<std::size_t>(s.batch * m.layout.local_len * s.heads * dd);
  const auto n_kv =
      static_cast<std::size_t>(s.batch * m.layout.local_len * m.cfg.effective_kv_heads() * dd);
  std::fill(dq, dq + n, 0.0f);
  std::fill(dk, dk + n_kv, 0.0f);
  std::fill(dv, dv + n_kv, 0.0f);

  kernels::BackwardParams p;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.dout = dout;
  p.dq = dq;
  p.head_dim = dd;
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.causal = m.cfg.causal;
  p.out_scale = p.dout_scale = m.grouped_scale;
  auto compute = [&](int t, const float* kk, const float* vv, float* dkk, float* dvv) {
    const auto t0 = std::chrono::steady_clock::now();
    p.k = kk;
    p.v = vv;
    p.dk = dkk;
    p.dv = dvv;
    for (const Wave& w : m.sched.steps[static_cast<std::size_t>(t)].waves) {
      // One call per place in the K/V groups, in order: calls never share dK/dV rows.
      const std::span<const kernels::SubseqTask> tasks(w.tasks);
      std::size_t begin = 0;
      for (const std::size_t end : w.backward_ends) {
        kernels::flash_backward(p, tasks.subspan(begin, end - begin), m.tiles, m.threads,
                                m.workspace.get());
        begin = end;
      }
    }
    m.bwd.compute_ms += ms_since(t0);
  };
  // Gradient partials for the rows this rank sent at step t come back from rank r+t.
  std::vector<int> ret_ticket(static_cast<std::size_t>(world), -1);
  auto finish_return = [&](int t) {
    if (t < 1 || ret_ticket[static_cast<std::size_t>(t)] < 0) return;
    m.wait(ret_ticket[static_cast<std::size_t>(t)], m.bwd);
    ret_ticket[static_cast<std::size_t>(t)] = -1;
    const auto t0 = std::chrono::steady_clock::now();
    m.unpack_add(m.sched.steps[static_cast<std::size_t>(t)], m.ret_buf[t % 2].get(), dk, dv);
    m.bwd.compute_ms += ms_since(t0);
  };

  m.step_done(0, world);
  int ticket = world > 1 ? m.post_kv(1, k, v, kKvBackward, m.bwd) : -1;
  m.fault.fail_if_due(rank, 0);
  compute(0, k, v, dk, dv);
  m.step_done(1, world);
  for (int t = 1; t < world; ++t) {
    m.wait(ticket, m.bwd);
    ticket = t + 1 < world ? m.post_kv(t + 1, k, v, kKvBackward, m.bwd) : -1;
    finish_return(t - 2);  // frees part_buf/ret_buf[t % 2] for this step
    m.fault.fail_if_due(rank, t);
    const RingStep& st = m.sched.steps[static_cast<std::size_t>(t)];
    float* part = m.part_buf[t % 2].get();
    std::vector<Transfer> sends, recvs;
    if (st.recv_from >= 0) {
      std::fill(part, part + st.recv_rows * 2 * dd, 0.0f);
      const float* buf = m.recv_buf[t % 2].get();
      compute(t, buf, buf + st.recv_rows * dd, part, part + st.recv_rows * dd);
      const auto bytes = static_cast<std::size_t>(st.recv_rows * 2 * dd) * sizeof(float);
      sends.push_back({st.recv_from, part, bytes});
      m.bwd.bytes_sent += static_cast<int64_t>(bytes);
    }
    if (st.send_to >= 0)
      recvs.push_back({st.send_to, m.ret_buf[t % 2].get(),
                       static_cast<std::size_t>(st.send_rows * 2 * dd) * sizeof(float)});
    ret_ticket[static_cast<std::size_t>(t)] = m.progress->post(
        std::move(sends), std::move(recvs), tag_of(t, kGradReturn), t, "dK/dV return");
    m.step_done(t + 1, world);
  }
  for (int t = std::max(1, world - 2); t < world; ++t) finish_return(t);
}

}  // namespace ringattn::ring

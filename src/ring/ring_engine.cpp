// RingPlan: the ring protocol (ring_protocol.hpp) on host memory. Its backend packs and adds
// rows with OpenMP, waits on the communication thread (the time a wait blocks is the exposed
// communication) and runs the CPU flash kernels over each step's waves.
#include "ring/ring_engine.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/patterns.hpp"
#include "kernels/cpu_flash.hpp"
#include "ring/host_exchanges.hpp"
#include "ring/ring_protocol.hpp"
#include "ring/ring_schedule.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/tensor.hpp"
#include "single/schedule.hpp"

namespace ringattn::ring {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

struct RingPlan::Impl {
  AttentionConfig cfg;
  int threads = 1;
  kernels::TileConfig tiles;
  ShardLayout layout;
  RingSchedule sched;
  RingProtocol protocol;
  double timeout_s = kDefaultTimeoutSeconds;
  float grouped_scale = 1.0f;     // 1/G for grouped (and dense: G = 1), 1 for mixture
  std::vector<bool> rows_repeat;  // per step, runs_repeat_a_row: its dK/dV rows added serially
  std::unique_ptr<float[], AlignedFree> workspace;
  std::size_t workspace_floats = 0;
  // Double buffers, each rows · (D + Dv) floats: K rows then V rows (or dK then dV).
  RingBuffers<std::unique_ptr<float[], AlignedFree>> buf;
  HostExchanges exchanges;  // after the buffers: its thread ends before they go
  RingTimings fwd, bwd;

  int64_t d() const { return cfg.shape.head_dim; }
  int64_t dv() const { return cfg.effective_head_dim_v(); }

  struct Host;
};

// The protocol's backend for one call: the plan's host buffers and kernels, the call's
// parameters, and its timings (kernels, packing and adding count as compute).
struct RingPlan::Impl::Host {
  Impl& m;
  RingTimings& tm;
  kernels::ForwardParams fwd{};   // forward calls
  kernels::BackwardParams bwd{};  // backward calls

  int64_t head_dim() const { return m.d(); }
  int64_t head_dim_v() const { return m.dv(); }
  std::size_t kv_elem_bytes() const { return sizeof(float); }

  void* buffer(RingBuffer which, int t) const { return m.buf.at(which, t).get(); }

  // The offset of each of step t's send runs in the packed rows.
  static std::vector<int64_t> packed_bases(const RingStep& st) {
    std::vector<int64_t> base(st.send_runs.size());
    int64_t acc = 0;
    for (std::size_t i = 0; i < st.send_runs.size(); ++i)
      base[i] = acc, acc += st.send_runs[i].rows();
    return base;
  }

  void pack(int t, const void* k_rows, const void* v_rows) {
    const ScopedMs timer(tm.compute_ms);
    const auto* k = static_cast<const float*>(k_rows);
    const auto* v = static_cast<const float*>(v_rows);
    const RingStep& st = m.sched.steps[static_cast<std::size_t>(t)];
    const int64_t dd = m.d(), dv = m.dv();
    float* kb = m.buf.send[t % 2].get();
    float* vb = kb + st.send_rows * dd;
    const std::vector<int64_t> base = packed_bases(st);
#pragma omp parallel for num_threads(m.threads) schedule(dynamic, 16)
    for (std::size_t i = 0; i < st.send_runs.size(); ++i) {
      const Run& r = st.send_runs[i];
      // Runs count floats of K rows; V's rows sit at the same positions, Dv floats each.
      const float* vr = v + kernels::value_floats(r.row0, dd, dv);
      const int64_t vs = kernels::value_floats(r.stride, dd, dv);
      for (int64_t j = 0; j < r.rows(); ++j) {
        std::memcpy(kb + (base[i] + j) * dd, k + r.row0 + j * r.stride, sizeof(float) * dd);
        std::memcpy(vb + (base[i] + j) * dv, vr + j * vs, sizeof(float) * dv);
      }
    }
  }

  int post(std::vector<Transfer> sends, std::vector<Transfer> recvs, int tag, int step,
           const char* what) {
    return m.exchanges.post(std::move(sends), std::move(recvs), tag, step, what);
  }

  void wait(int ticket) { m.exchanges.wait(ticket, tm); }

  void compute_forward(int t, const void* k, const void* v) {
    const ScopedMs timer(tm.compute_ms);
    fwd.k = static_cast<const float*>(k);
    fwd.v = static_cast<const float*>(v);
    for (const Wave& w : m.sched.steps[static_cast<std::size_t>(t)].waves)
      kernels::flash_forward(fwd, w.tasks, w.items, m.tiles, m.threads, m.workspace.get());
  }

  void compute_backward(int t, const void* k, const void* v, float* dk, float* dv) {
    const ScopedMs timer(tm.compute_ms);
    bwd.k = static_cast<const float*>(k);
    bwd.v = static_cast<const float*>(v);
    bwd.dk = dk;
    bwd.dv = dv;
    for (const Wave& w : m.sched.steps[static_cast<std::size_t>(t)].waves) {
      // One call per place in the K/V groups, in order: calls never share dK/dV rows.
      const std::span<const kernels::SubseqTask> tasks(w.tasks);
      std::size_t begin = 0;
      for (const std::size_t end : w.backward_ends) {
        kernels::flash_backward(bwd, tasks.subspan(begin, end - begin), m.tiles, m.threads,
                                m.workspace.get());
        begin = end;
      }
    }
  }

  void clear(float* p, int64_t floats) const { std::fill(p, p + floats, 0.0f); }

  void add_returned(int t, float* dk, float* dv) {
    const ScopedMs timer(tm.compute_ms);
    const RingStep& st = m.sched.steps[static_cast<std::size_t>(t)];
    const int64_t dd = m.d(), dvd = m.dv();
    const float* kb = m.buf.returned[t % 2].get();
    const float* vb = kb + st.send_rows * dd;
    const std::vector<int64_t> base = packed_bases(st);
    // Two read-modify-writes of one row would race: a step whose runs repeat a row (a
    // mixture, or a K/V head shared by two patterns' head groups) adds them serially.
    const bool serial = m.rows_repeat[static_cast<std::size_t>(t)];
#pragma omp parallel for num_threads(serial ? 1 : m.threads) schedule(dynamic, 16)
    for (std::size_t i = 0; i < st.send_runs.size(); ++i) {
      const Run& r = st.send_runs[i];
      const int64_t v0 = kernels::value_floats(r.row0, dd, dvd);
      const int64_t vs = kernels::value_floats(r.stride, dd, dvd);
      for (int64_t j = 0; j < r.rows(); ++j) {
        float* dkr = dk + r.row0 + j * r.stride;
        float* dvr = dv + v0 + j * vs;
        const float* pk = kb + (base[i] + j) * dd;
        const float* pv = vb + (base[i] + j) * dvd;
        for (int64_t c = 0; c < dd; ++c) dkr[c] += pk[c];
        for (int64_t c = 0; c < dvd; ++c) dvr[c] += pv[c];
      }
    }
  }
};

RingPlan::RingPlan(const AttentionConfig& cfg, Communicator& comm, PlanOptions opts,
                   RingOptions ring_opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg, opts.heads);
  Impl& m = *impl_;
  m.cfg = cfg;
  m.threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
  m.tiles = single::choose_tiles(cfg.shape.head_dim, opts.q_tile, opts.k_tile);
  m.layout = make_layout(cfg, comm.size(), opts.heads);
  m.sched = build_ring_schedule(cfg, m.layout, comm.rank(), m.tiles, opts.heads);
  m.protocol = RingProtocol(m.sched, comm, ring_opts);
  m.timeout_s = ring_opts.timeout_s;
  m.grouped_scale = grouped_scale(cfg);
  for (const RingStep& st : m.sched.steps) m.rows_repeat.push_back(runs_repeat_a_row(st.send_runs));
  m.workspace_floats = std::max(kernels::forward_workspace_floats(m.tiles, m.d(), m.dv()),
                                kernels::backward_workspace_floats(m.tiles, m.d(), m.dv()));
  m.workspace = aligned_floats(m.workspace_floats * static_cast<std::size_t>(m.threads),
                               "ring kernel workspace");
  const auto rows_send = static_cast<std::size_t>(m.sched.max_send_rows * (m.d() + m.dv()));
  const auto rows_recv = static_cast<std::size_t>(m.sched.max_recv_rows * (m.d() + m.dv()));
  for (int i = 0; i < 2; ++i) {
    m.buf.send[i] = aligned_floats(rows_send, "ring send buffer");
    m.buf.returned[i] = aligned_floats(rows_send, "ring gradient return buffer");
    m.buf.receive[i] = aligned_floats(rows_recv, "ring receive buffer");
    m.buf.partial[i] = aligned_floats(rows_recv, "ring gradient partial buffer");
  }
  m.exchanges = HostExchanges(comm, m.timeout_s);
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
                                  (m.sched.max_send_rows + m.sched.max_recv_rows) *
                                  (m.d() + m.dv())));
}

void RingPlan::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  Impl& m = *impl_;
  m.fwd = {};
  const Shape4& s = m.cfg.shape;
  const auto n_out = static_cast<std::size_t>(s.batch * m.layout.local_len * s.heads * m.dv());
  const auto n_lse = static_cast<std::size_t>(s.batch * s.heads * m.layout.local_len);
  std::fill(out, out + n_out, 0.0f);
  std::fill(lse, lse + n_lse, kNegInf);

  Impl::Host host{m, m.fwd};
  kernels::ForwardParams& p = host.fwd;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.head_dim = s.head_dim;
  p.head_dim_v = m.dv();
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.softcap = static_cast<float>(m.cfg.softcap);
  p.causal = m.cfg.causal;
  p.accumulate = true;
  m.protocol.forward(host, k, v, m.fwd);
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
  const int64_t dd = m.d();
  const auto n = static_cast<std::size_t>(s.batch * m.layout.local_len * s.heads * dd);
  const auto n_kv =
      static_cast<std::size_t>(s.batch * m.layout.local_len * m.cfg.effective_kv_heads() * dd);
  const auto n_v = n_kv / static_cast<std::size_t>(dd) * static_cast<std::size_t>(m.dv());
  std::fill(dq, dq + n, 0.0f);
  std::fill(dk, dk + n_kv, 0.0f);
  std::fill(dv, dv + n_v, 0.0f);

  Impl::Host host{m, m.bwd};
  kernels::BackwardParams& p = host.bwd;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.dout = dout;
  p.dq = dq;
  p.head_dim = dd;
  p.head_dim_v = m.dv();
  p.scale = static_cast<float>(m.cfg.effective_scale());
  p.softcap = static_cast<float>(m.cfg.softcap);
  p.causal = m.cfg.causal;
  p.out_scale = p.dout_scale = m.grouped_scale;
  m.protocol.backward(host, k, v, dk, dv, m.bwd);
}

}  // namespace ringattn::ring

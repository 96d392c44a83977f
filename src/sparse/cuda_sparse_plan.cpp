// CudaSparsePlan (see cuda_sparse_plan.hpp): this rank's block-sparse work lists, uploaded
// once, run on one stream by the exchange of sparse_protocol.hpp. Its backend packs and adds
// slabs with kernels, waits for exchanges on the device (StreamExchanges) and launches the
// block-sparse CUDA kernels (kernels/cuda/native/sparse.hpp).
#include "sparse/cuda_sparse_plan.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/patterns.hpp"
#include "kernels/cuda/choice/form_chooser.hpp"
#include "kernels/cuda/hopper/head_dims.hpp"
#include "kernels/cuda/hopper/sparse_backward.hpp"
#include "kernels/cuda/hopper/sparse_forward.hpp"
#include "kernels/cuda/native/sparse.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_memory.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"
#include "ring/stream_exchanges.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"
#include "sparse/rank_work.hpp"
#include "sparse/sparse_device_lists.hpp"
#include "sparse/sparse_plan.hpp"
#include "sparse/sparse_protocol.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn::sparse {

namespace kc = kernels::cuda;
using kc::aligned16;  // 16-byte copies, TMA and bulk adds need 16-byte aligned base pointers

struct CudaSparsePlan::Impl {
  AttentionConfig cfg;
  std::shared_ptr<const BlockLists> lists;
  CudaPlanOptions opts;
  kc::Elem elem = kc::Elem::bf16;
  CudaDeviceStatus device;
  ring::Communicator* comm = nullptr;  // null on one rank without a communicator
  int me = 0, world = 1;
  ring::ShardLayout layout;
  RankSparseWork w;
  SparseProtocol protocol;
  cudaStream_t stream = nullptr;
  int64_t B = 0, H = 0, G = 0, D = 0, NL = 0, bs = 0;  // G: K/V heads
  int64_t Dv = 0;  // v, out, dout, dv rows (the slabs' V halves too)
  int64_t send_rows = 0, recv_rows = 0;                // rows of each half (K, V) of the slabs
  DeviceLists local, remote;
  kc::DeviceAllocation delta, send_buf, recv_buf, grad_buf, ret_buf, send_runs, ret_runs;
  std::vector<std::pair<int64_t, int64_t>> ret_slots;  // (first run, runs) per launch
  std::vector<int64_t> ret_slot_rows;
  bool vector_loads = false;
  // The sm_90a kernels' choice (form_chooser.hpp): the forward, and the backward where it
  // applies (D 64 or 128), the local blocks' over the shard's [B, N/P, HKV, D] tensors and the
  // received ones' over the receive slab's rows (HopperSparseShape::kv_rows).
  kc::FormChooser hopper;
  std::vector<std::string> notes;
  std::unique_ptr<ring::StreamExchanges> ex;  // several ranks only
  ring::RingTimings fwd, bwd;

  ~Impl() {
    const kc::ScopedDevice on(opts.device, std::nothrow);
    ex.reset();
    local.reset();
    remote.reset();
    for (kc::DeviceAllocation* a :
         {&delta, &send_buf, &recv_buf, &grad_buf, &ret_buf, &send_runs, &ret_runs})
      a->reset();
    kc::close_plan_stream(stream, opts.device);
  }

  std::size_t eb() const { return static_cast<std::size_t>(kc::elem_bytes(elem)); }
  int64_t kv_row(int64_t b, int64_t local_row, int64_t g) const {
    return ((b * NL + local_row) * G + g) * D;
  }
  int64_t slab_row(int64_t entry, int64_t b) const { return (entry * B + b) * bs; }

  void build(const CudaPlanOptions& o) {
    const Shape4& s = cfg.shape;
    B = s.batch;
    H = s.heads;
    G = cfg.effective_kv_heads();
    D = s.head_dim;
    Dv = cfg.effective_head_dim_v();
    bs = cfg.block_size;
    layout = sparse_layout(cfg, world);
    NL = layout.local_len;
    w = build_rank_sparse_work(cfg, *lists, layout, me);
    const int dev = o.device;
    local.upload(w.local_tiles, w.local_spans, w.local_ktiles, w.local_qspans, cfg.causal, dev,
                 stream);
    remote.upload(w.remote_tiles, w.remote_spans, w.remote_ktiles, w.remote_qspans, cfg.causal, dev,
                  stream);
    delta = kc::DeviceAllocation(static_cast<std::size_t>(B * H * NL) * sizeof(float),
                                 "the backward's row sums D = rowsum(out * dout)", dev, stream);
    send_rows = slab_row(static_cast<int64_t>(w.send_entries.size()), 0);
    recv_rows = slab_row(static_cast<int64_t>(w.recv_entries.size()), 0);
    // The send runs: entry e, batch b is rows slab_row(e, b).. of the send slab.
    std::vector<kc::PackedRun> runs;
    for (std::size_t e = 0; e < w.send_entries.size(); ++e) {
      const Entry& en = w.send_entries[e];
      const int64_t lr = w.owners[static_cast<std::size_t>(en.block)].local_row;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t at = slab_row(static_cast<int64_t>(e), b);
        runs.push_back({kv_row(b, lr, en.head), G * D, bs, at, at});
      }
    }
    // The returned partials of one (head, block) come from several peers: launch k adds
    // each group's k-th (peers ascending), so no launch names a row twice and every sum is
    // taken in the same order.
    std::vector<kc::PackedRun> ret;
    for (int64_t slot = 0;; ++slot) {
      const auto first = static_cast<int64_t>(ret.size());
      int64_t rows = 0;
      for (std::size_t g = 0; g + 1 < w.ret_group_ptr.size(); ++g) {
        const int64_t x = w.ret_group_ptr[g] + slot;
        if (x >= w.ret_group_ptr[g + 1]) continue;
        const int64_t e = w.ret_order[static_cast<std::size_t>(x)];
        const Entry& en = w.send_entries[static_cast<std::size_t>(e)];
        const int64_t lr = w.owners[static_cast<std::size_t>(en.block)].local_row;
        for (int64_t b = 0; b < B; ++b) {
          ret.push_back({kv_row(b, lr, en.head), G * D, bs, rows, slab_row(e, b)});
          rows += bs;
        }
      }
      if (rows == 0) break;
      ret_slots.emplace_back(first, static_cast<int64_t>(ret.size()) - first);
      ret_slot_rows.push_back(rows);
    }
    send_runs = kc::upload_vector(runs, "the block-sparse send lists", dev, stream);
    ret_runs = kc::upload_vector(ret, "the block-sparse return lists", dev, stream);
    kc::wait_for_stream(stream, "the block-sparse lists' upload");  // before runs, ret go
    const auto kv = [&](int64_t rows, std::size_t bytes) {  // K rows of D, then V rows of Dv
      return static_cast<std::size_t>(rows * (D + Dv)) * bytes;
    };
    send_buf = kc::DeviceAllocation(kv(send_rows, eb()), "the block-sparse send slab", dev, stream);
    recv_buf =
        kc::DeviceAllocation(kv(recv_rows, eb()), "the block-sparse receive slab", dev, stream);
    grad_buf = kc::DeviceAllocation(kv(recv_rows, sizeof(float)), "the block-sparse dK/dV partials",
                                    dev, stream);
    ret_buf = kc::DeviceAllocation(kv(send_rows, sizeof(float)),
                                   "the block-sparse returned dK/dV partials", dev, stream);
    // 16-byte copies need 8-element aligned rows of exactly the instantiated head dim (v's too).
    vector_loads = elem != kc::Elem::fp32 && D == kc::padded_head_dim(D) && Dv == D &&
                   (H * D) % 8 == 0 && (G * D) % 8 == 0 && local.rows_aligned &&
                   remote.rows_aligned;
  }

  void init(const AttentionConfig& c, std::shared_ptr<const BlockLists> l, CudaPlanOptions o) {
    validate(c);
    const std::string on_gpu =
        field_is("device", "cuda") + " (use " + field_is("device", "cpu") + ")";
    require_bnhd(c, on_gpu);
    if (c.attention != AttentionKind::block_sparse)
      throw std::invalid_argument("CudaSparsePlan: the configuration is not block-sparse");
    if (o.kernel == KernelChoice::cudnn)
      throw InputError("kernel", "'cudnn' has no block-sparse kernel; use " +
                                     field_is("kernel", "native") + " or auto");
    cfg = c;
    lists = std::move(l);
    opts = o;
    elem = kc::elem_of(o.dtype);
    device = probe_cuda_device(o.device);
    if (!device.usable) throw InputError("device", "'cuda' cannot be used: " + device.reason);
  }

  kc::SparseForwardParams forward_params(const DeviceLists& l, const void* q, const void* k,
                                         const void* v, float* out, float* lse,
                                         bool accumulate) const {
    kc::SparseForwardParams p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    p.lse = lse;
    p.tiles = l.q_tiles.as<kernels::SparseQueryTile>();
    p.spans = l.key_spans.as<kernels::KeySpan>();
    p.items = l.q_items.as<kernels::ForwardItem>();
    p.n_items = l.n_q_items;
    p.q_stride = H * D;
    p.lse_stride = 1;
    p.head_dim = static_cast<int>(D);
    p.head_dim_v = static_cast<int>(Dv);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
    p.causal = cfg.causal;
    const WindowLimits win = kernel_window(cfg);
    p.window_left = win.left;
    p.window_right = win.right;
    p.accumulate = accumulate;
    p.vector_loads = vector_loads && aligned16(q) && aligned16(k) && aligned16(v);
    return p;
  }

  kc::SparseBackwardParams backward_params(const DeviceLists& l, const void* q, const void* k,
                                           const void* v, const float* lse, const void* dout,
                                           float* dq, float* dk, float* dv) const {
    kc::SparseBackwardParams p;
    p.q = q, p.k = k, p.v = v, p.dout = dout, p.lse = lse, p.delta = delta.as<float>();
    p.dq = dq, p.dk = dk, p.dv = dv;
    p.q_tiles = l.q_tiles.as<kernels::SparseQueryTile>();
    p.key_spans = l.key_spans.as<kernels::KeySpan>();
    p.q_items = l.q_items.as<kernels::ForwardItem>();
    p.n_q_items = l.n_q_items;
    p.k_tiles = l.k_tiles.as<kernels::SparseKeyTile>();
    p.query_spans = l.query_spans.as<kernels::QuerySpan>();
    p.k_items = l.k_items.as<kernels::ForwardItem>();
    p.n_k_items = l.n_k_items;
    p.q_stride = H * D;
    p.lse_stride = 1;
    p.head_dim = static_cast<int>(D);
    p.head_dim_v = static_cast<int>(Dv);
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
    p.causal = cfg.causal;
    const WindowLimits win = kernel_window(cfg);
    p.window_left = win.left;
    p.window_right = win.right;
    p.vector_loads =
        vector_loads && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
    return p;
  }

  // Whether this rank's backward has the wide fused kernel: D = 64 or 128, both lists' key
  // items pair up, and some do (key tiles of 128 keys or more).
  bool wide_ok() const {
    return kc::hopper_wide_head_dim(D) && local.wide_pairs && remote.wide_pairs &&
           (local.n_wide_k_items < local.n_k_items || remote.n_wide_k_items < remote.n_k_items);
  }

  // The sm_90a backward's params over `l`: with wide_backward, its 128-key items.
  kc::SparseBackwardParams hopper_backward_params(const DeviceLists& l, const void* q,
                                                  const void* k, const void* v, const float* lse,
                                                  const void* dout, float* dq, float* dk,
                                                  float* dv) const {
    kc::SparseBackwardParams p = backward_params(l, q, k, v, lse, dout, dq, dk, dv);
    if (hopper.wide()) {
      p.k_items = l.wide_k_items.as<kernels::ForwardItem>();
      p.n_k_items = l.n_wide_k_items;
    }
    return p;
  }

  // The local blocks' tensors ([B, N/P, HKV, D] K/V), or (received) the receive slab's rows.
  kc::HopperSparseShape hopper_shape(bool received = false) const {
    return {static_cast<int>(B),
            static_cast<int>(NL),
            static_cast<int>(H),
            static_cast<int>(G),
            received ? static_cast<int>(recv_rows) : 0,
            hopper.forward_form()};
  }

  // Chooses the Hopper forward and backward, for the local blocks and the received ones
  // alike, where they apply, with a note either way: asked for (kernel=hopper), or under
  // kernel=auto, where they are the faster block-sparse kernels on compute capability 9.0
  // (measured: docs/PERFORMANCE.md).
  void choose_hopper(bool automatic) {
    std::string why, why_backward;
    if (const std::string f = kc::hopper_feature_refusal(cfg, kc::GpuPath::sparse, automatic);
        !f.empty())
      why = f;
    else if (NL > std::numeric_limits<int>::max() / 2)
      why = "a shard of " + std::to_string(NL) + " rows (tensor map coordinates are int)";
    else if (recv_rows > std::numeric_limits<int>::max() / 2)
      why = "a receive slab of " + std::to_string(recv_rows) +
            " rows (tensor map coordinates are int)";
    else
      why = kc::hopper_sparse_forward_unsupported(
          elem, forward_params(local, nullptr, nullptr, nullptr, nullptr, nullptr, false),
          hopper_shape(), opts.device);
    if (why.empty())
      why_backward = kc::hopper_sparse_backward_unsupported(
          elem,
          backward_params(local, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                          nullptr),
          hopper_shape(), opts.device);
    kc::FormChooser::Path path;
    path.path = kc::GpuPath::sparse;
    path.forward_what = "the block-sparse sm_90a forward";
    path.backward_what = "the block-sparse sm_90a backward";
    path.kernels = "the Hopper block-sparse";
    path.collective = comm != nullptr;
    if (comm) {
      path.slowest = [this](double ms) { return comm->max(ms); };
    }
    hopper = kc::FormChooser(std::move(path), opts.deterministic,
                             opts.kernel == KernelChoice::automatic, static_cast<int>(D),
                             static_cast<int>(Dv));
    hopper.decide(why, why_backward, wide_ok(), notes);
    if (hopper.forward()) kc::hopper_feature_forced_notes(cfg, kc::GpuPath::sparse, notes);
    const std::string blocks = world > 1 ? "the local and received blocks" : "the blocks";
    if (!automatic) {
      notes.push_back(
          hopper.asked_note(why, why_backward, "block-sparse ", " (TMA + wgmma) for " + blocks));
      return;
    }
    notes.push_back(
        field_is("kernel", "auto") + ": " +
        (!hopper.forward()
             ? "the native block-sparse kernels (cuDNN has none; the sm_90a ones cannot run: " +
                   why + ")"
         : hopper.backward()
             ? "the sm_90a block-sparse forward and backward (TMA + wgmma) for " + blocks +
                   ", the fastest block-sparse kernels on this GPU"
             : "the sm_90a block-sparse forward (TMA + wgmma) for " + blocks +
                   " and the native backward (the Hopper one cannot run: " + why_backward + ")"));
  }

  struct Device;
  void run_forward(const void* q, const void* k, const void* v, float* out, float* lse);
  void run_backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                    const void* dout, float* dq, float* dk, float* dv);
};

// The protocol's backend for one call: the plan's slabs and lists, the call's tensors.
// Everything is enqueued on the plan's stream; timings come from
// StreamExchanges::finish_call.
struct CudaSparsePlan::Impl::Device {
  Impl& m;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  float *out = nullptr, *lse = nullptr;  // written by the forward, read by the backward
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;

  int64_t entry_elems() const { return m.slab_row(1, 0) * m.D; }
  int64_t value_entry_elems() const { return m.slab_row(1, 0) * m.Dv; }
  std::size_t kv_elem_bytes() const { return m.eb(); }

  SlabHalves slab(SparseSlab which) const {
    const auto halves = [&](const kc::DeviceAllocation& a, int64_t rows, std::size_t bytes) {
      auto* base = static_cast<char*>(a.get());
      return SlabHalves{base, base + static_cast<std::size_t>(rows * m.D) * bytes};  // V after K
    };
    switch (which) {
      case SparseSlab::send:
        return halves(m.send_buf, m.send_rows, m.eb());
      case SparseSlab::receive:
        return halves(m.recv_buf, m.recv_rows, m.eb());
      case SparseSlab::partial:
        return halves(m.grad_buf, m.recv_rows, sizeof(float));
      case SparseSlab::returned:
        break;
    }
    return halves(m.ret_buf, m.send_rows, sizeof(float));
  }

  void pack() {
    kc::PackParams pp;
    pp.runs = m.send_runs.as<kc::PackedRun>();
    pp.n_runs = static_cast<int64_t>(m.w.send_entries.size()) * m.B;
    pp.total_rows = pp.buffer_rows = m.send_rows;
    pp.head_dim = m.D;
    pp.head_dim_v = m.Dv;
    kc::launch_pack_rows(m.elem, pp, k, v, m.send_buf.get(), m.stream);
  }

  // Starts once the stream's work so far is done: the pack, and every read of the slabs
  // the exchange overwrites.
  int post(std::vector<ring::Transfer> sends, std::vector<ring::Transfer> recvs, int tag, int step,
           const char* what) {
    return m.ex->post(std::move(sends), std::move(recvs), tag, step, what);
  }

  void wait(int ticket) { m.ex->device_wait(ticket); }

  void compute_forward(SparseBlocks which) {
    // Every row has one local query tile: written, not merged; remote tiles merge.
    if (which == SparseBlocks::local) {
      const kc::SparseForwardParams p = m.forward_params(m.local, q, k, v, out, lse, false);
      if (m.hopper.forward() && m.hopper.forward_reads(q, k, v, m.notes)) {  // TMA
        kc::hopper_sparse_forward(m.elem, p, m.hopper_shape(), m.stream);
        return;
      }
      kc::sparse_forward(m.elem, p, m.stream);
      return;
    }
    const SlabHalves r = slab(SparseSlab::receive);
    const kc::SparseForwardParams p = m.forward_params(m.remote, q, r.k, r.v, out, lse, true);
    if (m.hopper.forward() && aligned16(q) && aligned16(r.k) && aligned16(r.v)) {
      kc::hopper_sparse_forward(m.elem, p, m.hopper_shape(true), m.stream);
      return;
    }
    kc::sparse_forward(m.elem, p, m.stream);
  }

  void start_backward() {
    kc::start_backward(m.elem, {out, dout, m.delta.as<float>(), m.B, m.NL, m.H, m.Dv}, m.G, dq,
                       dk, dv, m.stream, m.D);
  }

  void compute_backward(SparseBlocks which) {
    if (which == SparseBlocks::local) {
      const kc::SparseBackwardParams p = m.backward_params(m.local, q, k, v, lse, dout, dq, dk, dv);
      if (m.hopper.backward() && m.hopper.backward_reads(q, k, v, dout, m.notes)) {
        kc::hopper_sparse_backward(
            m.elem, m.hopper_backward_params(m.local, q, k, v, lse, dout, dq, dk, dv),
            m.hopper_shape(), m.stream, m.hopper.fused(), m.hopper.wide());
        return;
      }
      kc::sparse_backward(m.elem, p, m.stream);
      return;
    }
    const SlabHalves r = slab(SparseSlab::receive), g = slab(SparseSlab::partial);
    const kc::SparseBackwardParams p = m.backward_params(
        m.remote, q, r.k, r.v, lse, dout, dq, static_cast<float*>(g.k), static_cast<float*>(g.v));
    if (m.hopper.backward() && aligned16(q) && aligned16(dout) && aligned16(r.k) &&
        aligned16(r.v)) {
      kc::hopper_sparse_backward(
          m.elem,
          m.hopper_backward_params(m.remote, q, r.k, r.v, lse, dout, dq, static_cast<float*>(g.k),
                                   static_cast<float*>(g.v)),
          m.hopper_shape(true), m.stream, m.hopper.fused(), m.hopper.wide());
      return;
    }
    kc::sparse_backward(m.elem, p, m.stream);
  }

  void clear_partials() {
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(m.grad_buf.get(), 0, m.grad_buf.bytes(), m.stream));
  }

  // Launch s adds each (head, block)'s s-th returned partial (peers ascending): no launch
  // names a row twice, and every sum is taken in the same order.
  void add_returned() {
    for (std::size_t s = 0; s < m.ret_slots.size(); ++s) {
      kc::PackParams pp;
      pp.runs = m.ret_runs.as<kc::PackedRun>() + m.ret_slots[s].first;
      pp.n_runs = m.ret_slots[s].second;
      pp.total_rows = m.ret_slot_rows[s];
      pp.buffer_rows = m.send_rows;
      pp.head_dim = m.D;
      pp.head_dim_v = m.Dv;
      kc::launch_unpack_add_rows(pp, m.ret_buf.as<float>(), dk, dv, false, m.stream);
    }
  }
};

CudaSparsePlan::CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                               CudaPlanOptions opts)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(cfg, std::move(lists), opts);
  finish_construction();
}

CudaSparsePlan::CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                               ring::Communicator& comm, CudaPlanOptions opts,
                               ring::RingOptions ring_opts)
    : impl_(std::make_unique<Impl>()) {
  if (comm.size() > 1 && comm.memory_space() != ring::MemorySpace::device)
    throw InputError("device", "'cuda' with several ranks needs a device communicator (NCCL)");
  impl_->init(cfg, std::move(lists), opts);
  Impl& m = *impl_;
  m.comm = &comm;
  m.me = comm.rank();
  m.world = comm.size();
  m.protocol = SparseProtocol(m.w, &comm, ring_opts);
  finish_construction(ring_opts.timeout_s);
}

void CudaSparsePlan::finish_construction(double timeout_s) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  if (m.elem != kc::Elem::fp32) {
    const std::string why = kc::sparse_kernels_fit(
        std::max(m.cfg.shape.head_dim, m.cfg.effective_head_dim_v()), m.elem, m.opts.device);
    if (!why.empty()) {
      m.notes.push_back(why + "; running the fp32 kernels instead");
      m.opts.dtype = DeviceDType::fp32;
      m.elem = kc::Elem::fp32;
    }
  }
  RINGATTN_CUDA_CHECK(cudaStreamCreate(&m.stream));
  kc::register_stream(m.stream, m.opts.timeout_s);
  // Device blocks own kQueryTile query rows (kKeyTile key rows); CPU tiles are one block of
  // any size, so items cut them into such pieces. A block smaller than 64 rows leaves part
  // of its device block idle: merging several query blocks into one device tile would need a
  // per-row mask, since neighbouring blocks list different keys.
  static_assert(kc::kQueryTile == kc::kKeyTile, "one item size for both passes");
  m.build(m.opts);
  if (m.world > 1)
    m.ex =
        std::make_unique<ring::StreamExchanges>(*m.comm, m.stream, m.opts.device, timeout_s, false);
  if (m.opts.kernel == KernelChoice::automatic || m.opts.kernel == KernelChoice::hopper)
    m.choose_hopper(m.opts.kernel == KernelChoice::automatic);
  // The native kernels' caveat where they may run the job's features: not where the sm_90a
  // kernels take both passes.
  if (std::string n = native_unverified_note(m.cfg, "the native block-sparse kernels");
      !n.empty() && !(m.hopper.forward() && m.hopper.backward()))
    m.notes.push_back(std::move(n));
  // The host lists go out of scope: the copies must have landed.
  kc::wait_for_stream(m.stream, "the block-sparse plan's uploads");
}

CudaSparsePlan::~CudaSparsePlan() = default;
CudaSparsePlan::CudaSparsePlan(CudaSparsePlan&&) noexcept = default;
CudaSparsePlan& CudaSparsePlan::operator=(CudaSparsePlan&&) noexcept = default;

const AttentionConfig& CudaSparsePlan::config() const noexcept { return impl_->cfg; }
DeviceDType CudaSparsePlan::dtype() const noexcept { return impl_->opts.dtype; }
const std::vector<std::string>& CudaSparsePlan::notes() const noexcept { return impl_->notes; }
std::string CudaSparsePlan::kernel_name() const { return impl_->hopper.forward_name(); }
std::string CudaSparsePlan::backward_kernel_name() const { return impl_->hopper.backward_name(); }
const ring::ShardLayout& CudaSparsePlan::layout() const noexcept { return impl_->layout; }
const ring::RingTimings& CudaSparsePlan::last_forward() const noexcept { return impl_->fwd; }
const ring::RingTimings& CudaSparsePlan::last_backward() const noexcept { return impl_->bwd; }

int CudaSparsePlan::peers() const noexcept { return impl_->w.peers(); }

std::size_t CudaSparsePlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t b = m.local.bytes() + m.remote.bytes();
  for (const kc::DeviceAllocation* a :
       {&m.delta, &m.send_buf, &m.recv_buf, &m.grad_buf, &m.ret_buf, &m.send_runs, &m.ret_runs})
    b += a->bytes();
  return b;
}

std::string CudaSparsePlan::device_description() const {
  const CudaDeviceStatus& d = impl_->device;
  return d.name + " (sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) + ")";
}

void* CudaSparsePlan::stream() const noexcept { return impl_->stream; }

void CudaSparsePlan::synchronize() {
  const kc::ScopedDevice on(impl_->opts.device);
  kc::wait_for_stream(impl_->stream, "the block-sparse work");
}

void CudaSparsePlan::forward(const void* q, const void* k, const void* v, float* out, float* lse) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  m.hopper.time_forward(
      m.stream, [&] { m.run_forward(q, k, v, out, lse); }, m.notes);
  m.run_forward(q, k, v, out, lse);
}

void CudaSparsePlan::Impl::run_forward(const void* q, const void* k, const void* v, float* out,
                                       float* lse) {
  Impl& m = *this;
  m.fwd = {};
  if (m.ex) m.ex->start_call();
  Impl::Device dev{m};
  dev.q = q;
  dev.k = k;
  dev.v = v;
  dev.out = out;
  dev.lse = lse;
  m.protocol.forward(dev, m.fwd);
  if (m.ex) m.ex->finish_call(m.fwd);
}

void CudaSparsePlan::backward(const void* q, const void* k, const void* v, const float* out,
                              const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  const kc::ScopedDevice on(m.opts.device);
  const kc::FormChooser::Call call = m.hopper.backward_call(
      m.stream, dq, true, [&] { m.run_backward(q, k, v, out, lse, dout, dq, dk, dv); }, m.notes);
  m.run_backward(q, k, v, out, lse, dout, dq, dk, dv);
}

void CudaSparsePlan::Impl::run_backward(const void* q, const void* k, const void* v,
                                        const float* out, const float* lse, const void* dout,
                                        float* dq, float* dk, float* dv) {
  Impl& m = *this;
  m.bwd = {};
  if (m.ex) m.ex->start_call();
  Impl::Device dev{m};
  dev.q = q;
  dev.k = k;
  dev.v = v;
  dev.out = const_cast<float*>(out);  // read only in the backward
  dev.lse = const_cast<float*>(lse);
  dev.dout = dout;
  dev.dq = dq;
  dev.dk = dk;
  dev.dv = dv;
  m.protocol.backward(dev, m.bwd);
  if (m.ex) m.ex->finish_call(m.bwd);
}

}  // namespace ringattn::sparse

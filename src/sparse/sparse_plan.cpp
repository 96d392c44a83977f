// SparsePlan: this rank's block-sparse work (rank_work.hpp), built once, run on the host by
// the exchange of sparse_protocol.hpp. Its backend packs and adds slabs with OpenMP, waits on
// the communication thread and runs the CPU block-sparse kernels; calls allocate nothing.
#include "sparse/sparse_plan.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "kernels/cpu_block_sparse.hpp"
#include "ring/host_exchanges.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/tensor.hpp"
#include "single/schedule.hpp"
#include "sparse/rank_work.hpp"
#include "sparse/sparse_protocol.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn::sparse {

namespace {

void check_lists(const AttentionConfig& cfg, const BlockLists& l) {
  const Shape4& s = cfg.shape;
  if (l.heads != s.heads || l.block_size != cfg.block_size || l.blocks * l.block_size != s.seq_len)
    throw std::invalid_argument("SparsePlan: block lists are for H=" + std::to_string(l.heads) +
                                ", bs=" + std::to_string(l.block_size) + ", nb=" +
                                std::to_string(l.blocks) + ", not for this configuration");
}

}  // namespace

ring::ShardLayout sparse_layout(const AttentionConfig& cfg, int world) {
  const int64_t n = cfg.shape.seq_len, bs = cfg.block_size;
  if (world < 1) throw InputError("ranks", "world size must be at least 1");
  const int64_t per_rank = n / world;
  if (n % world != 0 || per_rank % bs != 0)
    throw InputError(n % world != 0 ? "config.shape.seq_len" : "config.block_size",
                     std::to_string(n) + " tokens in blocks of " + std::to_string(bs) +
                         " cannot be split over " + std::to_string(world) +
                         " ranks in whole blocks (N/P must be a multiple of the block size)");
  ring::ShardLayout l;
  l.world = world;
  l.seq_len = n;
  l.local_len = per_rank;
  l.zigzag = cfg.causal && world > 1 && (per_rank / 2) % bs == 0 && per_rank % 2 == 0;
  return l;
}

std::vector<double> attended_pairs_by_rank(const BlockLists& lists, const ring::ShardLayout& layout,
                                           const AttentionConfig& cfg) {
  const int64_t bs = lists.block_size;
  std::vector<double> by_rank(static_cast<std::size_t>(layout.world), 0.0);
  for (int r = 0; r < layout.world; ++r)
    for (const ring::Chunk& c : layout.chunks(r))
      for (int64_t i = c.begin / bs; i < (c.begin + c.length) / bs; ++i)
        for (int64_t h = 0; h < lists.heads; ++h)
          for (int32_t j : lists.of_head(h).row(i))
            by_rank[static_cast<std::size_t>(r)] +=
                static_cast<double>(allowed_token_pairs(cfg, bs, i, j));
  return by_rank;
}

int64_t minimum_bytes_sent(const AttentionConfig& cfg, const BlockLists& lists,
                           const ring::ShardLayout& layout, int rank) {
  const Shape4& s = cfg.shape;
  const auto owners = block_owners(layout, lists.blocks, lists.block_size);
  std::vector<BlockCsr> cols;
  for (const BlockCsr& c : lists.lists) cols.push_back(transpose(c, lists.blocks));
  int64_t sends = 0;
  std::vector<char> needs(static_cast<std::size_t>(layout.world));
  const int64_t per_kv = cfg.queries_per_kv_head();
  // A K/V head's key block goes once to each rank owning a query block that some query head
  // sharing it attends, with at least one token pair the dense rule allows.
  for (int64_t g = 0; g < cfg.effective_kv_heads(); ++g)
    for (int64_t j = 0; j < lists.blocks; ++j) {
      if (owners[static_cast<std::size_t>(j)].rank != rank) continue;
      std::fill(needs.begin(), needs.end(), 0);
      for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h) {
        const BlockCsr& t =
            cols[static_cast<std::size_t>(lists.head_list[static_cast<std::size_t>(h)])];
        for (int32_t i : t.row(j))
          if (allowed_token_pairs(cfg, lists.block_size, i, j) > 0)
            needs[static_cast<std::size_t>(owners[static_cast<std::size_t>(i)].rank)] = 1;
      }
      needs[static_cast<std::size_t>(rank)] = 0;
      for (char c : needs) sends += c;
    }
  return sends * s.batch * lists.block_size * (s.head_dim + cfg.effective_head_dim_v()) *
         static_cast<int64_t>(sizeof(float));
}

struct SparsePlan::Impl {
  AttentionConfig cfg;
  std::shared_ptr<const BlockLists> lists;
  int threads = 1, me = 0, world = 1;
  kernels::TileConfig tiles;
  ring::ShardLayout layout;
  int64_t bs = 0, B = 0, H = 0, G = 0, D = 0, Dv = 0, NL = 0;  // G: K/V heads, Dv: v's head dim

  RankSparseWork w;  // the exchange and the work lists (rank_work.hpp)
  std::vector<kernels::SparseKeyTile> split_local_ktiles, split_remote_ktiles;

  std::unique_ptr<float[], AlignedFree> workspace, send_k, send_v, recv_k, recv_v, grad_k, grad_v,
      ret_k, ret_v, delta;
  std::size_t workspace_floats = 0;
  ring::HostExchanges exchanges;  // after the slabs: its thread ends before they go
  SparseProtocol protocol;
  ring::RingTimings fwd, bwd;

  single::RowStrides q_rows, kv_rows;  // the local shard's rows in the config's layout
  int64_t q_row(int64_t b, int64_t local_row, int64_t h) const {
    return q_rows.at(b, local_row, h);
  }
  int64_t kv_row(int64_t b, int64_t local_row, int64_t g) const {
    return kv_rows.at(b, local_row, g);
  }
  int64_t lse_at(int64_t b, int64_t h, int64_t local_row) const {
    return (b * H + h) * NL + local_row;
  }
  // K (dK) slabs are [rows, D], V (dV) slabs [rows, Dv], with the same rows: the V offset of
  // a K offset is kernels::value_floats of it (v_floats).
  int64_t slab(int64_t entry, int64_t b) const { return (entry * B + b) * bs * D; }
  int64_t slab_floats(int64_t entries) const { return entries * B * bs * D; }
  int64_t v_floats(int64_t k_floats) const { return kernels::value_floats(k_floats, D, Dv); }

  // Most expensive tiles first, for the dynamic schedule.
  void sort_by_cost() {
    auto cost_q = [](const std::vector<kernels::KeySpan>& spans) {
      return [&spans](const kernels::SparseQueryTile& a, const kernels::SparseQueryTile& b) {
        int64_t ca = 0, cb = 0;
        for (int64_t s = a.first_span; s < a.first_span + a.n_spans; ++s)
          ca += spans[static_cast<std::size_t>(s)].n_k;
        for (int64_t s = b.first_span; s < b.first_span + b.n_spans; ++s)
          cb += spans[static_cast<std::size_t>(s)].n_k;
        return ca > cb;
      };
    };
    auto cost_k = [](const std::vector<kernels::QuerySpan>& spans) {
      return [&spans](const kernels::SparseKeyTile& a, const kernels::SparseKeyTile& b) {
        int64_t ca = 0, cb = 0;
        for (int64_t s = a.first_span; s < a.first_span + a.n_spans; ++s)
          ca += spans[static_cast<std::size_t>(s)].n_q;
        for (int64_t s = b.first_span; s < b.first_span + b.n_spans; ++s)
          cb += spans[static_cast<std::size_t>(s)].n_q;
        return ca > cb;
      };
    };
    std::stable_sort(w.local_tiles.begin(), w.local_tiles.end(), cost_q(w.local_spans));
    std::stable_sort(w.remote_tiles.begin(), w.remote_tiles.end(), cost_q(w.remote_spans));
    std::stable_sort(w.bwd_local_tiles.begin(), w.bwd_local_tiles.end(), cost_q(w.bwd_local_spans));
    std::stable_sort(w.bwd_remote_tiles.begin(), w.bwd_remote_tiles.end(),
                     cost_q(w.bwd_remote_spans));
    // The fused backward walks the key tiles in task order; the split one takes them most
    // expensive first (the order of tiles changes no bit: one writer per row).
    split_local_ktiles = w.local_ktiles;
    split_remote_ktiles = w.remote_ktiles;
    std::stable_sort(split_local_ktiles.begin(), split_local_ktiles.end(), cost_k(w.local_qspans));
    std::stable_sort(split_remote_ktiles.begin(), split_remote_ktiles.end(),
                     cost_k(w.remote_qspans));
  }

  kernels::SparseParams params() const {
    kernels::SparseParams p;
    p.head_dim = D;
    p.head_dim_v = Dv;
    p.q_stride = q_rows.position;
    p.lse_stride = 1;
    p.scale = static_cast<float>(cfg.effective_scale());
    p.softcap = static_cast<float>(cfg.softcap);
    p.causal = cfg.causal;
    const WindowLimits win = kernel_window(cfg);
    p.window_left = win.left;
    p.window_right = win.right;
    return p;
  }

  // One phase of the backward (the local blocks, or the received ones): fused (5 products
  // per tile pair) when there are at least as many (batch, K/V head) tasks as threads, else
  // split into a dQ pass over query tiles and a dK/dV pass over key tiles (7 products, every
  // thread busy). Both give the same bits (cpu_block_sparse.hpp), so the result does not
  // depend on the thread count.
  void backward_pass(const kernels::SparseParams& p, bool local) {
    if (B * G >= threads) {
      kernels::sparse_backward_fused(
          p, local ? w.local_ktiles : w.remote_ktiles, local ? w.local_qspans : w.remote_qspans,
          local ? w.local_task_ptr : w.remote_task_ptr, tiles, threads, workspace.get());
      return;
    }
    kernels::sparse_backward_dq(p, local ? w.bwd_local_tiles : w.bwd_remote_tiles,
                                local ? w.bwd_local_spans : w.bwd_remote_spans, tiles, threads,
                                workspace.get());
    kernels::sparse_backward_dkdv(p, local ? split_local_ktiles : split_remote_ktiles,
                                  local ? w.local_qspans : w.remote_qspans, tiles, threads,
                                  workspace.get());
  }

  struct Host;
};

// The protocol's backend for one call: the plan's slabs and lists, the call's tensors, and
// its timings (kernels, packing and adding count as compute).
struct SparsePlan::Impl::Host {
  Impl& m;
  ring::RingTimings& tm;
  const float *k = nullptr, *v = nullptr, *out = nullptr;
  float *dk = nullptr, *dv = nullptr;
  kernels::SparseParams p{};  // the call's fixed parameters

  int64_t entry_elems() const { return m.slab_floats(1); }
  int64_t value_entry_elems() const { return m.v_floats(m.slab_floats(1)); }
  std::size_t kv_elem_bytes() const { return sizeof(float); }

  SlabHalves slab(SparseSlab which) const {
    switch (which) {
      case SparseSlab::send:
        return {m.send_k.get(), m.send_v.get()};
      case SparseSlab::receive:
        return {m.recv_k.get(), m.recv_v.get()};
      case SparseSlab::partial:
        return {m.grad_k.get(), m.grad_v.get()};
      case SparseSlab::returned:
        break;
    }
    return {m.ret_k.get(), m.ret_v.get()};
  }

  void pack() {
    const ring::ScopedMs timer(tm.compute_ms);
    const RankSparseWork& w = m.w;
    const auto n = static_cast<int64_t>(w.send_entries.size());
    const auto k_bytes = sizeof(float) * static_cast<std::size_t>(m.D);
    const auto v_bytes = sizeof(float) * static_cast<std::size_t>(m.Dv);
#pragma omp parallel for num_threads(m.threads) schedule(static)
    for (int64_t e = 0; e < n; ++e) {
      const Entry& en = w.send_entries[static_cast<std::size_t>(e)];
      const int64_t lr = w.owners[static_cast<std::size_t>(en.block)].local_row;
      for (int64_t b = 0; b < m.B; ++b)
        for (int64_t r = 0; r < m.bs; ++r) {
          const int64_t src = m.kv_row(b, lr + r, en.head), dst = m.slab(e, b) + r * m.D;
          std::memcpy(m.send_k.get() + dst, k + src, k_bytes);
          std::memcpy(m.send_v.get() + m.v_floats(dst), v + m.v_floats(src), v_bytes);
        }
    }
  }

  int post(std::vector<ring::Transfer> sends, std::vector<ring::Transfer> recvs, int tag, int step,
           const char* what) {
    return m.exchanges.post(std::move(sends), std::move(recvs), tag, step, what);
  }

  void wait(int ticket) { m.exchanges.wait(ticket, tm); }

  // The call's parameters over the local K/V (dK/dV into dk, dv) or over the receive slab
  // (into the partial slab).
  kernels::SparseParams over(SparseBlocks which) const {
    const bool local = which == SparseBlocks::local;
    kernels::SparseParams o = p;
    o.k = local ? k : m.recv_k.get();
    o.v = local ? v : m.recv_v.get();
    o.dk = local ? dk : m.grad_k.get();
    o.dv = local ? dv : m.grad_v.get();
    return o;
  }

  void compute_forward(SparseBlocks which) {
    const ring::ScopedMs timer(tm.compute_ms);
    const bool local = which == SparseBlocks::local;
    kernels::SparseParams fp = over(which);
    fp.accumulate = !local;  // every row has one local query tile; remote ones merge
    kernels::sparse_forward(fp, local ? m.w.local_tiles : m.w.remote_tiles,
                            local ? m.w.local_spans : m.w.remote_spans, m.tiles, m.threads,
                            m.workspace.get());
  }

  void start_backward() {
    const ring::ScopedMs timer(tm.compute_ms);
    const auto n = static_cast<std::size_t>(m.B * m.NL * m.H * m.D);
    const auto n_k = static_cast<std::size_t>(m.B * m.NL * m.G * m.D);
    const auto n_v = static_cast<std::size_t>(m.B * m.NL * m.G * m.Dv);
    std::fill(p.dq, p.dq + n, 0.0f);
    std::fill(dk, dk + n_k, 0.0f);
    std::fill(dv, dv + n_v, 0.0f);
    // delta = rowsum(dO ∘ O) per (batch, head, row), laid out like lse.
    const int64_t rows = m.B * m.H * m.NL;
    float* delta = m.delta.get();
#pragma omp parallel for num_threads(m.threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t lr = r % m.NL, bh = r / m.NL, b = bh / m.H, h = bh % m.H;
      const int64_t row = m.v_floats(m.q_row(b, lr, h));
      const float* o = out + row;
      const float* g = p.dout + row;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t c = 0; c < m.Dv; ++c) acc += o[c] * g[c];
      delta[m.lse_at(b, h, lr)] = acc;
    }
  }

  void compute_backward(SparseBlocks which) {
    const ring::ScopedMs timer(tm.compute_ms);
    m.backward_pass(over(which), which == SparseBlocks::local);
  }

  void clear_partials() {
    const ring::ScopedMs timer(tm.compute_ms);
    const int64_t n = m.slab_floats(static_cast<int64_t>(m.w.recv_entries.size()));
    std::fill(m.grad_k.get(), m.grad_k.get() + n, 0.0f);
    std::fill(m.grad_v.get(), m.grad_v.get() + m.v_floats(n), 0.0f);
  }

  // Group g adds every returned partial of one local (head, block), peers ascending: each
  // row is summed by one thread, in the same order every run.
  void add_returned() {
    const ring::ScopedMs timer(tm.compute_ms);
    const RankSparseWork& w = m.w;
    const auto groups = static_cast<int64_t>(w.ret_group_ptr.size()) - 1;
#pragma omp parallel for num_threads(m.threads) schedule(static)
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t x = w.ret_group_ptr[static_cast<std::size_t>(gi)];
           x < w.ret_group_ptr[static_cast<std::size_t>(gi) + 1]; ++x) {
        const int64_t e = w.ret_order[static_cast<std::size_t>(x)];
        const Entry& en = w.send_entries[static_cast<std::size_t>(e)];
        const int64_t lr = w.owners[static_cast<std::size_t>(en.block)].local_row;
        for (int64_t b = 0; b < m.B; ++b)
          for (int64_t r = 0; r < m.bs; ++r) {
            const int64_t row = m.kv_row(b, lr + r, en.head), at = m.slab(e, b) + r * m.D;
            float* dkr = dk + row;
            float* dvr = dv + m.v_floats(row);
            const float* pk = m.ret_k.get() + at;
            const float* pv = m.ret_v.get() + m.v_floats(at);
            for (int64_t c = 0; c < m.D; ++c) dkr[c] += pk[c];
            for (int64_t c = 0; c < m.Dv; ++c) dvr[c] += pv[c];
          }
      }
    }
  }
};

SparsePlan::SparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                       ring::Communicator& comm, PlanOptions opts, ring::RingOptions ring_opts)
    : impl_(std::make_unique<Impl>()) {
  validate(cfg);
  if (cfg.attention != AttentionKind::block_sparse)
    throw std::invalid_argument("SparsePlan: the configuration is not block-sparse");
  check_lists(cfg, *lists);
  Impl& m = *impl_;
  m.cfg = cfg;
  m.lists = std::move(lists);
  m.me = comm.rank();
  m.world = comm.size();
  m.threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
  const Shape4& s = cfg.shape;
  m.bs = cfg.block_size;
  m.B = s.batch;
  m.H = s.heads;
  m.G = cfg.effective_kv_heads();
  m.D = s.head_dim;
  m.Dv = cfg.effective_head_dim_v();
  // A query tile is one block (or a q_tile slice of one); key spans run k_tile at a time.
  m.tiles = single::choose_tiles(
      s.head_dim, opts.q_tile > 0 ? opts.q_tile : std::min<int64_t>(128, m.bs), opts.k_tile);
  m.layout = sparse_layout(cfg, m.world);
  m.NL = m.layout.local_len;
  m.q_rows = single::row_strides(cfg.layout, m.NL, m.H, m.D);
  m.kv_rows = single::row_strides(cfg.effective_kv_layout(), m.NL, m.G, m.D);
  m.w = build_rank_sparse_work(cfg, *m.lists, m.layout, m.me);
  m.sort_by_cost();

  m.workspace_floats = kernels::sparse_workspace_floats(m.tiles, m.D, m.Dv);
  m.workspace = aligned_floats(m.workspace_floats * static_cast<std::size_t>(m.threads),
                               "block-sparse kernel workspace");
  const int64_t n_send = m.slab_floats(static_cast<int64_t>(m.w.send_entries.size()));
  const int64_t n_recv = m.slab_floats(static_cast<int64_t>(m.w.recv_entries.size()));
  const auto send_k = static_cast<std::size_t>(n_send);
  const auto send_v = static_cast<std::size_t>(m.v_floats(n_send));
  const auto recv_k = static_cast<std::size_t>(n_recv);
  const auto recv_v = static_cast<std::size_t>(m.v_floats(n_recv));
  m.send_k = aligned_floats(send_k, "block-sparse send buffer (K)");
  m.send_v = aligned_floats(send_v, "block-sparse send buffer (V)");
  m.ret_k = aligned_floats(send_k, "block-sparse returned dK partials");
  m.ret_v = aligned_floats(send_v, "block-sparse returned dV partials");
  m.recv_k = aligned_floats(recv_k, "block-sparse receive buffer (K)");
  m.recv_v = aligned_floats(recv_v, "block-sparse receive buffer (V)");
  m.grad_k = aligned_floats(recv_k, "block-sparse dK partials");
  m.grad_v = aligned_floats(recv_v, "block-sparse dV partials");
  m.delta = aligned_floats(static_cast<std::size_t>(m.B * m.H * m.NL), "block-sparse delta rows");
  m.protocol = SparseProtocol(m.w, &comm, ring_opts);
  m.exchanges = ring::HostExchanges(comm, ring_opts.timeout_s);
}

SparsePlan::~SparsePlan() = default;

const ring::ShardLayout& SparsePlan::layout() const noexcept { return impl_->layout; }
int SparsePlan::threads() const noexcept { return impl_->threads; }
const BlockLists& SparsePlan::lists() const noexcept { return *impl_->lists; }
const ring::RingTimings& SparsePlan::last_forward() const noexcept { return impl_->fwd; }
const ring::RingTimings& SparsePlan::last_backward() const noexcept { return impl_->bwd; }
int SparsePlan::peers() const noexcept { return impl_->w.peers(); }

std::size_t SparsePlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  const int64_t slabs =
      m.slab_floats(static_cast<int64_t>(m.w.send_entries.size() + m.w.recv_entries.size()));
  std::size_t floats = m.workspace_floats * static_cast<std::size_t>(m.threads) +
                       2 * static_cast<std::size_t>(slabs + m.v_floats(slabs)) +
                       static_cast<std::size_t>(m.B * m.H * m.NL);
  std::size_t work =
      (m.w.local_tiles.size() + m.w.remote_tiles.size()) * sizeof(kernels::SparseQueryTile) +
      (m.w.local_spans.size() + m.w.remote_spans.size()) * sizeof(kernels::KeySpan) +
      (m.w.local_ktiles.size() + m.w.remote_ktiles.size()) * sizeof(kernels::SparseKeyTile) +
      (m.w.local_qspans.size() + m.w.remote_qspans.size()) * sizeof(kernels::QuerySpan);
  return floats * sizeof(float) + work + m.lists->bytes();
}

void SparsePlan::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  Impl& m = *impl_;
  m.fwd = {};
  Impl::Host host{m, m.fwd};
  host.k = k;
  host.v = v;
  host.p = m.params();
  host.p.q = q;
  host.p.out = out;
  host.p.lse = lse;
  m.protocol.forward(host, m.fwd);
}

void SparsePlan::backward(const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  m.bwd = {};
  Impl::Host host{m, m.bwd};
  host.k = k;
  host.v = v;
  host.out = out;
  host.dk = dk;
  host.dv = dv;
  host.p = m.params();
  host.p.q = q;
  host.p.lse = const_cast<float*>(lse);  // read only in the backward
  host.p.delta = m.delta.get();
  host.p.dout = dout;
  host.p.dq = dq;
  m.protocol.backward(host, m.bwd);
}

}  // namespace ringattn::sparse

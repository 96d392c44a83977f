// The block-sparse plan: from the block lists it derives, once, this rank's query tiles and
// key spans (local rows and received rows), the key tiles and query spans of the dK/dV pass,
// and the exact set of (head, block) K/V rows to exchange with each peer. Calls then pack,
// post one grouped exchange, compute the local part while it flies, and finish with the
// remote part; they allocate nothing.
#include "sparse/sparse_plan.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu_block_sparse.hpp"
#include "ring/progress_thread.hpp"
#include "ring/schedule.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/tensor.hpp"

namespace ringattn::sparse {

namespace {

// Tags apart from the ring engine's (step * 4 + kind).
enum Tag { kFwdKv = 1 << 20, kBwdKv, kGradReturn };

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Owner {
  int rank = 0;
  int64_t local_row = 0;  // first local row of the block on its owner
};

std::vector<Owner> block_owners(const ring::ShardLayout& l, int64_t blocks, int64_t bs) {
  std::vector<Owner> o(static_cast<std::size_t>(blocks));
  for (int r = 0; r < l.world; ++r)
    for (const ring::Chunk& c : l.chunks(r))
      for (int64_t p = c.begin; p < c.begin + c.length; p += bs)
        o[static_cast<std::size_t>(p / bs)] = {r, c.local_begin + (p - c.begin)};
  return o;
}

// One (head, key block) whose K/V rows (every batch) travel between two ranks.
struct Entry {
  int peer = 0;
  int32_t head = 0, block = 0;
  auto operator<=>(const Entry&) const = default;
};

struct PeerRange {
  int peer = 0;
  int64_t first = 0, count = 0;  // entries
};

std::vector<PeerRange> ranges_of(const std::vector<Entry>& entries) {
  std::vector<PeerRange> r;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (r.empty() || r.back().peer != entries[i].peer)
      r.push_back({entries[i].peer, static_cast<int64_t>(i), 0});
    ++r.back().count;
  }
  return r;
}

void check_lists(const AttentionConfig& cfg, const BlockLists& l) {
  const Shape4& s = cfg.shape;
  if (l.heads != s.heads || l.block_size != cfg.block_size ||
      l.blocks * l.block_size != s.seq_len)
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
    throw InputError(n % world != 0 ? "--seq-len" : "--block-size",
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

int64_t minimum_bytes_sent(const AttentionConfig& cfg, const BlockLists& lists,
                           const ring::ShardLayout& layout, int rank) {
  const Shape4& s = cfg.shape;
  const auto owners = block_owners(layout, lists.blocks, lists.block_size);
  std::vector<BlockCsr> cols;
  for (const BlockCsr& c : lists.lists) cols.push_back(transpose(c, lists.blocks));
  int64_t sends = 0;
  std::vector<char> needs(static_cast<std::size_t>(layout.world));
  for (int64_t h = 0; h < s.heads; ++h) {
    const BlockCsr& t = cols[static_cast<std::size_t>(lists.head_list[static_cast<std::size_t>(h)])];
    for (int64_t j = 0; j < lists.blocks; ++j) {
      if (owners[static_cast<std::size_t>(j)].rank != rank) continue;
      std::fill(needs.begin(), needs.end(), 0);
      for (int32_t i : t.row(j))
        if (!cfg.causal || j <= i) needs[static_cast<std::size_t>(owners[static_cast<std::size_t>(i)].rank)] = 1;
      needs[static_cast<std::size_t>(rank)] = 0;
      for (char c : needs) sends += c;
    }
  }
  return sends * 2 * s.batch * lists.block_size * s.head_dim * static_cast<int64_t>(sizeof(float));
}

struct SparsePlan::Impl {
  AttentionConfig cfg;
  std::shared_ptr<const BlockLists> lists;
  ring::Communicator* comm = nullptr;
  int threads = 1, me = 0, world = 1;
  kernels::TileConfig tiles;
  ring::ShardLayout layout;
  std::vector<Owner> owners;
  int64_t bs = 0, B = 0, H = 0, D = 0, NL = 0;

  // Forward and dQ work: every local query tile with its local spans; the tiles with
  // remote spans again, with those.
  std::vector<kernels::SparseQueryTile> local_tiles, remote_tiles;
  std::vector<kernels::KeySpan> local_spans, remote_spans;
  // dK/dV work: local key tiles, and received key tiles (into the gradient buffers).
  std::vector<kernels::SparseKeyTile> local_ktiles, remote_ktiles;
  std::vector<kernels::QuerySpan> local_qspans, remote_qspans;

  std::vector<Entry> recv_entries, send_entries;
  std::vector<PeerRange> recv_ranges, send_ranges;
  // Returned partials: send entries grouped by the local (head, block) they add into.
  std::vector<int64_t> ret_order, ret_group_ptr;

  std::unique_ptr<float[], AlignedFree> workspace, send_k, send_v, recv_k, recv_v, grad_k, grad_v,
      ret_k, ret_v, delta;
  std::size_t workspace_floats = 0;
  std::unique_ptr<ring::ProgressThread> progress;
  ring::FaultInjection fault;
  ring::RingTimings fwd, bwd;

  int64_t row(int64_t b, int64_t local_row, int64_t h) const {
    return ((b * NL + local_row) * H + h) * D;
  }
  int64_t lse_at(int64_t b, int64_t h, int64_t local_row) const {
    return (b * H + h) * NL + local_row;
  }
  int64_t slab(int64_t entry, int64_t b) const { return (entry * B + b) * bs * D; }
  int64_t slab_floats(int64_t entries) const { return entries * B * bs * D; }

  int64_t find_recv(int peer, int64_t h, int64_t j) const {
    const Entry key{peer, static_cast<int32_t>(h), static_cast<int32_t>(j)};
    const auto it = std::lower_bound(recv_entries.begin(), recv_entries.end(), key);
    return it - recv_entries.begin();
  }

  void build_exchange() {
    const BlockLists& l = *lists;
    for (int64_t h = 0; h < H; ++h) {
      const BlockCsr& c = l.of_head(h);
      for (int64_t i = 0; i < l.blocks; ++i) {
        const int qr = owners[static_cast<std::size_t>(i)].rank;
        for (int32_t j : c.row(i)) {
          if (cfg.causal && j > i) break;  // rows are sorted
          const int kr = owners[static_cast<std::size_t>(j)].rank;
          if (qr == kr) continue;
          if (qr == me) recv_entries.push_back({kr, static_cast<int32_t>(h), j});
          if (kr == me) send_entries.push_back({qr, static_cast<int32_t>(h), j});
        }
      }
    }
    for (auto* e : {&recv_entries, &send_entries}) {
      std::sort(e->begin(), e->end());
      e->erase(std::unique(e->begin(), e->end()), e->end());
    }
    recv_ranges = ranges_of(recv_entries);
    send_ranges = ranges_of(send_entries);
    // Group the send entries by the local rows their returned partials add into, peers in
    // order, so the sum is deterministic and groups can run in parallel.
    ret_order.resize(send_entries.size());
    for (std::size_t i = 0; i < ret_order.size(); ++i) ret_order[i] = static_cast<int64_t>(i);
    std::sort(ret_order.begin(), ret_order.end(), [&](int64_t a, int64_t b) {
      const Entry& x = send_entries[static_cast<std::size_t>(a)];
      const Entry& y = send_entries[static_cast<std::size_t>(b)];
      return std::tie(x.head, x.block, x.peer) < std::tie(y.head, y.block, y.peer);
    });
    for (std::size_t i = 0; i < ret_order.size(); ++i) {
      const Entry& e = send_entries[static_cast<std::size_t>(ret_order[i])];
      const Entry* prev = i ? &send_entries[static_cast<std::size_t>(ret_order[i - 1])] : nullptr;
      if (!prev || prev->head != e.head || prev->block != e.block)
        ret_group_ptr.push_back(static_cast<int64_t>(i));
    }
    ret_group_ptr.push_back(static_cast<int64_t>(ret_order.size()));
  }

  // Appends a key span, extending the previous one of the same tile when the rows continue
  // it in memory and in position.
  static void add_key_span(std::vector<kernels::KeySpan>& spans, int64_t tile_first,
                           kernels::KeySpan s) {
    if (static_cast<int64_t>(spans.size()) > tile_first) {
      kernels::KeySpan& last = spans.back();
      if (last.k_stride == s.k_stride && last.k_row0 + last.n_k * last.k_stride == s.k_row0 &&
          last.causal_offset - last.n_k == s.causal_offset) {
        last.n_k += s.n_k;
        return;
      }
    }
    spans.push_back(s);
  }

  static void add_query_span(std::vector<kernels::QuerySpan>& spans, int64_t tile_first,
                             kernels::QuerySpan s, int64_t q_stride) {
    if (static_cast<int64_t>(spans.size()) > tile_first) {
      kernels::QuerySpan& last = spans.back();
      if (last.q_row0 + last.n_q * q_stride == s.q_row0 && last.lse0 + last.n_q == s.lse0 &&
          last.causal_offset + last.n_q == s.causal_offset) {
        last.n_q += s.n_q;
        return;
      }
    }
    spans.push_back(s);
  }

  void build_work() {
    const BlockLists& l = *lists;
    std::vector<int64_t> my_blocks;  // global blocks I own, in local order
    for (const ring::Chunk& c : layout.chunks(me))
      for (int64_t p = c.begin; p < c.begin + c.length; p += bs) my_blocks.push_back(p / bs);
    std::vector<BlockCsr> cols;
    for (const BlockCsr& c : l.lists) cols.push_back(transpose(c, l.blocks));

    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const BlockCsr& c = l.of_head(h);
        const BlockCsr& t = cols[static_cast<std::size_t>(l.head_list[static_cast<std::size_t>(h)])];
        for (int64_t i : my_blocks) {
          const int64_t lr = owners[static_cast<std::size_t>(i)].local_row;
          kernels::SparseQueryTile lt{row(b, lr, h), lse_at(b, h, lr), bs,
                                      static_cast<int64_t>(local_spans.size()), 0};
          kernels::SparseQueryTile rt = lt;
          rt.first_span = static_cast<int64_t>(remote_spans.size());
          for (int32_t j : c.row(i)) {
            if (cfg.causal && j > i) break;
            const Owner& o = owners[static_cast<std::size_t>(j)];
            const int64_t off = (i - j) * bs;
            if (o.rank == me)
              add_key_span(local_spans, lt.first_span, {row(b, o.local_row, h), H * D, bs, off});
            else
              add_key_span(remote_spans, rt.first_span,
                           {slab(find_recv(o.rank, h, j), b), D, bs, off});
          }
          lt.n_spans = static_cast<int64_t>(local_spans.size()) - lt.first_span;
          rt.n_spans = static_cast<int64_t>(remote_spans.size()) - rt.first_span;
          local_tiles.push_back(lt);  // every tile: the local pass initialises every row
          if (rt.n_spans > 0) remote_tiles.push_back(rt);
        }
        // dK/dV of my key blocks, from my query blocks.
        for (int64_t j : my_blocks) {
          const int64_t lr = owners[static_cast<std::size_t>(j)].local_row;
          kernels::SparseKeyTile kt{row(b, lr, h), H * D, bs,
                                    static_cast<int64_t>(local_qspans.size()), 0};
          for (int32_t i : t.row(j)) {
            if (cfg.causal && j > i) continue;
            const Owner& o = owners[static_cast<std::size_t>(i)];
            if (o.rank != me) continue;
            add_query_span(local_qspans, kt.first_span,
                           {row(b, o.local_row, h), lse_at(b, h, o.local_row), bs, (i - j) * bs},
                           H * D);
          }
          kt.n_spans = static_cast<int64_t>(local_qspans.size()) - kt.first_span;
          if (kt.n_spans > 0) local_ktiles.push_back(kt);
        }
      }
    // dK/dV partials of received blocks, from my query blocks.
    for (std::size_t e = 0; e < recv_entries.size(); ++e) {
      const Entry& en = recv_entries[e];
      const BlockCsr& t =
          cols[static_cast<std::size_t>(l.head_list[static_cast<std::size_t>(en.head)])];
      for (int64_t b = 0; b < B; ++b) {
        kernels::SparseKeyTile kt{slab(static_cast<int64_t>(e), b), D, bs,
                                  static_cast<int64_t>(remote_qspans.size()), 0};
        for (int32_t i : t.row(en.block)) {
          if (cfg.causal && en.block > i) continue;
          const Owner& o = owners[static_cast<std::size_t>(i)];
          if (o.rank != me) continue;
          add_query_span(remote_qspans, kt.first_span,
                         {row(b, o.local_row, en.head), lse_at(b, en.head, o.local_row), bs,
                          (i - en.block) * bs},
                         H * D);
        }
        kt.n_spans = static_cast<int64_t>(remote_qspans.size()) - kt.first_span;
        if (kt.n_spans > 0) remote_ktiles.push_back(kt);
      }
    }
    // Most expensive first, for the dynamic schedule.
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
    std::stable_sort(local_tiles.begin(), local_tiles.end(), cost_q(local_spans));
    std::stable_sort(remote_tiles.begin(), remote_tiles.end(), cost_q(remote_spans));
    std::stable_sort(local_ktiles.begin(), local_ktiles.end(), cost_k(local_qspans));
    std::stable_sort(remote_ktiles.begin(), remote_ktiles.end(), cost_k(remote_qspans));
  }

  void pack(const float* k, const float* v) {
    const auto n = static_cast<int64_t>(send_entries.size());
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t e = 0; e < n; ++e) {
      const Entry& en = send_entries[static_cast<std::size_t>(e)];
      const int64_t lr = owners[static_cast<std::size_t>(en.block)].local_row;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t r = 0; r < bs; ++r) {
          const int64_t src = row(b, lr + r, en.head), dst = slab(e, b) + r * D;
          std::memcpy(send_k.get() + dst, k + src, sizeof(float) * static_cast<std::size_t>(D));
          std::memcpy(send_v.get() + dst, v + src, sizeof(float) * static_cast<std::size_t>(D));
        }
    }
  }

  // Posts K and V of each peer's range, from `kb`/`vb` laid out by `from` ranges, into
  // `rk`/`rv` laid out by `into` ranges.
  int post(const std::vector<PeerRange>& from, float* kb, float* vb,
           const std::vector<PeerRange>& into, float* rk, float* rv, int tag, int64_t& bytes,
           const char* what) {
    fault.stall_if_due(me, 1, *comm);
    std::vector<ring::Transfer> sends, recvs;
    for (const PeerRange& r : from) {
      const auto n = static_cast<std::size_t>(slab_floats(r.count)) * sizeof(float);
      sends.push_back({r.peer, kb + slab(r.first, 0), n});
      sends.push_back({r.peer, vb + slab(r.first, 0), n});
      bytes += 2 * static_cast<int64_t>(n);
    }
    for (const PeerRange& r : into) {
      const auto n = static_cast<std::size_t>(slab_floats(r.count)) * sizeof(float);
      recvs.push_back({r.peer, rk + slab(r.first, 0), n});
      recvs.push_back({r.peer, rv + slab(r.first, 0), n});
    }
    return progress->post(std::move(sends), std::move(recvs), tag, 1, what);
  }

  void wait(int ticket, ring::RingTimings& tm) {
    const auto t0 = std::chrono::steady_clock::now();
    tm.comm_ms += progress->wait(ticket);
    tm.exposed_ms += ms_since(t0);
  }

  kernels::SparseParams params() const {
    kernels::SparseParams p;
    p.head_dim = D;
    p.q_stride = H * D;
    p.lse_stride = 1;
    p.scale = static_cast<float>(cfg.effective_scale());
    p.causal = cfg.causal;
    return p;
  }

  bool exchanges() const { return !send_entries.empty() || !recv_entries.empty(); }
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
  m.comm = &comm;
  m.me = comm.rank();
  m.world = comm.size();
  m.threads = opts.threads > 0 ? opts.threads : omp_get_max_threads();
  const Shape4& s = cfg.shape;
  m.bs = cfg.block_size;
  m.B = s.batch;
  m.H = s.heads;
  m.D = s.head_dim;
  // A query tile is one block (or a q_tile slice of one); key spans run k_tile at a time.
  m.tiles = ring::choose_tiles(s.head_dim, opts.q_tile > 0 ? opts.q_tile : std::min<int64_t>(128, m.bs),
                               opts.k_tile);
  m.layout = sparse_layout(cfg, m.world);
  m.NL = m.layout.local_len;
  m.owners = block_owners(m.layout, m.lists->blocks, m.bs);
  m.build_exchange();
  m.build_work();

  m.workspace_floats = kernels::sparse_workspace_floats(m.tiles, m.D);
  m.workspace = aligned_floats(m.workspace_floats * static_cast<std::size_t>(m.threads),
                               "block-sparse kernel workspace");
  const auto n_send = static_cast<std::size_t>(m.slab_floats(static_cast<int64_t>(m.send_entries.size())));
  const auto n_recv = static_cast<std::size_t>(m.slab_floats(static_cast<int64_t>(m.recv_entries.size())));
  m.send_k = aligned_floats(n_send, "block-sparse send buffer (K)");
  m.send_v = aligned_floats(n_send, "block-sparse send buffer (V)");
  m.ret_k = aligned_floats(n_send, "block-sparse returned dK partials");
  m.ret_v = aligned_floats(n_send, "block-sparse returned dV partials");
  m.recv_k = aligned_floats(n_recv, "block-sparse receive buffer (K)");
  m.recv_v = aligned_floats(n_recv, "block-sparse receive buffer (V)");
  m.grad_k = aligned_floats(n_recv, "block-sparse dK partials");
  m.grad_v = aligned_floats(n_recv, "block-sparse dV partials");
  m.delta = aligned_floats(static_cast<std::size_t>(m.B * m.H * m.NL), "block-sparse delta rows");
  m.fault = ring_opts.fault;
  if (m.world > 1) m.progress = std::make_unique<ring::ProgressThread>(comm, ring_opts.timeout_s);
}

SparsePlan::~SparsePlan() = default;

const ring::ShardLayout& SparsePlan::layout() const noexcept { return impl_->layout; }
int SparsePlan::threads() const noexcept { return impl_->threads; }
const BlockLists& SparsePlan::lists() const noexcept { return *impl_->lists; }
const ring::RingTimings& SparsePlan::last_forward() const noexcept { return impl_->fwd; }
const ring::RingTimings& SparsePlan::last_backward() const noexcept { return impl_->bwd; }
int SparsePlan::peers() const noexcept {
  std::vector<int> p;
  for (const auto& r : impl_->recv_ranges) p.push_back(r.peer);
  for (const auto& r : impl_->send_ranges) p.push_back(r.peer);
  std::sort(p.begin(), p.end());
  return static_cast<int>(std::unique(p.begin(), p.end()) - p.begin());
}

std::size_t SparsePlan::workspace_bytes() const noexcept {
  const Impl& m = *impl_;
  std::size_t floats = m.workspace_floats * static_cast<std::size_t>(m.threads) +
                       4 * static_cast<std::size_t>(m.slab_floats(
                               static_cast<int64_t>(m.send_entries.size() + m.recv_entries.size()))) +
                       static_cast<std::size_t>(m.B * m.H * m.NL);
  std::size_t work = (m.local_tiles.size() + m.remote_tiles.size()) * sizeof(kernels::SparseQueryTile) +
                     (m.local_spans.size() + m.remote_spans.size()) * sizeof(kernels::KeySpan) +
                     (m.local_ktiles.size() + m.remote_ktiles.size()) * sizeof(kernels::SparseKeyTile) +
                     (m.local_qspans.size() + m.remote_qspans.size()) * sizeof(kernels::QuerySpan);
  return floats * sizeof(float) + work + m.lists->bytes();
}

void SparsePlan::forward(const float* q, const float* k, const float* v, float* out, float* lse) {
  Impl& m = *impl_;
  m.fwd = {};
  int ticket = -1;
  if (m.world > 1 && m.exchanges()) {
    const auto t0 = std::chrono::steady_clock::now();
    m.pack(k, v);
    m.fwd.compute_ms += ms_since(t0);
    ticket = m.post(m.send_ranges, m.send_k.get(), m.send_v.get(), m.recv_ranges, m.recv_k.get(),
                    m.recv_v.get(), kFwdKv, m.fwd.bytes_sent, "block-sparse forward K/V");
  }
  m.fault.fail_if_due(m.me, 0);
  kernels::SparseParams p = m.params();
  p.q = q;
  p.out = out;
  p.lse = lse;
  auto t0 = std::chrono::steady_clock::now();
  p.k = k;
  p.v = v;
  kernels::sparse_forward(p, m.local_tiles, m.local_spans, m.tiles, m.threads, m.workspace.get());
  m.fwd.compute_ms += ms_since(t0);
  if (ticket >= 0) {
    m.wait(ticket, m.fwd);
    m.fault.fail_if_due(m.me, 1);
    t0 = std::chrono::steady_clock::now();
    p.k = m.recv_k.get();
    p.v = m.recv_v.get();
    p.accumulate = true;
    kernels::sparse_forward(p, m.remote_tiles, m.remote_spans, m.tiles, m.threads,
                            m.workspace.get());
    m.fwd.compute_ms += ms_since(t0);
  }
}

void SparsePlan::backward(const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  Impl& m = *impl_;
  m.bwd = {};
  const auto n = static_cast<std::size_t>(m.B * m.NL * m.H * m.D);
  int ticket = -1;
  auto t0 = std::chrono::steady_clock::now();
  if (m.world > 1 && m.exchanges()) {
    m.pack(k, v);
    ticket = m.post(m.send_ranges, m.send_k.get(), m.send_v.get(), m.recv_ranges, m.recv_k.get(),
                    m.recv_v.get(), kBwdKv, m.bwd.bytes_sent, "block-sparse backward K/V");
  }
  std::fill(dq, dq + n, 0.0f);
  std::fill(dk, dk + n, 0.0f);
  std::fill(dv, dv + n, 0.0f);
  // delta = rowsum(dO ∘ O) per (batch, head, row), laid out like lse.
  const int64_t rows = m.B * m.NL * m.H;
  float* delta = m.delta.get();
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r % m.H, bl = r / m.H, b = bl / m.NL, lr = bl % m.NL;
    const float* o = out + r * m.D;
    const float* g = dout + r * m.D;
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t c = 0; c < m.D; ++c) acc += o[c] * g[c];
    delta[m.lse_at(b, h, lr)] = acc;
  }
  kernels::SparseParams p = m.params();
  p.q = q;
  p.lse = const_cast<float*>(lse);  // read only in the backward
  p.delta = delta;
  p.dout = dout;
  p.dq = dq;
  p.k = k;
  p.v = v;
  p.dk = dk;
  p.dv = dv;
  kernels::sparse_backward_dq(p, m.local_tiles, m.local_spans, m.tiles, m.threads,
                              m.workspace.get());
  kernels::sparse_backward_dkdv(p, m.local_ktiles, m.local_qspans, m.tiles, m.threads,
                                m.workspace.get());
  m.bwd.compute_ms += ms_since(t0);
  if (ticket < 0) return;

  m.wait(ticket, m.bwd);
  t0 = std::chrono::steady_clock::now();
  p.k = m.recv_k.get();
  p.v = m.recv_v.get();
  kernels::sparse_backward_dq(p, m.remote_tiles, m.remote_spans, m.tiles, m.threads,
                              m.workspace.get());
  const auto n_recv = static_cast<std::size_t>(m.slab_floats(static_cast<int64_t>(m.recv_entries.size())));
  std::fill(m.grad_k.get(), m.grad_k.get() + n_recv, 0.0f);
  std::fill(m.grad_v.get(), m.grad_v.get() + n_recv, 0.0f);
  p.dk = m.grad_k.get();
  p.dv = m.grad_v.get();
  kernels::sparse_backward_dkdv(p, m.remote_ktiles, m.remote_qspans, m.tiles, m.threads,
                                m.workspace.get());
  m.bwd.compute_ms += ms_since(t0);
  // Partials go back to the blocks' owners, the reverse of the K/V exchange.
  ticket = m.post(m.recv_ranges, m.grad_k.get(), m.grad_v.get(), m.send_ranges, m.ret_k.get(),
                  m.ret_v.get(), kGradReturn, m.bwd.bytes_sent, "block-sparse dK/dV return");
  m.wait(ticket, m.bwd);
  t0 = std::chrono::steady_clock::now();
  const auto groups = static_cast<int64_t>(m.ret_group_ptr.size()) - 1;
#pragma omp parallel for num_threads(m.threads) schedule(static)
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int64_t x = m.ret_group_ptr[static_cast<std::size_t>(gi)];
         x < m.ret_group_ptr[static_cast<std::size_t>(gi) + 1]; ++x) {
      const int64_t e = m.ret_order[static_cast<std::size_t>(x)];
      const Entry& en = m.send_entries[static_cast<std::size_t>(e)];
      const int64_t lr = m.owners[static_cast<std::size_t>(en.block)].local_row;
      for (int64_t b = 0; b < m.B; ++b)
        for (int64_t r = 0; r < m.bs; ++r) {
          float* dkr = dk + m.row(b, lr + r, en.head);
          float* dvr = dv + m.row(b, lr + r, en.head);
          const float* pk = m.ret_k.get() + m.slab(e, b) + r * m.D;
          const float* pv = m.ret_v.get() + m.slab(e, b) + r * m.D;
          for (int64_t c = 0; c < m.D; ++c) dkr[c] += pk[c], dvr[c] += pv[c];
        }
    }
  }
  m.bwd.compute_ms += ms_since(t0);
}

}  // namespace ringattn::sparse

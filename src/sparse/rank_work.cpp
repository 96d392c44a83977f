// build_rank_sparse_work (see rank_work.hpp): the exchange is every (query block, key block)
// pair of the lists whose blocks have different owners, deduplicated per (peer, head, block);
// the work lists then point local spans at the shard and remote spans at the slabs.
#include "sparse/rank_work.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "single/schedule.hpp"
#include "sparse/token_rule.hpp"

namespace ringattn::sparse {

std::vector<Owner> block_owners(const ring::ShardLayout& l, int64_t blocks, int64_t bs) {
  std::vector<Owner> o(static_cast<std::size_t>(blocks));
  for (int r = 0; r < l.world; ++r)
    for (const ring::Chunk& c : l.chunks(r))
      for (int64_t p = c.begin; p < c.begin + c.length; p += bs)
        o[static_cast<std::size_t>(p / bs)] = {r, c.local_begin + (p - c.begin)};
  return o;
}

void add_key_span(std::vector<kernels::KeySpan>& spans, int64_t tile_first, kernels::KeySpan s) {
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

namespace {

std::vector<PeerRange> ranges_of(const std::vector<Entry>& entries) {
  std::vector<PeerRange> r;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (r.empty() || r.back().peer != entries[i].peer)
      r.push_back({entries[i].peer, static_cast<int64_t>(i), 0});
    ++r.back().count;
  }
  return r;
}

// Items of `rows` rows (the last may be shorter) for every tile, ordered by `cost` of the
// item, largest first; ties keep tile order, so the list is the same on every build.
template <typename Cost>
std::vector<kernels::ForwardItem> items_of(int64_t n_tiles, int64_t rows_per_item,
                                           const std::vector<int64_t>& tile_rows, Cost&& cost) {
  std::vector<kernels::ForwardItem> items;
  std::vector<int64_t> costs;
  for (int64_t t = 0; t < n_tiles; ++t)
    for (int64_t r = 0; r < tile_rows[static_cast<std::size_t>(t)]; r += rows_per_item) {
      items.push_back({t, r});
      costs.push_back(cost(t, r));
    }
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<kernels::ForwardItem> sorted;
  sorted.reserve(items.size());
  for (std::size_t i : order) sorted.push_back(items[i]);
  return sorted;
}

}  // namespace

std::vector<kernels::ForwardItem> sparse_query_items(
    const std::vector<kernels::SparseQueryTile>& tiles, const std::vector<kernels::KeySpan>& spans,
    bool causal, int64_t rows_per_item) {
  std::vector<int64_t> rows(tiles.size());
  for (std::size_t t = 0; t < tiles.size(); ++t) rows[t] = tiles[t].n_q;
  return items_of(
      static_cast<int64_t>(tiles.size()), rows_per_item, rows, [&](int64_t t, int64_t i0) {
        const kernels::SparseQueryTile& qt = tiles[static_cast<std::size_t>(t)];
        const int64_t bq = std::min(rows_per_item, qt.n_q - i0);
        int64_t keys = 0;
        for (int64_t x = qt.first_span; x < qt.first_span + qt.n_spans; ++x) {
          const kernels::KeySpan& sp = spans[static_cast<std::size_t>(x)];
          keys += causal ? std::clamp<int64_t>(i0 + bq + sp.causal_offset, 0, sp.n_k) : sp.n_k;
        }
        return keys;
      });
}

std::vector<kernels::ForwardItem> sparse_key_items(const std::vector<kernels::SparseKeyTile>& tiles,
                                                   const std::vector<kernels::QuerySpan>& spans,
                                                   bool causal, int64_t rows_per_item) {
  std::vector<int64_t> rows(tiles.size());
  for (std::size_t t = 0; t < tiles.size(); ++t) rows[t] = tiles[t].n_k;
  return items_of(
      static_cast<int64_t>(tiles.size()), rows_per_item, rows, [&](int64_t t, int64_t j0) {
        const kernels::SparseKeyTile& kt = tiles[static_cast<std::size_t>(t)];
        int64_t queries = 0;
        for (int64_t x = kt.first_span; x < kt.first_span + kt.n_spans; ++x) {
          const kernels::QuerySpan& sp = spans[static_cast<std::size_t>(x)];
          const int64_t first = causal ? std::max<int64_t>(0, j0 - sp.causal_offset) : 0;
          queries += std::max<int64_t>(0, sp.n_q - first);
        }
        return queries;
      });
}

int RankSparseWork::peers() const {
  std::vector<int> p;
  for (const PeerRange& r : recv_ranges) p.push_back(r.peer);
  for (const PeerRange& r : send_ranges) p.push_back(r.peer);
  std::sort(p.begin(), p.end());
  return static_cast<int>(std::unique(p.begin(), p.end()) - p.begin());
}

RankSparseWork build_rank_sparse_work(const AttentionConfig& cfg, const BlockLists& lists,
                                      const ring::ShardLayout& layout, int me) {
  const Shape4& s = cfg.shape;
  const int64_t B = s.batch, H = s.heads, D = s.head_dim, NL = layout.local_len;
  const int64_t G = cfg.effective_kv_heads(), per_kv = cfg.queries_per_kv_head();
  const int64_t bs = lists.block_size;
  // Pairs the dense rule leaves nothing of neither travel nor get a span.
  const BlockLists reached = has_token_rule(cfg) ? within_reach(lists, cfg) : BlockLists{};
  const BlockLists& l = has_token_rule(cfg) ? reached : lists;
  // Rows of the local shard in the config's layout (a head's consecutive rows heads·D or D
  // floats apart); slabs are [rows, D] either way.
  const single::RowStrides q_rows = single::row_strides(cfg.layout, NL, H, D);
  const single::RowStrides kv_rows = single::row_strides(cfg.effective_kv_layout(), NL, G, D);
  auto row = [&](int64_t b, int64_t local_row, int64_t h) { return q_rows.at(b, local_row, h); };
  auto kv_row = [&](int64_t b, int64_t local_row, int64_t g) {
    return kv_rows.at(b, local_row, g);
  };
  const int64_t kv_stride = kv_rows.position;
  auto lse_at = [&](int64_t b, int64_t h, int64_t local_row) {
    return (b * H + h) * NL + local_row;
  };
  auto slab = [&](int64_t entry, int64_t b) { return (entry * B + b) * bs * D; };

  RankSparseWork w;
  w.owners = block_owners(layout, l.blocks, bs);
  const std::vector<Owner>& owners = w.owners;

  // The exchange: (K/V head, key block) rows, once per peer whatever the query heads sharing
  // the K/V head ask.
  for (int64_t h = 0; h < H; ++h) {
    const BlockCsr& c = l.of_head(h);
    const auto g = static_cast<int32_t>(h / per_kv);
    for (int64_t i = 0; i < l.blocks; ++i) {
      const int qr = owners[static_cast<std::size_t>(i)].rank;
      for (int32_t j : c.row(i)) {
        if (cfg.causal && j > i) break;  // rows are sorted
        const int kr = owners[static_cast<std::size_t>(j)].rank;
        if (qr == kr) continue;
        if (qr == me) w.recv_entries.push_back({kr, g, j});
        if (kr == me) w.send_entries.push_back({qr, g, j});
      }
    }
  }
  for (auto* e : {&w.recv_entries, &w.send_entries}) {
    std::sort(e->begin(), e->end());
    e->erase(std::unique(e->begin(), e->end()), e->end());
  }
  w.recv_ranges = ranges_of(w.recv_entries);
  w.send_ranges = ranges_of(w.send_entries);
  w.ret_order.resize(w.send_entries.size());
  std::iota(w.ret_order.begin(), w.ret_order.end(), int64_t{0});
  std::sort(w.ret_order.begin(), w.ret_order.end(), [&](int64_t a, int64_t b) {
    const Entry& x = w.send_entries[static_cast<std::size_t>(a)];
    const Entry& y = w.send_entries[static_cast<std::size_t>(b)];
    return std::tie(x.head, x.block, x.peer) < std::tie(y.head, y.block, y.peer);
  });
  for (std::size_t i = 0; i < w.ret_order.size(); ++i) {
    const Entry& e = w.send_entries[static_cast<std::size_t>(w.ret_order[i])];
    const Entry* prev = i ? &w.send_entries[static_cast<std::size_t>(w.ret_order[i - 1])] : nullptr;
    if (!prev || prev->head != e.head || prev->block != e.block)
      w.ret_group_ptr.push_back(static_cast<int64_t>(i));
  }
  w.ret_group_ptr.push_back(static_cast<int64_t>(w.ret_order.size()));

  auto find_recv = [&](int peer, int64_t g, int64_t j) {
    const Entry key{peer, static_cast<int32_t>(g), static_cast<int32_t>(j)};
    return std::lower_bound(w.recv_entries.begin(), w.recv_entries.end(), key) -
           w.recv_entries.begin();
  };

  // The work lists. A query tile is one block's rows within one document (the whole block
  // when unpacked); its key spans are the listed blocks' keys in that document.
  std::vector<int64_t> my_blocks;  // global blocks I own, in local order
  for (const ring::Chunk& c : layout.chunks(me))
    for (int64_t p = c.begin; p < c.begin + c.length; p += bs) my_blocks.push_back(p / bs);
  std::vector<int64_t> blocks_by_position = my_blocks;
  std::sort(blocks_by_position.begin(), blocks_by_position.end());
  std::vector<BlockCsr> cols;
  for (const BlockCsr& c : l.lists) cols.push_back(transpose(c, l.blocks));
  auto column = [&](int64_t h) -> const BlockCsr& {
    return cols[static_cast<std::size_t>(l.head_list[static_cast<std::size_t>(h)])];
  };
  // The query spans of key piece `kp` of block j, K/V head g, batch b: my query blocks of every
  // query head sharing g that list j, cut to kp's document, one span per query block piece.
  auto add_query_spans = [&](std::vector<kernels::QuerySpan>& spans, int64_t b, int64_t g,
                             int64_t j, const Piece& kp) {
    for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h)
      for (int32_t i : column(h).row(j)) {
        if (cfg.causal && j > i) continue;
        const Owner& o = owners[static_cast<std::size_t>(i)];
        if (o.rank != me) continue;
        const Piece qp = in_document_of(cfg, kp.begin, i * bs, bs);
        if (qp.size() <= 0) continue;
        const int64_t qr = o.local_row + (qp.begin - i * bs);
        spans.push_back({row(b, qr, h), lse_at(b, h, qr), qp.size(), qp.begin - kp.begin});
      }
  };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const BlockCsr& c = l.of_head(h);
      const int64_t g = h / per_kv;
      for (int64_t i : my_blocks) {
        const int64_t lr = owners[static_cast<std::size_t>(i)].local_row;
        for (const Piece& qp : document_pieces(cfg, i * bs, bs)) {
          const int64_t qr = lr + (qp.begin - i * bs);
          kernels::SparseQueryTile lt{row(b, qr, h), lse_at(b, h, qr), qp.size(),
                                      static_cast<int64_t>(w.local_spans.size()), 0};
          kernels::SparseQueryTile rt = lt;
          rt.first_span = static_cast<int64_t>(w.remote_spans.size());
          kernels::SparseQueryTile blt = lt, brt = lt;  // the backward's: one span per key tile
          blt.first_span = static_cast<int64_t>(w.bwd_local_spans.size());
          brt.first_span = static_cast<int64_t>(w.bwd_remote_spans.size());
          for (int32_t j : c.row(i)) {
            if (cfg.causal && j > i) break;
            const Piece kp = in_document_of(cfg, qp.begin, j * bs, bs);
            if (kp.size() <= 0) continue;
            const Owner& o = owners[static_cast<std::size_t>(j)];
            const int64_t skip = kp.begin - j * bs, off = qp.begin - kp.begin;
            if (o.rank == me) {
              const kernels::KeySpan sp{kv_row(b, o.local_row + skip, g), kv_stride, kp.size(),
                                        off};
              add_key_span(w.local_spans, lt.first_span, sp);
              w.bwd_local_spans.push_back(sp);
            } else {
              const kernels::KeySpan sp{slab(find_recv(o.rank, g, j), b) + skip * D, D, kp.size(),
                                        off};
              add_key_span(w.remote_spans, rt.first_span, sp);
              w.bwd_remote_spans.push_back(sp);
            }
          }
          lt.n_spans = static_cast<int64_t>(w.local_spans.size()) - lt.first_span;
          rt.n_spans = static_cast<int64_t>(w.remote_spans.size()) - rt.first_span;
          blt.n_spans = static_cast<int64_t>(w.bwd_local_spans.size()) - blt.first_span;
          brt.n_spans = static_cast<int64_t>(w.bwd_remote_spans.size()) - brt.first_span;
          w.local_tiles.push_back(lt);  // every tile: the local pass initialises every row
          if (rt.n_spans > 0) w.remote_tiles.push_back(rt);
          if (blt.n_spans > 0) w.bwd_local_tiles.push_back(blt);
          if (brt.n_spans > 0) w.bwd_remote_tiles.push_back(brt);
        }
      }
    }
    // dK/dV of my key blocks (per K/V head, one tile per document piece, in ascending
    // position), from my query blocks of every query head sharing the K/V head; one query span
    // per query block piece, since the fused backward and the dQ pass must cut alike.
    for (int64_t g = 0; g < G; ++g) {
      w.local_task_ptr.push_back(static_cast<int64_t>(w.local_ktiles.size()));
      for (int64_t j : blocks_by_position) {
        const int64_t lr = owners[static_cast<std::size_t>(j)].local_row;
        for (const Piece& kp : document_pieces(cfg, j * bs, bs)) {
          kernels::SparseKeyTile kt{kv_row(b, lr + (kp.begin - j * bs), g), kv_stride, kp.size(),
                                    static_cast<int64_t>(w.local_qspans.size()), 0};
          add_query_spans(w.local_qspans, b, g, j, kp);
          kt.n_spans = static_cast<int64_t>(w.local_qspans.size()) - kt.first_span;
          if (kt.n_spans > 0) w.local_ktiles.push_back(kt);
        }
      }
    }
  }
  w.local_task_ptr.push_back(static_cast<int64_t>(w.local_ktiles.size()));
  // dK/dV partials of received blocks, from my query blocks: per (batch, K/V head), in
  // ascending key position (a block has one owner, so one entry per (head, block)).
  std::vector<std::size_t> by_block(w.recv_entries.size());
  std::iota(by_block.begin(), by_block.end(), std::size_t{0});
  std::sort(by_block.begin(), by_block.end(), [&](std::size_t x, std::size_t y) {
    return std::tie(w.recv_entries[x].head, w.recv_entries[x].block) <
           std::tie(w.recv_entries[y].head, w.recv_entries[y].block);
  });
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      w.remote_task_ptr.push_back(static_cast<int64_t>(w.remote_ktiles.size()));
      for (std::size_t e : by_block) {
        const Entry& en = w.recv_entries[e];
        if (en.head != g) continue;
        const int64_t j = en.block;
        for (const Piece& kp : document_pieces(cfg, j * bs, bs)) {
          kernels::SparseKeyTile kt{slab(static_cast<int64_t>(e), b) + (kp.begin - j * bs) * D, D,
                                    kp.size(), static_cast<int64_t>(w.remote_qspans.size()), 0};
          add_query_spans(w.remote_qspans, b, g, j, kp);
          kt.n_spans = static_cast<int64_t>(w.remote_qspans.size()) - kt.first_span;
          if (kt.n_spans > 0) w.remote_ktiles.push_back(kt);
        }
      }
    }
  w.remote_task_ptr.push_back(static_cast<int64_t>(w.remote_ktiles.size()));
  return w;
}

}  // namespace ringattn::sparse

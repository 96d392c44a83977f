// Builds each rank's ring schedule from the pattern arithmetic: selected rows of every
// (pattern, head, batch, segment) intersected with the shard chunks, paired query run by key
// run into kernel tasks, and grouped into waves that a kernel call may run in parallel.
#include "ring/ring_schedule.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/patterns.hpp"
#include "single/schedule.hpp"

namespace ringattn::ring {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

std::vector<int64_t> heads_of(const AttentionConfig& cfg, const HeadSlice& slice, int64_t pattern,
                              int64_t n_patterns) {
  std::vector<int64_t> heads;
  if (cfg.combine == Combine::mixture && cfg.attention == AttentionKind::dilated) {
    for (int64_t h = 0; h < cfg.shape.heads; ++h) heads.push_back(h);
  } else {
    const HeadRange r = group_heads_of(cfg, slice, n_patterns, pattern);
    for (int64_t h = r.first; h < r.first + r.count; ++h) heads.push_back(h);
  }
  return heads;
}

// Selected rows of (pattern at `offset`, head, batch, segment) in each chunk of `rank`, in a
// local tensor of `heads` heads laid out as `tensor`: the query heads H for query runs, the
// K/V heads HKV for key runs (whose lse fields are unused).
std::vector<Run> runs_in(const AttentionConfig& cfg, TensorLayout tensor, const ShardLayout& layout,
                         int rank, int pattern, const DilatedPattern& pat, const SegmentList& segs,
                         int64_t offset, int64_t head, int64_t heads, int64_t batch,
                         int64_t segment) {
  const Shape4& s = cfg.shape;
  const int64_t m = selected_in(segs.length(segment), pat, offset);
  const int64_t first = segs.begin(segment) + offset;  // position of selection index 0
  std::vector<Run> runs;
  const auto chunks = layout.chunks(rank);
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& ch = chunks[c];
    const int64_t k_lo = std::max<int64_t>(0, ceil_div(ch.begin - first, pat.dilation));
    const int64_t k_hi = std::min<int64_t>(m, ceil_div(ch.begin + ch.length - first, pat.dilation));
    if (k_lo >= k_hi) continue;
    Run r;
    r.pattern = pattern;
    r.chunk = static_cast<int>(c);
    r.head = head;
    r.batch = batch;
    r.segment = segment;
    r.k_begin = k_lo;
    r.k_end = k_hi;
    const int64_t local_row = ch.local_begin + (first + k_lo * pat.dilation - ch.begin);
    const single::RowStrides rs = single::row_strides(tensor, layout.local_len, heads, s.head_dim);
    r.row0 = rs.at(batch, local_row, head);
    r.stride = pat.dilation * rs.position;
    r.lse0 = (batch * heads + head) * layout.local_len + local_row;
    r.lse_stride = pat.dilation;
    runs.push_back(r);
  }
  return runs;
}

// Segments of `list` that overlap any chunk of `rank`, ascending.
std::vector<int64_t> segments_touching(const ShardLayout& layout, int rank,
                                       const SegmentList& list) {
  std::vector<int64_t> segs;
  for (const Chunk& ch : layout.chunks(rank))
    for (int64_t s = list.at(ch.begin); s <= list.at(ch.begin + ch.length - 1); ++s)
      segs.push_back(s);
  std::sort(segs.begin(), segs.end());
  segs.erase(std::unique(segs.begin(), segs.end()), segs.end());
  return segs;
}

struct PairTask {
  Run query;
  std::size_t key_run = 0;  // index into the pair's key runs
};

struct PairWork {
  std::vector<Run> key_runs;  // src-side rows dest needs, in packing order
  std::vector<PairTask> tasks;
};

// The query heads of pattern `pattern` that read K/V head `kv_head`, grouped by their
// offset (in the order offsets first appear): heads with one offset select the same rows.
std::vector<std::pair<int64_t, std::vector<int64_t>>> heads_by_offset(const AttentionConfig& cfg,
                                                                      const HeadSlice& slice,
                                                                      int pattern,
                                                                      int64_t n_patterns,
                                                                      int64_t kv_head) {
  std::vector<std::pair<int64_t, std::vector<int64_t>>> groups;
  for (int64_t h : heads_of(cfg, slice, pattern, n_patterns)) {
    if (cfg.kv_head_of(h) != kv_head) continue;
    const int64_t o = pattern_offset(cfg, slice, pattern, h);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == o; });
    if (it == groups.end()) it = groups.insert(groups.end(), {o, {}});
    it->second.push_back(h);
  }
  return groups;
}

// Sliding window (dense only, so run indices are positions in the segment): the keys of `kr` within
// reach of some query run, as pieces of `kr` (the query runs' windows, merged where they overlap),
// each paired with the query runs whose window meets it. A query run's window is one
// interval, so it meets at most one piece: tasks of one wave still share no query rows.
void add_window_pieces(const AttentionConfig& cfg, const Run& kr,
                       const std::vector<std::vector<Run>>& qruns, PairWork& work) {
  const auto reach = cfg.window_reach();
  std::vector<std::pair<int64_t, int64_t>> wanted;  // [begin, end) within kr
  for (const Run& q : qruns.front()) {
    const int64_t a = std::max(kr.k_begin, q.k_begin - reach.left);
    const int64_t e = std::min(kr.k_end, q.k_end + reach.right);
    if (a < e) wanted.push_back({a, e});
  }
  std::sort(wanted.begin(), wanted.end());
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (const auto& w : wanted) {
    if (!pieces.empty() && w.first <= pieces.back().second)
      pieces.back().second = std::max(pieces.back().second, w.second);
    else
      pieces.push_back(w);
  }
  for (const auto& [a, e] : pieces) {
    Run piece = kr;
    piece.k_begin = a;
    piece.k_end = e;
    piece.row0 = kr.row0 + (a - kr.k_begin) * kr.stride;
    work.key_runs.push_back(piece);
    for (const auto& runs : qruns)
      for (const Run& q : runs)
        if (q.k_begin - reach.left < e && a < q.k_end + reach.right)
          work.tasks.push_back({q, work.key_runs.size() - 1});
  }
}

// What rank `dest`'s queries need from rank `src`'s keys and values. Under grouped-query
// attention the query heads sharing a K/V head and an offset need the same K/V rows: one key
// run serves all of them, so only K/V heads travel.
PairWork pair_work(const AttentionConfig& cfg, const HeadSlice& slice, const ShardLayout& layout,
                   int dest, int src) {
  PairWork work;
  const auto pats = patterns_of(cfg);
  const auto n_patterns = static_cast<int64_t>(pats.size());
  const int64_t heads = cfg.shape.heads, kv_heads = cfg.effective_kv_heads();
  for (int i = 0; i < static_cast<int>(pats.size()); ++i) {
    const DilatedPattern& pat = pats[static_cast<std::size_t>(i)];
    const SegmentList list = segments_of(cfg, pat);
    const auto dest_segs = segments_touching(layout, dest, list);
    const auto src_segs = segments_touching(layout, src, list);
    std::vector<int64_t> segs;
    std::set_intersection(dest_segs.begin(), dest_segs.end(), src_segs.begin(), src_segs.end(),
                          std::back_inserter(segs));
    for (int64_t kh = 0; kh < kv_heads; ++kh)
      for (const auto& [offset, q_heads] : heads_by_offset(cfg, slice, i, n_patterns, kh))
        for (int64_t b = 0; b < cfg.shape.batch; ++b)
          for (int64_t seg : segs) {
            // The query heads of this group select the same positions: same runs, same max.
            std::vector<std::vector<Run>> qruns;
            for (int64_t h : q_heads)
              qruns.push_back(
                  runs_in(cfg, cfg.layout, layout, dest, i, pat, list, offset, h, heads, b, seg));
            if (qruns.front().empty()) continue;
            int64_t max_q = 0;  // one past the last selected query index of dest here
            for (const Run& q : qruns.front()) max_q = std::max(max_q, q.k_end);
            for (Run kr : runs_in(cfg, cfg.effective_kv_layout(), layout, src, i, pat, list, offset,
                                  kh, kv_heads, b, seg)) {
              if (cfg.windowed()) {
                add_window_pieces(cfg, kr, qruns, work);
                continue;
              }
              if (cfg.causal) kr.k_end = std::min(kr.k_end, max_q);
              if (kr.k_end <= kr.k_begin) continue;
              work.key_runs.push_back(kr);
              for (const auto& runs : qruns)
                for (const Run& q : runs) {
                  if (cfg.causal && kr.k_begin > q.k_end - 1) continue;  // all keys in its future
                  work.tasks.push_back({q, work.key_runs.size() - 1});
                }
            }
          }
  }
  return work;
}

}  // namespace

RingSchedule build_ring_schedule(const AttentionConfig& cfg, const ShardLayout& layout, int rank,
                                 const kernels::TileConfig& tiles, const HeadSlice& slice) {
  RingSchedule sched;
  const int world = layout.world;
  const int64_t d = cfg.shape.head_dim;
  const bool per_pattern_waves =
      cfg.combine == Combine::mixture && cfg.attention == AttentionKind::dilated;
  const auto places = static_cast<std::size_t>(cfg.queries_per_kv_head());
  for (int t = 0; t < world; ++t) {
    RingStep step;
    const int dest = (rank + t) % world, src = (rank - t + world) % world;
    if (t > 0) {
      step.send_runs = pair_work(cfg, slice, layout, dest, rank).key_runs;
      for (const Run& r : step.send_runs) step.send_rows += r.rows();
      if (step.send_rows > 0) step.send_to = dest;
    }
    PairWork work = pair_work(cfg, slice, layout, rank, src);
    std::vector<int64_t> packed_base;  // first packed row of each key run
    for (const Run& r : work.key_runs) {
      packed_base.push_back(step.recv_rows);
      step.recv_rows += r.rows();
    }
    if (t > 0) {
      step.recv_runs = work.key_runs;
      if (step.recv_rows > 0) step.recv_from = src;
    } else {
      step.recv_from = rank;
    }
    // Waves: tasks of one wave share no query rows (one query chunk, one pattern under
    // mixture) and, within one backward range, no key rows (one key chunk; one query head
    // per K/V head: tasks are bucketed by the query head's place in its K/V group).
    std::map<std::tuple<int, int, int>, std::size_t> wave_of;
    std::vector<std::vector<std::vector<kernels::SubseqTask>>> by_place;  // [wave][place]
    for (const PairTask& pt : work.tasks) {
      const Run& q = pt.query;
      const Run& k = work.key_runs[pt.key_run];
      const auto key = std::make_tuple(per_pattern_waves ? q.pattern : 0, q.chunk, k.chunk);
      auto it = wave_of.find(key);
      if (it == wave_of.end()) {
        it = wave_of.emplace(key, step.waves.size()).first;
        step.waves.emplace_back();
        by_place.emplace_back(places);
      }
      kernels::SubseqTask task;
      task.q_row0 = q.row0;
      task.q_stride = q.stride;
      task.lse0 = q.lse0;
      task.lse_stride = q.lse_stride;
      if (t == 0) {
        task.k_row0 = k.row0;
        task.k_stride = k.stride;
      } else {
        task.k_row0 = packed_base[pt.key_run] * d;
        task.k_stride = d;
      }
      task.n_q = q.rows();
      task.n_k = k.rows();
      task.causal_offset = q.k_begin - k.k_begin;
      if (cfg.windowed()) {
        const auto reach = cfg.window_reach();
        task.window_left = reach.left;
        task.window_right = reach.right;
      }
      by_place[it->second][static_cast<std::size_t>(q.head) % places].push_back(task);
    }
    for (std::size_t w = 0; w < step.waves.size(); ++w) {
      Wave& wave = step.waves[w];
      single::append_by_kv_place(by_place[w], wave.tasks, wave.backward_ends);
      wave.items = single::forward_items(wave.tasks, cfg.causal, tiles);
    }
    sched.max_send_rows = std::max(sched.max_send_rows, step.send_rows);
    sched.max_recv_rows = std::max(sched.max_recv_rows, step.recv_rows);
    sched.bytes_sent += step.send_rows * (d + cfg.effective_head_dim_v()) *
                        static_cast<int64_t>(sizeof(float));
    sched.steps.push_back(std::move(step));
  }
  return sched;
}

namespace {

// Dense attention with a window or packed documents: every other rank needs, of each K/V
// head, the keys its queries attend. For the queries [x, y) of one chunk that lie in one
// document [ds, de), those are [max(ds, x - L), min(de, y + R)) (R = 0 when causal, L and R
// the sequence length where there is no window); counted on merged position intervals.
int64_t minimum_dense_rows(const AttentionConfig& cfg, const ShardLayout& layout, int rank) {
  const auto reach = cfg.window_reach();
  const std::vector<int64_t> whole{0, cfg.shape.seq_len};
  const std::vector<int64_t>& cu = cfg.packed() ? cfg.cu_seqlens : whole;
  int64_t rows = 0;
  for (int dest = 0; dest < layout.world; ++dest) {
    if (dest == rank) continue;
    std::vector<std::pair<int64_t, int64_t>> reached;
    for (const Chunk& c : layout.chunks(dest)) {
      const int64_t c_end = c.begin + c.length;
      auto doc = std::upper_bound(cu.begin(), cu.end(), c.begin) - 1;
      for (; doc + 1 != cu.end() && *doc < c_end; ++doc) {
        const int64_t x = std::max(*doc, c.begin), y = std::min(*(doc + 1), c_end);
        reached.push_back({std::max(*doc, x - reach.left), std::min(*(doc + 1), y + reach.right)});
      }
    }
    std::sort(reached.begin(), reached.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& r : reached) {
      if (!merged.empty() && r.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    }
    for (const auto& [x, y] : merged)
      for (const Chunk& c : layout.chunks(rank))
        rows += std::max<int64_t>(0, std::min(y, c.begin + c.length) - std::max(x, c.begin));
  }
  return rows * cfg.effective_kv_heads();
}

}  // namespace

int64_t minimum_bytes_sent(const AttentionConfig& cfg, const ShardLayout& layout, int rank,
                           const HeadSlice& slice) {
  const Shape4& s = cfg.shape;
  if (cfg.attention == AttentionKind::dense && (cfg.windowed() || cfg.packed()))
    return minimum_dense_rows(cfg, layout, rank) * s.batch *
           (s.head_dim + cfg.effective_head_dim_v()) * static_cast<int64_t>(sizeof(float));
  const auto pats = patterns_of(cfg);
  const auto n_patterns = static_cast<int64_t>(pats.size());
  // Selected positions of (w, r, offset) in segment `seg` that lie in [x, y).
  auto count_in = [](const DilatedPattern& p, int64_t offset, int64_t seg, int64_t x, int64_t y) {
    const int64_t first = seg * p.segment + offset;
    const int64_t m = selected_per_segment(p, offset);
    const int64_t lo = std::max<int64_t>(0, ceil_div(x - first, p.dilation));
    const int64_t hi = std::min<int64_t>(m, ceil_div(y - first, p.dilation));
    return std::max<int64_t>(0, hi - lo);
  };
  // Per pattern and K/V head, the distinct offsets its query heads use: each offset's rows
  // of that K/V head are needed once, however many query heads share them.
  std::vector<std::vector<std::vector<int64_t>>> offsets(pats.size());
  for (int i = 0; i < static_cast<int>(pats.size()); ++i) {
    auto& of_kv = offsets[static_cast<std::size_t>(i)];
    of_kv.resize(static_cast<std::size_t>(cfg.effective_kv_heads()));
    for (int64_t h : heads_of(cfg, slice, i, n_patterns)) {
      auto& o = of_kv[static_cast<std::size_t>(h / cfg.queries_per_kv_head())];
      o.push_back(pattern_offset(cfg, slice, i, h));
    }
    for (auto& o : of_kv) {
      std::sort(o.begin(), o.end());
      o.erase(std::unique(o.begin(), o.end()), o.end());
    }
  }
  int64_t rows = 0;
  for (int dest = 0; dest < layout.world; ++dest) {
    if (dest == rank) continue;
    for (int i = 0; i < static_cast<int>(pats.size()); ++i) {
      const DilatedPattern& p = pats[static_cast<std::size_t>(i)];
      for (const auto& kv_offsets : offsets[static_cast<std::size_t>(i)])
        for (const int64_t o : kv_offsets) {
          if (selected_per_segment(p, o) == 0) continue;
          for (int64_t seg = 0; seg < s.seq_len / p.segment; ++seg) {
            const int64_t seg_lo = seg * p.segment, seg_hi = seg_lo + p.segment;
            // The last selected position dest holds in this segment (-1: none).
            int64_t last_q = -1;
            for (const Chunk& c : layout.chunks(dest)) {
              const int64_t x = std::max(seg_lo, c.begin), y = std::min(seg_hi, c.begin + c.length);
              if (x >= y || count_in(p, o, seg, x, y) == 0) continue;
              const int64_t first = seg * p.segment + o;
              const int64_t k_last = (y - 1 - first) / p.dilation;  // y-1 >= first here
              last_q = std::max(last_q, first + k_last * p.dilation);
            }
            if (last_q < 0) continue;
            const int64_t limit = cfg.causal ? last_q + 1 : seg_hi;
            for (const Chunk& c : layout.chunks(rank)) {
              const int64_t x = std::max(seg_lo, c.begin);
              const int64_t y = std::min({seg_hi, c.begin + c.length, limit});
              if (x < y) rows += count_in(p, o, seg, x, y);
            }
          }
        }
    }
  }
  return rows * s.batch * (s.head_dim + cfg.effective_head_dim_v()) *
         static_cast<int64_t>(sizeof(float));
}

bool runs_repeat_a_row(const std::vector<Run>& runs) {
  std::vector<int64_t> rows;
  for (const Run& r : runs)
    for (int64_t i = 0; i < r.rows(); ++i) rows.push_back(r.row0 + i * r.stride);
  std::sort(rows.begin(), rows.end());
  return std::adjacent_find(rows.begin(), rows.end()) != rows.end();
}

}  // namespace ringattn::ring

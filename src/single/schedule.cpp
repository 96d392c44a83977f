// Builds the single-rank schedule: one task per (batch, head, pattern, segment) that
// selects at least one position (a packed sequence's documents are dense attention's
// segments), as a strided view with stride dilation·H·D for queries and
// dilation·HKV·D for keys (query head h reads K/V head h / (H / HKV) in place); with
// [B, H, N, D] tensors (TensorLayout::bhnd) the strides are dilation·D.
#include "single/schedule.hpp"

#include <algorithm>

#include "core/patterns.hpp"

namespace ringattn::single {

namespace {

RowStrides strides_of(TensorLayout layout, const Shape4& shape) {
  return row_strides(layout, shape.seq_len, shape.heads, shape.head_dim);
}

void add_pattern_tasks(const AttentionConfig& cfg, const HeadSlice& slice, int64_t pattern,
                       int64_t head, std::vector<kernels::SubseqTask>& tasks) {
  const Shape4& s = cfg.shape;
  const DilatedPattern pat = patterns_of(cfg)[static_cast<std::size_t>(pattern)];
  const int64_t offset = pattern_offset(cfg, slice, pattern, head);
  const SegmentList segs = segments_of(cfg, pat);
  const RowStrides q = strides_of(cfg.layout, s);
  const RowStrides kv = strides_of(cfg.effective_kv_layout(), cfg.kv_shape());
  const int64_t kv_head = cfg.kv_head_of(head);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t seg = 0; seg < segs.count(); ++seg) {
      const int64_t m = selected_in(segs.length(seg), pat, offset);
      if (m == 0) continue;
      const int64_t p0 = segs.begin(seg) + offset;
      kernels::SubseqTask t;
      t.q_row0 = q.at(b, p0, head);
      t.k_row0 = kv.at(b, p0, kv_head);
      t.q_stride = pat.dilation * q.position;
      t.k_stride = pat.dilation * kv.position;
      t.lse0 = (b * s.heads + head) * s.seq_len + p0;
      t.lse_stride = pat.dilation;
      t.n_q = t.n_k = m;
      t.causal_offset = 0;
      if (cfg.windowed()) {  // dense only: view indices are positions in the segment
        const auto reach = cfg.window_reach();
        t.window_left = reach.left;
        t.window_right = reach.right;
      }
      tasks.push_back(t);
    }
  }
}

}  // namespace

void append_by_kv_place(std::vector<std::vector<kernels::SubseqTask>>& by_place,
                        std::vector<kernels::SubseqTask>& tasks, std::vector<std::size_t>& ends) {
  for (auto& bucket : by_place) {
    if (bucket.empty()) continue;
    tasks.insert(tasks.end(), bucket.begin(), bucket.end());
    ends.push_back(tasks.size());
  }
}

LocalSchedule build_local_schedule(const AttentionConfig& cfg, const kernels::TileConfig& t,
                                   const HeadSlice& slice) {
  LocalSchedule sched;
  const auto n_patterns = static_cast<int64_t>(patterns_of(cfg).size());
  const int64_t heads = cfg.shape.heads;
  const auto places = static_cast<std::size_t>(cfg.queries_per_kv_head());
  auto finish = [&](KernelPass& pass, std::vector<std::vector<kernels::SubseqTask>>& by_place) {
    append_by_kv_place(by_place, pass.tasks, pass.backward_ends);
    pass.items = forward_items(pass.tasks, cfg.causal, t);
    sched.passes.push_back(std::move(pass));
  };
  if (cfg.attention == AttentionKind::dense || cfg.combine == Combine::grouped) {
    KernelPass pass;
    pass.out_scale = grouped_scale(cfg);
    std::vector<std::vector<kernels::SubseqTask>> by_place(places);
    for (int64_t g = 0; g < n_patterns; ++g) {
      const HeadRange r = group_heads_of(cfg, slice, n_patterns, g);
      for (int64_t h = r.first; h < r.first + r.count; ++h)
        add_pattern_tasks(cfg, slice, g, h, by_place[static_cast<std::size_t>(h) % places]);
    }
    finish(pass, by_place);
    sched.clear_outputs_first = cfg.attention == AttentionKind::dilated;
  } else {
    for (int64_t i = 0; i < n_patterns; ++i) {
      KernelPass pass;
      pass.accumulate = true;
      std::vector<std::vector<kernels::SubseqTask>> by_place(places);
      for (int64_t h = 0; h < heads; ++h)
        add_pattern_tasks(cfg, slice, i, h, by_place[static_cast<std::size_t>(h) % places]);
      finish(pass, by_place);
    }
    sched.clear_outputs_first = true;
  }
  return sched;
}

std::vector<kernels::ForwardItem> forward_items(std::span<const kernels::SubseqTask> tasks,
                                                bool causal, const kernels::TileConfig& tiles) {
  std::vector<std::pair<int64_t, kernels::ForwardItem>> costed;
  for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
    const auto& t = tasks[ti];
    for (int64_t i0 = 0; i0 < t.n_q; i0 += tiles.q_tile) {
      const int64_t bq = std::min(tiles.q_tile, t.n_q - i0);
      const kernels::KeyRange keys = kernels::visible_key_range(t, causal, i0, bq);
      costed.push_back({bq * (keys.end - keys.begin), {static_cast<int64_t>(ti), i0}});
    }
  }
  // Longest first, so that dynamic scheduling ends with the short items (LPT balance).
  std::stable_sort(costed.begin(), costed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<kernels::ForwardItem> items;
  items.reserve(costed.size());
  for (const auto& c : costed) items.push_back(c.second);
  return items;
}

std::size_t schedule_bytes(const LocalSchedule& s) {
  std::size_t bytes = 0;
  for (const auto& p : s.passes)
    bytes += p.tasks.size() * sizeof(kernels::SubseqTask) +
             p.items.size() * sizeof(kernels::ForwardItem);
  return bytes;
}

}  // namespace ringattn::single

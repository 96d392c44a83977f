// Ring steps as cuDNN views (see ring_cudnn_views.hpp).
#include "ring/ring_cudnn_views.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

namespace ringattn::ring {

namespace kc = kernels::cuda;

namespace {

int64_t key_rows(const kc::SdpaView& v) { return v.kv_rows > 0 ? v.kv_rows : v.rows; }

// The keys row i of a view sees, [lo, hi] (lo > hi: none): the band's bounds within the view's
// key rows.
struct Span {
  int64_t lo, hi;
  bool empty() const { return lo > hi; }
  bool operator==(const Span& o) const {
    return (empty() && o.empty()) || (lo == o.lo && hi == o.hi);
  }
};
Span visible(const kc::SdpaView& v, int64_t i) {
  const int64_t lo = v.left_bound ? std::max<int64_t>(0, i - *v.left_bound + 1) : 0;
  const int64_t hi = v.right_bound ? std::min(key_rows(v) - 1, i + *v.right_bound)
                                   : key_rows(v) - 1;
  return {lo, hi};
}

// The view without the query rows that see no key and the key rows no query sees (with the
// band's bounds moved to match), and without a bound that masks nothing: cuDNN is never asked
// for a row without keys, and the bounds it gets are right >= 0, left >= 1. nullopt when no
// row sees a key.
std::optional<kc::SdpaView> trimmed(kc::SdpaView v) {
  int64_t first = 0, last = v.rows - 1;
  while (first <= last && visible(v, first).empty()) ++first;
  while (last >= first && visible(v, last).empty()) --last;
  if (first > last) return std::nullopt;
  // Seen keys: lo and hi do not decrease with the row, so the first row's lo and the last
  // row's hi bound them.
  const int64_t k_first = visible(v, first).lo, k_last = visible(v, last).hi;
  v.q_offset += first * v.q_stride[2];
  v.row_offset += first * v.dilation;
  v.rows = last - first + 1;
  v.kv_offset += k_first * v.kv_stride[2];
  v.kv_rows = k_last - k_first + 1;
  // Row i' = i - first, key j' = j - k_first: j <= i + R becomes j' <= i' + R + first - k_first.
  if (v.right_bound) *v.right_bound += first - k_first;
  if (v.left_bound) *v.left_bound -= first - k_first;
  if (v.right_bound && *v.right_bound >= v.kv_rows - 1) v.right_bound.reset();
  if (v.left_bound && *v.left_bound >= v.rows) v.left_bound.reset();
  return v;
}

bool same_grid(const kc::SdpaView& a, const kc::SdpaView& b) {
  return a.batch == b.batch && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim && a.q_stride == b.q_stride && a.kv_stride == b.kv_stride &&
         a.scale == b.scale && a.segment == b.segment && a.dilation == 1 && b.dilation == 1 &&
         a.first_head == b.first_head && a.head_step == b.head_step &&
         a.accumulate == b.accumulate && a.out_scale == b.out_scale;
}

// a and b as one view, where they read the same query rows and adjacent key rows (a's, then
// b's) or the same key rows and adjacent query rows, and one band sees exactly what the two
// see: one launch instead of two. nullopt otherwise.
std::optional<kc::SdpaView> joined(const kc::SdpaView& a, const kc::SdpaView& b) {
  if (!same_grid(a, b)) return std::nullopt;
  kc::SdpaView m = a;
  std::vector<std::optional<int64_t>> rights{std::nullopt, a.right_bound},
      lefts{std::nullopt, a.left_bound};
  // What row i of the joined view must see; nullopt where the two views' keys are not one
  // interval (no band can join them).
  std::function<std::optional<Span>(int64_t)> want;
  const int64_t na = key_rows(a), ma = a.rows;
  if (a.q_offset == b.q_offset && a.rows == b.rows &&
      b.kv_offset == a.kv_offset + na * a.kv_stride[2]) {
    m.kv_rows = na + key_rows(b);
    if (b.right_bound) rights.push_back(*b.right_bound + na);
    if (b.left_bound) lefts.push_back(*b.left_bound - na);
    want = [&](int64_t i) -> std::optional<Span> {
      const Span x = visible(a, i), y = visible(b, i);
      if (y.empty()) return x;
      const Span ys{y.lo + na, y.hi + na};
      if (x.empty()) return ys;
      if (x.hi + 1 != ys.lo) return std::nullopt;
      return Span{x.lo, ys.hi};
    };
  } else if (a.kv_offset == b.kv_offset && key_rows(a) == key_rows(b) &&
             b.q_offset == a.q_offset + ma * a.q_stride[2] && b.row_offset == a.row_offset + ma) {
    m.rows = ma + b.rows;
    if (b.right_bound) rights.push_back(*b.right_bound - ma);
    if (b.left_bound) lefts.push_back(*b.left_bound + ma);
    want = [&](int64_t i) -> std::optional<Span> {
      return i < ma ? visible(a, i) : visible(b, i - ma);
    };
  } else {
    return std::nullopt;
  }
  for (const auto& r : rights)
    for (const auto& l : lefts) {
      m.right_bound = r, m.left_bound = l;
      bool same = true;
      for (int64_t i = 0; same && i < m.rows; ++i) {
        const std::optional<Span> w = want(i);
        same = w && visible(m, i) == *w;
      }
      if (same) return m;
    }
  return std::nullopt;
}

// Joins views pairwise (joined()) until no two join.
void join_adjacent(std::vector<kc::SdpaView>& views) {
  for (bool again = true; again;) {
    again = false;
    for (std::size_t i = 0; i < views.size() && !again; ++i)
      for (std::size_t j = 0; j < views.size() && !again; ++j) {
        if (i == j) continue;
        if (std::optional<kc::SdpaView> m = joined(views[i], views[j])) {
          views[std::min(i, j)] = *m;
          views.erase(views.begin() + static_cast<std::ptrdiff_t>(std::max(i, j)));
          again = true;
        }
      }
  }
}

}  // namespace

std::string ring_cudnn_unsupported(const AttentionConfig& cfg) {
  if (cfg.layout != TensorLayout::bnhd || cfg.effective_kv_layout() != TensorLayout::bnhd)
    return "cuDNN reads [B,N,H,D] tensors here";
  if (cfg.attention != AttentionKind::dense)
    return std::string(to_string(cfg.attention)) +
           " attention's ring steps are not cuDNN grids (the sm_90a or native kernels run them)";
  return "";
}

std::vector<kc::SdpaView> ring_step_views(const AttentionConfig& cfg, const ShardLayout& layout,
                                          const RingStep& step, std::string* why) {
  std::vector<kc::SdpaView> views;
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::vector<kc::SdpaView>{};
  };
  if (std::string r = ring_cudnn_unsupported(cfg); !r.empty()) return refuse(r);
  const Shape4& s = cfg.shape;
  const int64_t B = s.batch, H = s.heads, D = s.head_dim, n = layout.local_len;
  const int64_t HKV = cfg.effective_kv_heads(), qpk = cfg.queries_per_kv_head();
  // A task's (batch, head, first query position) from its q_row0 in the [B, n, H, D] shard.
  struct Place {
    int64_t b, h, pos;
  };
  auto place = [&](const kernels::SubseqTask& t) {
    const int64_t row = t.q_row0 / D;  // (b·n + pos)·H + h
    return Place{row / (n * H), row % H, row / H % n};
  };
  // The tasks of one view share everything but their (batch, head).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::map<std::pair<int64_t, int64_t>, const kernels::SubseqTask*>> grids;
  std::vector<Key> order;  // views in the schedule's order
  for (const Wave& w : step.waves)
    for (const kernels::SubseqTask& t : w.tasks) {
      if (t.q_row0 % D != 0 || t.q_stride != H * D || t.lse_stride != 1)
        return refuse("a ring task whose query rows are not whole [B,N,H,D] rows");
      const Place p = place(t);
      const Key key{p.pos,           t.n_q,         t.n_k,          t.k_stride,
                    t.causal_offset, t.window_left, t.window_right};
      auto [it, fresh] = grids.try_emplace(key);
      if (fresh) order.push_back(key);
      if (!it->second.emplace(std::make_pair(p.b, p.h), &t).second)
        return refuse("two ring tasks of one step read the same query rows and keys");
    }
  for (const Key& key : order) {
    const auto& grid = grids[key];
    if (static_cast<int64_t>(grid.size()) != B * H)
      return refuse("a ring step whose tasks do not cover every batch and head alike");
    const auto& [pos, n_q, n_k, k_stride, causal_offset, window_left, window_right] = key;
    const kernels::SubseqTask& t0 = *grid.at({0, 0});
    const int64_t k0 = t0.k_row0;
    const int64_t kb = B > 1 ? grid.at({1, 0})->k_row0 - k0 : 0;
    const int64_t kh = HKV > 1 ? grid.at({0, qpk})->k_row0 - k0 : 0;
    for (const auto& [bh, t] : grid) {
      const auto [b, h] = bh;
      if (t->q_row0 != ((b * n + pos) * H + h) * D || t->lse0 != (b * H + h) * n + pos)
        return refuse("a ring task whose rows are not where its batch and head put them");
      if (t->k_row0 != k0 + b * kb + h / qpk * kh)
        return refuse(
            "a ring step whose key rows are not one strided view over batches and "
            "K/V heads");
    }
    kc::SdpaView v;
    v.batch = B;
    v.heads = H;
    v.kv_heads = HKV;
    v.rows = n_q;
    v.kv_rows = n_k;
    v.head_dim = D;
    v.q_stride = {n * H * D, D, H * D, 1};
    v.q_offset = pos * H * D;
    // A dimension of extent 1 takes the stride of the next one out, as a packed tensor would.
    const int64_t kh_stride = HKV > 1 ? kh : n_k * k_stride;
    v.kv_stride = {B > 1 ? kb : HKV * kh_stride, kh_stride, k_stride, 1};
    v.kv_offset = k0;
    // V (and O) rows of their own width sit at the same row positions (SdpaView::v_stride).
    v.head_dim_v = cfg.effective_head_dim_v();
    v.softcap = static_cast<float>(cfg.softcap);
    v.scale = static_cast<float>(cfg.effective_scale());
    // Key j is seen by query i when j <= i + causal_offset (causal), and
    // i + causal_offset - window_left <= j <= i + causal_offset + window_right (a window):
    // cuDNN's band, right bound R (j <= i + R) and left bound L (i - L < j).
    if (cfg.causal) v.right_bound = causal_offset;
    if (window_right < kernels::kNoWindow)
      v.right_bound = std::min(v.right_bound.value_or(kernels::kNoWindow),
                               causal_offset + window_right);
    if (window_left < kernels::kNoWindow) v.left_bound = window_left - causal_offset + 1;
    v.segment = n;
    v.row_offset = pos;
    if (std::optional<kc::SdpaView> t = trimmed(v)) views.push_back(*t);
  }
  join_adjacent(views);
  return views;
}

}  // namespace ringattn::ring

// Ring steps as cuDNN views (see ring_cudnn_views.hpp).
#include "ring/ring_cudnn_views.hpp"

#include <map>
#include <tuple>

namespace ringattn::ring {

namespace kc = kernels::cuda;

std::string ring_cudnn_unsupported(const AttentionConfig& cfg) {
  if (cfg.layout != TensorLayout::bnhd || cfg.effective_kv_layout() != TensorLayout::bnhd)
    return "cuDNN reads [B,N,H,D] tensors here";
  if (cfg.attention != AttentionKind::dense)
    return std::string(to_string(cfg.attention)) +
           " attention's ring steps are not cuDNN grids (the sm_90a or native kernels run them)";
  if (cfg.packed()) return "packed documents' ring steps are not cuDNN grids";
  if (cfg.windowed()) return "sliding windows' ring steps are not cuDNN grids";
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
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::map<std::pair<int64_t, int64_t>, const kernels::SubseqTask*>> grids;
  std::vector<Key> order;  // views in the schedule's order
  for (const Wave& w : step.waves)
    for (const kernels::SubseqTask& t : w.tasks) {
      if (t.q_row0 % D != 0 || t.q_stride != H * D || t.lse_stride != 1)
        return refuse("a ring task whose query rows are not whole [B,N,H,D] rows");
      const Place p = place(t);
      const Key key{p.pos, t.n_q, t.n_k, t.k_stride, t.causal_offset};
      auto [it, fresh] = grids.try_emplace(key);
      if (fresh) order.push_back(key);
      if (!it->second.emplace(std::make_pair(p.b, p.h), &t).second)
        return refuse("two ring tasks of one step read the same query rows and keys");
    }
  for (const Key& key : order) {
    const auto& grid = grids[key];
    if (static_cast<int64_t>(grid.size()) != B * H)
      return refuse("a ring step whose tasks do not cover every batch and head alike");
    const auto& [pos, n_q, n_k, k_stride, causal_offset] = key;
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
    v.scale = static_cast<float>(cfg.effective_scale());
    if (cfg.causal && causal_offset < n_k - 1) {
      // Key j is seen by query i when j <= i + causal_offset: cuDNN's band right bound.
      if (causal_offset < 0)
        return refuse("a ring step whose first queries see none of its keys (causal offset " +
                      std::to_string(causal_offset) + ")");
      v.right_bound = causal_offset;
    }
    v.segment = n;
    v.row_offset = pos;
    views.push_back(v);
  }
  return views;
}

}  // namespace ringattn::ring

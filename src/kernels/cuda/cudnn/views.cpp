// sdpa_views (cudnn/graphs.hpp): a configuration read as cuDNN's strided views. Host code
// without cudnn-frontend, so that the emulated GPU's stand-in for cuDNN takes the same views.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/patterns.hpp"
#include "kernels/cuda/cudnn/graphs.hpp"

namespace ringattn::kernels::cuda {

std::vector<SdpaView> sdpa_views(const AttentionConfig& cfg, std::string* why) {
  std::vector<SdpaView> views;
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::vector<SdpaView>{};
  };
  if (cfg.layout != TensorLayout::bnhd || cfg.effective_kv_layout() != TensorLayout::bnhd)
    return refuse("cuDNN reads [B,N,H,D] tensors here");
  if (cfg.attention == AttentionKind::block_sparse)
    return refuse("block-sparse runs on the native kernels");
  const Shape4& s = cfg.shape;
  const int64_t H = s.heads, D = s.head_dim, HKV = cfg.effective_kv_heads();
  const int64_t qpk = cfg.queries_per_kv_head();
  const AttentionConfig::WindowReach reach = cfg.window_reach();
  SdpaView base;
  base.head_dim = D;
  base.head_dim_v = cfg.effective_head_dim_v();
  base.softcap = static_cast<float>(cfg.softcap);
  base.scale = static_cast<float>(cfg.effective_scale());
  if (cfg.causal) base.right_bound = 0;
  if (cfg.windowed()) {
    base.left_bound = reach.left + 1;  // keys j >= i - left
    base.right_bound = reach.right;
  }
  const std::vector<DilatedPattern> pats = patterns_of(cfg);
  const auto G = static_cast<int64_t>(pats.size());
  // One view per (pattern, offset, heads first, first + step, ...): segments of w tokens,
  // m selected rows each at stride r rows, heads at stride step.
  auto add = [&](const DilatedPattern& p, int64_t offset, int64_t first, int64_t count,
                 int64_t step, bool accumulate, float out_scale) -> bool {
    const int64_t m = selected_per_segment(p, offset);
    if (m == 0 || count == 0) return true;
    SdpaView v = base;
    v.batch = s.batch * (s.seq_len / p.segment);
    v.heads = count;
    v.rows = m;
    v.q_stride = {p.segment * H * D, step * D, p.dilation * H * D, 1};
    v.q_offset = (offset * H + first) * D;
    if (qpk == 1) {
      v.kv_heads = count;
      v.kv_stride = {p.segment * HKV * D, step * D, p.dilation * HKV * D, 1};
      v.kv_offset = (offset * HKV + first) * D;
    } else {
      // GQA: cuDNN maps query head j of the view to K/V head j / (count / kv_heads), so the
      // view's query heads must cover whole K/V heads, consecutively.
      if (step != 1 || first % qpk != 0 || count % qpk != 0) return false;
      v.kv_heads = count / qpk;
      v.kv_stride = {p.segment * HKV * D, D, p.dilation * HKV * D, 1};
      v.kv_offset = (offset * HKV + first / qpk) * D;
    }
    v.accumulate = accumulate;
    v.out_scale = out_scale;
    v.segment = p.segment, v.dilation = p.dilation, v.row_offset = offset;
    v.first_head = first, v.head_step = step;
    views.push_back(v);
    return true;
  };
  if (cfg.packed()) {  // dense only (validate() refuses packed dilated): a view per document
    for (std::size_t d = 0; d + 1 < cfg.cu_seqlens.size(); ++d) {
      const int64_t begin = cfg.cu_seqlens[d], len = cfg.cu_seqlens[d + 1] - begin;
      SdpaView v = base;
      v.batch = s.batch;
      v.heads = H;
      v.kv_heads = HKV;
      v.rows = len;
      v.q_stride = {s.seq_len * H * D, D, H * D, 1};
      v.kv_stride = {s.seq_len * HKV * D, D, HKV * D, 1};
      v.q_offset = begin * H * D;
      v.kv_offset = begin * HKV * D;
      v.segment = s.seq_len, v.row_offset = begin;
      if (v.left_bound) v.left_bound = std::min(*v.left_bound, len + 1);
      if (v.right_bound) v.right_bound = std::min(*v.right_bound, len);
      views.push_back(v);
    }
    return views;
  }
  if (cfg.attention == AttentionKind::dense || cfg.combine == Combine::grouped) {
    for (int64_t g = 0; g < G; ++g) {
      const HeadRange hr = group_heads(H, G, g);
      if (!add(pats[static_cast<std::size_t>(g)], pattern_offset(cfg, HeadSlice{}, g, hr.first),
               hr.first, hr.count, 1, false, 1.0f / static_cast<float>(G)))
        return refuse("head group " + std::to_string(g) + " splits a K/V head (GQA)");
    }
    return views;
  }
  for (int64_t i = 0; i < G; ++i) {
    const DilatedPattern& p = pats[static_cast<std::size_t>(i)];
    for (int64_t o = 0; o < std::min(p.dilation, H); ++o)
      if (!add(p, o, o, (H - o + p.dilation - 1) / p.dilation, p.dilation, true, 1.0f))
        return refuse("mixture heads at stride " + std::to_string(p.dilation) +
                      " do not cover whole K/V heads (GQA)");
  }
  return views;
}

std::vector<SdpaView> sdpa_views_or_throw(const AttentionConfig& cfg) {
  std::string why;
  std::vector<SdpaView> views = sdpa_views(cfg, &why);
  if (views.empty()) throw std::runtime_error(why);
  return views;
}

}  // namespace ringattn::kernels::cuda

// A block-sparse plan's device lists (sparse_device_lists.hpp).
#include "sparse/sparse_device_lists.hpp"

#include "kernels/cuda/hopper/dense_backward.hpp"  // hopper_wide_key_items
#include "kernels/cuda/runtime/device_wait.hpp"
#include "kernels/cuda/tiles.hpp"
#include "sparse/rank_work.hpp"  // sparse_query_items, sparse_key_items

namespace ringattn::sparse {

namespace kc = kernels::cuda;

void DeviceLists::upload(const std::vector<kernels::SparseQueryTile>& qt,
                         const std::vector<kernels::KeySpan>& ks,
                         const std::vector<kernels::SparseKeyTile>& kt,
                         const std::vector<kernels::QuerySpan>& qs, bool causal, int device,
                         cudaStream_t stream) {
  const std::vector<kernels::ForwardItem> qi = sparse_query_items(qt, ks, causal, kc::kQueryTile);
  const std::vector<kernels::ForwardItem> ki = sparse_key_items(kt, qs, causal, kc::kKeyTile);
  n_q_items = static_cast<int64_t>(qi.size());
  n_k_items = static_cast<int64_t>(ki.size());
  q_tiles = kc::upload_vector(qt, "the block-sparse query tiles", device, stream);
  key_spans = kc::upload_vector(ks, "the block-sparse key spans", device, stream);
  q_items = kc::upload_vector(qi, "the block-sparse query work items", device, stream);
  k_tiles = kc::upload_vector(kt, "the block-sparse key tiles", device, stream);
  query_spans = kc::upload_vector(qs, "the block-sparse query spans", device, stream);
  k_items = kc::upload_vector(ki, "the block-sparse key work items", device, stream);
  std::vector<kernels::ForwardItem> wide;
  wide_pairs = kc::hopper_wide_key_items(ki, wide).empty();
  if (wide_pairs && !wide.empty()) {
    n_wide_k_items = static_cast<int64_t>(wide.size());
    wide_k_items = kc::upload_vector(wide, "the block-sparse 128-key work items", device, stream);
  }
  kc::wait_for_stream(stream, "the block-sparse lists' upload");  // before qi, ki, wide go
  auto ok = [](int64_t x) { return x % 8 == 0; };
  for (const auto& t : qt) rows_aligned = rows_aligned && ok(t.q_row0);
  for (const auto& s : ks) rows_aligned = rows_aligned && ok(s.k_row0) && ok(s.k_stride);
  for (const auto& t : kt) rows_aligned = rows_aligned && ok(t.k_row0) && ok(t.k_stride);
  for (const auto& s : qs) rows_aligned = rows_aligned && ok(s.q_row0);
}

}  // namespace ringattn::sparse

// The Hopper block-sparse backward (see hopper/sparse_backward.hpp): hopper/backward_mainloop.cuh's
// two passes over hopper/work_sparse.cuh's SparseWork (dQ) and SparseKeyWork (dK/dV), in the native
// sparse_backward's order.
#include <limits>
#include <string>

#include "kernels/cuda/hopper/backward_launch.cuh"
#include "kernels/cuda/hopper/dense_backward.hpp"  // require_bulk_aligned_dq
#include "kernels/cuda/hopper/sparse_backward.hpp"
#include "kernels/cuda/hopper/work_sparse.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

std::string hopper_sparse_backward_unsupported(Elem e, const SparseBackwardParams& p,
                                               const HopperSparseShape& s, int device) {
  if (s.batch <= 0 || s.seq_len <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.kv_rows < 0)
    return "an empty tensor shape";
  if (p.q_stride != static_cast<int64_t>(s.heads) * p.head_dim)
    return "query rows not [B, N, H, D] (q_stride " + std::to_string(p.q_stride) + ")";
  if (p.n_q_items > std::numeric_limits<int>::max() ||
      p.n_k_items > std::numeric_limits<int>::max())
    return "more work items than a grid holds";
  return hopper::device_unsupported(p.head_dim, e, device, p.value_dim());
}

void hopper_sparse_backward(Elem e, const SparseBackwardParams& p, const HopperSparseShape& s,
                            cudaStream_t stream, bool fused, bool wide) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_sparse_backward_unsupported(e, p, s, device); !why.empty())
    throw RuntimeFailure("the Hopper block-sparse backward cannot run: " + why);
  if (p.n_q_items == 0 && p.n_k_items == 0) return;
  const hopper::KeyGeometry kv = hopper::key_geometry(s);
  const TmaDesc maps[4] = {
      hopper::tensor_map(p.q, e, s.batch, s.seq_len, s.heads, p.head_dim),
      hopper::tensor_map(p.k, e, kv.batch, kv.seq_len, kv.heads, p.head_dim),
      hopper::tensor_map(p.v, e, kv.batch, kv.seq_len, kv.heads, p.value_dim()),
      hopper::tensor_map(p.dout, e, s.batch, s.seq_len, s.heads, p.value_dim())};
  const hopper::SparseReach reach = hopper::sparse_reach(p.causal, p.window_left, p.window_right);
  fused = fused && hopper_fused_head_dims(p.head_dim, p.value_dim()) && p.n_k_items > 0;
  wide = wide && fused && hopper_wide_head_dim(p.head_dim);
  if (fused) require_bulk_aligned_dq(p.dq, "the Hopper block-sparse backward");
  if (p.n_q_items > 0 && !fused) {
    const auto a = hopper::backward_args(
        maps, p, 1.0f, 1.0f,
        hopper::SparseWork{p.q_tiles, p.key_spans, p.q_items, nullptr, nullptr, p.q_stride,
                           p.lse_stride, s.seq_len, s.heads, kv.heads, p.head_dim, kv.seq_len,
                           p.causal, p.window_left, p.window_right, reach.left, reach.right});
    hopper::launch_backward_pass<false>(p.head_dim, p.value_dim(), e, a,
                                        dim3(static_cast<unsigned>(p.n_q_items)), stream);
  }
  if (p.n_k_items > 0) {
    const auto a = hopper::backward_args(
        maps, p, 1.0f, 1.0f,
        hopper::SparseKeyWork{p.k_tiles, p.query_spans, p.k_items, p.lse_stride, s.seq_len, s.heads,
                              kv.heads, p.head_dim, kv.seq_len, p.causal, p.window_left,
                              p.window_right, reach.left, reach.right});
    if (wide) {
      auto w = a;
      w.work.block_rows = 2 * hopper::kRows;
      hopper::launch_fused_wide_backward(p.head_dim, e, w, dim3(static_cast<unsigned>(p.n_k_items)),
                                         stream);
    } else if (fused)
      hopper::launch_fused_backward(p.head_dim, p.value_dim(), e, a,
                                    dim3(static_cast<unsigned>(p.n_k_items)), stream);
    else
      hopper::launch_backward_pass<true>(p.head_dim, p.value_dim(), e, a,
                                         dim3(static_cast<unsigned>(p.n_k_items)), stream);
  }
}

}  // namespace ringattn::kernels::cuda

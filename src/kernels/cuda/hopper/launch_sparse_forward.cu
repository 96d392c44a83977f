// The Hopper block-sparse forward (see hopper/sparse_forward.hpp): hopper/forward_mainloop.cuh's
// body over hopper/work_sparse.cuh's SparseWork, a block per work item (64 rows of a query tile)
// walking the tile's key spans.
#include <limits>
#include <string>

#include "kernels/cuda/hopper/forward_launch.cuh"
#include "kernels/cuda/hopper/sparse_forward.hpp"
#include "kernels/cuda/hopper/work_sparse.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

std::string hopper_sparse_forward_unsupported(Elem e, const SparseForwardParams& p,
                                              const HopperSparseShape& s, int device) {
  if (s.batch <= 0 || s.seq_len <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.kv_rows < 0)
    return "an empty tensor shape";
  if (p.q_stride != static_cast<int64_t>(s.heads) * p.head_dim)
    return "query rows not [B, N, H, D] (q_stride " + std::to_string(p.q_stride) + ")";
  if (p.n_items > std::numeric_limits<int>::max()) return "more work items than a grid holds";
  return hopper::device_unsupported(p.head_dim, e, device, p.value_dim());
}

void hopper_sparse_forward(Elem e, const SparseForwardParams& p, const HopperSparseShape& s,
                           cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_sparse_forward_unsupported(e, p, s, device); !why.empty())
    throw RuntimeFailure("the Hopper block-sparse forward cannot run: " + why);
  if (p.n_items == 0) return;
  const hopper::SparseReach reach = hopper::sparse_reach(p.causal, p.window_left, p.window_right);
  const hopper::KeyGeometry kv = hopper::key_geometry(s);
  const hopper::Args<hopper::SparseWork> a{
      hopper::tensor_map(p.q, e, s.batch, s.seq_len, s.heads, p.head_dim),
      hopper::tensor_map(p.k, e, kv.batch, kv.seq_len, kv.heads, p.head_dim),
      hopper::tensor_map(p.v, e, kv.batch, kv.seq_len, kv.heads, p.value_dim()),
      hopper::logits_of(p.scale, p.softcap),
      p.accumulate,
      {p.tiles, p.spans, p.items, p.out, p.lse, p.q_stride, p.lse_stride, s.seq_len, s.heads,
       kv.heads, p.head_dim, kv.seq_len, p.causal, p.window_left, p.window_right, reach.left,
       reach.right}};
  hopper::launch_for(p.head_dim, p.value_dim(), e, "hopper_sparse_fwd_kernel", a,
                     dim3(static_cast<unsigned>(p.n_items)), stream, s.form);
}

}  // namespace ringattn::kernels::cuda

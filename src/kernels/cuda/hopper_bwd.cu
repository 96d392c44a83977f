// The Hopper dense backward (see hopper_bwd.hpp): hopper_bwd_kernel.cuh's two passes over
// hopper_dense_work.cuh's DenseWork, keys as rows for dK/dV and queries as rows for dQ.
#include <cstdlib>
#include <string>

#include "kernels/cuda/hopper_bwd.hpp"
#include "kernels/cuda/hopper_bwd_kernel.cuh"
#include "kernels/cuda/hopper_dense_work.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

bool hopper_fused_backward_chosen(bool deterministic, int head_dim) {
  static const bool fused = [] {
    const char* v = std::getenv("RINGATTN_HOPPER_BWD");
    return v && std::string(v) == "fused";
  }();
  return fused && !deterministic && head_dim <= 128;
}

std::string hopper_backward_unsupported(const HopperBackwardParams& p, int device) {
  return hopper::attention_unsupported(p, device);
}

void hopper_backward(const HopperBackwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_backward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper backward kernels cannot run: " + why);
  if (p.batch <= 0 || p.seq_len <= 0) return;
  const TmaDesc maps[4] = {
      hopper::tensor_map(p.q, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
      hopper::tensor_map(p.k, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      hopper::tensor_map(p.v, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      hopper::tensor_map(p.dout, p.elem, p.batch, p.seq_len, p.heads, p.head_dim)};
  auto a =
      hopper::backward_args(maps, p, 1.0f, 1.0f, hopper::dense_work(p, nullptr, nullptr, true));
  if (p.fused && p.head_dim <= 128) {
    hopper::launch_fused_backward(p.head_dim, p.elem, a, hopper::dense_grid(p, p.kv_heads),
                                  stream);
    return;
  }
  hopper::launch_backward_pass<true>(p.head_dim, p.elem, a, hopper::dense_grid(p, p.kv_heads),
                                     stream);
  a.work = hopper::dense_work(p, nullptr, nullptr, false);
  hopper::launch_backward_pass<false>(p.head_dim, p.elem, a, hopper::dense_grid(p, p.heads),
                                      stream);
}

}  // namespace ringattn::kernels::cuda

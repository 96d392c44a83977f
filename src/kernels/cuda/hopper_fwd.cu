// The Hopper dense forward (see hopper_fwd.hpp): hopper_fwd_kernel.cuh's body over
// hopper_dense_work.cuh's DenseWork, a block per (64-row query tile, head, batch), or (at
// D = 256, or as RINGATTN_HOPPER_PINGPONG says) its ping-pong kernel, a block per 128 rows.
#include <string>

#include "kernels/cuda/hopper_dense_work.cuh"
#include "kernels/cuda/hopper_fwd.hpp"
#include "kernels/cuda/hopper_fwd_kernel.cuh"
#include "ringattn/errors.hpp"

namespace ringattn::kernels::cuda {

std::string hopper_forward_unsupported(const HopperForwardParams& p, int device) {
  return hopper::attention_unsupported(p, device);
}

void hopper_forward(const HopperForwardParams& p, cudaStream_t stream) {
  int device = 0;
  RINGATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (const std::string why = hopper_forward_unsupported(p, device); !why.empty())
    throw RuntimeFailure("the Hopper forward kernel cannot run: " + why);
  hopper::Args<hopper::DenseWork> a{
      hopper::tensor_map(p.q, p.elem, p.batch, p.seq_len, p.heads, p.head_dim),
      hopper::tensor_map(p.k, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      hopper::tensor_map(p.v, p.elem, p.batch, p.seq_len, p.kv_heads, p.head_dim),
      p.scale * hopper::kLog2ef,
      false,
      hopper::dense_work(p, p.out, p.lse, false)};
  // The ping-pong kernel: 128-row blocks, two consumer warpgroups.
  if (const int step = hopper::pingpong_chosen(p.head_dim); step > 0) {
    a.work.block_rows = 2 * hopper::kRows;
    hopper::launch_pingpong(p.head_dim, p.elem, step, "hopper_fwd_pingpong_kernel", a,
                            hopper::dense_grid(p, p.heads, a.work.block_rows), stream);
    return;
  }
  hopper::launch_for(p.head_dim, p.elem, "hopper_fwd_kernel", a, hopper::dense_grid(p, p.heads),
                     stream);
}

}  // namespace ringattn::kernels::cuda

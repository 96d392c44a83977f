// CudaSparsePlan: block-sparse attention on CUDA devices, one rank or several. Built once
// from the configuration and the block lists: this rank's work lists and exchange
// (sparse/rank_work.hpp, the CPU SparsePlan's own) are uploaded once, the buffers for the
// exchanged K/V rows and dK/dV partials and the backward's row sums allocated once, and
// forward/backward then run on device pointers without allocating, on the plan's stream.
// On several ranks the needed (head, block) K/V rows are packed on the device and exchanged
// through a device communicator (NCCL) while the local blocks compute; the received blocks
// are merged in by log-sum-exp, and the backward returns their dK/dV partials to the owners,
// added in a fixed order (bitwise reproducible for a given P). No host synchronisation
// inside a call until its end (ring/stream_exchanges.hpp).
// Inputs (q, k, v, dout) are bf16, fp16 or fp32 on the device; outputs fp32. In a build
// without CUDA the same interface exists and refuses, as an InputError naming `device`.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ring/communicator.hpp"
#include "ring/ring_engine.hpp"
#include "ring/sharding.hpp"
#include "ringattn/config.hpp"
#include "single/cuda_plan.hpp"
#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

class CudaSparsePlan {
 public:
  // `cfg.attention` must be block_sparse and `lists` match its heads, N and block size.
  // `opts.kernel` cudnn is refused (InputError naming `kernel`): cuDNN has no block-sparse
  // kernel; automatic and native run the native kernels; hopper runs the local blocks'
  // forward and backward on the sm_90a kernels where they apply (bf16/fp16, D 64 or 128, a
  // compute capability 9.0 device, a build with sm_90a code) and says why not in notes()
  // otherwise.
  CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                 CudaPlanOptions opts = {});
  // On the ranks of `comm`, a device communicator (memory_space() == device) bound to
  // opts.device; each rank holds its shard of sparse_layout(cfg, comm.size()).
  // `ring_opts`: the watchdog's timeout and test fault injection (step 0 is the local
  // compute, step 1 the exchange and the remote compute), as for the CPU plan.
  CudaSparsePlan(const AttentionConfig& cfg, std::shared_ptr<const BlockLists> lists,
                 ring::Communicator& comm, CudaPlanOptions opts, ring::RingOptions ring_opts = {});
  ~CudaSparsePlan();
  CudaSparsePlan(CudaSparsePlan&&) noexcept;
  CudaSparsePlan& operator=(CudaSparsePlan&&) noexcept;

  const AttentionConfig& config() const noexcept;
  // The element type the kernels read: fp32 where the tensor-core kernels do not fit.
  DeviceDType dtype() const noexcept;

  // Device pointers to the local shards (layout()): q, k, v [B, N/P, H, D] of dtype(); out
  // fp32 [B, N/P, H, D]; lse fp32 [B, H, N/P]. Asynchronous on the plan's stream (call
  // synchronize() before reading).
  void forward(const void* q, const void* k, const void* v, float* out, float* lse);
  // Gradients of sum(out * dout); dout of dtype(); dq, dk, dv fp32, overwritten.
  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv);
  void synchronize();
  // The plan's cudaStream_t (its work is ordered on it; null in a build without CUDA).
  void* stream() const noexcept;

  // Each pass's kernel: "hopper" where --kernel hopper runs the local blocks on the sm_90a
  // block-sparse forward (backward), else "native".
  std::string kernel_name() const;
  std::string backward_kernel_name() const;
  const ring::ShardLayout& layout() const noexcept;
  // Of the last call, once synchronised (several ranks only; zeros on one): as the GPU ring's.
  const ring::RingTimings& last_forward() const noexcept;
  const ring::RingTimings& last_backward() const noexcept;
  int peers() const noexcept;  // ranks this rank exchanges with
  const std::vector<std::string>& notes() const noexcept;
  // Device bytes the plan holds beyond the caller's tensors (work lists, exchange buffers,
  // row sums).
  std::size_t workspace_bytes() const noexcept;
  std::string device_description() const;

 private:
  struct Impl;
  void finish_construction(double timeout_s = 0);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::sparse

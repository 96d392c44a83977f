// Attention sinks (docs/SEMANTICS.md, "Attention sinks"): a learned logit per query head that
// joins every query row's softmax normaliser and attends no value. The sink enters once, on a
// finished attention's out and lse (after every partial result has been merged), so every
// engine carries it with the same two steps: the forward's epilogue, and the sinks' gradient
// from the backward's out, dout and lse. The dq, dk, dv of the engines need nothing more: with
// the sink-adjusted out and lse, D = rowsum(dout ∘ out) and P = exp(s - lse) already are the
// softmax's with the sink. These are the host forms; kernels/cuda/ops/device_ops.hpp has the device
// ones.
#pragma once

#include <cstdint>

#include "ringattn/config.hpp"
#include "ringattn/types.hpp"  // DeviceDType

namespace ringattn::kernels {

// A shard's out [B, N, H, D] (laid out as `layout` says: rows, or the transpose(1, 2) of
// contiguous [B, H, N, D]) and lse [B, H, N].
struct SinkRows {
  int64_t batch = 0, rows = 0, heads = 0, head_dim = 0;
  TensorLayout layout = TensorLayout::bnhd;
};

// lse' = logaddexp(lse, sinks[h]) and out *= exp(lse - lse'), for every row. A sink of -inf
// leaves its head as it was; a row that attends no key gets lse' = sink and keeps out = 0.
void apply_sinks(const SinkRows& s, const float* sinks, float* out, float* lse, int threads);

// terms[h] = sum over this shard's rows of head h of exp(sinks[h] - lse) · rowsum(out ∘ dout),
// with out and lse the forward's (sink-adjusted) results; the shard's part of the sinks'
// gradient is -terms. Each head's sum is taken in row order (deterministic).
void sink_gradient_terms(const SinkRows& s, const float* sinks, const float* out, const float* dout,
                         const float* lse, double* terms, int threads);

}  // namespace ringattn::kernels

namespace ringattn::kernels::cuda {

// The device forms on a [B, N, H, D] shard (rows layout) in device memory on GPU `device`,
// enqueued on `stream` (a cudaStream_t): the epilogue as apply_sinks above, and dsinks[h] =
// minus this shard's terms (fp32), from dout of element type `dout_type`, summed in parallel
// in a fixed order through `workspace` (device memory of sink_gradient_workspace_bytes(s)).
// Throws InputError naming `device` in a build without CUDA kernels.
void apply_sinks(const SinkRows& s, const float* sinks, float* out, float* lse, void* stream,
                 int device);
std::size_t sink_gradient_workspace_bytes(const SinkRows& s);
void sink_gradient(const SinkRows& s, DeviceDType dout_type, const float* sinks, const float* out,
                   const void* dout, const float* lse, float* dsinks, void* workspace,
                   void* stream, int device);

}  // namespace ringattn::kernels::cuda

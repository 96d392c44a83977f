// The device forms of the attention sinks' epilogue and gradient (kernels/attention_sinks.hpp)
// over device_ops' kernels.
#include "kernels/attention_sinks.hpp"

#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"

namespace ringattn::kernels::cuda {
namespace {

SinkParams params_of(const SinkRows& s) {
  SinkParams p;
  p.batch = s.batch, p.seq_len = s.rows, p.heads = s.heads, p.head_dim = s.head_dim;
  return p;
}

}  // namespace

void apply_sinks(const SinkRows& s, const float* sinks, float* out, float* lse, void* stream,
                 int device) {
  const ScopedDevice on(device);
  SinkParams p = params_of(s);
  p.sinks = sinks, p.out = out, p.lse = lse;
  launch_apply_sinks(p, static_cast<cudaStream_t>(stream));
}

std::size_t sink_gradient_workspace_bytes(const SinkRows& s) {
  return static_cast<std::size_t>(sink_gradient_partials(s.batch, s.rows, s.heads)) *
         sizeof(double);
}

void sink_gradient(const SinkRows& s, DeviceDType dout_type, const float* sinks, const float* out,
                   const void* dout, const float* lse, float* dsinks, void* workspace,
                   void* stream, int device) {
  const ScopedDevice on(device);
  SinkParams p = params_of(s);
  p.sinks = sinks, p.out = const_cast<float*>(out), p.lse = const_cast<float*>(lse);
  p.dout = dout, p.dsinks = dsinks, p.partials = static_cast<double*>(workspace);
  launch_sink_gradient(elem_of(dout_type), p, static_cast<cudaStream_t>(stream));
}

}  // namespace ringattn::kernels::cuda

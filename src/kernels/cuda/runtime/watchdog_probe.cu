// The watchdog's probe (see device_wait.hpp): one warp whose first thread spins on a flag in
// device memory until the host sets it. The watchdog's tests plant it where a kernel never
// finishes; nothing else launches it.
#include "kernels/cuda/device_seam.cuh"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"

namespace ringattn::kernels::cuda {

namespace {

__global__ void watchdog_probe_kernel(const int* release) {
  if (threadIdx.x != 0) return;
  const volatile int* flag = release;
  while (*flag == 0) {
  }
}

}  // namespace

void launch_watchdog_probe(const int* release, cudaStream_t stream) {
  launch_kernel("ringattn_watchdog_probe_kernel", &watchdog_probe_kernel, dim3(1), dim3(32), 0,
                stream, release);
  RINGATTN_CUDA_CHECK_LAUNCH("ringattn_watchdog_probe_kernel");
}

}  // namespace ringattn::kernels::cuda

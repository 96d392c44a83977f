// How `--kernel auto` times a candidate on a GPU (one device and the ring alike): the median
// of 5 runs measured with events on the candidate's stream, after one warm-up run.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"

namespace ringattn::kernels::cuda {

// Milliseconds; `run` enqueues the work on `stream`. Throws what `run` or CUDA throws, and
// DeviceHang where a run does not finish within the stream's watchdog timeout.
template <class Run>
double median_ms(cudaStream_t stream, Run&& run) {
  cudaEvent_t a, b;
  RINGATTN_CUDA_CHECK(cudaEventCreate(&a));
  RINGATTN_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  try {
    run();
    for (int i = 0; i < 5; ++i) {
      RINGATTN_CUDA_CHECK(cudaEventRecord(a, stream));
      run();
      RINGATTN_CUDA_CHECK(cudaEventRecord(b, stream));
      wait_for_event(b, stream, "a timed kernel form");
      float t = 0;
      RINGATTN_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
  } catch (...) {
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
    throw;
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace ringattn::kernels::cuda

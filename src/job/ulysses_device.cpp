// The Ulysses all-to-all's device moves (see ulysses.hpp): cudaMemcpy2DAsync and a small add
// kernel on the inner plan's stream, the exchanges ordered after them by an event and the
// later copies after the exchange by its device event. Built with the CUDA plans.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "job/ulysses.hpp"
#include "kernels/cuda/ops/device_ops.hpp"
#include "kernels/cuda/runtime/cuda_check.hpp"
#include "kernels/cuda/runtime/device_wait.hpp"
#include "single/cuda_plan.hpp"

namespace ringattn::job {

namespace {

namespace kc = kernels::cuda;

class DeviceMoves final : public Moves {
 public:
  DeviceMoves(cudaStream_t stream, int device) : stream_(stream), device_(device) {
    const kc::ScopedDevice on(device_);
    RINGATTN_CUDA_CHECK(cudaEventCreateWithFlags(&packed_, cudaEventDisableTiming));
  }
  ~DeviceMoves() override {
    const kc::ScopedDevice on(device_, std::nothrow);
    if (!kc::device_stuck()) (void)cudaStreamSynchronize(stream_);  // not after a hang
    (void)cudaEventDestroy(packed_);
  }

  void* allocate(std::size_t bytes, const char* what) override {
    return buffers_.emplace_back(bytes ? bytes : 1, what, device_).data();
  }
  void copy2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
              std::size_t height) override {
    const kc::ScopedDevice on(device_);
    RINGATTN_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                          cudaMemcpyDeviceToDevice, stream_));
  }
  void add2d(float* dst, std::size_t dpitch, const float* src, std::size_t spitch,
             std::size_t width, std::size_t height) override {
    const kc::ScopedDevice on(device_);
    const auto f = [](std::size_t bytes) { return static_cast<int64_t>(bytes / sizeof(float)); };
    kc::add_floats_2d(dst, f(dpitch), src, f(spitch), f(width), static_cast<int64_t>(height),
                      stream_);
  }
  void zero(void* dst, std::size_t bytes) override {
    const kc::ScopedDevice on(device_);
    RINGATTN_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void before_exchange(ring::Communicator& comm) override {
    const kc::ScopedDevice on(device_);
    RINGATTN_CUDA_CHECK(cudaEventRecord(packed_, stream_));
    comm.stream_wait(packed_);
  }
  void after_exchange(ring::PendingExchange& done) override {
    if (void* e = done.device_event()) {
      const kc::ScopedDevice on(device_);
      RINGATTN_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(e), 0));
    }
  }

 private:
  cudaStream_t stream_;
  int device_;
  cudaEvent_t packed_ = nullptr;
  std::vector<DeviceBuffer> buffers_;
};

}  // namespace

std::unique_ptr<Moves> make_device_moves(void* stream, int device) {
  return std::make_unique<DeviceMoves>(static_cast<cudaStream_t>(stream), device);
}

}  // namespace ringattn::job

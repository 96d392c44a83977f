// The emulated CUDA runtime's internals, for the parts of the emulator built on it (kernel
// launches through device_seam.cuh, the in-process NCCL): devices, the current device of
// each host thread, streams as in-order queues run by their own worker thread, and sticky
// device errors. The public face is cuda_shim/cuda_runtime_api.h.
//
// Environment (read once, at first use):
//   RINGATTN_EMU_DEVICES        number of emulated devices (default 4, 1..64)
//   RINGATTN_EMU_PROFILE        sm_90 (H100: 132 SMs, 227 KiB opt-in shared memory per
//                               block; the default) or sm_86 (99 KiB opt-in); a comma list
//                               gives each device its own ("sm_90,sm_86")
//   RINGATTN_EMU_DEVICE_MEMORY  bytes of memory per emulated device (default 16 GiB; an
//                               accounting limit, allocations are host memory)
//   RINGATTN_EMU_STREAM_DELAY   SEED: each stream task starts after a random 0-200 us delay
//                               drawn from SEED, to shake out missing stream/event ordering
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "emu/dim3.hpp"

namespace ringattn::emu::runtime {

struct DeviceProfile {
  const char* arch;  // "sm_90"
  int major, minor;
  int multiprocessors;
  std::size_t shared_per_block;        // without opt-in (48 KiB)
  std::size_t shared_per_block_optin;  // the most cudaFuncSetAttribute may allow
};

int device_count();
const DeviceProfile& device_profile(int device);
// This host thread's current device (cudaSetDevice; 0 until set).
int current_device();

// The device a stream belongs to; nullptr is the current device's legacy default stream.
// -1 for a handle that is not a live stream.
int stream_device(cudaStream_t stream);

// Appends `task` to the stream's queue: it runs on the stream's worker thread once the work
// enqueued before it has run. Returns cudaErrorInvalidResourceHandle for a bad stream and the
// device's sticky error once a task on it has failed (the task is then not enqueued). A task
// reports a failure by throwing: the emulator prints it, makes it the device's sticky error
// (cudaErrorLaunchFailure for kernel faults) and skips the device's later tasks.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> task);

// Whether [p, p + bytes) lies in one live allocation (of `device`, or of any with -1).
bool is_device_memory(const void* p, std::size_t bytes, int device = -1);

// Sets this host thread's last error (cudaGetLastError) with a detail for the message.
cudaError_t fail(cudaError_t error, const std::string& detail);

// Launches a kernel body on `stream` (see device_seam.cuh): checks the configuration and the
// dynamic shared memory against the device's limit and the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize there, then runs the blocks on the stream's
// worker. A configuration error is returned (and is the last error), naming the kernel.
cudaError_t launch(const void* kernel, const char* name, Dim3 grid, Dim3 block,
                   std::size_t shared_bytes, cudaStream_t stream, std::function<void()> body);

// Tests: streams created from now on start each task after a random 0-200 us delay drawn
// from `seed` (as RINGATTN_EMU_STREAM_DELAY does for the whole process), or none with
// `enabled` false. Streams that exist keep their setting.
void set_stream_delays(bool enabled, std::uint64_t seed = 0);

// The detail of the most recent failure in the process (kernel fault, refused call), for
// cudaGetErrorString and tests; empty when none.
std::string last_failure_detail();

}  // namespace ringattn::emu::runtime

// The device watchdog: every wait of ours on a GPU stream polls with a deadline instead of
// blocking, so that a kernel that never finishes (a deadlock that needs real concurrency, a
// form no GPU has run before) ends the job with a message naming it, as a stalled rank does
// (progress_thread.hpp), never a hang. Plans register their streams; each kernel launched on
// a registered stream leaves an event in the stream's journal, and a wait that times out names
// the first journaled kernel that has not finished. After a timeout the device is left
// running that kernel: destructors then skip their synchronizations (device_stuck()), and the
// CLI ends the process at once.
#pragma once

#include <cuda_runtime_api.h>

namespace ringattn::kernels::cuda {

// The watchdog's timeout where a stream has none registered: JobSpec::timeout_s's default.
inline constexpr double kDefaultDeviceTimeoutSeconds = 300;

// `stream` (of the current device) is a plan's: its launches are journaled, and waits on it
// time out after `timeout_s`. forget_stream() before the stream is destroyed.
void register_stream(cudaStream_t stream, double timeout_s);
void forget_stream(cudaStream_t stream) noexcept;

// How a plan ends its stream (null: nothing): waits for its work (not after the watchdog
// fired: the device still runs the hung kernel), forgets it, destroys it, and hands the
// device pool's unused memory back. After the plan's device memory went back to the pool.
void close_plan_stream(cudaStream_t stream, int device) noexcept;

// The watchdog's timeout for `stream` (kDefaultDeviceTimeoutSeconds if not registered).
double stream_timeout(cudaStream_t stream);

// Called after each launch on `stream` (launch_kernel does; so do the places that run
// cuDNN's graphs): on a registered stream, not under graph capture, records an event after
// the work with `name` (a string literal) for the watchdog's message. Never throws, and never
// sets CUDA's last error.
void journal_launch(const char* name, cudaStream_t stream) noexcept;

// Waits until all work enqueued on `stream` so far has finished, polling for at most
// `timeout_s` (stream_timeout(stream) when negative). Throws DeviceHang (ringattn/errors.hpp)
// naming the kernel in flight and `what` ("the forward") when it does not finish in time, and
// the CUDA error (RuntimeFailure) when the stream faulted.
void wait_for_stream(cudaStream_t stream, const char* what, double timeout_s = -1);

// As wait_for_stream, until `event`, recorded on `stream`, has completed.
void wait_for_event(cudaEvent_t event, cudaStream_t stream, const char* what,
                    double timeout_s = -1);

// Whether a wait has timed out on work that has still not finished: then nothing may wait on
// the device (a synchronize, a cudaFree) or it would hang with it.
bool device_stuck() noexcept;

// Enqueues on `stream` a kernel that spins until `*release` (device memory, or null: never)
// is nonzero: the watchdog's tests plant it as a kernel that never finishes. Its name in the
// watchdog's messages is "ringattn_watchdog_probe_kernel".
void launch_watchdog_probe(const int* release, cudaStream_t stream);

// RINGATTN_TEST_PLANT_HANG=1, for the watchdog's tests only: the first call in the process
// enqueues on `stream` a watchdog probe that is never released (CudaPlan's forward calls it),
// so that a whole job meets a kernel that never finishes. Otherwise nothing.
void plant_hang_if_asked(cudaStream_t stream);

}  // namespace ringattn::kernels::cuda

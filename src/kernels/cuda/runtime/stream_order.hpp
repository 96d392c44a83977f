// Orders one stream's later work after everything already queued on another, through an
// event and without the host waiting: how an engine runs on its own stream while taking its
// inputs from, and handing its results to, the caller's stream.
#pragma once

namespace ringattn::kernels::cuda {

// Work queued on `then` after this call starts only once the work queued on `first` before
// it is done. Streams are cudaStream_t (null: the legacy default stream) on `device`.
// Throws RuntimeFailure (in a build without CUDA: InputError naming `device`).
void order_after(void* first, void* then, int device);

}  // namespace ringattn::kernels::cuda

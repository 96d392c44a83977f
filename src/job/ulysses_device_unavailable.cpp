// The Ulysses all-to-all on device memory in a build without the CUDA toolkit: asking for it
// says, naming `device`, that this build has no CUDA kernels.
#include "job/ulysses.hpp"
#include "kernels/cuda/runtime/unavailable.hpp"

namespace ringattn::job {
std::unique_ptr<Moves> make_device_moves(void*, int) { kernels::cuda::no_cuda(); }
}  // namespace ringattn::job

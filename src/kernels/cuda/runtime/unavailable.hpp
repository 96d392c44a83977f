// For the `*_unavailable.cpp` stubs of a build without the CUDA toolkit (one per layer): the
// one error every entry point that needs a device throws.
#pragma once

namespace ringattn::kernels::cuda {

// Throws InputError naming `device`: this build has no CUDA kernels.
[[noreturn]] void no_cuda();
// Its message, for reports that say why no device is usable.
extern const char* const kNoCudaReason;

}  // namespace ringattn::kernels::cuda

// Which vector forms the CPU kernels run: chosen from CPUID when the process first asks, not
// at build time, so that one binary runs well (and correctly) on any x86-64 host. The forms
// are the hand-written softmax steps of cpu_keymajor (AVX-512 or AVX2 + FMA, each compiled
// with a function target attribute so that the rest of the build keeps its own -march), the
// libxsmm JIT target of the tile products and OpenBLAS's kernels. `portable` is the C++ form
// the compiler vectorises for the build's own target.
//
// RINGATTN_CPU_KERNELS=auto|avx512|avx2|portable forces a variant the CPU can execute (an
// InputError naming the variable otherwise): to measure the AVX2 path on an AVX-512 host, or
// to test every variant the host runs. Forcing avx2 also sets libxsmm's target to 'hsw' and
// OpenBLAS's kernels to Haswell, unless LIBXSMM_TARGET or OPENBLAS_CORETYPE say otherwise.
#pragma once

#include <string>

namespace ringattn::kernels {

enum class CpuIsa { portable, avx2, avx512 };

// "portable", "avx2" or "avx512".
const char* to_string(CpuIsa isa);

// Whether this CPU executes the variant (AVX2 needs AVX2 and FMA; AVX-512 needs F, CD, BW,
// DQ and VL: the set OpenBLAS's SkylakeX kernels and our forms use). Always true for portable.
bool cpu_can_run(CpuIsa isa);

// The widest variant this CPU executes.
CpuIsa best_cpu_isa();

// The variant in use: set_cpu_isa's, else RINGATTN_CPU_KERNELS's (read once), else the best.
CpuIsa cpu_isa();

// Whether RINGATTN_CPU_KERNELS (not CPUID) chose the variant.
bool cpu_isa_forced();

// For tests and benchmarks: run `isa` from now on (InputError naming RINGATTN_CPU_KERNELS
// when the CPU cannot execute it). Not thread-safe against running kernels.
void set_cpu_isa(CpuIsa isa);

// For reports: "AVX-512 (chosen by ringattn, from the CPU's features)" or
// "AVX2 (RINGATTN_CPU_KERNELS; the CPU has AVX-512)".
std::string cpu_isa_summary();

}  // namespace ringattn::kernels

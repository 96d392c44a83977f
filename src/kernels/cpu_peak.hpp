// The floating-point ceiling of the machine for the CPU kernels as built: what benchmarks
// set their GFLOP/s against besides the same run's SGEMM rate (which is what a tuned BLAS
// gets of it). Not used by the kernels themselves.
#pragma once

namespace ringattn::kernels {

// Single-precision fused multiply-add rate, in GFLOP/s (2 per lane per FMA), of `threads`
// threads each running independent FMA chains on registers only, at the vector width of the
// kernels' variant in use (cpu_isa.hpp: AVX-512 or AVX2): no memory traffic, enough chains
// to hide the FMA latency, so no kernel of that variant can run faster. The median of 3
// runs of ~0.1 s after a warm-up. 0 for the portable variant (no FMA vectors assumed).
double fma_peak_gflops(int threads);

// The vector width fma_peak_gflops measured: "AVX-512", "AVX2+FMA" or "none".
const char* fma_peak_isa();

}  // namespace ringattn::kernels

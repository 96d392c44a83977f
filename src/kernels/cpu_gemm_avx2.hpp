// ringattn's own AVX2 tile product: the tile products' backend where libxsmm is not built in
// and the CPU runs AVX2 (an AVX-512 host included: OpenBLAS's sgemm packs both operands on
// every call and reaches ~40 % of its large-GEMM rate on these tiles), or when
// RINGATTN_SMALL_GEMM=avx2 asks for it. On the forward's tile shapes (256 queries × 128 keys
// × head dim 64, and P·V) it runs about as fast as libxsmm's generated AVX2 ('hsw') kernels
// (docs/PERFORMANCE.md, bench/README.md "AVX2 hosts"). Column-major, the small_gemm contract:
// C (m×n) = A (m×k) · B (k×n) + beta · C, beta 0 or 1, any m, n, k and leading dimensions;
// each element's sum runs over k in order (one FMA chain), so the result does not depend on
// the blocking.
#pragma once

namespace ringattn::kernels {

// Whether this build has the kernel (x86-64 with GCC or Clang); cpu_can_run(CpuIsa::avx2)
// says whether the CPU can run it.
bool gemm_avx2_built();

// Only on a CPU that runs AVX2 and FMA.
void gemm_avx2(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
               float* c, int ldc);

}  // namespace ringattn::kernels

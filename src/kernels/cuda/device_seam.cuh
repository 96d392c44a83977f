// The one seam between the kernel sources and what runs them: a real GPU (nvcc) or the SIMT
// emulator (the same sources as host C++, -DRINGATTN_CUDA_EMULATION=ON, see src/emu/). The
// kernels are written against these names only:
//   SmemPtr<T>, SmemAddr   a pointer into the block's dynamic shared memory and the 32-bit
//                          shared-window address ldmatrix and cp.async take (on the
//                          emulator: a checked offset into the block's arena)
//   dynamic_smem<T>()      the start of the block's dynamic shared memory
//   smem_addr(p)           the shared-window address of p
//   ptx::...               the PTX instructions the kernels use (inline asm on the device,
//                          warp-collective emulations with the PTX ISA's layouts otherwise)
//   launch_kernel(...)     kernel<<<grid, block, shared, stream>>>(args...), with a name for
//                          messages and the device watchdog's journal (device_wait.hpp);
//                          check cudaGetLastError after it, as after <<<>>>
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime/device_wait.hpp"  // journal_launch

#if RINGATTN_CUDA_EMULATION
#include <memory>
#include <tuple>
#include <type_traits>

#include "emu/bulk_reduce.hpp"
#include "emu/cp_async.hpp"
#include "emu/ldmatrix.hpp"
#include "emu/mbarrier.hpp"
#include "emu/mma.hpp"
#include "emu/named_barrier.hpp"
#include "emu/runtime.hpp"
#include "emu/shared_memory.hpp"
#include "emu/tma.hpp"
#include "emu/wgmma.hpp"
#else
#include <cuda.h>  // CUtensorMap
#endif

namespace ringattn::kernels::cuda {

namespace ptx {
// The N of wgmma's register-A product with B read N-major (O += P·V, dK/dV += ·Q/dO, dQ +=
// dS·K) that hopper/wgmma.cuh has wrappers for: the head dims, D or Dv.
template <int kN>
inline constexpr bool kRsTbWidth = kN == 64 || kN == 128 || kN == 192 || kN == 256;
}  // namespace ptx

#if RINGATTN_CUDA_EMULATION

template <typename T>
using SmemPtr = emu::SharedPtr<T>;
using SmemAddr = emu::SharedAddress;

template <typename T>
inline SmemPtr<T> dynamic_smem() {
  return emu::dynamic_shared_memory<T>();
}
template <typename T>
inline SmemAddr smem_addr(SmemPtr<T> p) {
  return p.address();
}

namespace ptx {
inline void cp_async_cg_16(SmemAddr dst, const void* src, int src_size) {
  emu::cp_async_cg_16(dst, src, static_cast<unsigned>(src_size));
}
inline void cp_async_commit_group() { emu::cp_async_commit_group(); }
template <int kPending>
inline void cp_async_wait_group() {
  emu::cp_async_wait_group(kPending);
}
inline void ldmatrix_x4(uint32_t (&r)[4], SmemAddr row) { emu::ldmatrix_x4(r, row); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], SmemAddr row) { emu::ldmatrix_x4_trans(r, row); }
inline void mma_m16n8k16_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_m16n8k16(emu::MmaInput::bf16, c, a, b0, b1);
}
inline void mma_m16n8k16_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_m16n8k16(emu::MmaInput::f16, c, a, b0, b1);
}

// Hopper (sm_90a): mbarriers, TMA box loads, wgmma, stmatrix (see src/emu/*.hpp for the
// semantics).
inline void stmatrix_x4_trans(SmemAddr row, const uint32_t (&r)[4]) {
  emu::stmatrix_x4_trans(r, row);
}
inline void mbarrier_init(SmemAddr bar, unsigned count) { emu::mbarrier_init(bar, count); }
inline void fence_barrier_init() {}
inline void mbarrier_arrive(SmemAddr bar) { (void)emu::mbarrier_arrive(bar); }
inline void mbarrier_arrive_expect_tx(SmemAddr bar, unsigned bytes) {
  (void)emu::mbarrier_arrive_expect_tx(bar, bytes);
}
inline void mbarrier_wait(SmemAddr bar, unsigned parity) {
  (void)emu::mbarrier_try_wait_parity(bar, parity);
}
inline void tma_load_4d(SmemAddr dst, const emu::TensorMap& map, SmemAddr bar, int c0, int c1,
                        int c2, int c3) {
  const int32_t coords[] = {c0, c1, c2, c3};
  emu::cp_async_bulk_tensor(dst, map, coords, bar);
}
inline void wgmma_fence() { emu::wgmma_fence(); }
inline void wgmma_commit_group() { emu::wgmma_commit_group(); }
template <int kPending>
inline void wgmma_wait_group() {
  emu::wgmma_wait_group(kPending);
}
template <int kN, bool kBf16>
inline void wgmma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::wgmma_m64k16_ss(kBf16 ? emu::MmaInput::bf16 : emu::MmaInput::f16, kN, d, desc_a, desc_b,
                       scale_d != 0);
}
template <int kN, bool kBf16>
inline void wgmma_rs_tb(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  // The GPU build's wrappers (hopper/wgmma.cuh) exist for these widths only: an emulated
  // build that instantiated another would not compile for sm_90a.
  static_assert(kRsTbWidth<kN>, "O, dK, dV and dQ tiles are a head dim wide");
  emu::wgmma_m64k16_rs(kBf16 ? emu::MmaInput::bf16 : emu::MmaInput::f16, kN, d, a, desc_b,
                       scale_d != 0, true);
}
// Register A, B read K-major (not transposed): S = Q·Kᵀ with Q in registers.
template <int kN, bool kBf16>
inline void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  emu::wgmma_m64k16_rs(kBf16 ? emu::MmaInput::bf16 : emu::MmaInput::f16, kN, d, a, desc_b,
                       scale_d != 0, false);
}
template <bool kIncrease, unsigned kCount>
inline void setmaxnreg() {
  emu::setmaxnreg(kIncrease, kCount);
}
// bar.sync id, count (a named barrier of `count` threads).
inline void named_barrier_sync(unsigned id, unsigned count) { emu::named_barrier_sync(id, count); }
// bar.arrive id, count: counts toward the barrier without waiting for it.
inline void named_barrier_arrive(unsigned id, unsigned count) {
  emu::named_barrier_arrive(id, count);
}
// fence.proxy.async.shared::cta: this thread's generic stores to shared memory, ordered before
// the async proxy's (wgmma's, TMA's) later accesses. The emulator faults when a wgmma reads
// shared memory that a thread accessed through the generic proxy with no such fence since.
inline void fence_proxy_async_shared() { emu::fence_proxy_async_shared(); }
// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [dst], [src], bytes: adds
// `bytes` (a multiple of 16; both addresses 16-byte aligned) of fp32 from shared memory to
// global memory, asynchronously; completed by the bulk async-group waits below. The emulator
// faults on a missing fence.proxy.async before it, the source rewritten before
// bulk_wait_group_read, overlapping slices in flight, the destination touched before
// bulk_wait_group, and a thread exiting with one in flight (emu/bulk_reduce.hpp).
inline void bulk_reduce_add_f32(float* dst, SmemAddr src, unsigned bytes) {
  emu::cp_reduce_async_bulk_add_f32(dst, src, bytes);
}
// cp.async.bulk.commit_group: this thread's bulk operations since the last one, as a group.
inline void bulk_commit_group() { emu::cp_async_bulk_commit_group(); }
// cp.async.bulk.wait_group N: all but the newest N groups complete (their writes visible).
template <int kPending>
inline void bulk_wait_group() {
  emu::cp_async_bulk_wait_group(kPending, false);
}
// cp.async.bulk.wait_group.read N: all but the newest N groups have read their sources.
template <int kPending>
inline void bulk_wait_group_read() {
  emu::cp_async_bulk_wait_group(kPending, true);
}
}  // namespace ptx

using TmaDesc = emu::TensorMap;
#define RINGATTN_GRID_CONSTANT

template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::size_t shared_bytes, cudaStream_t stream, const Args&... args) {
  // The launch keeps its own copy of the arguments, as the runtime does at the call; every
  // emulated thread then receives them by value.
  auto copies = std::make_shared<std::tuple<std::decay_t<Params>...>>(args...);
  (void)emu::runtime::launch(reinterpret_cast<const void*>(kernel), name, {grid.x, grid.y, grid.z},
                             {block.x, block.y, block.z}, shared_bytes, stream,
                             [kernel, copies] { std::apply(kernel, *copies); });
  journal_launch(name, stream);
}

#else  // a real GPU

template <typename T>
using SmemPtr = T*;
using SmemAddr = uint32_t;

extern __shared__ __align__(16) unsigned char ringattn_dynamic_smem[];

template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  return reinterpret_cast<T*>(ringattn_dynamic_smem);
}
template <typename T>
__device__ __forceinline__ uint32_t smem_addr(const T* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

namespace ptx {
// 16 bytes global → shared, bypassing L1; bytes past src_size (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async_cg_16(uint32_t dst, const void* src, int src_size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_m16n8k16_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
}  // namespace ptx

#if CUDA_VERSION >= 12000
using TmaDesc = CUtensorMap;
#endif
#define RINGATTN_GRID_CONSTANT __grid_constant__

#if defined(RINGATTN_SM90A_KERNELS)
// Hopper (sm_90a) instructions, for sources compiled for 90a only (hopper/launch_dense_forward.cu).
namespace ptx {
// Four 8 × 8 b16 matrices from the warp's registers (ldmatrix's fragment layout), each
// stored transposed: lanes 8j..8j+7 give the addresses of matrix j's eight 16-byte rows.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :
               : "r"(row), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void mbarrier_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap& map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, unsigned bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <bool kIncrease, unsigned kCount>
__device__ __forceinline__ void setmaxnreg() {
  if constexpr (kIncrease)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kCount));
  else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCount));
}
}  // namespace ptx
}  // namespace ringattn::kernels::cuda
#include "kernels/cuda/hopper/wgmma.cuh"
namespace ringattn::kernels::cuda {
namespace ptx {
template <int kN, bool kBf16>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  static_assert(kN == 64, "S = Q K^T tiles are 64 keys wide");
  if constexpr (kBf16)
    wgmma_ss_m64n64k16_bf16(d, desc_a, desc_b, scale_d);
  else
    wgmma_ss_m64n64k16_f16(d, desc_a, desc_b, scale_d);
}
template <int kN, bool kBf16>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4],
                                         uint64_t desc_b, int scale_d) {
  static_assert(kN == 64, "S = Q K^T tiles are 64 keys wide");
  if constexpr (kBf16)
    wgmma_rs_m64n64k16_bf16(d, a, desc_b, scale_d);
  else
    wgmma_rs_m64n64k16_f16(d, a, desc_b, scale_d);
}
template <int kN, bool kBf16>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[kN / 2], const uint32_t (&a)[4],
                                            uint64_t desc_b, int scale_d) {
  static_assert(kRsTbWidth<kN>, "O, dK, dV and dQ tiles are a head dim wide");
  if constexpr (kN == 64 && kBf16)
    wgmma_rs_m64n64k16_bf16_tb(d, a, desc_b, scale_d);
  else if constexpr (kN == 64)
    wgmma_rs_m64n64k16_f16_tb(d, a, desc_b, scale_d);
  else if constexpr (kN == 128 && kBf16)
    wgmma_rs_m64n128k16_bf16_tb(d, a, desc_b, scale_d);
  else if constexpr (kN == 128)
    wgmma_rs_m64n128k16_f16_tb(d, a, desc_b, scale_d);
  else if constexpr (kN == 192 && kBf16)
    wgmma_rs_m64n192k16_bf16_tb(d, a, desc_b, scale_d);
  else if constexpr (kN == 192)
    wgmma_rs_m64n192k16_f16_tb(d, a, desc_b, scale_d);
  else if constexpr (kBf16)
    wgmma_rs_m64n256k16_bf16_tb(d, a, desc_b, scale_d);
  else
    wgmma_rs_m64n256k16_f16_tb(d, a, desc_b, scale_d);
}
}  // namespace ptx
#endif

template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::size_t shared_bytes, cudaStream_t stream, const Args&... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
  journal_launch(name, stream);
}

#endif

}  // namespace ringattn::kernels::cuda

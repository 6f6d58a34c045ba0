// Thin wrappers over the Hopper (sm_90a) instructions of the wgmma decode
// kernel (decode_kernel_sm90.cuh): warpgroup MMA on e4m3 (A in registers or
// shared memory, B in shared memory), the shared-memory matrix descriptor,
// and the proxy fence that orders ordinary shared-memory writes before the
// tensor cores read them.
//
// Only compiled into device code for sm_90a (MLA_SM90A_DEVICE below); other
// device passes see declarations with empty bodies that are never launched
// (the launcher checks the device and the build, see decode_kernel_sm90.cuh).
#pragma once

#include <stdint.h>

#include "../../mla_decode/portability.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_SM90A_DEVICE 1
#else
#define MLA_SM90A_DEVICE 0
#endif

namespace mla_decode {
namespace cuda {
namespace sm90 {

// ---------------------------------------------------------------------------
// Shared-memory matrix descriptor (PTX ISA, "matrix descriptor" of wgmma), for
// the no-swizzle ("interleaved") canonical layout only: the operand is a grid
// of core matrices, each 8 rows (M or N) x 16 bytes (K) stored as 128
// contiguous bytes; `lbo` is the byte distance between core matrices adjacent
// in K, `sbo` between core matrices adjacent in M/N. Bits: 0-13 start address
// >> 4, 16-29 lbo >> 4, 32-45 sbo >> 4, 62-63 swizzle mode (0: none).
// ---------------------------------------------------------------------------
// Kept as two 32-bit words so that stepping the start address is one 32-bit
// add (shared-memory addresses < 256 KB never carry out of the 14 bits).
__device__ __forceinline__ uint32_t smem_desc_lo(uint32_t smem_addr, uint32_t lbo) {
  return ((smem_addr >> 4) & 0x3FFFu) | (((lbo >> 4) & 0x3FFFu) << 16);
}
__device__ __forceinline__ uint64_t smem_desc(uint32_t lo, uint32_t sbo) {
  return (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | lo;
}

// ---------------------------------------------------------------------------
// wgmma. Issued by all 128 threads of a warpgroup. A fragment (8-bit types,
// m64 x k32; warp w of the group supplies rows 16w..16w+15; g = lane / 4,
// c = lane % 4; byte i of a register is k + i):
//   a0 = (row g,   k 4c..4c+3)     a1 = (row g+8, k 4c..4c+3)
//   a2 = (row g,   k 16+4c..+3)    a3 = (row g+8, k 16+4c..+3)
// Accumulator (m64 x nN fp32, N/2 registers): d[4i + 2r + e] = (row 16w + g + 8r,
// column 8i + 2c + e).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() {
#if MLA_SM90A_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MLA_SM90A_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if MLA_SM90A_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Precision note: the e4m3 tensor cores add into the fp32 accumulator with
// only ~14 significant bits (the DeepSeek-V3 report measured this on H800;
// the same holds here, docs/kernel-design.md), so every chained wgmma adds a
// truncation error relative to the accumulator's magnitude. Callers keep the
// chains short and sum them in fp32.
//
// d (64 x 16) (+)= A (64 x 32, registers) * B (32 x 16, shared, K-major).
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n16k32_e4m3_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
#endif
}

// d (64 x N) (+)= A (64 x 32, shared, K-major) * B (32 x N, shared, K-major):
// the two shapes the QK step uses (N = 32 for Q's mid|lo terms, N = 16 for hi).
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n32k32_e4m3_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
#endif
}
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n16k32_e4m3_ss(float (&d)[8], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
#endif
}

// ---------------------------------------------------------------------------
// Proxy fence: shared memory written by ordinary stores and read next by
// wgmma (the async proxy) needs this in every writing thread before the
// barrier that publishes it.
// ---------------------------------------------------------------------------
__device__ __forceinline__ void fence_proxy_async_shared() {
#if MLA_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

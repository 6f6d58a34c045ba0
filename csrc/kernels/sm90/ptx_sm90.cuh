// Thin wrappers over the Hopper (sm_90a) instructions of the wide, narrow and
// register-V kernels (wide_kernel.cuh, narrow_kernel.cuh,
// narrow_register_v_kernel.cuh): warpgroup MMA (bf16 / f16 with operands in
// shared memory or A in registers; e4m3 with operands in shared memory), the
// shared-memory matrix descriptor, mbarriers, TMA loads with an optional L2
// policy, setmaxnreg, named barriers, and the proxy fence that orders
// ordinary shared-memory writes before the tensor cores read them.
//
// Only compiled into device code for sm_90a (MLA_SM90A_DEVICE below); other
// device passes see declarations with empty bodies that are never launched
// (the plan selects a Hopper kernel only for an sm_90a build on an sm_90
// device: plan.cpp, why_not_hopper).
#pragma once

#include <cuda_fp8.h>
#include <stdint.h>

#include "common/portability.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_SM90A_DEVICE 1
#else
#define MLA_SM90A_DEVICE 0
#endif

namespace mla_decode {
namespace cuda {
namespace sm90 {

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

// wgmma_wait<n> for an n known at compile time after unrolling (a loop
// index): the switch folds away.
__device__ __forceinline__ void wgmma_wait_dynamic(int n) {
  switch (n) {
    case 0: wgmma_wait<0>(); break;
    case 1: wgmma_wait<1>(); break;
    case 2: wgmma_wait<2>(); break;
    case 3: wgmma_wait<3>(); break;
    case 4: wgmma_wait<4>(); break;
    case 5: wgmma_wait<5>(); break;
    case 6: wgmma_wait<6>(); break;
    default: wgmma_wait<7>(); break;
  }
}

// Precision note: the e4m3 tensor cores add into the fp32 accumulator with
// only ~14 significant bits (the DeepSeek-V3 report measured this on H800;
// the same holds on the H200, docs/kernels.md), so every chained wgmma adds a
// truncation error relative to the accumulator's magnitude. Callers keep the
// chains short and sum them in fp32.
//
// d (64 x 32) (+)= A (64 x 32, shared, K-major) * B (32 x 32, shared,
// K-major): the register-V kernel's QK (N = 32: the hi and mid terms of 16
// heads' Q side by side).
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
// The same with d = A * B (no accumulation): d is only written, so its
// registers carry no dependence on their previous contents (a group of
// chained k-steps starts here).
__device__ __forceinline__ void wgmma_m64n32k32_e4m3_ss_first(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 0, 1, 1;\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
      : "l"(desc_a), "l"(desc_b));
#endif
}

// ---------------------------------------------------------------------------
// 128-byte-swizzled operands (every shared-memory operand of the wide, narrow
// and register-V kernels). A swizzle atom is 8 rows of 128 bytes (1024 bytes,
// 1024-aligned); the 16-byte chunk j of row r is stored at chunk position
// j ^ (r % 8), which is what the hardware undoes from the address bits.
// Descriptor (PTX ISA, "matrix descriptor" of wgmma): bits 0-13 the start
// address >> 4, 16-29 lbo >> 4, 32-45 sbo >> 4, 62-63 the layout type (1:
// 128-byte swizzle).
//   K-major (rows along M or N, 128 bytes of K per row: 64 bf16 / f16 or 128
//     e4m3): sbo = bytes between 8-row groups; lbo unused (1). A k-step (16
//     16-bit or 32 8-bit elements) starts 32 bytes on.
//   MN-major (rows along K, 64 bf16 of M or N per row): lbo = bytes between
//     64-element column blocks of M/N, sbo = bytes between 8-row groups of K.
// ---------------------------------------------------------------------------
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// d (64 x 64 fp32) (+)= A (64 x 16, shared, K-major) * B (16 x 64, shared, K-major);
// d (64 x 256 fp32) (+)= A (64 x 16, shared, K-major) * B (16 x 256, shared, N-major);
// bf16 or f16 operands. Accumulator layout as for e4m3: d[4i + 2r + e] = (row 16w + g + 8r,
// column 8i + 2c + e).
// Accumulator operand lists of the bf16 / f16 wgmma wrappers below (N / 2
// fp32 registers per thread for an m64nN shape) and their register strings.
#define MLA_WGMMA_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define MLA_WGMMA_R8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define MLA_WGMMA_D32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MLA_WGMMA_R32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MLA_WGMMA_D128 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define MLA_WGMMA_R128 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// d (+)= A * B with both operands in shared memory (descriptors), fp32
// accumulators; TYPE "bf16" or "f16"; TNSPA "1" reads A M-major, TNSPB "1"
// reads B N-major.
#define MLA_WGMMA_SS_T(SHAPE, TYPE, TNSPA, TNSPB, NREG, IA, IB, IS)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                                           \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" MLA_WGMMA_R##NREG              \
               "}, %" IA ", %" IB ", p, 1, 1, " TNSPA ", " TNSPB ";\n}\n"                                    \
               : MLA_WGMMA_D##NREG                                                                          \
               : "l"(desc_a), "l"(desc_b), "n"(kAccumulate ? 1 : 0))
#define MLA_WGMMA_SS(SHAPE, TYPE, TNSPB, NREG, IA, IB, IS) MLA_WGMMA_SS_T(SHAPE, TYPE, "0", TNSPB, NREG, IA, IB, IS)

// kF16: f16 operands (OCP fp8 on the wide and narrow kernels), else bf16.
template <bool kF16, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  if constexpr (kF16) {
    MLA_WGMMA_SS("m64n64k16", "f16", "0", 32, "32", "33", "34");
  } else {
    MLA_WGMMA_SS("m64n64k16", "bf16", "0", 32, "32", "33", "34");
  }
#endif
}
template <bool kF16, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n256k16_ss_tnspb(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  if constexpr (kF16) {
    MLA_WGMMA_SS("m64n256k16", "f16", "1", 128, "128", "129", "130");
  } else {
    MLA_WGMMA_SS("m64n256k16", "bf16", "1", 128, "128", "129", "130");
  }
#endif
}
// d (64 x 16 fp32) (+)= A (64 x 16, shared) * B (16 x 16, shared, K-major), bf16
// or f16 operands; kTnspA reads A M-major (the narrow kernel's V^T: the stored
// key tile, dims contiguous, read with keys as K).
template <bool kF16, bool kAccumulate, bool kTnspA>
__device__ __forceinline__ void wgmma_m64n16k16_ss(float (&d)[8], uint64_t desc_a, uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  if constexpr (kF16 && kTnspA) {
    MLA_WGMMA_SS_T("m64n16k16", "f16", "1", "0", 8, "8", "9", "10");
  } else if constexpr (kF16) {
    MLA_WGMMA_SS_T("m64n16k16", "f16", "0", "0", 8, "8", "9", "10");
  } else if constexpr (kTnspA) {
    MLA_WGMMA_SS_T("m64n16k16", "bf16", "1", "0", 8, "8", "9", "10");
  } else {
    MLA_WGMMA_SS_T("m64n16k16", "bf16", "0", "0", 8, "8", "9", "10");
  }
#endif
}

// d (64 x 16 fp32) += A (64 x 16 f16, registers) * B (16 x 16 f16, shared,
// K-major). A is the mma.sync m16n8k16 fragment of the warp's 16 rows:
// a0 = (row g, k 2c..2c+1), a1 = (row g+8, k 2c..), a2 = (row g, k 8+2c..),
// a3 = (row g+8, k 8+2c..), the lower k in the low half.
__device__ __forceinline__ void wgmma_m64n16k16_f16_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
#if MLA_SM90A_DEVICE
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {" MLA_WGMMA_R8
               "}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
               : MLA_WGMMA_D8
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
#endif
}

// Keeps the compiler from moving reads or writes of a register that an
// in-flight wgmma uses across this point (wgmma is asynchronous; the compiler
// only sees the asm statement that issues it).
__device__ __forceinline__ void pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
// Every register of an accumulator array.
template <int N>
__device__ __forceinline__ void pin(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) pin(x[i]);
}
template <int M, int N>
__device__ __forceinline__ void pin(float (&x)[M][N]) {
#pragma unroll
  for (int m = 0; m < M; ++m) pin(x[m]);
}

// mbarrier (shared-memory barrier object, sm_90 form): one 8-byte word set
// up with the number of arrivals that complete a phase; a waiter passes the
// parity of the phase it waits for (0 for the first). Arrive has release and
// the completed wait acquire semantics at CTA scope.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
#if MLA_SM90A_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if MLA_SM90A_DEVICE
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if MLA_SM90A_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

// mbarrier arrival that also announces `bytes` of asynchronous (TMA)
// transactions for the current phase: the phase completes once the arrivals
// and those bytes are all in.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if MLA_SM90A_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Makes mbarrier initialisation visible to the async proxy (TMA), before the
// CTA barrier that publishes the mbarriers.
__device__ __forceinline__ void fence_mbarrier_init() {
#if MLA_SM90A_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Starts fetching a tensor map (the address of a __grid_constant__ CUtensorMap
// kernel parameter) into the TMA unit's descriptor cache, so that the first
// TMA load through it need not wait for that fetch.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
#if MLA_SM90A_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// TMA: the box of a 3-D tensor map at element coordinates (x, y, z), as
// tma_load_2d below.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int x, int y, int z, uint32_t bar) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
#endif
}

// TMA: the box of a 2-D tensor map (`map`: the address of a __grid_constant__
// CUtensorMap kernel parameter) at element coordinates (x, y) into shared
// memory at `dst`, laid out as the map's swizzle says; elements outside the
// tensor are zero-filled. Completion is counted in bytes on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int x, int y, uint32_t bar) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
#endif
}

// L2 eviction priority for cache tiles read once per call: lines fetched
// with this policy are the first candidates when L2 needs room, so a stream of
// tiles mostly replaces its own earlier lines instead of evicting what else L2
// holds. After a kernel that wrote more than L2's size (the competition's
// flush; a model's previous layer) L2 is full of dirty lines, and every one a
// read evicts costs a DRAM write: measured on the H200 (docs/performance.md),
// a plain stream of a few tens of MB takes ~35% longer after a large write
// than after a large read, and this policy recovers part of that; from
// ~300 MB on it is 3-5% slower, so the plan asks for it only for small caches
// and one head group (Plan::stream_kv, plan/tuning.h).
// (The same hint on cp.async, `cp.async.cg ... .L2::cache_hint`, is compiled
// by ptxas 13.0 into an instruction that faults with an illegal instruction
// on the H200; so the cp.async kernels go without it.)
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy = 0;
#if MLA_SM90A_DEVICE
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// tma_load_2d with an L2 policy (l2_evict_first_policy).
__device__ __forceinline__ void tma_load_2d_stream(uint32_t dst, const void* map, int x, int y, uint32_t bar,
                                                   uint64_t policy) {
#if MLA_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
#endif
}

// tma_load_2d, with the L2 policy `policy` when `stream` (Plan::stream_kv,
// passed as DecodeLaunch::stream_kv) and without a hint otherwise.
__device__ __forceinline__ void tma_load_2d_maybe_stream(uint32_t dst, const void* map, int x, int y, uint32_t bar,
                                                         bool stream, uint64_t policy) {
  if (stream) {
    tma_load_2d_stream(dst, map, x, y, bar, policy);
  } else {
    tma_load_2d(dst, map, x, y, bar);
  }
}

// Two floats to two e4m3 codes (round to nearest even, saturating to +-448;
// NaN stays NaN), x in the low byte.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float x, float y) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3));
}

// Warpgroup register budget (all 128 threads of the warpgroup execute it):
// gives registers back to the CTA's pool, or takes them from it, so
// warpgroups with different roles can hold different numbers.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if MLA_SM90A_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if MLA_SM90A_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Named barriers (ids 1..15; 0 is __syncthreads). `count` threads, a multiple
// of 32, take part. A thread's earlier shared-memory
// writes are visible to the threads that complete the barrier with bar_sync.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// bar_sync that also returns whether `pred` was true in any of the `count`
// threads (barrier.red.or): a block-uniform vote and a barrier in one.
__device__ __forceinline__ bool bar_sync_or(int id, int count, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(count)
      : "memory");
  return any != 0;
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

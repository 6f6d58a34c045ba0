// The one place where CUDA and HIP differ.
//
// Every kernel source includes this header and nothing vendor-specific. On a
// ROCm build PyTorch's hipify rewrites cuda* identifiers in the other files;
// the differences that hipify cannot express (wavefront width, shuffle masks,
// the fp8 flavour of the target, matrix-core intrinsics) are decided here.
//
// Rules kept by the kernels:
//   * never use `warpSize` as a compile-time constant (it is 64 on CDNA);
//     use MLA_WARP_SIZE, a constexpr chosen per target here;
//   * shuffles go through mla_shfl_xor(), whose mask type is 64-bit on HIP;
//   * matrix instructions live behind MLA_HAS_MMA_SYNC (NVIDIA sm_80+) and
//     MLA_HAS_MFMA (AMD CDNA3/CDNA4) in the kernel files, with a plain-FMA
//     path for anything else.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define MLA_HOST_DEVICE __host__ __device__
#define MLA_DEVICE __device__
#else
#define MLA_HOST_DEVICE
#define MLA_DEVICE
#endif

#if defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#define MLA_PLATFORM_HIP 1
#else
#define MLA_PLATFORM_HIP 0
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)

#if MLA_PLATFORM_HIP
#include <hip/hip_runtime.h>
#include <hip/hip_bf16.h>
// CDNA wavefronts are 64 lanes wide (gfx9xx). RDNA can run 32, but this
// project targets CDNA only (gfx942, gfx950).
constexpr int MLA_WARP_SIZE = 64;
using mla_lane_mask_t = unsigned long long;
constexpr mla_lane_mask_t MLA_FULL_MASK = ~0ull;
template <typename T>
__device__ __forceinline__ T mla_shfl_xor(T v, int lane_mask) {
  return __shfl_xor(v, lane_mask, MLA_WARP_SIZE);
}
// gfx942 (MI300) has the fnuz fp8 flavour in hardware, gfx950 (MI355X) the OCP one.
#if defined(__gfx942__)
#define MLA_NATIVE_FP8_FNUZ 1
#endif
#if defined(__gfx950__)
#define MLA_NATIVE_FP8_OCP 1
#endif
#if defined(__gfx942__) || defined(__gfx950__) || defined(__gfx90a__)
#define MLA_HAS_MFMA 1
#endif
// CDNA3/4: 64 KB of LDS per workgroup (gfx950 has 160 KB per CU, but a
// workgroup may address 64 KB without opting in).
constexpr int MLA_MAX_SMEM_BYTES = 64 * 1024;

#else  // CUDA

#include <cuda_runtime.h>
#include <cuda_bf16.h>
constexpr int MLA_WARP_SIZE = 32;
using mla_lane_mask_t = unsigned int;
constexpr mla_lane_mask_t MLA_FULL_MASK = 0xffffffffu;
template <typename T>
__device__ __forceinline__ T mla_shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(MLA_FULL_MASK, v, lane_mask, MLA_WARP_SIZE);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MLA_HAS_MMA_SYNC 1
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MLA_HAS_CVT_E4M3 1
#endif
constexpr int MLA_MAX_SMEM_BYTES = 227 * 1024;  // sm_90 opt-in limit per block

#endif  // MLA_PLATFORM_HIP

#endif  // __CUDACC__ || __HIPCC__

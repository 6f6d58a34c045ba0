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
//   * shuffles go through mla_shfl_xor() / mla_shfl(), whose mask type is
//     64-bit on HIP; code written for 32-lane groups (the combine kernel) stays
//     correct on wave64 because xor offsets < 32 never leave a 32-lane half
//     and mla_shfl takes the group width;
//   * float infinities / NaN come from MLA_INF / MLA_NAN (not CUDART_*, which
//     hipify cannot map onto every ROCm release), bf16 packing from
//     mla_pack_bf16x2() (not __nv_bfloat162 types: ROCm < 6 has no hip_bf16.h);
//   * no `std::max(` / `std::min(` in .cu files: hipify rewrites those
//     spellings to `::max(` / `::min(` (write std::max<T>( instead);
//   * matrix instructions stay in their family's kernel folder: mma.sync in
//     kernels/sm80 (every NVIDIA build is sm_80+, setup.py refuses older
//     archs), wgmma and TMA in kernels/sm90 (sm_90a device code only), MFMA
//     in kernels/cdna (MLA_HAS_MFMA below: the CDNA targets).
#pragma once

// Device qualifiers only under a device compiler: a ROCm build passes
// -D__HIP_PLATFORM_AMD__ to the host compiler of the .cpp files as well.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define MLA_HOST_DEVICE __host__ __device__
#define MLA_DEVICE __device__
#else
#define MLA_HOST_DEVICE
#define MLA_DEVICE
#endif

#if defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM) || defined(__HIP__)
#define MLA_PLATFORM_HIP 1
#else
#define MLA_PLATFORM_HIP 0
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)

#include <stdint.h>

#if MLA_PLATFORM_HIP
#include <hip/hip_runtime.h>
#if __has_include(<hip/hip_bf16.h>)  // ROCm >= 6 (not needed by the kernels)
#include <hip/hip_bf16.h>
#endif
// CDNA wavefronts are 64 lanes wide (gfx9xx). RDNA can run 32, but this
// project targets CDNA only (gfx942, gfx950).
constexpr int MLA_WARP_SIZE = 64;
using mla_lane_mask_t = unsigned long long;
constexpr mla_lane_mask_t MLA_FULL_MASK = ~0ull;
template <typename T>
__device__ __forceinline__ T mla_shfl_xor(T v, int lane_mask) {
  return __shfl_xor(v, lane_mask, MLA_WARP_SIZE);
}
// Value of lane `src_lane` of the caller's group of `width` lanes.
template <typename T>
__device__ __forceinline__ T mla_shfl(T v, int src_lane, int width = MLA_WARP_SIZE) {
  return __shfl(v, src_lane, width);
}
#define MLA_INF __builtin_huge_valf()
#define MLA_NAN __builtin_bit_cast(float, 0x7fffffffu)  // the bits of CUDART_NAN_F
// Two floats to bf16 (round to nearest even; NaN -> 0x7FFF as CUDA does),
// `lo` in the low half. Plain integer code: gfx942 has no bf16 convert.
__device__ __forceinline__ uint32_t mla_bf16_bits_rn(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
__device__ __forceinline__ uint32_t mla_pack_bf16x2(float lo, float hi) {
  return mla_bf16_bits_rn(lo) | (mla_bf16_bits_rn(hi) << 16);
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
#include <math_constants.h>
constexpr int MLA_WARP_SIZE = 32;
using mla_lane_mask_t = unsigned int;
constexpr mla_lane_mask_t MLA_FULL_MASK = 0xffffffffu;
template <typename T>
__device__ __forceinline__ T mla_shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(MLA_FULL_MASK, v, lane_mask, MLA_WARP_SIZE);
}
template <typename T>
__device__ __forceinline__ T mla_shfl(T v, int src_lane, int width = MLA_WARP_SIZE) {
  return __shfl_sync(MLA_FULL_MASK, v, src_lane, width);
}
#define MLA_INF CUDART_INF_F
#define MLA_NAN CUDART_NAN_F
__device__ __forceinline__ uint32_t mla_pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
constexpr int MLA_MAX_SMEM_BYTES = 227 * 1024;  // sm_90 opt-in limit per block

#endif  // MLA_PLATFORM_HIP

#endif  // __CUDACC__ || __HIPCC__

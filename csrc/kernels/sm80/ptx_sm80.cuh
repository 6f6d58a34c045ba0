// Thin wrappers over the sm_80+ instructions the CUDA kernels use:
// mma.sync (bf16 and fp16 m16n8k16), ldmatrix, cp.async, prmt, and the
// register-level format conversions (e4m3 -> fp16, e4m3fnuz -> bf16,
// E2M1 -> bf16) and power-of-two Q scaling, which the Hopper kernels
// (kernels/sm90) share. Each wrapper is one or a few instructions; the
// mma.sync fragment layouts they assume are documented in mma_sync_kernel.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "common/formats.h"
#include "common/portability.h"

namespace mla_decode {
namespace cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// D += A * B for one m16n8k16 tile: A 16x16 bf16 (4 regs), B 16x8 bf16 (2 regs), D fp32 (4 regs).
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                  uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Same with fp16 operands (used where the cache decodes to fp16 in one
// instruction: OCP e4m3 via cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool kF16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kF16) {
    mma_f16_m16n8k16(d, a, b0, b1);
  } else {
    mma_bf16_m16n8k16(d, a, b0, b1);
  }
}

// Two OCP e4m3 codes (low byte -> low half) to f16x2, exactly, in one
// instruction on sm_89+: the codes in the low (HalfSel 0) or high (HalfSel 1)
// 16 bits of `codes`. The high half is read in place (F2FP's .H1 operand), so
// no shift is spent on it. sm_80 / sm_86 have no e4m3 conversion: there the
// scalar decoder does it (every e4m3 value, NaN included, is exact in f16).
template <int HalfSel = 0>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  const uint32_t pair = HalfSel ? codes >> 16 : codes;
  const __half2 h = __floats2half2_rn(e4m3fn_to_float(static_cast<uint8_t>(pair & 0xFFu)),
                                      e4m3fn_to_float(static_cast<uint8_t>((pair >> 8) & 0xFFu)));
  return *reinterpret_cast<const uint32_t*>(&h);
#else
  uint32_t d;
  if constexpr (HalfSel == 0) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(d) : "r"(codes));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(d) : "r"(codes));
  }
  return d;
#endif
}

// Eight e4m3 codes (codes 0-3 in `lo`, 4-7 in `hi`, byte order) to f16x2
// words: out[i] holds codes 2i (low half) and 2i + 1.
__device__ __forceinline__ void e4m3x8_to_f16(uint32_t lo, uint32_t hi, uint32_t* out) {
  out[0] = e4m3x2_to_f16x2<0>(lo);
  out[1] = e4m3x2_to_f16x2<1>(lo);
  out[2] = e4m3x2_to_f16x2<0>(hi);
  out[3] = e4m3x2_to_f16x2<1>(hi);
}

// One 16-byte shared-memory store of w[0..3].
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t* w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

// Four transposed 8x8 b16 matrices: lane l supplies the row address of
// matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte global -> shared copy that bypasses L1; src_bytes == 0 zero-fills
// the destination without reading the source.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ __nv_bfloat162 bits_bf16x2(uint32_t u) {
  return *reinterpret_cast<__nv_bfloat162*>(&u);
}

// Per-head (or per-CTA) scaling of Q before it is narrowed (to f16 or e4m3):
// bf16_finite_abs_max folds the two bf16 of `w` into `amax`, the magnitude
// bits of the largest finite |q| so far (finite bf16 magnitudes order like
// integers; inf / NaN are left out, so a NaN head poisons only its own rows),
// and pow2_scale_exponent gives the e with max |q| * 2^e in
// [2^(kTopBiased - 127), 2^(kTopBiased - 126)) (kTopBiased: the biased
// exponent of the scaled maximum), clamped to [-120, 120]; 0 when amax is 0.
__device__ __forceinline__ uint32_t bf16_finite_abs_max(uint32_t w, uint32_t amax) {
  const uint32_t lo = w & 0x7FFFu, hi = (w >> 16) & 0x7FFFu;
  if (lo < 0x7F80u) amax = max(amax, lo);
  if (hi < 0x7F80u) amax = max(amax, hi);
  return amax;
}
template <int kTopBiased>
__device__ __forceinline__ int pow2_scale_exponent(uint32_t amax) {
  const int amax_exp = static_cast<int>(amax >> 7);  // biased exponent of max |q|
  return amax == 0 ? 0 : min(max(kTopBiased - amax_exp, -120), 120);
}

// Two e4m3fnuz codes (AMD MI300 flavour) to bf16x2, exactly, through the
// scalar decoder: NVIDIA has no hardware for this flavour and it is not a
// performance path here.
__device__ __forceinline__ uint32_t e4m3fnuz_x2_to_bf16x2(uint32_t two_codes) {
  const float lo = e4m3fnuz_to_float(static_cast<uint8_t>(two_codes & 0xFFu));
  const float hi = e4m3fnuz_to_float(static_cast<uint8_t>((two_codes >> 8) & 0xFFu));
  return bf16x2_bits(__floats2bfloat162_rn(lo, hi));
}

// E2M1 decode without a table. (code & 7) << 6 read as bf16 bits is exactly
// |code| * 2^-126 (code 1, 0.5, lands on the subnormal 2^-127), and code bit 3
// is the sign: e2m1_pair_unscaled_bits gives the bf16x2 pair {code p (low
// half), code p+4 (high half)} of the 8 codes in `w` so placed (2 shifts, 2
// masks). e2m1_pair_bits returns that pair times 2^(E-127), given `scales` =
// bf16 {2^floor((E-1)/2), 2^ceil((E-1)/2)} (two factors because 2^(E-1)
// overflows bf16 for E > 128): 6 instructions per pair, against 7 plus a
// table lookup for a prmt-table decode.
template <int P>
__device__ __forceinline__ uint32_t e2m1_pair_unscaled_bits(uint32_t w) {
  constexpr int kMag = 6 - 4 * P;   // nibble bits 0-2 -> bf16 bits 6-8 (and 22-24)
  constexpr int kSgn = 12 - 4 * P;  // nibble bit 3 -> bf16 bit 15 (and 31)
  const uint32_t mag = (kMag >= 0 ? (w << kMag) : (w >> -kMag)) & 0x01C001C0u;
  const uint32_t sgn = (w << kSgn) & 0x80008000u;
  return mag | sgn;
}
template <int P>
__device__ __forceinline__ uint32_t e2m1_pair_bits(uint32_t w, uint32_t scales) {
  const __nv_bfloat162 sc = bits_bf16x2(scales);
  const __nv_bfloat162 y = __hmul2(bits_bf16x2(e2m1_pair_unscaled_bits<P>(w)), __low2bfloat162(sc));
  return bf16x2_bits(__hmul2(y, __high2bfloat162(sc)));
}

// e2m1_pair_bits with one multiply, for blocks with E <= 128, where 2^(E-1)
// is a normal bf16: `scale` = bf16x2 {2^(E-1), 2^(E-1)} (e8m0_to_bf16_one_factor).
template <int P>
__device__ __forceinline__ uint32_t e2m1_pair_bits_one_factor(uint32_t w, uint32_t scale) {
  return bf16x2_bits(__hmul2(bits_bf16x2(e2m1_pair_unscaled_bits<P>(w)), bits_bf16x2(scale)));
}
// bf16x2 {2^(E-1), 2^(E-1)} for E in [0, 128] (biased exponent E + 126).
__device__ __forceinline__ uint32_t e8m0_to_bf16_one_factor(uint32_t e) {
  return ((e + 126u) << 7) * 0x00010001u;
}

// The two bf16 factors of 2^(E-1) for e2m1_pair_bits (low half: 2^floor((E-1)/2),
// high half: the rest); E = 0xFF (NaN block) gives NaN.
__device__ __forceinline__ uint32_t e8m0_to_bf16_scale_pair(uint32_t e) {
  if (e == 0xFFu) return 0x7FC07FC0u;
  const int t = static_cast<int>(e) - 1;  // -1..253
  const int e1 = t >> 1, e2 = t - e1;     // floor, then the rest: both in [-1, 127]
  return (static_cast<uint32_t>(e1 + 127) << 7) | (static_cast<uint32_t>(e2 + 127) << 23);
}

}  // namespace cuda
}  // namespace mla_decode

// Split-KV MLA decode for an OCP fp8 (e4m3) cache on Hopper (sm_90a): both
// products on the fp8 tensor cores through wgmma, which on sm_90 is the only
// fp8 tensor-core path (ptxas emulates e4m3 mma.sync there).
//
// Grid and outputs: as every split kernel (decode_common.h): x = query token *
// head_groups + group of 16 heads, y = KV split; one split writes bf16 out and
// lse, several write fp32 partials for combine_kernel.
// Block: 128 threads = one warpgroup; warp w, lane = 4g + c.
//
// Per 64-token stage (kStages-deep ring of raw cache rows in shared memory,
// 576 bytes + 16 of padding per row, filled by bulk copies that complete on
// one mbarrier per stage):
//   1. S^T = K Q^T with tokens as M: wgmma.m64n48k32.e4m3, A = the K rows
//      straight from shared memory into registers (ldmatrix, no conversion;
//      warp w holds tokens 16w..16w+15), B = Q^T in shared memory as three
//      e4m3 terms per head (q * 2^e_h = hi + mid / 16 + lo / 256, exact to
//      ~2^-12 relative), 18 k-steps over the 576 dims. Each thread gets the
//      scores of 2 tokens x 4 heads and adds the three terms in fp32.
//   2. Online softmax over tokens, per head: the tile max crosses the 4 warps
//      through shared memory (barrier A). P (scaled by 256) is written as two
//      e4m3 terms, hi + lo, to shared memory, in the layout PV's B operand needs
//      (barrier B).
//   3. O^T = V^T P^T with value dims as M: wgmma.m64n16k32.e4m3, A = V^T in
//      registers (ldmatrix.trans of the same raw rows plus one prmt per
//      register), B = [P_hi; P_lo] stacked along K, so the two P terms reuse the
//      same V registers and add in the accumulator: 8 blocks of 64 dims x 4
//      k-steps. Each thread accumulates 8 x 8 fp32 (dims 2g, 2g+1 of each
//      warp's 16-dim slice of a block; heads 2c, 2c+1, 8+2c, 9+2c).
// Per stage: two CTA barriers (A, B) and one mbarrier wait; the next stage
// into a slot is issued right after barrier A, when every warp has read it.
//
// Precision: K and V enter the tensor cores exactly (raw e4m3); Q carries
// ~2^-12 relative error per element, P ~2^-8 (two e4m3 terms; the softmax
// sum l uses the fp32 P); fp32 accumulation.
#pragma once

#include <cuda_fp8.h>
#include <math_constants.h>

#include "../mla_decode/addressing.h"
#include "../mla_decode/params.h"
#include "decode_common.h"
#include "decode_work.cuh"
#include "ptx_sm80.cuh"
#include "ptx_sm90.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {

constexpr int kThreads = 128;          // one warpgroup
constexpr int kTileTokens = 64;        // tokens per stage: the M of the QK wgmma
constexpr int kStages = 2;             // two CTAs per SM fit (106 KB each)
constexpr int kRowBytes = kHeadDimQK;  // 576 e4m3 codes per cache row
constexpr int kRowSmem = kRowBytes + 16;  // padding: 8 rows x 16 bytes hit 32 distinct banks
constexpr int kStageBytes = kTileTokens * kRowSmem;
constexpr int kQTerms = 3;
constexpr int kQCols = kQTerms * kTileRows;   // 48: B columns of the QK wgmma (term-major)
constexpr int kQKSteps = kHeadDimQK / 32;     // 18
// B operands in the no-swizzle K-major layout: core matrices of 8 columns x 16
// bytes of K (128 contiguous bytes), K-adjacent core matrices 128 bytes apart
// (LBO), column groups of 8 a whole K extent apart (SBO).
constexpr int kCoreBytes = 128;
constexpr int kQSbo = kCoreBytes * (kHeadDimQK / 16);  // 4608
constexpr int kQBytes = (kQCols / 8) * kQSbo;          // 27648
constexpr int kPK = 2 * kTileTokens;                   // P_hi tokens, then P_lo tokens
constexpr int kPSbo = kCoreBytes * (kPK / 16);         // 1024
constexpr int kPBytes = (kTileRows / 8) * kPSbo;       // 2048
constexpr int kVBlocks = kHeadDimV / 64;               // 8 blocks of 64 value dims (PV's M)
constexpr float kPScale = 256.f;                       // P * 256 <= 256 < 448 (e4m3 max)

struct Smem {
  static constexpr int kKv = 0;
  static constexpr int kQ = kKv + kStages * kStageBytes;
  static constexpr int kP = kQ + kQBytes;
  static constexpr int kRed = kP + kPBytes;                    // [4 warps][16 heads] fp32
  static constexpr int kQScale = kRed + 4 * kTileRows * 4;     // [16] fp32: 2^-e of each head
  static constexpr int kFlags = kQScale + kTileRows * 4;       // [kStages][2] u32: bad-row masks
  static constexpr int kBars = kFlags + kStages * 8;           // [kStages] u64 mbarriers
  static constexpr int kTotal = kBars + kStages * 8;
};
static_assert(Smem::kQ % 128 == 0 && Smem::kP % 128 == 0, "wgmma B operands must be 128-byte aligned");
static_assert(Smem::kBars % 8 == 0, "mbarriers are 8-byte aligned");

// Two floats to two e4m3 codes (round to nearest even, saturating to +-448;
// NaN stays NaN), x in the low byte.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float x, float y) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3));
}
// The two e4m3 codes in the low 16 bits of `codes` back to float.
__device__ __forceinline__ float2 e4m3x2_to_f32x2(uint32_t codes) {
  const uint32_t h = e4m3x2_to_f16x2<0>(codes);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Keeps the compiler from moving reads or writes of a register that an
// in-flight wgmma uses across this point (wgmma is asynchronous; the compiler
// only sees the asm statement that issues it).
__device__ __forceinline__ void pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

// kHiChains: how many fp32-summed chains the hi term of QK is split into
// (3 or 6; see the QK step).
template <int kHiChains>
__global__ void __launch_bounds__(kThreads) decode_fp8_wgmma_kernel(const DecodeLaunch args) {
  static_assert(kQKSteps % kHiChains == 0, "equal chains");
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(128) uint8_t smem[];
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;

  const uint32_t smem_base = smem_u32(smem);
  const uint32_t kv_smem = smem_base + Smem::kKv;
  const uint32_t q_smem = smem_base + Smem::kQ;
  const uint32_t p_smem = smem_base + Smem::kP;
  const uint32_t bars = smem_base + Smem::kBars;
  float* red = reinterpret_cast<float*>(smem + Smem::kRed);
  float* q_scale = reinterpret_cast<float*>(smem + Smem::kQScale);
  uint32_t* flags = reinterpret_cast<uint32_t*>(smem + Smem::kFlags);

  const WorkItem work = locate_work<kTileTokens>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(bars + 8 * s, kTileTokens);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // ---- stage loader: thread tid < 64 owns token tid of every stage ---------
  const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
  const bool contiguous = p.layout == KvLayout::kIndptr;
  const int64_t contiguous_base = (contiguous && !work.orphan) ? static_cast<int64_t>(__ldg(p.kv_indptr + work.b)) : 0;
  auto issue_tile = [&](int tile_idx, int slot) {
    if (tid >= kTileTokens) return;
    const int j = kv_begin + tile_idx * kTileTokens + tid;
    int64_t r = -2;  // past the split: zero row, masked
    if (j < kv_end) {
      r = contiguous ? contiguous_base + j : kv_row(p, work.b, j);
      if (r < 0 || r >= p.num_cache_rows) r = -1;  // bad index: zero row, NaN score
    }
    const uint32_t bad = __ballot_sync(0xffffffffu, r == -1);
    if (lane == 0) flags[2 * slot + warp] = bad;
    const uint32_t bar = bars + 8 * slot;
    const uint32_t dst = kv_smem + slot * kStageBytes + tid * kRowSmem;
    if (r >= 0) {
      mbarrier_arrive_expect_tx(bar, kRowBytes);
      bulk_copy_g2s(dst, kv_base + r * p.kv_row_stride_bytes, kRowBytes, bar);
    } else {
      // PV multiplies every row by its P; a masked row's P is 0, so its codes
      // only need to be finite (stale shared memory may hold NaN codes).
      for (int k = 0; k < kRowBytes / 16; ++k) {
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst + 16 * k), "r"(0) : "memory");
      }
      fence_proxy_async_shared();  // before a later bulk copy rewrites the row
      mbarrier_arrive_expect_tx(bar, 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < n_tiles) issue_tile(s, s);
  }
  // Let the combine kernel (a programmatic dependent) start launching.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // ---- Q^T as three e4m3 terms per head (once per CTA) ---------------------
  // Thread tid converts head tid / 8, dims [72 (tid % 8), +72): per head, q is
  // scaled by 2^e so that max |q| lands in [128, 256); then hi = e4m3(q'),
  // mid = e4m3(16 (q' - hi)), lo = e4m3(16 (16 (q' - hi) - mid)). Non-finite
  // elements become a NaN code, so only their own head's rows turn NaN.
  float scale_log2 = p.sm_scale * 1.4426950408889634f * __ldg(p.fp8_scale);
  {
    const int hq = tid >> 3, part = tid & 7;
    const int head = work.h0 + hq;
    const bool valid = !work.orphan && head < p.num_heads;
    const __nv_bfloat16* qrow = static_cast<const __nv_bfloat16*>(p.q) +
                                static_cast<int64_t>(work.t) * p.q_stride_token +
                                static_cast<int64_t>(valid ? head : 0) * p.q_stride_head + 72 * part;
    constexpr int kChunks = 72 / 8;
    uint4 x[kChunks];
#pragma unroll
    for (int m = 0; m < kChunks; ++m) {
      x[m] = valid ? *reinterpret_cast<const uint4*>(qrow + 8 * m) : make_uint4(0, 0, 0, 0);
    }
    uint32_t amax = 0;  // bf16 bits of the largest finite |q| (compare as integers)
#pragma unroll
    for (int m = 0; m < kChunks; ++m) {
      const uint32_t w4[4] = {x[m].x, x[m].y, x[m].z, x[m].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t lo = w4[i] & 0x7FFFu, hi = (w4[i] >> 16) & 0x7FFFu;
        if (lo < 0x7F80u) amax = max(amax, lo);
        if (hi < 0x7F80u) amax = max(amax, hi);
      }
    }
    amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    const int amax_exp = static_cast<int>(amax >> 7);  // biased exponent of max |q|
    const int e = amax == 0 ? 0 : min(max(134 - amax_exp, -120), 120);
    const float factor = __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
    if (part == 0) q_scale[hq] = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
#pragma unroll
    for (int m = 0; m < kChunks; ++m) {
      const uint32_t w4[4] = {x[m].x, x[m].y, x[m].z, x[m].w};
      uint32_t terms[kQTerms][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v0 = __uint_as_float(w4[i] << 16) * factor;
        float v1 = __uint_as_float(w4[i] & 0xFFFF0000u) * factor;
        uint32_t code[kQTerms];
#pragma unroll
        for (int k = 0; k < kQTerms; ++k) {
          code[k] = f32x2_to_e4m3x2(v0, v1);
          const float2 back = e4m3x2_to_f32x2(code[k]);
          v0 = (v0 - back.x) * 16.f;
          v1 = (v1 - back.y) * 16.f;
        }
        // inf would saturate to 448: make a non-finite element NaN (hi) + 0 + 0.
        uint32_t keep = 0xFFFFu, nan = 0u;
        if (!isfinite(__uint_as_float(w4[i] << 16))) keep &= 0xFF00u, nan |= 0x007Fu;
        if (!isfinite(__uint_as_float(w4[i] & 0xFFFF0000u))) keep &= 0x00FFu, nan |= 0x7F00u;
        code[0] = (code[0] & keep) | nan;
        code[1] &= keep;
        code[2] &= keep;
#pragma unroll
        for (int k = 0; k < kQTerms; ++k) {
          const int sh = 16 * (i & 1);
          if (sh == 0) terms[k][i >> 1] = code[k]; else terms[k][i >> 1] |= code[k] << 16;
        }
      }
      // Dims d..d+7 (d = 72 part + 8m, 8-aligned) of B column n = 16k + hq sit
      // at 8 consecutive bytes of one core-matrix row.
      const int d = 72 * part + 8 * m;
#pragma unroll
      for (int k = 0; k < kQTerms; ++k) {
        const int n = kTileRows * k + hq;
        const uint32_t addr = q_smem + (n / 8) * kQSbo + (d / 16) * kCoreBytes + (n % 8) * 16 + (d % 16);
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(terms[k][0]), "r"(terms[k][1]) : "memory");
      }
    }
    fence_proxy_async_shared();
  }
  __syncthreads();  // Q terms and their scales visible (to wgmma as well)

  // Heads of this thread's accumulator columns: j -> 8 (j / 2) + 2c + j % 2.
  int head_of[4];
  float qs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    head_of[j] = 8 * (j >> 1) + 2 * c + (j & 1);
    qs[j] = q_scale[head_of[j]] * scale_log2;
  }

  float o[kVBlocks][8];
#pragma unroll
  for (int mb = 0; mb < kVBlocks; ++mb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
  }
  float m_run[4], l_run[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    m_run[j] = -CUDART_INF_F;
    l_run[j] = 0.f;
  }

  // ldmatrix row addresses. QK A (non-transposed; matrices: tokens 16w+0..7 /
  // 16w+8..15 x bytes 0..15 / 16..31 of a k-step): lane l -> token
  // 16w + 8 (mi & 1) + ri, byte 16 (mi >> 1), with mi = l / 8, ri = l % 8.
  const int mi = lane >> 3, ri = lane & 7;
  const uint32_t qk_lane_off = (16 * warp + 8 * (mi & 1) + ri) * kRowSmem + 16 * (mi >> 1);
  // PV A (transposed; matrices: tokens 32h + 8mi + 0..7 x the 16 bytes of dims
  // 64mb + 16w ..): lane l -> token 8 mi + ri.
  const uint32_t pv_lane_off = (8 * mi + ri) * kRowSmem + 16 * warp;

  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it % kStages;
    mbarrier_wait(bars + 8 * slot, (it / kStages) & 1);
    const uint32_t stage = kv_smem + slot * kStageBytes;

    // ---- 1. S^T = K Q^T ------------------------------------------------------
    // The hi term's accumulation is split into kHiChains chains of
    // kQKSteps / kHiChains k-steps, summed in fp32 (see the precision note in
    // ptx_sm90.cuh); the mid and lo terms (scaled down by 16 and 256 in S) run
    // as one chain. Chain 0 shares one N = 48 wgmma with them, the other hi
    // chains are N = 16 wgmmas next to an N = 32 one for mid and lo.
    constexpr int kChain = kQKSteps / kHiChains;
    float acc_hi[kHiChains][8], acc_ml[16];
    {
      uint32_t ka[kQKSteps][4];
#pragma unroll
      for (int ks = 0; ks < kQKSteps; ++ks) ldmatrix_x4(ka[ks], stage + qk_lane_off + 32 * ks);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kQKSteps; ++ks) {
        const uint32_t b = q_smem + ks * 2 * kCoreBytes;  // dims 32 ks .. 32 ks + 31, columns 0..
        if (ks == 0) {
          wgmma_m64n48k32_e4m3_rs<false>(acc_hi[0], acc_ml, ka[ks], smem_desc_noswizzle(b, kCoreBytes, kQSbo));
        } else if (ks < kChain) {
          wgmma_m64n48k32_e4m3_rs<true>(acc_hi[0], acc_ml, ka[ks], smem_desc_noswizzle(b, kCoreBytes, kQSbo));
        } else {
          const uint64_t desc_hi = smem_desc_noswizzle(b, kCoreBytes, kQSbo);
          const uint64_t desc_ml = smem_desc_noswizzle(b + 2 * kQSbo, kCoreBytes, kQSbo);  // columns 16..47
          if (ks % kChain == 0) {
            wgmma_m64n16k32_e4m3_rs<false>(acc_hi[ks / kChain], ka[ks], desc_hi);
          } else {
            wgmma_m64n16k32_e4m3_rs<true>(acc_hi[ks / kChain], ka[ks], desc_hi);
          }
          wgmma_m64n32k32_e4m3_rs<true>(acc_ml, ka[ks], desc_ml);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int ks = 0; ks < kQKSteps; ++ks) {
#pragma unroll
        for (int r = 0; r < 4; ++r) pin(ka[ks][r]);
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) pin(acc_ml[i]);
#pragma unroll
      for (int ch = 0; ch < kHiChains; ++ch) {
#pragma unroll
        for (int i = 0; i < 8; ++i) pin(acc_hi[ch][i]);
      }
    }

    // ---- V^T fragments for PV (A operand, registers) --------------------------
    // ldmatrix.trans of matrix q (tokens t0 + 8q + 0..7, dims d0..d0+15) gives
    // lane (g, c) bytes [t0+8q+2c: d0+2g, d0+2g+1 | t0+8q+2c+1: d0+2g, d0+2g+1].
    // prmt 0x6240 / 0x7351 of matrices (0, 1) gather dim d0+2g / d0+2g+1 of
    // tokens t0 + {2c, 8+2c, 2c+1, 9+2c}: so A row g is dim 2g, row g+8 is dim
    // 2g+1, and k = 4c + v is token t0 + {2c, 8+2c, 2c+1, 9+2c}[v] (matrices
    // (2, 3): the same, 16 tokens on). The P layout below follows this k order:
    // in each 16-token group, token 2u + e (u < 8, e < 2) ... see the P store.
    uint32_t va[kVBlocks][2][4];
#pragma unroll
    for (int mb = 0; mb < kVBlocks; ++mb) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, stage + pv_lane_off + 32 * h * kRowSmem + 64 * mb);
        va[mb][h][0] = prmt(r[0], r[1], 0x6240);
        va[mb][h][1] = prmt(r[0], r[1], 0x7351);
        va[mb][h][2] = prmt(r[2], r[3], 0x6240);
        va[mb][h][3] = prmt(r[2], r[3], 0x7351);
      }
    }

    // ---- 2. online softmax (log2 domain), per head over the tile's tokens ------
    // This thread's scores: tokens 16w + g (r = 0) and 16w + g + 8 (r = 1) of
    // the stage, heads head_of[j]; accumulator index idx = 4i + 2r + e for
    // j = 2i + e in acc_hi, idx (mid term) and 8 + idx (lo term) in acc_ml.
    float s[4][2];
    {
      const int row0 = 16 * warp + g;
      const int pos0 = kv_begin + it * kTileTokens + row0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int idx = 4 * (j >> 1) + 2 * r + (j & 1);
          float hi = acc_hi[0][idx];
#pragma unroll
          for (int ch = 1; ch < kHiChains; ++ch) hi += acc_hi[ch][idx];
          float v = (hi + acc_ml[idx] * 0.0625f + acc_ml[8 + idx] * 0.00390625f) * qs[j];
          const int row = row0 + 8 * r;
          if (pos0 + 8 * r >= kv_end) {
            v = -CUDART_INF_F;
          } else if ((flags[2 * slot + (row >> 5)] >> (row & 31)) & 1u) {
            v = CUDART_NAN_F;
          }
          s[j][r] = v;
        }
      }
    }
    float tile_max[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float mx = fmaxf(s[j][0], s[j][1]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      tile_max[j] = mx;
    }
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) red[warp * kTileRows + head_of[j]] = tile_max[j];
    }
    __syncthreads();  // (A) the 4 warps' maxima visible; every warp has read this stage
    if (it + kStages < n_tiles) issue_tile(it + kStages, slot);

    float alpha[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float mx = red[head_of[j]];
#pragma unroll
      for (int w = 1; w < 4; ++w) mx = fmaxf(mx, red[w * kTileRows + head_of[j]]);
      const float m_new = fmaxf(m_run[j], mx);
      const bool none = m_new == -CUDART_INF_F;
      alpha[j] = none ? 1.f : exp2f(m_run[j] - m_new);
      // exp2(-inf) = 0 for masked keys; a NaN score (bad index) stays NaN.
      const float p0 = exp2f(s[j][0] - (none ? 0.f : m_new));
      const float p1 = exp2f(s[j][1] - (none ? 0.f : m_new));
      l_run[j] = l_run[j] * alpha[j] + (p0 + p1);
      m_run[j] = m_new;
      // P^T as B of PV: column n = head, k = term * 64 + token position. Tokens
      // 16w + g and 16w + g + 8 are k positions 16w + 2g and 16w + 2g + 1 in
      // the V fragment order above, so one 16-bit store per term holds both.
      const uint32_t hi = f32x2_to_e4m3x2(p0 * kPScale, p1 * kPScale);
      const float2 back = e4m3x2_to_f32x2(hi);
      const uint32_t lo = f32x2_to_e4m3x2(p0 * kPScale - back.x, p1 * kPScale - back.y);
      const int n = head_of[j];
      const uint32_t addr = p_smem + (n / 8) * kPSbo + warp * kCoreBytes + (n % 8) * 16 + 2 * g;
      asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<uint16_t>(hi)) : "memory");
      asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr + (kTileTokens / 16) * kCoreBytes),
                   "h"(static_cast<uint16_t>(lo))
                   : "memory");
    }
    fence_proxy_async_shared();
    __syncthreads();  // (B) P visible to the tensor cores

    // ---- 3. O^T = alpha O^T + V^T P^T ----------------------------------------------
    // Each tile's product starts from zero (4 chained k-steps: P_hi tokens 0-31,
    // 32-63, then P_lo) and is added to the fp32 O here, never chained across
    // tiles inside the tensor cores (see the precision note in ptx_sm90.cuh).
    {
      float pv[kVBlocks][8];
      wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < kVBlocks; ++mb) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint64_t desc = smem_desc_noswizzle(p_smem + ks * 2 * kCoreBytes, kCoreBytes, kPSbo);
          if (ks == 0) {
            wgmma_m64n16k32_e4m3_rs<false>(pv[mb], va[mb][0], desc);
          } else {
            wgmma_m64n16k32_e4m3_rs<true>(pv[mb], va[mb][ks & 1], desc);
          }
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int mb = 0; mb < kVBlocks; ++mb) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int r = 0; r < 4; ++r) pin(va[mb][h][r]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          pin(pv[mb][i]);
          o[mb][i] = o[mb][i] * alpha[2 * (i >> 2) + (i & 1)] + pv[mb][i];
        }
      }
    }
  }

  // ---- epilogue ----------------------------------------------------------------
  // Row sums: this thread's two tokens per tile -> the warp (lanes of equal c)
  // -> the 4 warps through shared memory.
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 4);
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 8);
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 16);
  }
  __syncthreads();  // every warp is done reading `red` (barrier A's maxima)
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) red[warp * kTileRows + head_of[j]] = l_run[j];
  }
  __syncthreads();
  const float out_scale = __ldg(p.fp8_scale) / kPScale;  // V's dequantisation and P's 256
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int h = work.h0 + head_of[j];
    if (h >= p.num_heads) continue;
    const float l = red[head_of[j]] + red[kTileRows + head_of[j]] + red[2 * kTileRows + head_of[j]] +
                    red[3 * kTileRows + head_of[j]];
    const float m = m_run[j];
    float inv = l > 0.f ? out_scale / l : 0.f;
    float lse = l > 0.f ? (m + __log2f(l)) * 0.6931471805599453f : -CUDART_INF_F;
    if (isnan(l) || work.orphan) {
      inv = CUDART_NAN_F;
      lse = CUDART_NAN_F;
    }
    const int i = j >> 1, e = j & 1;
    if (args.num_splits == 1) {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                      static_cast<int64_t>(h) * p.out_stride_head;
#pragma unroll
      for (int mb = 0; mb < kVBlocks; ++mb) {
        const int dim = 64 * mb + 16 * warp + 2 * g;
        *reinterpret_cast<uint32_t*>(dst + dim) =
            mla_pack_bf16x2(o[mb][4 * i + e] * inv, o[mb][4 * i + 2 + e] * inv);
      }
      if (warp == 0 && g == 0) {
        p.lse[static_cast<int64_t>(work.t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] = lse;
      }
    } else {
      const int64_t row = static_cast<int64_t>(work.t) * p.num_heads + h;
      float* dst = args.partial_out + (static_cast<int64_t>(work.split) * rows + row) * kHeadDimV;
#pragma unroll
      for (int mb = 0; mb < kVBlocks; ++mb) {
        const int dim = 64 * mb + 16 * warp + 2 * g;
        *reinterpret_cast<float2*>(dst + dim) = make_float2(o[mb][4 * i + e] * inv, o[mb][4 * i + 2 + e] * inv);
      }
      if (warp == 0 && g == 0) args.partial_lse[static_cast<int64_t>(work.split) * rows + row] = lse;
    }
  }
#endif  // MLA_SM90A_DEVICE
}

}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

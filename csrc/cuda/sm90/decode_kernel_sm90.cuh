// Split-KV MLA decode for an OCP fp8 (e4m3) cache on Hopper (sm_90a): both
// products on the fp8 tensor cores through wgmma, which on sm_90 is the only
// fp8 tensor-core path (ptxas emulates e4m3 mma.sync there).
//
// Grid and outputs: as every split kernel (decode_common.h): x = query token *
// head_groups + group of 16 heads, y = KV split; one split writes bf16 out and
// lse, several write fp32 partials for combine_kernel.
// Block: 256 threads = two warpgroups (wg 0, 1); warp w of a group, lane 4g + c.
// One CTA per SM (shared memory).
//
// Keys come in 64-token tiles through a kStages-deep cp.async ring. A stage is
// stored chunk-major: the 16-byte chunk kc (dims 16kc..16kc+15) of token n
// sits at kc * 1024 + n * 16, which is at once the canonical no-swizzle K-major
// layout of wgmma (core matrices of 8 tokens x 16 bytes) and conflict-free for
// ldmatrix (8 consecutive tokens of one chunk are 128 contiguous bytes).
//
// The tiles go in pairs (2k, 2k+1). Per pair:
//   1. Warpgroup wg takes tile 2k + wg alone: S^T = K Q^T with tokens as M,
//      wgmma.m64nNk32.e4m3 with A = the stage and B = Q^T, both in shared
//      memory. Q is stored as three e4m3 terms per head (q * 2^e_h = hi +
//      mid / 16 + lo / 256, ~2^-12 relative). Warp w gets the scores of
//      tokens 16w..16w+15; a thread, 2 tokens x 4 heads. Softmax against the
//      tile's own max m_t (across the group's 4 warps through shared memory):
//      P (scaled by 256) is written as two e4m3 terms, hi + lo, laid out as
//      PV's B operand, with m_t and the partial row sums.
//   2. CTA barrier. Each warpgroup then multiplies both tiles' P into its half
//      of the value dims: O^T = V^T P^T with value dims as M,
//      wgmma.m64n16k32.e4m3, A = V^T in registers (ldmatrix.trans of the
//      stage plus one prmt per register), B = [P_hi; P_lo] stacked along K, so
//      both P terms reuse the same V registers. Each tile's product starts
//      from zero and is added as O = O exp2(M - M') + PV exp2(m_t - M'), with
//      M the running max, so the two tiles of a pair are independent.
// Two CTA barriers and one named barrier per pair. Tile 2k's product runs
// while tile 2k+1's V fragments load.
//
// Precision: K and V enter the tensor cores exactly (raw e4m3). The e4m3
// tensor cores add into their fp32 accumulator with ~14 significant bits, so
// chains are kept short and summed in fp32: QK's hi term runs as kHiChains
// chains, each tile's PV starts from zero.
#pragma once

#include <cuda_fp8.h>
#include <math_constants.h>

#include "../../mla_decode/addressing.h"
#include "../../mla_decode/params.h"
#include "../decode_common.h"
#include "../decode_work.cuh"
#include "../ptx_sm80.cuh"
#include "ptx_sm90.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {

constexpr int kThreads = 256;              // two warpgroups
constexpr int kTileTokens = kBlockNWgmma;  // 64 tokens per stage: the M of the QK wgmma
constexpr int kStages = 5;                 // two tiles in use, three in flight
constexpr int kRowBytes = kHeadDimQK;      // 576 e4m3 codes per cache row
constexpr int kRowChunks = kRowBytes / 16;              // 36
constexpr int kChunkStride = kTileTokens * 16;          // 1024: bytes between chunk columns
constexpr int kStageBytes = kRowChunks * kChunkStride;  // 36864
constexpr int kQTerms = 3;
constexpr int kQCols = kQTerms * kTileRows;  // 48: B columns of QK (term-major)
constexpr int kQKSteps = kHeadDimQK / 32;    // 18
// B operands in the no-swizzle K-major layout: core matrices of 8 columns x 16
// bytes of K (128 contiguous bytes), K-adjacent core matrices 128 bytes apart
// (LBO), column groups of 8 a whole K extent apart (SBO).
constexpr int kCoreBytes = 128;
constexpr int kQSbo = kCoreBytes * (kHeadDimQK / 16);  // 4608
constexpr int kQBytes = (kQCols / 8) * kQSbo;          // 27648
constexpr int kPK = 2 * kTileTokens;                   // P_hi tokens, then P_lo tokens
constexpr int kPSbo = kCoreBytes * (kPK / 16);         // 1024
constexpr int kPBytes = (kTileRows / 8) * kPSbo;       // 2048 per tile of a pair
constexpr int kVBlocksPerWg = kHeadDimV / 64 / 2;      // 4 blocks of 64 value dims (PV's M) each
constexpr float kPScale = 256.f;                       // P * 256 <= 256 < 448 (e4m3 max)
// How many fp32-summed chains the hi term of QK is split into. Measured on
// the H200 (one-key rows, the score alone): max |lse error| 2.4e-3 with one
// chain of 18 k-steps, 1.0e-3 with 3 chains, 5.6e-4 with 6 (the mma.sync
// kernel: 5.5e-7); the tests allow 2e-3.
constexpr int kHiChains = 6;
static_assert(kQKSteps % kHiChains == 0, "equal chains");

// Per tile of a pair: its max m_t per head and the 4 warps' partial row sums.
struct TileStat {
  float m[kTileRows];
  float l[kTileRows][4];
};

struct Smem {
  static constexpr int kKv = 0;
  static constexpr int kQ = kKv + kStages * kStageBytes;
  static constexpr int kP = kQ + kQBytes;                         // [2 tiles of a pair]
  static constexpr int kStat = kP + 2 * kPBytes;                  // TileStat [2]
  static constexpr int kRed = kStat + 2 * sizeof(TileStat);       // [2 wg][16 heads][4 warps] fp32
  static constexpr int kQScale = kRed + 2 * kTileRows * 4 * 4;    // [16] fp32: 2^-e of each head
  static constexpr int kFlags = kQScale + kTileRows * 4;          // [kStages][2] u32: bad-token masks
  static constexpr int kTotal = kFlags + kStages * 8;
};
static_assert(Smem::kQ % 128 == 0 && Smem::kP % 128 == 0 && kPBytes % 128 == 0,
              "wgmma operands are 128-byte aligned");
static_assert(Smem::kRed % 16 == 0 && Smem::kStat % 16 == 0, "float4 reads");

// The two e4m3 codes in the low 16 bits of `codes` back to float.
__device__ __forceinline__ float2 e4m3x2_to_f32x2(uint32_t codes) {
  const uint32_t h = e4m3x2_to_f16x2<0>(codes);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Barrier among the 128 threads of warpgroup `wg` (ids 1, 2; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

__global__ void __launch_bounds__(kThreads, 1) decode_fp8_wgmma_kernel(const DecodeLaunch args) {
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(128) uint8_t smem[];
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;  // within the warpgroup
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;

  const uint32_t smem_base = smem_u32(smem);
  const uint32_t kv_smem = smem_base + Smem::kKv;
  const uint32_t q_smem = smem_base + Smem::kQ;
  const uint32_t p_smem = smem_base + Smem::kP;
  TileStat* stat = reinterpret_cast<TileStat*>(smem + Smem::kStat);
  float* red = reinterpret_cast<float*>(smem + Smem::kRed) + wg * kTileRows * 4;
  float* q_scale = reinterpret_cast<float*>(smem + Smem::kQScale);
  uint32_t* flags = reinterpret_cast<uint32_t*>(smem + Smem::kFlags);

  const WorkItem work = locate_work<kTileTokens>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);

  // ---- stage loader --------------------------------------------------------
  // Thread tid copies token n = tid % 64, chunks kc = tid / 64 + 4m (m < 9):
  // a warp writes 32 consecutive tokens of one chunk, 512 contiguous bytes.
  // Rows past the split or with a bad index are zero-filled (src_bytes 0):
  // PV multiplies every row by its P, so those rows must hold finite codes.
  const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
  const bool contiguous = p.layout == KvLayout::kIndptr;
  const int64_t contiguous_base = (contiguous && !work.orphan) ? static_cast<int64_t>(__ldg(p.kv_indptr + work.b)) : 0;
  const int ld_token = tid % kTileTokens, ld_chunk0 = tid / kTileTokens;
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int slot = tile % kStages;
      const int j = kv_begin + tile * kTileTokens + ld_token;
      int64_t r = -2;  // past the split
      if (j < kv_end) {
        r = contiguous ? contiguous_base + j : kv_row(p, work.b, j);
        if (r < 0 || r >= p.num_cache_rows) r = -1;  // bad index: NaN score
      }
      if (tid < kTileTokens) {  // warps 0 and 1 hold every token once
        const uint32_t bad = __ballot_sync(0xffffffffu, r == -1);
        if (lane == 0) flags[2 * slot + tid / 32] = bad;
      }
      const uint8_t* src = kv_base + (r >= 0 ? r : 0) * p.kv_row_stride_bytes + 16 * ld_chunk0;
      const uint32_t dst = kv_smem + slot * kStageBytes + ld_chunk0 * kChunkStride + ld_token * 16;
      const int src_bytes = r >= 0 ? 16 : 0;
#pragma unroll
      for (int m = 0; m < kRowChunks / 4; ++m) cp_async_16(dst + 4 * m * kChunkStride, src + 64 * m, src_bytes);
    }
    cp_async_commit();  // one group per tile, empty past the end
  };
  // Pair k reads tiles 2k, 2k+1 and, after its first barrier, issues tiles
  // 2k+3 and 2k+4 into the slots of tiles 2k-2 and 2k-1.
#pragma unroll
  for (int t = 0; t < kStages - 2; ++t) issue_tile(t);
  // Let the combine kernel (a programmatic dependent) start launching.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // ---- Q^T as three e4m3 terms per head (once per CTA) ---------------------
  // Thread tid converts head tid / 16, dims [36 (tid % 16), +36): per head, q
  // is scaled by 2^e so that max |q| lands in [128, 256); then hi = e4m3(q'),
  // mid = e4m3(16 (q' - hi)), lo = e4m3(16 (16 (q' - hi) - mid)). A non-finite
  // element becomes NaN (hi) + 0 + 0, so only its own head's rows turn NaN.
  const float scale_log2 = p.sm_scale * 1.4426950408889634f * __ldg(p.fp8_scale);
  {
    const int hq = tid >> 4, part = tid & 15;
    const int head = work.h0 + hq;
    const bool valid = !work.orphan && head < p.num_heads;
    const __nv_bfloat16* qrow = static_cast<const __nv_bfloat16*>(p.q) +
                                static_cast<int64_t>(work.t) * p.q_stride_token +
                                static_cast<int64_t>(valid ? head : 0) * p.q_stride_head + 36 * part;
    // 36 dims = 9 loads of 4 bf16 (36 part bf16 is 8-byte aligned, not 16).
    uint32_t x[18];  // word i: dims 36 part + 2i, +1
#pragma unroll
    for (int m = 0; m < 9; ++m) {
      const uint2 v = valid ? *reinterpret_cast<const uint2*>(qrow + 4 * m) : make_uint2(0, 0);
      x[2 * m] = v.x;
      x[2 * m + 1] = v.y;
    }
    uint32_t amax = 0;  // bf16 bits of the largest finite |q| (compare as integers)
#pragma unroll
    for (int i = 0; i < 18; ++i) amax = bf16_finite_abs_max(x[i], amax);
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const int e = pow2_scale_exponent<134>(amax);  // max |q| * 2^e in [128, 256)
    const float factor = __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
    if (part == 0) q_scale[hq] = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
    uint32_t terms[kQTerms][9];  // 36 codes per term, 4 per word
#pragma unroll
    for (int i = 0; i < 18; ++i) {
      float v0 = __uint_as_float(x[i] << 16) * factor;
      float v1 = __uint_as_float(x[i] & 0xFFFF0000u) * factor;
      uint32_t code[kQTerms];
#pragma unroll
      for (int k = 0; k < kQTerms; ++k) {
        code[k] = f32x2_to_e4m3x2(v0, v1);
        const float2 back = e4m3x2_to_f32x2(code[k]);
        v0 = (v0 - back.x) * 16.f;
        v1 = (v1 - back.y) * 16.f;
      }
      // inf would saturate to 448: a non-finite element becomes NaN + 0 + 0.
      uint32_t keep = 0xFFFFu, nan = 0u;
      if (!isfinite(__uint_as_float(x[i] << 16))) keep &= 0xFF00u, nan |= 0x007Fu;
      if (!isfinite(__uint_as_float(x[i] & 0xFFFF0000u))) keep &= 0x00FFu, nan |= 0x7F00u;
      code[0] = (code[0] & keep) | nan;
#pragma unroll
      for (int k = 1; k < kQTerms; ++k) code[k] &= keep;
#pragma unroll
      for (int k = 0; k < kQTerms; ++k) {
        if (i % 2 == 0) terms[k][i / 2] = code[k]; else terms[k][i / 2] |= code[k] << 16;
      }
    }
    // Word m holds dims d = 36 part + 4m .. +3 (4-aligned, inside one 16-byte
    // core-matrix row) of B column n = 16k + hq.
#pragma unroll
    for (int k = 0; k < kQTerms; ++k) {
      const int n = kTileRows * k + hq;
#pragma unroll
      for (int m = 0; m < 9; ++m) {
        const int d = 36 * part + 4 * m;
        const uint32_t addr = q_smem + (n / 8) * kQSbo + (d / 16) * kCoreBytes + (n % 8) * 16 + (d % 16);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(terms[k][m]) : "memory");
      }
    }
    fence_proxy_async_shared();
  }
  // (Q terms and scales are published by the first pair's barrier.)

  // Heads of this thread's accumulator columns: j -> 8 (j / 2) + 2c + j % 2.
  int head_of[4];
  float m_run[4], l_run[4], qs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    head_of[j] = 8 * (j >> 1) + 2 * c + (j & 1);
    m_run[j] = -CUDART_INF_F;
    l_run[j] = 0.f;
    qs[j] = 0.f;
  }
  float o[kVBlocksPerWg][8];
#pragma unroll
  for (int mb = 0; mb < kVBlocksPerWg; ++mb) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
  }

  // Descriptor words. QK A: the stage, chunk-major (LBO = the chunk stride,
  // SBO = 8 tokens x 16 bytes); QK B: Q^T; PV B: P^T of a tile.
  const uint32_t q_desc_lo = smem_desc_lo(q_smem, kCoreBytes);
  // PV A (transposed; matrices q = tokens t0 + 8q + 0..7 x the 16 bytes of
  // dims 64 mb + 16 w ..): lane l supplies token 8 (l / 8) + l % 8.
  const uint32_t pv_lane_off = ((lane >> 3) * 8 + (lane & 7)) * 16;

  const int n_pairs = ceil_div(n_tiles, 2);
  for (int k = 0; k < n_pairs; ++k) {
    cp_async_wait<1>();          // this thread's copies of tiles 2k and 2k+1
    fence_proxy_async_shared();  // ...ordered before the tensor cores read them
    __syncthreads();             // both tiles visible; pair k-1 is done everywhere
    // Tiles 2k+3 and 2k+4 go into the slots of pair k-1, now free. They are
    // issued while this pair's wgmmas run (below): issued here in one burst by
    // all 8 warps, their 144 warp-wide cp.async stalled the warps on the
    // memory pipeline for about a third of the loop (ncu, run36).
    if (k == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) qs[j] = q_scale[head_of[j]] * scale_log2;
    }

    // ---- 1. this warpgroup's tile: scores and softmax ----------------------------
    const int my_tile = 2 * k + wg;
    if (my_tile < n_tiles) {
      const int slot = my_tile % kStages;
      const uint32_t a_lo = smem_desc_lo(kv_smem + slot * kStageBytes, kChunkStride);
      // Per k-step, an N = 16 wgmma for the hi term and an N = 32 one for mid
      // and lo. The hi term's accumulation is split into kHiChains chains,
      // summed in fp32 (mid and lo are scaled down by 16 and 256 in S, so one
      // chain does for them). (One N = 48 wgmma per k-step would make the
      // mid/lo registers take two accumulator shapes, and then ptxas
      // serializes every wgmma of the kernel: C7511.)
      constexpr int kChain = kQKSteps / kHiChains;
      float acc_hi[kHiChains][8], acc_ml[16];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kQKSteps; ++ks) {
        const uint64_t desc_a = smem_desc(a_lo + ((2 * ks * kChunkStride) >> 4), kCoreBytes);
        const uint32_t b_lo = q_desc_lo + ((2 * ks * kCoreBytes) >> 4);  // dims 32 ks .. +31
        const uint64_t desc_hi = smem_desc(b_lo, kQSbo);
        const uint64_t desc_ml = smem_desc(b_lo + ((2 * kQSbo) >> 4), kQSbo);  // columns 16..47
        if (ks % kChain == 0) {
          wgmma_m64n16k32_e4m3_ss<false>(acc_hi[ks / kChain], desc_a, desc_hi);
        } else {
          wgmma_m64n16k32_e4m3_ss<true>(acc_hi[ks / kChain], desc_a, desc_hi);
        }
        if (ks == 0) {
          wgmma_m64n32k32_e4m3_ss<false>(acc_ml, desc_a, desc_ml);
        } else {
          wgmma_m64n32k32_e4m3_ss<true>(acc_ml, desc_a, desc_ml);
        }
      }
      wgmma_commit();
      issue_tile(2 * k + kStages - 2);  // overlaps the QK wgmmas
      const uint32_t bad_lo = flags[2 * slot], bad_hi = flags[2 * slot + 1];
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 16; ++i) pin(acc_ml[i]);
#pragma unroll
      for (int ch = 0; ch < kHiChains; ++ch) {
#pragma unroll
        for (int i = 0; i < 8; ++i) pin(acc_hi[ch][i]);
      }

      // Scores (log2 domain) of tokens 16w + g (r = 0) and 16w + g + 8 (r = 1),
      // heads head_of[j]: accumulator index idx = 4i + 2r + e for j = 2i + e in
      // acc_hi, idx (mid term) and 8 + idx (lo term) in acc_ml.
      const uint32_t bad = warp < 2 ? bad_lo : bad_hi;
      const int row0 = 16 * warp + g;
      const int pos0 = kv_begin + my_tile * kTileTokens + row0;
      float s[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int idx = 4 * (j >> 1) + 2 * r + (j & 1);
          float hi = acc_hi[0][idx];
#pragma unroll
          for (int ch = 1; ch < kHiChains; ++ch) hi += acc_hi[ch][idx];
          float v = (hi + acc_ml[idx] * 0.0625f + acc_ml[8 + idx] * 0.00390625f) * qs[j];
          if (pos0 + 8 * r >= kv_end) {
            v = -CUDART_INF_F;
          } else if ((bad >> ((row0 + 8 * r) & 31)) & 1u) {
            v = CUDART_NAN_F;
          }
          s[j][r] = v;
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float mx = fmaxf(s[j][0], s[j][1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g == 0) red[head_of[j] * 4 + warp] = mx;
      }
      warpgroup_barrier(wg);  // the 4 warps' maxima visible
      TileStat& st = stat[wg];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 mx4 = *reinterpret_cast<const float4*>(red + head_of[j] * 4);
        const float m_t = fmaxf(fmaxf(mx4.x, mx4.y), fmaxf(mx4.z, mx4.w));
        // exp2(-inf) = 0 for masked keys; a NaN score (bad index) stays NaN.
        // m_t is -inf only when every visible key of the tile is NaN.
        const float m_ref = m_t == -CUDART_INF_F ? 0.f : m_t;
        const float p0 = exp2f(s[j][0] - m_ref), p1 = exp2f(s[j][1] - m_ref);
        float l = p0 + p1;
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        if (g == 0) {
          st.l[head_of[j]][warp] = l;
          if (warp == 0) st.m[head_of[j]] = m_t;
        }
        // P^T as B of PV: column n = head, k = term * 64 + k position. Tokens
        // 16w + g and 16w + g + 8 are k positions 16w + 2g and 16w + 2g + 1 (see
        // the V fragments), so one 16-bit store per term holds both.
        const uint32_t hi = f32x2_to_e4m3x2(p0 * kPScale, p1 * kPScale);
        const float2 back = e4m3x2_to_f32x2(hi);
        const uint32_t lo = f32x2_to_e4m3x2(p0 * kPScale - back.x, p1 * kPScale - back.y);
        const int n = head_of[j];
        const uint32_t addr = p_smem + wg * kPBytes + (n / 8) * kPSbo + warp * kCoreBytes + (n % 8) * 16 + 2 * g;
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<uint16_t>(hi)) : "memory");
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr + (kTileTokens / 16) * kCoreBytes),
                     "h"(static_cast<uint16_t>(lo))
                     : "memory");
      }
      fence_proxy_async_shared();
    } else {
      issue_tile(2 * k + kStages - 2);
    }
    __syncthreads();  // both tiles' P and statistics visible (to the tensor cores too)

    // ---- 2. O^T += V^T P^T for both tiles, this warpgroup's 256 value dims --------
    // V^T fragments: ldmatrix.trans of matrix q (tokens t0 + 8q + 0..7, dims
    // d0..d0+15) gives lane (g, c) bytes [t0+8q+2c: d0+2g, d0+2g+1 | t0+8q+2c+1:
    // d0+2g, d0+2g+1]. prmt 0x6240 / 0x7351 of matrices (0, 1) gather dim
    // d0+2g / d0+2g+1 of tokens t0 + {2c, 8+2c, 2c+1, 9+2c}: A row g is dim 2g,
    // row g+8 is dim 2g+1, and k = 4c + v is token t0 + {2c, 8+2c, 2c+1,
    // 9+2c}[v] (matrices (2, 3): the same, 16 tokens on). In each 16-token
    // group, token u < 8 is k = 2u and token 8 + u is k = 2u + 1: the P store
    // above follows this.
    // Tile 2k's product runs while tile 2k+1's V fragments load; then tile
    // 2k+1's (one product in flight at a time keeps the registers in budget).
    const int n_here = min(2, n_tiles - 2 * k);
    auto load_v = [&](int tile, uint32_t(&va)[kVBlocksPerWg][2][4]) {
      const uint32_t stage = kv_smem + (tile % kStages) * kStageBytes;
#pragma unroll
      for (int mb = 0; mb < kVBlocksPerWg; ++mb) {
        const int kc = 4 * (kVBlocksPerWg * wg + mb) + warp;  // dims 64 (4 wg + mb) + 16 w ..
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, stage + kc * kChunkStride + 32 * h * 16 + pv_lane_off);
          va[mb][h][0] = prmt(r[0], r[1], 0x6240);
          va[mb][h][1] = prmt(r[0], r[1], 0x7351);
          va[mb][h][2] = prmt(r[2], r[3], 0x6240);
          va[mb][h][3] = prmt(r[2], r[3], 0x7351);
        }
      }
    };
    auto issue_pv = [&](int tt, const uint32_t(&va)[kVBlocksPerWg][2][4], float(&pv)[kVBlocksPerWg][8]) {
      const uint32_t p_lo = smem_desc_lo(p_smem + tt * kPBytes, kCoreBytes);
      wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < kVBlocksPerWg; ++mb) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {  // k-steps: P_hi tokens 0-31, 32-63, then P_lo
          const uint64_t desc = smem_desc(p_lo + ((2 * ks * kCoreBytes) >> 4), kPSbo);
          if (ks == 0) {
            wgmma_m64n16k32_e4m3_rs<false>(pv[mb], va[mb][0], desc);
          } else {
            wgmma_m64n16k32_e4m3_rs<true>(pv[mb], va[mb][ks & 1], desc);
          }
        }
      }
      wgmma_commit();
    };
    // O = O exp2(M - M') + PV exp2(m_t - M'), L likewise, M' = max(M, m_t).
    auto fold = [&](int tt, uint32_t(&va)[kVBlocksPerWg][2][4], float(&pv)[kVBlocksPerWg][8]) {
      float alpha[4], beta[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float m_t = stat[tt].m[head_of[j]];
        const float4 l4 = *reinterpret_cast<const float4*>(stat[tt].l[head_of[j]]);
        const float m_new = fmaxf(m_run[j], m_t);
        alpha[j] = m_new == -CUDART_INF_F ? 1.f : exp2f(m_run[j] - m_new);
        beta[j] = m_t == -CUDART_INF_F ? 1.f : exp2f(m_t - m_new);
        l_run[j] = l_run[j] * alpha[j] + ((l4.x + l4.y) + (l4.z + l4.w)) * beta[j];
        m_run[j] = m_new;
      }
#pragma unroll
      for (int mb = 0; mb < kVBlocksPerWg; ++mb) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int r = 0; r < 4; ++r) pin(va[mb][h][r]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          pin(pv[mb][i]);
          const int j = 2 * (i >> 2) + (i & 1);
          o[mb][i] = o[mb][i] * alpha[j] + pv[mb][i] * beta[j];
        }
      }
    };
    {
      uint32_t va0[kVBlocksPerWg][2][4], va1[kVBlocksPerWg][2][4];
      float pv[kVBlocksPerWg][8];
      load_v(2 * k, va0);
      issue_pv(0, va0, pv);
      issue_tile(2 * k + kStages - 1);  // overlaps tile 2k's PV wgmmas
      if (n_here == 2) load_v(2 * k + 1, va1);
      wgmma_wait<0>();
      fold(0, va0, pv);
      if (n_here == 2) {
        issue_pv(1, va1, pv);
        wgmma_wait<0>();
        fold(1, va1, pv);
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue ----------------------------------------------------------------
  // Both warpgroups folded the same tiles' statistics in the same order, so
  // their (m, l) agree; each writes its half of the dims.
  const float out_scale = __ldg(p.fp8_scale) / kPScale;  // V's dequantisation and P's 256
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int h = work.h0 + head_of[j];
    if (h >= p.num_heads) continue;
    const float l = l_run[j];
    const float m = m_run[j];
    float inv = l > 0.f ? out_scale / l : 0.f;
    float lse = l > 0.f ? (m + __log2f(l)) * 0.6931471805599453f : -CUDART_INF_F;
    if (isnan(l) || work.orphan) {
      inv = CUDART_NAN_F;
      lse = CUDART_NAN_F;
    }
    // o[mb][4i + 2r + e]: dim 64 (4 wg + mb) + 16w + 2g + r, head 8i + 2c + e.
    const int i = j >> 1, e = j & 1;
    const bool writes_lse = wg == 0 && warp == 0 && g == 0;
    if (args.num_splits == 1) {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                      static_cast<int64_t>(h) * p.out_stride_head;
#pragma unroll
      for (int mb = 0; mb < kVBlocksPerWg; ++mb) {
        const int dim = 64 * (kVBlocksPerWg * wg + mb) + 16 * warp + 2 * g;
        *reinterpret_cast<uint32_t*>(dst + dim) =
            mla_pack_bf16x2(o[mb][4 * i + e] * inv, o[mb][4 * i + 2 + e] * inv);
      }
      if (writes_lse) {
        p.lse[static_cast<int64_t>(work.t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] = lse;
      }
    } else {
      const int64_t row = static_cast<int64_t>(work.t) * p.num_heads + h;
      float* dst = args.partial_out + (static_cast<int64_t>(work.split) * rows + row) * kHeadDimV;
#pragma unroll
      for (int mb = 0; mb < kVBlocksPerWg; ++mb) {
        const int dim = 64 * (kVBlocksPerWg * wg + mb) + 16 * warp + 2 * g;
        *reinterpret_cast<float2*>(dst + dim) = make_float2(o[mb][4 * i + e] * inv, o[mb][4 * i + 2 + e] * inv);
      }
      if (writes_lse) args.partial_lse[static_cast<int64_t>(work.split) * rows + row] = lse;
    }
  }
#endif  // MLA_SM90A_DEVICE
}

}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

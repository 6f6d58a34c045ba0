// Split-KV MLA decode kernel for AMD CDNA, wave64: the body for gfx90a (MI200)
// and gfx942 (MI300) in this file (bf16 MFMA, and fp8 MFMA for fp8 caches on
// gfx942: "fp8 MFMA path" below); gfx950 (MI355X) compiles
// mfma_gfx950.cuh's body instead (CDNA4's scaled f8f6f4 and 16x16x32 bf16
// MFMAs), which reuses this file's constants and helpers. Launch contract:
// kernels/common/launch_contract.h; one instantiation per format in
// mfma_{bf16,fp8,mxfp4}.cu.
//
// Grid:  x = query token t * head_groups + head group (16 heads), y = KV split.
// Block: 256 threads = 4 waves of 64; one workgroup owns 16 query rows (heads
//        h0..h0+15 of token t) and the KV positions [kv_begin, kv_end) of its
//        split (kernels/common/work.cuh, shared with the CUDA kernels).
//
// Per 32-token stage (one LDS buffer, register prefetch: AMD has no cp.async):
//   0. The raw cache bytes of stage it+1 are loaded into registers with plain
//      16-byte global loads while stage it is computed. At the top of the next
//      iteration each thread dequantises its own chunks in registers (fp8 /
//      MXFP4 -> bf16, exactly: every fp8 and every scaled E2M1 value is a bf16
//      value) and writes them to the LDS tile, so every element is converted
//      once and the MFMA loops below are the same for all formats. fp8 codes
//      stay unscaled (the per-tensor scale multiplies S and O, as on CUDA):
//      v_cvt_pk_f32_fp8 where the target has it (gfx942 fnuz, gfx950 OCP:
//      fp8x4_to_bf16, either e4m3 flavour through Fmt::kFp8Ratio; gfx950's
//      body uses it for fnuz caches), formats.h's scalar decoders on gfx90a.
//      MXFP4 block
//      scales are folded into the values: a v_perm_b32 table lookup for
//      2 <= E8M0 <= 252, formats.h's decoders for the other scales.
//   1. S^T = K Q^T, split over the head dim: wave w owns dims [144w, 144w+144)
//      = 9 k-steps of 16 and keeps its Q fragments in registers for the whole
//      kernel; 2 x 9 MFMAs give a partial 32x16 (token x head) score tile.
//   2. The 4 partial tiles are summed through LDS; 16 threads per row run the
//      online softmax (log2 domain) and write P (bf16) and the rescale alpha.
//   3. O^T = V^T P^T, split over the value dim: wave w owns dims
//      [128w, 128w+128) = 8 m-tiles of 16 (2 x 8 MFMAs per stage, O in 32
//      fp32 registers per lane).
//
// MFMA used: v_mfma_f32_16x16x16bf16_1k through
//   __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(short4 a, short4 b, float4 c, cbsz, abid, blgp)
// (gfx90a, gfx942): D(16x16, fp32) = A(16x16) * B(16x16) + C, one wave
// of 64 lanes. With cbsz = abid = blgp = 0, lane l (g = l / 16):
//   A: row l % 16, k = 4g .. 4g+3      (4 bf16 = 2 VGPRs, k ascending)
//   B: col l % 16, k = 4g .. 4g+3      (4 bf16 = 2 VGPRs)
//   C/D: col l % 16, rows 4g .. 4g+3   (4 fp32, row ascending)
// (AMD Matrix Instruction Calculator, gfx9 formulas for M = N = K = 16, one
// block: A[i][k] in lane 16 floor(k/4) + i, element k % 4; D[i][j] in lane
// 16 floor(i/4) + j, register i % 4. The LLVM builtin takes A, B, C in the
// instruction's Src0, Src1, Src2 order.)
// The k index (head dim for S, token for O) and the m index of the PV tiles
// (value dim) may be permuted freely as long as both operands agree; the
// kernel uses that to read V with row-contiguous LDS loads (step 3) and
// undoes the dim permutation in the output store.
//
// LDS (47808 bytes, under the 64 KB a workgroup may use on CDNA3/CDNA4):
//   kv    32 rows x (576 + 4) bf16   the dequantised stage; the 8-byte pad
//                                    makes the 16 rows read by one MFMA
//                                    operand fall on 16 distinct bank pairs
//   red   4 x 16 x 36 fp32           partial score tiles, one per wave
//   p     16 x 36 bf16               probabilities (18 dwords per row:
//                                    conflict-free 8-byte operand reads)
//   flag, alpha, m, l
//
// fp8 MFMA path (Fmt<F>::kFp8Mfma: fp8 caches on gfx942, whose fp8 MFMA reads
// e4m3 as fnuz): fp8_e4m3fnuz as is; fp8_e4m3fn through the factor-2
// relation of the two flavours (Fmt::kFp8Ratio, bytes 0x80 / 0x7F / 0xFF
// fixed up in registers: -0 -> +0, NaN -> the fnuz NaN 0x80). gfx90a, MXFP4
// and bf16 use bf16 MFMA as described above.
// The cache's raw fp8 bytes go to LDS unchanged (no decode at all) and are
// the A operands of v_mfma_f32_16x16x32_fp8_fp8 through
//   __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(long a, long b, float4 c, cbsz, abid, blgp)
// D(16x16 fp32) = A(16x32 fp8) * B(32x16 fp8) + C, one wave; with cbsz = abid
// = blgp = 0, lane l (g = l / 16):
//   A: row l % 16, k = 8g .. 8g+7      (8 fp8 = 2 VGPRs, byte j = k 8g + j)
//   B: col l % 16, k = 8g .. 8g+7      (8 fp8 = 2 VGPRs)
//   C/D: col l % 16, rows 4g .. 4g+3   (4 fp32, as for the bf16 instruction)
// (AMD, "Matrix Core Programming on AMD CDNA3 and CDNA4 architecture" and the
// CDNA3 ISA, section 7: the fp8 MFMAs take 8 consecutive k per lane group;
// A[i][k] in lane 16 floor(k/8) + i, byte k % 8; CDNA3 reads fp8 as
// E4M3FNUZ; products are exact and accumulate in fp32.)
// Again only the pairing of A's and B's (lane, byte) -> k maps matters, and
// both operands use the same one.
// Q and P are not fp8, so each is split into two fp8 terms (fp8_split):
//   x ~ hi + lo,  hi = rne8(s x),  lo = rne8(s x - hi),  s a power of two,
// where rne8 rounds to the target's e4m3 grid (4 significant bits, subnormals
// included; integer code, not the hardware convert, so it is exactly the code
// the emulator checks), and S = (hi.K + lo.K) / s is two MFMAs on the same K
// bytes (likewise O += V (hi + lo), P's scale folded into the output scale).
// Error of the split (t = the top exponent used, see kFp8TopExp; the OCP
// variants of the helpers are kept and tested for completeness):
//   * q (bf16: 8 significant bits) with s x in [2^t, 2^(t+1)) for the row's
//     largest |q|: s x - hi is a multiple of ulp_bf16(s x) and at most
//     half an fp8 ulp, so it has <= 4 significant bits and lo = s x - hi is
//     EXACT unless it falls below the fp8 subnormal quantum (2^-10 fnuz,
//     2^-9 OCP): every q with |q| >= 2^-9 max|q| of its row (per 288 dims) is
//     represented exactly; smaller ones err by <= half a quantum, i.e.
//     <= 2^-17 max|q| absolute. Scores are then K.q up to fp32 accumulation:
//     no error comparable to bf16's at all.
//   * p (fp32, in [0, 1], s = kFp8PScale = 2^7: s p <= 128, under the fnuz
//     maximum 240; 2^8 for OCP): lo's own rounding error is <= half an ulp of a
//     number below 2^(E-4) (E = exponent of s p), so |p' - p| <= 2^-8 p
//     (bf16's P rounding: <= 2^-9 p), unbiased (round to nearest even), plus
//     at most half a quantum, 2^-18, absolute where lo is subnormal
//     (p < ~2^-10). Relative to the row sum l >= 1 (the running maximum has
//     p = 1) that adds <= 2^-18 per key, random in sign. Scaling by less
//     would raise the underflow floor; by more would overflow the flavour.
//   * K and V bytes are used exactly, as the bf16 path's exact dequantisation.
// Measured in the host emulation (docs/amd.md): the same relative Frobenius
// error as the bf16-MFMA path (~1-2e-3, dominated by the bf16 output).
// Q scales are per (head, wave): a wave's 288 dims of one head are one
// column of its B operand, so 1 / s multiplies its partial score column
// exactly before the partial tiles are summed.
// Stage structure of the fp8 path (differences from steps 0-3 above):
//   0. raw bytes -> LDS unchanged (OCP bytes on gfx942: the fix-up above);
//   1. 576 / 32 = 18 k-steps do not split over 4 waves, so wave w takes token
//      tile w & 1 over dims [288 (w >> 1), +288): 9 k-steps x (hi, lo) = 18
//      MFMAs, two partial tiles meet in LDS;
//   2. P * kFp8PScale is split into hi / lo fp8 codes (LDS p8);
//   3. one k-step of 32 tokens: m-tile i (0..7) row m = value dim
//      128 w + 8m + i; a lane reads 8 bytes (8 dims) of each of its 8 tokens
//      and transposes the 8x8 bytes with v_perm_b32 (32 per stage); 8 x (hi,
//      lo) = 16 MFMAs. Same 34 MFMAs per stage as the bf16 path, no decode.
// LDS of the fp8 path (SmemFp8, 24896 bytes: two workgroups per gfx942 CU):
//   kv 32 rows x 584 bytes (raw fp8, 146 dwords per row), red 2 x 16 x 36
//   fp32, p8 2 x 16 x 40 bytes, flag, alpha, m, l.
#pragma once

#include <stdint.h>

#include "common/addressing.h"
#include "common/formats.h"
#include "common/params.h"
#include "common/portability.h"
#include "kernels/common/launch_contract.h"
#include "kernels/common/work.cuh"

#if defined(__HIP_DEVICE_COMPILE__) && !defined(MLA_HAS_MFMA)
#error "mla_decode: the HIP kernels need bf16 MFMA and wave64 (CDNA2/3/4: gfx90a, gfx942, gfx950); set PYTORCH_ROCM_ARCH to those."
#endif

namespace mla_decode {
namespace cuda {
namespace mfma {

constexpr int kThreads = 256;
constexpr int kWaves = 4;
constexpr int kWaveSize = 64;
constexpr int kKSteps = 9;                     // 576 / 16 / 4 waves
constexpr int kQkDimsPerWave = 16 * kKSteps;   // 144
constexpr int kVDimsPerWave = kHeadDimV / kWaves;  // 128
constexpr int kVTiles = kVDimsPerWave / 16;    // 8 m-tiles of O^T per wave
constexpr int kLdsRow = kHeadDimQK + 4;        // bf16 per LDS row (1160 bytes)
constexpr int kRedStride = kBlockN + 4;        // fp32 per row of a partial score tile
constexpr int kPStride = kBlockN + 4;          // bf16 per row of P (18 dwords)
constexpr int kRowThreads = kThreads / kTileRows;  // 16 softmax threads per row
static_assert(kKSteps * 16 * kWaves == kHeadDimQK, "QK split");
static_assert(kWaveSize == MLA_WARP_SIZE, "CDNA wavefronts are 64 lanes (portability.h)");
static_assert(kRowThreads * 2 == kBlockN, "softmax: two tokens per thread");

typedef short bf16x4_t __attribute__((ext_vector_type(4)));
typedef float f32x4_t __attribute__((ext_vector_type(4)));
typedef float f32x2_t __attribute__((ext_vector_type(2)));
typedef uint32_t u32x2_t __attribute__((ext_vector_type(2)));
typedef uint32_t u32x4_t __attribute__((ext_vector_type(4)));

struct alignas(16) Smem {
  uint16_t kv[kBlockN * kLdsRow];
  float red[kWaves][kTileRows][kRedStride];
  uint16_t p[kTileRows][kPStride];
  int32_t flag[kBlockN];
  float alpha[kTileRows];
  float m[kTileRows];
  float l[kTileRows];
};
static_assert(sizeof(Smem) <= MLA_MAX_SMEM_BYTES, "LDS budget exceeded");

// fp8-MFMA path: the stage's raw fp8 bytes. Row stride 584 bytes = 146 dwords
// (18 mod 32 banks): the 16 rows read at one offset by an A operand (8 bytes
// each) fall on 16 distinct bank pairs; V reads are 128 contiguous bytes per
// 16 lanes. P is kept as its two fp8 terms.
constexpr int kRawRow = kHeadDimQK + 8;        // bytes per LDS row
constexpr int kQkHalf = kHeadDimQK / 2;        // 288 dims per QK wave
constexpr int kQkSteps8 = kQkHalf / 32;        // 9 k-steps of 32
constexpr int kP8Stride = kBlockN + 8;         // bytes per P row (10 dwords: conflict-free 8-byte reads)
static_assert(kQkSteps8 * 32 * 2 == kHeadDimQK, "fp8 QK split");
static_assert(kVDimsPerWave == 16 * 8, "fp8 PV: 16 lanes x 8 dims per wave");
struct alignas(16) SmemFp8 {
  uint8_t kv[kBlockN * kRawRow];
  float red[2][kTileRows][kRedStride];   // partial score tiles, one per half of the head dim
  uint8_t p8[2][kTileRows][kP8Stride];   // P terms: [0] hi, [1] lo (fp8 codes of P * kFp8PScale)
  int32_t flag[kBlockN];
  float alpha[kTileRows];
  float m[kTileRows];
  float l[kTileRows];
};
static_assert(sizeof(SmemFp8) <= MLA_MAX_SMEM_BYTES, "LDS budget exceeded");
template <bool kFp8Mfma>
struct SmemOf { typedef Smem type; };
template <>
struct SmemOf<true> { typedef SmemFp8 type; };

// Raw cache bytes per row, and how a stage splits into 16-byte chunks.
template <KvFormat F>
struct Fmt {
  static constexpr int kRowBytes = F == KvFormat::kBf16 ? 2 * kHeadDimQK
                                   : F == KvFormat::kMxfp4 ? kMxfp4RowBytes
                                                           : kHeadDimQK;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kElemsPerChunk = kHeadDimQK / kChunksPerRow;  // 8, 16, 32
  static constexpr int kChunks = kBlockN * kChunksPerRow;
  static constexpr int kSlots = (kChunks + kThreads - 1) / kThreads;  // 9, 5, 3
  static constexpr bool kMx = F == KvFormat::kMxfp4;
  static constexpr bool kFp8 = F == KvFormat::kFp8E4M3FN || F == KvFormat::kFp8E4M3FNUZ;
#if defined(MLA_NATIVE_FP8_FNUZ)
  static constexpr bool kNativeFnuz = true;
#else
  static constexpr bool kNativeFnuz = false;
#endif
#if defined(MLA_NATIVE_FP8_OCP)
  static constexpr bool kNativeOcp = true;
#else
  static constexpr bool kNativeOcp = false;
#endif
  // fp8 through the target's convert instruction (v_cvt_pk_f32_fp8: fnuz on
  // gfx942, OCP on gfx950). The two e4m3 flavours share every bit pattern but
  // three: an OCP value is exactly twice the fnuz value of the same byte
  // (bias 7 vs 8, subnormals included), except 0x80 (OCP -0, fnuz NaN) and
  // 0x7F / 0xFF (OCP NaN, fnuz +-240). So the other flavour is decoded in the
  // hardware's units (value / kFp8Ratio, exact), kFp8Ratio is folded into the
  // per-tensor scale, and the rare words holding one of the three bytes take
  // the scalar decoders of formats.h.
  static constexpr bool kHwFp8 = kFp8 && (kNativeFnuz || kNativeOcp);
  static constexpr float kFp8Ratio = !kHwFp8                                        ? 1.f
                                     : (F == KvFormat::kFp8E4M3FN && kNativeFnuz)   ? 2.f
                                     : (F == KvFormat::kFp8E4M3FNUZ && kNativeOcp)  ? 0.5f
                                                                                    : 1.f;
  static constexpr bool kFp8Fixups = kHwFp8 && kFp8Ratio != 1.f;
  // fp8 MFMA on the raw cache bytes (see the header): gfx942's fnuz MFMA, for
  // either flavour. (gfx950 runs mfma_gfx950.cuh, which does not read these.)
  static constexpr bool kFp8Mfma = kFp8 && kNativeFnuz;
  static constexpr bool kMfmaOcp = false;  // the flavour the fp8 MFMA reads: fnuz
  // Q: the row's largest |s q| lies in [2^kFp8TopExp, 2^(kFp8TopExp+1)),
  // which rounds to at most 128 (fnuz, max 240).
  static constexpr int kFp8TopExp = 6;
  // P in [0, 1] times this: at most 128.
  static constexpr float kFp8PScale = 128.f;
};
// MXFP4: a 16-byte chunk is 32 codes = exactly one E8M0 block.
static_assert(Fmt<KvFormat::kMxfp4>::kElemsPerChunk == kMxBlock, "one MX block per chunk");

__device__ __forceinline__ float fast_exp2(float x) {
#if __has_builtin(__builtin_amdgcn_exp2f)
  return __builtin_amdgcn_exp2f(x);  // v_exp_f32 (CUDA: ex2.approx under --use_fast_math)
#else
  return exp2f(x);
#endif
}
__device__ __forceinline__ float fast_log2(float x) {
#if __has_builtin(__builtin_amdgcn_logf)
  return __builtin_amdgcn_logf(x);  // v_log_f32
#else
  return __log2f(x);
#endif
}

// One online-softmax step of a row's two scores of a 32-key stage, shared by
// both MFMA kernels (kRowThreads lanes hold a row, two tokens each). `sv`:
// the row's summed partial scores of tokens pos0, pos0 + 1; masked past
// kv_end (-inf) and NaN where `bad` flags a bad index; scaled by scale_log2
// (log2 domain). Returns the rescale factor of the row's earlier state,
// writes the probabilities relative to the new running maximum into pv and
// updates (m_run, l_run). With no finite score yet, sv is -inf (masked) or
// NaN (bad index): exp2 gives 0 or NaN, so a row whose keys in this split
// are all bad still ends up NaN (docs/amd.md, "Differences from the CUDA
// kernel").
template <int kRowThreads>
__device__ __forceinline__ float softmax_step(float (&sv)[2], int pos0, int kv_end, const int32_t* bad,
                                              float scale_log2, float (&pv)[2], float& m_run, float& l_run) {
  float tile_max = -MLA_INF;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    sv[e] *= scale_log2;
    if (pos0 + e >= kv_end) sv[e] = -MLA_INF;
    else if (bad[e]) sv[e] = MLA_NAN;
    tile_max = fmaxf(tile_max, sv[e]);
  }
#pragma unroll
  for (int off = 1; off < kRowThreads; off <<= 1) tile_max = fmaxf(tile_max, mla_shfl_xor(tile_max, off));
  const float m_new = fmaxf(m_run, tile_max);
  const bool none = m_new == -MLA_INF;
  const float alpha = none ? 1.f : fast_exp2(m_run - m_new);
  float psum = 0.f;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    pv[e] = fast_exp2(sv[e] - (none ? 0.f : m_new));
    psum += pv[e];
  }
#pragma unroll
  for (int off = 1; off < kRowThreads; off <<= 1) psum += mla_shfl_xor(psum, off);
  l_run = l_run * alpha + psum;
  m_run = m_new;
  return alpha;
}

// The epilogue's stores of head h of query token t (split `split`), shared by
// both MFMA kernels: O^T's accumulators times 1 / l (times out_scale) into
// out (one split) or this split's partial row, and the natural-log LSE (wave
// 0's lanes of group 0). l = 0 gives 0 and -inf; a NaN sum or an orphan token
// gives NaN. This lane holds dims of value-dim block 128 wave in groups of
// four consecutive ones, o[a + 0..3][r] (a = 0, 4; r < 4), starting at
//   kK32Layout (the 16x16x32 MFMAs' accumulators): o[i][r] is dim
//     128 wave + 32 g + 8 r + i, so the group starts at 32 g + 8 r + a;
//   else (16x16x16 bf16): o[4q + i][r] is dim 128 wave + 64 q + 16 g + 4 r + i,
//     so it starts at 16 g + 64 (a / 4) + 4 r.
template <bool kK32Layout>
__device__ __forceinline__ void store_head_outputs(const DecodeLaunch& args, int t, int h, int split, int wave,
                                                   int g, const f32x4_t (&o)[kVTiles], float m, float l,
                                                   float out_scale, bool orphan) {
  const MlaDecodeParams& p = args.p;
  float inv = l > 0.f ? out_scale / l : 0.f;
  float lse = l > 0.f ? (m + fast_log2(l)) * 0.6931471805599453f : -MLA_INF;
  if (__builtin_isnan(l) || orphan) {
    inv = MLA_NAN;
    lse = MLA_NAN;
  }
  const int64_t row = static_cast<int64_t>(t) * p.num_heads + h;
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  uint16_t* out_row = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                      static_cast<int64_t>(h) * p.out_stride_head + kVDimsPerWave * wave;
  float* partial_row = args.num_splits == 1 ? nullptr
                                            : args.partial_out + (static_cast<int64_t>(split) * rows + row) * kHeadDimV +
                                                  kVDimsPerWave * wave;
#pragma unroll
  for (int a = 0; a < 8; a += 4) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int off = kK32Layout ? 32 * g + 8 * r + a : 16 * g + 64 * (a / 4) + 4 * r;
      const float v0 = o[a][r] * inv, v1 = o[a + 1][r] * inv, v2 = o[a + 2][r] * inv, v3 = o[a + 3][r] * inv;
      if (args.num_splits == 1) {
        uint32_t* d32 = reinterpret_cast<uint32_t*>(out_row + off);
        d32[0] = mla_pack_bf16x2(v0, v1);
        d32[1] = mla_pack_bf16x2(v2, v3);
      } else {
        *reinterpret_cast<f32x4_t*>(partial_row + off) = f32x4_t{v0, v1, v2, v3};
      }
    }
  }
  if (wave == 0 && g == 0) {
    if (args.num_splits == 1) {
      p.lse[static_cast<int64_t>(t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] = lse;
    } else {
      args.partial_lse[static_cast<int64_t>(split) * rows + row] = lse;
    }
  }
}

__device__ __forceinline__ f32x4_t mfma_bf16(u32x2_t a, u32x2_t b, f32x4_t c) {
#if defined(MLA_HAS_MFMA) || !defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(bf16x4_t, a), __builtin_bit_cast(bf16x4_t, b),
                                                   c, 0, 0, 0);
#else
  return c;  // unreachable: the #error above stops such targets
#endif
}

// bf16 bits of two floats that are bf16 values already (dequantised fp8 and
// scaled E2M1): truncation is exact, NaN stays NaN (quiet bit is kept).
__device__ __forceinline__ uint32_t pack_exact(float lo, float hi) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

// Does any byte of w equal 0x80, 0x7F or 0xFF (the bytes whose meaning
// differs between the e4m3 flavours)?
__device__ __forceinline__ bool fp8_flavour_special(uint32_t w) {
  const uint32_t low7 = w & 0x7f7f7f7fu;
  const uint32_t all_ones = (low7 + 0x01010101u) & 0x80808080u;   // low 7 bits == 0x7F
  const uint32_t neg_zero = ~(low7 + 0x7f7f7f7fu) & w & 0x80808080u;  // sign set, low 7 bits == 0
  return (all_ones | neg_zero) != 0u;
}

// Four fp8 codes (byte i = element i) -> bf16 pairs (0,1) and (2,3), in units
// of Fmt<F>::kFp8Ratio (1 unless the hardware decodes the other flavour).
template <KvFormat F>
__device__ __forceinline__ u32x2_t fp8x4_to_bf16(uint32_t w) {
  using Fm = Fmt<F>;
  u32x2_t r;
  if constexpr (Fm::kHwFp8) {
#if defined(MLA_NATIVE_FP8_FNUZ) || defined(MLA_NATIVE_FP8_OCP)
    if (!Fm::kFp8Fixups || !fp8_flavour_special(w)) {
      const f32x2_t a = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(w), false);
      const f32x2_t b = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(w), true);
      r.x = pack_exact(a.x, a.y);
      r.y = pack_exact(b.x, b.y);
      return r;
    }
#endif
  }
  float f[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t c = static_cast<uint8_t>(w >> (8 * i));
    f[i] = (F == KvFormat::kFp8E4M3FNUZ ? e4m3fnuz_to_float(c) : e4m3fn_to_float(c)) * (1.f / Fm::kFp8Ratio);
  }
  r.x = pack_exact(f[0], f[1]);
  r.y = pack_exact(f[2], f[3]);
  return r;
}

// v_perm_b32: byte i of the result is byte sel.byte[i] of the 8 bytes
// {hi (bytes 4-7), lo (bytes 0-3)}; selector 0x0C gives 0x00.
__device__ __forceinline__ uint32_t perm_bytes(uint32_t hi, uint32_t lo, uint32_t sel) {
  return __builtin_amdgcn_perm(hi, lo, sel);
}

// 32 E2M1 codes (byte j of word k = elements 8k + 2j (low nibble) and
// 8k + 2j + 1 (high nibble)) times 2^(e - 127) -> 16 bf16 pairs in order.
// Exact. For 2 <= e <= 252 every non-zero result is a normal bf16 whose bits
// are (magnitude code c: 1..7) (e << 7) + {-0x80, 0, 0x40, 0x80, 0xC0, 0x100,
// 0x140}[c - 1] plus the sign; an 8-entry byte table per bf16 byte, looked up
// with v_perm_b32 (4 codes per instruction), decodes a word in ~25 VALU
// instructions. Other e (tiny or huge scales, NaN) take formats.h.
__device__ __forceinline__ void mx_chunk_to_bf16(const u32x4_t w, uint32_t e, uint32_t (&out)[16]) {
  if (e >= 2u && e <= 252u) {
    const uint32_t x = e << 7;
    const uint32_t p01 = (x - 0x80u) << 16;                  // codes 0 (zero), 1
    const uint32_t p23 = x | ((x + 0x40u) << 16);            // codes 2, 3
    const uint32_t p45 = (x + 0x80u) | ((x + 0xc0u) << 16);  // codes 4, 5
    const uint32_t p67 = (x + 0x100u) | ((x + 0x140u) << 16);
    const uint32_t lo03 = perm_bytes(p23, p01, 0x06040200u), hi03 = perm_bytes(p23, p01, 0x07050301u);
    const uint32_t lo47 = perm_bytes(p67, p45, 0x06040200u), hi47 = perm_bytes(p67, p45, 0x07050301u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t word = w[k];
      const uint32_t ce = word & 0x07070707u, co = (word >> 4) & 0x07070707u;  // magnitude codes
      const uint32_t le = perm_bytes(lo47, lo03, ce), he = perm_bytes(hi47, hi03, ce);
      const uint32_t lo = perm_bytes(lo47, lo03, co), ho = perm_bytes(hi47, hi03, co);
      const uint32_t e01 = perm_bytes(he, le, 0x05010400u), e23 = perm_bytes(he, le, 0x07030602u);  // even elems
      const uint32_t o01 = perm_bytes(ho, lo, 0x05010400u), o23 = perm_bytes(ho, lo, 0x07030602u);  // odd elems
      const uint32_t se = (word << 4) & 0x80808080u, so = word & 0x80808080u;  // sign bits, bit 7 of byte j
      out[4 * k + 0] = perm_bytes(o01, e01, 0x05040100u) | perm_bytes(so, se, 0x040c000cu);
      out[4 * k + 1] = perm_bytes(o01, e01, 0x07060302u) | perm_bytes(so, se, 0x050c010cu);
      out[4 * k + 2] = perm_bytes(o23, e23, 0x05040100u) | perm_bytes(so, se, 0x060c020cu);
      out[4 * k + 3] = perm_bytes(o23, e23, 0x07060302u) | perm_bytes(so, se, 0x070c030cu);
    }
  } else {
    const float sc = e8m0_to_float(static_cast<uint8_t>(e));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = w[k] >> (8 * j);
        out[4 * k + j] = pack_exact(e2m1_to_float(byte & 0xfu) * sc, e2m1_to_float((byte >> 4) & 0xfu) * sc);
      }
    }
  }
}

// Low (hi == false) or high 16 bits of w0 and of w1, as one bf16 pair.
__device__ __forceinline__ uint32_t pick_halves(uint32_t w0, uint32_t w1, bool hi) {
  return hi ? ((w0 >> 16) | (w1 & 0xffff0000u)) : ((w0 & 0xffffu) | (w1 << 16));
}

// ---- fp8-MFMA path helpers ---------------------------------------------------
// x rounded to nearest even on the e4m3 grid of the flavour (OCP: normals
// from 2^-6, subnormal quantum 2^-9; fnuz: 2^-7 and 2^-10), without range
// limit at the top (callers stay below the flavour's maximum). NaN stays NaN.
template <bool kOcp>
__device__ __forceinline__ float fp8_round(float x) {
  constexpr float kMinNormal = kOcp ? 0x1p-6f : 0x1p-7f;
  constexpr float kQuantumShift = kOcp ? 0x1p14f : 0x1p13f;  // ulp_fp32(2^14) = 2^-9, ulp(2^13) = 2^-10
  const float a = __builtin_fabsf(x);
  float r;
  if (a >= kMinNormal) {  // keep 3 mantissa bits, round to nearest even
    uint32_t u = __float_as_uint(a);
    u = (u + 0x7ffffu + ((u >> 20) & 1u)) & 0xfff00000u;
    r = __uint_as_float(u);
  } else {  // subnormal range (and NaN): a multiple of the quantum, RNE by fp32 addition
    r = (a + kQuantumShift) - kQuantumShift;
  }
  return __builtin_copysignf(r, x);
}

// The e4m3 code (of the flavour) of v, which is on the flavour's grid and
// within its range (fp8_round's results); NaN / inf -> the flavour's NaN,
// zeros -> 0x00 (fnuz has no -0: 0x80 is its NaN).
template <bool kOcp>
__device__ __forceinline__ uint32_t fp8_code(float v) {
  constexpr int kBias = kOcp ? 7 : 8;
  constexpr int kMinExp = kOcp ? -6 : -7;
  constexpr float kInvQuantum = kOcp ? 0x1p9f : 0x1p10f;
  const uint32_t u = __float_as_uint(v);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return kOcp ? 0x7fu : 0x80u;
  if (a == 0u) return 0u;
  const int e = static_cast<int>(a >> 23) - 127;
  const uint32_t mag = e >= kMinExp ? (static_cast<uint32_t>(e + kBias) << 3) | ((a >> 20) & 7u)
                                    : static_cast<uint32_t>(__uint_as_float(a) * kInvQuantum);  // 1..7, exact
  return ((u >> 24) & 0x80u) | mag;
}

// Two-term fp8 split of x (already scaled): x ~ hi + lo (see the header for
// the error). Returns hi's code in bits 0-7 and lo's in bits 8-15.
template <bool kOcp>
__device__ __forceinline__ uint32_t fp8_split(float x) {
  const float hi = fp8_round<kOcp>(x);
  const float lo = fp8_round<kOcp>(x - hi);  // x - hi is exact in fp32
  return fp8_code<kOcp>(hi) | (fp8_code<kOcp>(lo) << 8);
}

// OCP e4m3 bytes read by the fnuz MFMA (gfx942): every byte means half its
// OCP value (kFp8Ratio = 2 folds the factor into the scale), except 0x80
// (OCP -0, fnuz NaN) -> 0x00 and 0x7F / 0xFF (OCP NaN, fnuz +-240) -> 0x80.
__device__ __forceinline__ uint32_t fp8_ocp_bytes_as_fnuz(uint32_t w) {
  const uint32_t low7 = w & 0x7f7f7f7fu;
  const uint32_t nan = (low7 + 0x01010101u) & 0x80808080u;            // bit 7 set: low 7 bits == 0x7F
  const uint32_t negz = ~(low7 + 0x7f7f7f7fu) & w & 0x80808080u;     // bit 7 set: byte == 0x80
  const uint32_t fix = ((nan | negz) >> 7) * 0xffu;                    // whole bytes
  return (w & ~fix) | nan;
}

__device__ __forceinline__ f32x4_t mfma_fp8(u32x2_t a, u32x2_t b, f32x4_t c) {
#if defined(MLA_NATIVE_FP8_FNUZ) || defined(MLA_NATIVE_FP8_OCP) || !defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(__builtin_bit_cast(long, a), __builtin_bit_cast(long, b), c, 0,
                                                    0, 0);
#else
  return c;  // not reached: Fmt<F>::kFp8Mfma is false on targets without fp8 MFMA
#endif
}

// 4x4 byte transpose: byte e of out[i] = byte i of w[e].
__device__ __forceinline__ void transpose_bytes4(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t (&out)[4]) {
  const uint32_t a_lo = perm_bytes(w1, w0, 0x05010400u), a_hi = perm_bytes(w1, w0, 0x07030602u);  // w0/w1 bytes 0,1 | 2,3
  const uint32_t b_lo = perm_bytes(w3, w2, 0x05010400u), b_hi = perm_bytes(w3, w2, 0x07030602u);
  out[0] = perm_bytes(b_lo, a_lo, 0x05040100u);
  out[1] = perm_bytes(b_lo, a_lo, 0x07060302u);
  out[2] = perm_bytes(b_hi, a_hi, 0x05040100u);
  out[3] = perm_bytes(b_hi, a_hi, 0x07060302u);
}

}  // namespace mfma
}  // namespace cuda
}  // namespace mla_decode

#if defined(__gfx950__)
#include "kernels/cdna/mfma_gfx950.cuh"
#endif

namespace mla_decode {
namespace cuda {
namespace mfma {

template <KvFormat F>
__global__ void __launch_bounds__(kThreads) mla_decode_split_kernel_mfma(const DecodeLaunch args) {
#if defined(__gfx950__)
  gfx950::split_kernel<F>(args);  // CDNA4's own instructions (mfma_gfx950.cuh)
#else
  using Fm = Fmt<F>;
  constexpr bool kMx = Fm::kMx;
  constexpr bool kFp8 = Fm::kFp8;
  constexpr bool kF8 = Fm::kFp8Mfma;  // fp8-MFMA path (raw bytes in LDS, split Q and P)
  constexpr bool kOcp = Fm::kMfmaOcp;
  __shared__ typename SmemOf<kF8>::type smem;

  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wave = tid / kWaveSize;
  const int lane = tid % kWaveSize;
  const int col = lane & 15;  // MFMA column / A-row index of this lane
  const int g = lane >> 4;    // MFMA k group (k = 4g..4g+3) / D row group

  // ---- which query token, heads and KV range (kernels/common/work.cuh) -------
  const WorkItem work = locate_work<kBlockN>(args);
  const int t = work.t, h0 = work.h0, split = work.split, b = work.b;
  const bool orphan = work.orphan;
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kBlockN);

  float scale_log2 = p.sm_scale * 1.4426950408889634f;  // log2(e)
  if constexpr (kFp8) {
    // fp8 codes enter the MFMA unscaled; the per-tensor scale multiplies S and O.
    scale_log2 *= *p.fp8_scale * Fm::kFp8Ratio;
  }

  // ---- Q fragments (B operand of S^T = K Q^T), registers, whole kernel -------
  // bf16 path: lane: head h0 + col, dims 144 wave + 16 kk + 4g .. +3.
  // fp8 path: wave w computes token tile w & 1 over dims [288 (w >> 1), +288);
  // lane: head h0 + col, dims 288 (w >> 1) + 32 kk + 8g .. +7, split into hi /
  // lo fp8 terms with one power-of-two scale per (head, wave).
  u32x2_t qf[kKSteps];
  u32x2_t qhi[kQkSteps8], qlo[kQkSteps8];
  float q_unscale = 1.f;  // 1 / s of this lane's head and wave
  if constexpr (kF8) {
    const int h = h0 + col;
    const bool valid = !orphan && h < p.num_heads;
    const uint16_t* q = static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(t) * p.q_stride_token +
                        static_cast<int64_t>(valid ? h : 0) * p.q_stride_head + kQkHalf * (wave >> 1) + 8 * g;
    u32x4_t raw_q[kQkSteps8];
    float amax = 0.f;
#pragma unroll
    for (int kk = 0; kk < kQkSteps8; ++kk) {
      raw_q[kk] = valid ? *reinterpret_cast<const u32x4_t*>(q + 32 * kk) : u32x4_t{0u, 0u, 0u, 0u};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax = fmaxf(amax, __builtin_fabsf(__uint_as_float(raw_q[kk][j] << 16)));
        amax = fmaxf(amax, __builtin_fabsf(__uint_as_float(raw_q[kk][j] & 0xffff0000u)));
      }
    }
    amax = fmaxf(amax, mla_shfl_xor(amax, 16));  // the 4 lanes of this head = the wave's 288 dims
    amax = fmaxf(amax, mla_shfl_xor(amax, 32));
    // s = 2^(kFp8TopExp - exponent(amax)), within the normal range both ways
    // (amax = 0 or subnormal: the largest; inf / NaN: the smallest, and such a
    // q element becomes a NaN code).
    int se = Fm::kFp8TopExp - (static_cast<int>(__float_as_uint(amax) >> 23) - 127);
    se = se < -126 ? -126 : se > 126 ? 126 : se;
    const float qs = __uint_as_float(static_cast<uint32_t>(se + 127) << 23);
    q_unscale = __uint_as_float(static_cast<uint32_t>(127 - se) << 23);
#pragma unroll
    for (int kk = 0; kk < kQkSteps8; ++kk) {
      uint32_t hw[2] = {0u, 0u}, lw[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // dim 8g + j -> byte j
        const uint32_t bits = raw_q[kk][j / 2];
        const float x = __uint_as_float((j & 1) ? (bits & 0xffff0000u) : (bits << 16));
        const uint32_t c = fp8_split<kOcp>(x * qs);
        hw[j / 4] |= (c & 0xffu) << (8 * (j % 4));
        lw[j / 4] |= (c >> 8) << (8 * (j % 4));
      }
      qhi[kk] = u32x2_t{hw[0], hw[1]};
      qlo[kk] = u32x2_t{lw[0], lw[1]};
    }
  } else {
    const int h = h0 + col;
    const bool valid = !orphan && h < p.num_heads;
    const uint16_t* q = static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(t) * p.q_stride_token +
                        static_cast<int64_t>(valid ? h : 0) * p.q_stride_head + kQkDimsPerWave * wave + 4 * g;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      qf[kk] = valid ? *reinterpret_cast<const u32x2_t*>(q + 16 * kk) : u32x2_t{0u, 0u};
    }
  }

  // ---- stage loader: global -> registers (prefetch), registers -> LDS -------
  const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
  // Lane (lane % 32) of every wave resolves the cache row of token lane % 32
  // of the tile; chunk loaders fetch it with a shuffle. -2: past the range
  // (zero-filled, masked to -inf), -1: bad index (zero-filled, NaN).
  auto tile_row = [&](int tile_idx) -> int {
    const int j = kv_begin + tile_idx * kBlockN + (lane & 31);
    if (j >= kv_end) return -2;
    const int64_t r = kv_row(p, b, j);
    return r < 0 ? -1 : static_cast<int>(r);
  };
  int pf_row = -2;             // this lane's token row of the prefetched stage
  u32x4_t raw[Fm::kSlots];     // chunk tid + 256 s of the prefetched stage
  uint32_t mx_e[Fm::kSlots];   // MXFP4: its E8M0 byte
  auto issue_tile = [&](int tile_idx) {
    pf_row = tile_row(tile_idx);
#pragma unroll
    for (int s = 0; s < Fm::kSlots; ++s) {
      const int idx = tid + kThreads * s;
      const int n = min(idx / Fm::kChunksPerRow, kBlockN - 1);
      const int ch = idx - (idx / Fm::kChunksPerRow) * Fm::kChunksPerRow;
      const int r = mla_shfl(pf_row, n);
      raw[s] = u32x4_t{0u, 0u, 0u, 0u};
      mx_e[s] = 127u;  // 2^0: a zero-filled row decodes to +0
      if (idx < Fm::kChunks && r >= 0) {
        raw[s] = *reinterpret_cast<const u32x4_t*>(kv_base + static_cast<int64_t>(r) * p.kv_row_stride_bytes + ch * 16);
        if constexpr (kMx) {
          mx_e[s] = p.mx_scale[static_cast<int64_t>(r) * p.mx_scale_stride_row +
                               static_cast<int64_t>(ch) * p.mx_scale_stride_col];
        }
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int s = 0; s < Fm::kSlots; ++s) {
      const int idx = tid + kThreads * s;
      if (idx >= Fm::kChunks) continue;
      const int n = idx / Fm::kChunksPerRow;
      const int ch = idx - n * Fm::kChunksPerRow;
      const u32x4_t w = raw[s];
      if constexpr (kF8) {  // raw bytes; rows are 8-byte aligned (584-byte stride)
        u32x2_t* dst = reinterpret_cast<u32x2_t*>(smem.kv + n * kRawRow + ch * 16);
        if constexpr (Fm::kFp8Fixups) {  // OCP bytes for the fnuz MFMA (gfx942)
          dst[0] = u32x2_t{fp8_ocp_bytes_as_fnuz(w.x), fp8_ocp_bytes_as_fnuz(w.y)};
          dst[1] = u32x2_t{fp8_ocp_bytes_as_fnuz(w.z), fp8_ocp_bytes_as_fnuz(w.w)};
        } else {
          dst[0] = u32x2_t{w.x, w.y};
          dst[1] = u32x2_t{w.z, w.w};
        }
        continue;
      }
      u32x2_t* dst = reinterpret_cast<u32x2_t*>(smem.kv + n * kLdsRow + ch * Fm::kElemsPerChunk);
      if constexpr (F == KvFormat::kBf16) {
        dst[0] = u32x2_t{w.x, w.y};
        dst[1] = u32x2_t{w.z, w.w};
      } else if constexpr (kFp8) {
        dst[0] = fp8x4_to_bf16<F>(w.x);
        dst[1] = fp8x4_to_bf16<F>(w.y);
        dst[2] = fp8x4_to_bf16<F>(w.z);
        dst[3] = fp8x4_to_bf16<F>(w.w);
      } else {
        uint32_t o[16];
        mx_chunk_to_bf16(w, mx_e[s], o);
#pragma unroll
        for (int k = 0; k < 8; ++k) dst[k] = u32x2_t{o[2 * k], o[2 * k + 1]};
      }
    }
    if (wave == 0 && lane < kBlockN) smem.flag[lane] = pf_row == -1 ? 1 : 0;
  };

  if (n_tiles > 0) issue_tile(0);

  f32x4_t o[kVTiles];
#pragma unroll
  for (int j = 0; j < kVTiles; ++j) o[j] = f32x4_t{0.f, 0.f, 0.f, 0.f};
  // Online-softmax state of row tid / 16, kept identically by its 16 threads.
  float m_run = -MLA_INF;
  float l_run = 0.f;
  const int sm_row = tid / kRowThreads;
  const int sm_col = (tid % kRowThreads) * 2;

  for (int it = 0; it < n_tiles; ++it) {
    __syncthreads();  // (A) everyone finished PV of stage it-1: the LDS tile is free
    store_tile();
    if (it + 1 < n_tiles) issue_tile(it + 1);  // in flight during this stage's math
    __syncthreads();  // (B) stage it visible

    // ---- 1. partial S^T = K Q^T -------------------------------------------------
    if constexpr (kF8) {
      // Token tile nt = wave & 1, dims 288 (wave >> 1) + 32 kk + 8g .. +7: 9 k-steps,
      // hi and lo terms in two accumulators (independent MFMA chains).
      const int nt = wave & 1, hh = wave >> 1;
      f32x4_t acc_hi = f32x4_t{0.f, 0.f, 0.f, 0.f}, acc_lo = acc_hi;
      const uint8_t* krow = smem.kv + (16 * nt + col) * kRawRow + kQkHalf * hh + 8 * g;
#pragma unroll
      for (int kk = 0; kk < kQkSteps8; ++kk) {
        const u32x2_t a = *reinterpret_cast<const u32x2_t*>(krow + 32 * kk);
        acc_hi = mfma_fp8(a, qhi[kk], acc_hi);
        acc_lo = mfma_fp8(a, qlo[kk], acc_lo);
      }
      // D: tokens 16 nt + 4g .. +3 of head col, in units of s: undo it (exact).
      *reinterpret_cast<f32x4_t*>(&smem.red[hh][col][16 * nt + 4 * g]) = (acc_hi + acc_lo) * q_unscale;
    } else {
      f32x4_t s_acc[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s_acc[nt] = f32x4_t{0.f, 0.f, 0.f, 0.f};
        // A operand: token 16 nt + col, dims 144 wave + 16 kk + 4g .. +3.
        const uint16_t* krow = smem.kv + (16 * nt + col) * kLdsRow + kQkDimsPerWave * wave + 4 * g;
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          s_acc[nt] = mfma_bf16(*reinterpret_cast<const u32x2_t*>(krow + 16 * kk), qf[kk], s_acc[nt]);
        }
        // D: tokens 16 nt + 4g .. +3 of head col.
        *reinterpret_cast<f32x4_t*>(&smem.red[wave][col][16 * nt + 4 * g]) = s_acc[nt];
      }
    }
    __syncthreads();  // (C) partial scores visible

    // ---- 2. online softmax: 16 threads per row, 2 tokens each --------------
    {
      float sv[2] = {0.f, 0.f};
      constexpr int kParts = kF8 ? 2 : kWaves;  // partial score tiles
#pragma unroll
      for (int w = 0; w < kParts; ++w) {
        const f32x2_t x = *reinterpret_cast<const f32x2_t*>(&smem.red[w][sm_row][sm_col]);
        sv[0] += x.x;
        sv[1] += x.y;
      }
      float pv[2];
      const float alpha = softmax_step<kRowThreads>(sv, kv_begin + it * kBlockN + sm_col, kv_end,
                                                    &smem.flag[sm_col], scale_log2, pv, m_run, l_run);
      if constexpr (kF8) {
        // P * kFp8PScale as hi / lo fp8 terms (NaN -> NaN codes, 0 -> 0).
        const uint32_t c0 = fp8_split<kOcp>(pv[0] * Fm::kFp8PScale);
        const uint32_t c1 = fp8_split<kOcp>(pv[1] * Fm::kFp8PScale);
        *reinterpret_cast<uint16_t*>(&smem.p8[0][sm_row][sm_col]) = static_cast<uint16_t>((c0 & 0xffu) | ((c1 & 0xffu) << 8));
        *reinterpret_cast<uint16_t*>(&smem.p8[1][sm_row][sm_col]) = static_cast<uint16_t>((c0 >> 8) | (c1 & 0xff00u));
      } else {
        *reinterpret_cast<uint32_t*>(&smem.p[sm_row][sm_col]) = mla_pack_bf16x2(pv[0], pv[1]);
      }
      if (tid % kRowThreads == 0) smem.alpha[sm_row] = alpha;
    }
    __syncthreads();  // (D) P and alpha visible

    // ---- 3. O^T = alpha * O^T + V^T P^T over this wave's 128 value dims -----
    // m-tile j = 4q + i, A row m: value dim 128 wave + 64 q + 4m + i. A lane
    // reads 4 contiguous dims (8 bytes) of each of its 4 tokens and regroups
    // them into the four m-tiles' operands, so every LDS read is a row read.
    if constexpr (kF8) {
      // One k-step of 32 tokens. m-tile i (0..7), A row m: value dim
      // 128 wave + 8m + i; k = token 8g + e (byte e). A lane reads 8 contiguous
      // dims (8 bytes) of each of its 8 tokens and transposes the 8x8 bytes,
      // so every LDS read is a row read. B: P terms of head col, tokens 8g .. +7.
      const float alpha = smem.alpha[col];
#pragma unroll
      for (int j = 0; j < kVTiles; ++j) o[j] *= alpha;
      const u32x2_t ph = *reinterpret_cast<const u32x2_t*>(&smem.p8[0][col][8 * g]);
      const u32x2_t pl = *reinterpret_cast<const u32x2_t*>(&smem.p8[1][col][8 * g]);
      const uint8_t* vrow = smem.kv + (8 * g) * kRawRow + kVDimsPerWave * wave + 8 * col;
      u32x2_t x[8];  // token 8g + e: dims 8col .. 8col+3 in .x, 8col+4 .. +7 in .y
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = *reinterpret_cast<const u32x2_t*>(vrow + e * kRawRow);
      uint32_t t_lo[2][4], t_hi[2][4];  // [dims 0-3 | 4-7][i % 4]: tokens 0-3 (lo dword) / 4-7 (hi dword)
      transpose_bytes4(x[0].x, x[1].x, x[2].x, x[3].x, t_lo[0]);
      transpose_bytes4(x[4].x, x[5].x, x[6].x, x[7].x, t_hi[0]);
      transpose_bytes4(x[0].y, x[1].y, x[2].y, x[3].y, t_lo[1]);
      transpose_bytes4(x[4].y, x[5].y, x[6].y, x[7].y, t_hi[1]);
#pragma unroll
      for (int i = 0; i < kVTiles; ++i) o[i] = mfma_fp8(u32x2_t{t_lo[i / 4][i % 4], t_hi[i / 4][i % 4]}, ph, o[i]);
#pragma unroll
      for (int i = 0; i < kVTiles; ++i) o[i] = mfma_fp8(u32x2_t{t_lo[i / 4][i % 4], t_hi[i / 4][i % 4]}, pl, o[i]);
    } else {
      const float alpha = smem.alpha[col];
#pragma unroll
      for (int j = 0; j < kVTiles; ++j) o[j] *= alpha;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        // B operand: P[head col][tokens 16 kk + 4g .. +3].
        const u32x2_t pb = *reinterpret_cast<const u32x2_t*>(&smem.p[col][16 * kk + 4 * g]);
        const uint16_t* vrow = smem.kv + (16 * kk + 4 * g) * kLdsRow + kVDimsPerWave * wave + 4 * col;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          u32x2_t x[4];  // token e: dims (4col, 4col+1) in .x, (4col+2, 4col+3) in .y
#pragma unroll
          for (int e = 0; e < 4; ++e) x[e] = *reinterpret_cast<const u32x2_t*>(vrow + e * kLdsRow + 64 * q);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool hi = i & 1;
            const u32x2_t a = i < 2 ? u32x2_t{pick_halves(x[0].x, x[1].x, hi), pick_halves(x[2].x, x[3].x, hi)}
                                    : u32x2_t{pick_halves(x[0].y, x[1].y, hi), pick_halves(x[2].y, x[3].y, hi)};
            o[4 * q + i] = mfma_bf16(a, pb, o[4 * q + i]);
          }
        }
      }
    }
  }

  // ---- epilogue --------------------------------------------------------------
  if (tid % kRowThreads == 0) {
    smem.m[sm_row] = m_run;
    smem.l[sm_row] = l_run;
  }
  __syncthreads();
  const int h = h0 + col;
  if (h >= p.num_heads) return;
  float out_scale = 1.f;
  if constexpr (kFp8) out_scale = *p.fp8_scale * Fm::kFp8Ratio;
  if constexpr (kF8) out_scale *= 1.f / Fm::kFp8PScale;  // O accumulated P * kFp8PScale
  store_head_outputs<kF8>(args, t, h, split, wave, g, o, smem.m[col], smem.l[col], out_scale, orphan);
#endif  // __gfx950__
}

}  // namespace mfma

// Launches mfma::mla_decode_split_kernel_mfma<F>; explicitly instantiated per
// format in mfma_<format>.cu. LDS is static (at most 48 KB: no opt-in is
// needed on AMD below 64 KB), so nothing is configured per device.
template <KvFormat F>
cudaError_t launch_mfma(const DecodeLaunch& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.p.total_q) * args.head_groups, args.num_splits);
  mfma::mla_decode_split_kernel_mfma<F><<<grid, mfma::kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla_decode

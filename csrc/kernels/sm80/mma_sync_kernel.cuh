// Split-KV MLA decode kernel for NVIDIA sm_80+ (mma.sync bf16 tensor cores).
//
// Grid:  x = query token t * head_groups + head group (16 heads),   (fastest: the
//            CTAs that read the same KV rows run side by side and share L2)
//        y = KV split.
// Block: 256 threads = 8 warps; one CTA owns 16 query rows (heads h0..h0+15 of
//        token t) and the KV positions [kv_begin, kv_end) of its split.
//
// Per 32-token stage (cp.async ring of kStages stages, raw cache bytes in
// shared memory, 16 bytes of padding per row against bank conflicts):
//   1. QK^T: warp w owns head dims [144 dg, 144 dg + 144) (dg = w % 4, 9
//      k-steps of 16, Q fragments kept in registers for the whole kernel) and
//      tokens [16 tg, 16 tg + 16) (tg = w / 4); it produces a partial 16x16
//      score tile.
//   2. The 4 partial tiles of each token are summed through shared memory;
//      16 threads per row run the online softmax (log2 domain) and write P
//      (bf16, or fp16 for OCP fp8) and the rescale factor alpha.
//   CTA barriers per stage: three, or two where no decoded tile exists and the
//   ring has at least three stages (OCP fp8, bf16's 4-stage ring; see the
//   tile loop).
//   3. PV, split over the value dim: warp w owns dims [64w, 64w+64) and
//      accumulates O (16 x 64 fp32 = 32 registers per thread).
// fp8 and MXFP4 rows are dequantised in registers right before their mma
// (never to bf16 in global memory). MXFP4 (and e4m3fnuz): the QK warps also
// store the decoded rows to a shared-memory tile, from which PV reads V with
// ldmatrix.trans exactly as the bf16 path reads the raw cache, so each element
// is decoded once. OCP fp8: PV reads the raw codes with ldmatrix.trans and
// converts them itself (one cvt per two codes is cheaper than the tile's
// shared-memory traffic). (A k-step's dims may be permuted freely,
// consistently for Q and K: each format uses the order that makes its
// conversion cheapest.)
//
// mma.sync m16n8k16 fragments (g = lane / 4, c = lane % 4):
//   A (16x16): a0 = (row g,   k 2c..2c+1)   a1 = (row g+8, k 2c..2c+1)
//              a2 = (row g,   k 2c+8..+9)   a3 = (row g+8, k 2c+8..+9)
//   B (16x8):  b0 = (k 2c..2c+1, col g)     b1 = (k 2c+8..+9, col g)
//   C (16x8):  c0,c1 = (row g, cols 2c, 2c+1)   c2,c3 = (row g+8, same cols)
//
// With one split the kernel writes bf16 out and lse directly; with several it
// writes fp32 partials (normalised O and LSE) that combine_kernel merges.
#pragma once

#include <math_constants.h>

#include "common/addressing.h"
#include "common/params.h"
#include "kernels/common/launch_contract.h"
#include "kernels/sm80/mma_sync_layout.h"
#include "kernels/common/work.cuh"
#include "kernels/sm80/ptx_sm80.cuh"
#include "kernels/common/trace.cuh"

namespace mla_decode {
namespace cuda {

constexpr int kThreads = 256;
constexpr int kWarps = 8;
constexpr int kTokGroups = 2;            // QK: the 32 tokens split two ways (and the dims kDimGroups ways)
constexpr int kKStepsPerWarp = 9;        // 576 / 16 / kDimGroups
constexpr int kVDimsPerWarp = 64;        // 512 / 8 warps
constexpr int kVTiles = kVDimsPerWarp / 8;  // n-tiles of the PV accumulator
// The 3 bits of x (0..7) reversed: the QK column -> token order (see the QK loop).
__device__ __forceinline__ int brev3(int x) { return ((x & 1) << 2) | (x & 2) | (x >> 2); }

// ---------------------------------------------------------------------------
// Value-dim column mapping per format: output dim of (n-tile j, column n) in
// the warp's 64-dim slice. C fragments hold columns 2c and 2c+1.
// ---------------------------------------------------------------------------
// Stores one row-half (half 0: row g, half 1: row g+8) of the PV accumulator
// to 512 contiguous values at `dst` (bf16 when OutT == __nv_bfloat16, else
// fp32), multiplied by `scale`. Which dims a thread holds (c = lane % 4):
//   kPairedDims false: accumulator j covers dims 64w + 8j .. (B column n =
//     dim 8j + n), so columns 2c, 2c+1 are dims 64w + 8j + 2c, +1;
//   kPairedDims true (fp8 V read raw, see the PV step): accumulators 2q and
//     2q+1 cover the even and odd dims of the slab 64w + 16q (B column n =
//     dim 2n, 2n+1), so columns 2c, 2c+1 of the two are the four contiguous
//     dims 64w + 16q + 4c ...
// kPairOrder (MXFP4): the decoded tile holds each 8-dim
// group whose dims are not a ninth-k-step group (dim % 144 < 128) in pair
// order (position 2p = dim p, 2p + 1 = dim p + 4), so columns 2c, 2c+1 of such
// a group are dims c, c + 4 (regrouped by shuffles before the store).
// `valid`: whether this thread's row exists (a head < num_heads). Every lane
// of the warp must call this, valid or not: the pair-order regrouping below
// shuffles across the whole warp (a lane that skipped the call while another
// waited in __shfl_sync is undefined behaviour, and hangs at H = 1 MXFP4 once a
// CTA barrier follows the epilogue).
template <bool kPairedDims, typename OutT, bool kPairOrder = false>
__device__ __forceinline__ void store_row(const float (&o)[kVTiles][4], int half, float scale, OutT* dst, int warp,
                                          int c, bool valid) {
  const int r0 = 2 * half;
  if constexpr (kPairOrder) {
    // In a pair-order group thread c holds dims c and c + 4; four shuffles
    // among the group's 4 lanes give it dims 2c and 2c + 1 instead, so every
    // store covers whole 32-byte sectors (scalar stores of dims c and c + 4
    // half-fill each sector of the fp32 partials: measured slower at the
    // split-heavy shapes, docs/performance.md).
    const int lane_base = (threadIdx.x % 32) & ~3;
    const int src0 = (2 * c) & 3, src1 = (2 * c + 1) & 3;
#pragma unroll
    for (int j = 0; j < kVTiles; ++j) {
      const int base = kVDimsPerWarp * warp + 8 * j;
      const bool natural = base % (kKStepsPerWarp * 16) >= (kKStepsPerWarp - 1) * 16;  // warp-uniform
      float v0 = o[j][r0] * scale, v1 = o[j][r0 + 1] * scale;
      if (!natural) {
        const float x0 = __shfl_sync(0xffffffffu, v0, lane_base | src0);
        const float y0 = __shfl_sync(0xffffffffu, v1, lane_base | src0);
        const float x1 = __shfl_sync(0xffffffffu, v0, lane_base | src1);
        const float y1 = __shfl_sync(0xffffffffu, v1, lane_base | src1);
        v0 = c < 2 ? x0 : y0;
        v1 = c < 2 ? x1 : y1;
      }
      const int dim = base + 2 * c;
      if (!valid) continue;
      if constexpr (sizeof(OutT) == 2) {
        *reinterpret_cast<__nv_bfloat162*>(dst + dim) = __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(dst + dim) = make_float2(v0, v1);
      }
    }
  } else if constexpr (kPairedDims) {
    if (!valid) return;
#pragma unroll
    for (int q = 0; q < kVTiles / 2; ++q) {
      const int dim = kVDimsPerWarp * warp + 16 * q + 4 * c;
      const float v0 = o[2 * q][r0] * scale, v1 = o[2 * q + 1][r0] * scale;
      const float v2 = o[2 * q][r0 + 1] * scale, v3 = o[2 * q + 1][r0 + 1] * scale;
      if constexpr (sizeof(OutT) == 2) {
        uint2 packed;
        packed.x = bf16x2_bits(__floats2bfloat162_rn(v0, v1));
        packed.y = bf16x2_bits(__floats2bfloat162_rn(v2, v3));
        *reinterpret_cast<uint2*>(dst + dim) = packed;
      } else {
        *reinterpret_cast<float4*>(dst + dim) = make_float4(v0, v1, v2, v3);
      }
    }
  } else {
    if (!valid) return;
#pragma unroll
    for (int j = 0; j < kVTiles; ++j) {
      const int dim = kVDimsPerWarp * warp + 8 * j + 2 * c;
      const float v0 = o[j][r0] * scale, v1 = o[j][r0 + 1] * scale;
      if constexpr (sizeof(OutT) == 2) {
        *reinterpret_cast<__nv_bfloat162*>(dst + dim) = __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(dst + dim) = make_float2(v0, v1);
      }
    }
  }
}

// Whether the mma operands are fp16 rather than bf16. OCP e4m3 decodes to
// fp16 in one instruction (to bf16 it takes four), so the fp8 path runs the
// tensor cores in fp16: K and V are exact in fp16, P in [0, 1] is more precise
// in fp16 than in bf16, and Q is scaled by a power of two per CTA so that its
// largest element lands in [2^14, 2^15) (every element down to 2^-31 of the
// largest is exact in fp16, smaller ones keep fewer bits; the factor is
// removed from the scores in fp32).
template <KvFormat F>
constexpr bool kMmaF16 = F == KvFormat::kFp8E4M3FN;

// Whether QK accumulates its even and odd k-steps in separate chains (four
// chains of at most 5 mma per warp instead of two of 9, summed before the
// scores are stored). Measured on the H200 (docs/performance.md): MXFP4 gains
// at the mid shapes (its competition geomean by 1-2%); OCP fp8 loses ~3% at
// the large shapes and bf16 is unchanged (and would spill a register at
// sm_90a), so those two keep two chains.
template <KvFormat F>
constexpr bool kSplitQkChains = F == KvFormat::kMxfp4;

// Whether PV converts V from the raw fp8 stage itself (OCP e4m3: one cvt per
// two codes) rather than reading rows the QK warps decoded: the decoded
// tile's 36.5 KB of stores and 32 KB of reads per tile cost more than the
// conversions done twice (measured on the H200, ~12% faster at the largest
// competition shape; docs/performance.md).
template <KvFormat F>
constexpr bool kPvReadsRawFp8 = F == KvFormat::kFp8E4M3FN;

// Two fp8 codes (low byte -> low half) to the mma operand type, from the low
// (HalfSel 0) or high (HalfSel 1) 16 bits of `codes`.
template <KvFormat F, int HalfSel>
__device__ __forceinline__ uint32_t fp8x2_to_operand(uint32_t codes) {
  if constexpr (F == KvFormat::kFp8E4M3FNUZ) {
    return e4m3fnuz_x2_to_bf16x2(HalfSel ? codes >> 16 : codes);
  } else {
    return e4m3x2_to_f16x2<HalfSel>(codes);
  }
}

template <KvFormat F, int kStagesT = FormatTraits<F>::kStages>
__global__ void __launch_bounds__(kThreads, 2) mla_decode_split_kernel(const DecodeLaunch args) {
  using L = SmemLayout<F, kStagesT>;
  constexpr int kStages = L::kStages;
  constexpr bool kMx = F == KvFormat::kMxfp4;
  constexpr bool kFp8 = F == KvFormat::kFp8E4M3FN || F == KvFormat::kFp8E4M3FNUZ;
  constexpr bool kF16 = kMmaF16<F>;
  // OCP fp8: PV reads V straight from the raw stage and converts it in
  // registers (kPvRaw); e4m3fnuz and MXFP4: the QK warps store the rows they
  // decoded and PV reads those (kDecode). See the PV step.
  constexpr bool kPvRaw = kPvReadsRawFp8<F>;
  constexpr bool kDecode = F != KvFormat::kBf16 && !kPvRaw;
  constexpr bool kSplitQk = kSplitQkChains<F>;

  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* smem_kv = smem + L::kKvOffset;
  uint8_t* smem_dec = smem + L::kDecOffset;
  uint32_t* smem_scale = reinterpret_cast<uint32_t*>(smem + L::kScaleOffset);
  int32_t* smem_flag = reinterpret_cast<int32_t*>(smem + L::kFlagOffset);
  float* smem_red = reinterpret_cast<float*>(smem + L::kRedOffset);
  __nv_bfloat16* smem_p = reinterpret_cast<__nv_bfloat16*>(smem + L::kPOffset);
  float* smem_alpha = reinterpret_cast<float*>(smem + L::kStatOffset);
  float* smem_m = smem_alpha + kTileRows;
  float* smem_l = smem_m + kTileRows;

  const MlaDecodeParams& p = args.p;
  TraceProbe<6> trace;  // -DMLA_DECODE_TRACE only (trace.cuh)
  trace.start((blockIdx.x == 0 || blockIdx.x == gridDim.x - 1) &&  // the corner CTAs
              (blockIdx.y == 0 || blockIdx.y == gridDim.y - 1));
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int dg = warp % kDimGroups;  // QK dim group
  const int tg = warp / kDimGroups;  // QK token group

  // ---- Q: the global loads go out first --------------------------------------
  // They depend on blockIdx only (the token and heads), so they are issued
  // before the row lookup and the KV prologue: issued after those, they queue
  // behind every CTA's burst of KV copies and Q arrives last (timeline probes,
  // trace.cuh: microseconds after the lookup at B = 4..64).
  // The registers are arranged into mma fragments after the prologue.
  // K-step kk < 8 of this warp pairs with kk ^ 1: one 16-byte (bf16),
  // 8-byte (fp8) or 4-byte (MXFP4) shared-memory load gives thread c the dims
  // base + 8c .. base + 8c + 7 (base = 144 dg + 32 (kk / 2)) for both k-steps,
  // and Q is permuted to match:
  //   bf16 / fp8: k-step 2m takes dims 8c + {0,1 | 2,3}, k-step 2m+1 8c + {4,5 | 6,7};
  //   MXFP4 (E2M1 pairs p, p+4 of one 32-bit word): k-step 2m takes
  //   8c + {0,4 | 1,5}, k-step 2m+1 8c + {2,6 | 3,7}.
  // The ninth k-step (dims 144 dg + 128 ..) uses 4 dims per thread: 4c + {0,1 | 2,3}
  // (MXFP4: 4c + {0,2 | 1,3}). ("a | b": the a0/a1 pair | the a2/a3 pair.)
  // Rows of heads past num_heads read as zero; t < total_q always (grid), so
  // the loads are in bounds even for an orphan token, whose rows become NaN.
  uint4 q_raw_a[kKStepsPerWarp / 2], q_raw_b[kKStepsPerWarp / 2];  // heads g, g + 8: dims 32m + 8c ..
  uint2 q_tail_a, q_tail_b;                                          // the ninth k-step
  {
    const CtaCoords cta = cta_coords(args);  // the token and heads locate_work reports below
    const int hA = cta.h0 + g, hB = hA + 8;
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q) + static_cast<int64_t>(cta.t) * p.q_stride_token;
    const __nv_bfloat16* qa = q + static_cast<int64_t>(hA) * p.q_stride_head;
    const __nv_bfloat16* qb = q + static_cast<int64_t>(hB) * p.q_stride_head;
    const bool va = hA < p.num_heads, vb = hB < p.num_heads;
#pragma unroll
    for (int m = 0; m < kKStepsPerWarp / 2; ++m) {
      const int d = kKStepsPerWarp * 16 * dg + 32 * m + 8 * c;
      q_raw_a[m] = va ? *reinterpret_cast<const uint4*>(qa + d) : make_uint4(0, 0, 0, 0);
      q_raw_b[m] = vb ? *reinterpret_cast<const uint4*>(qb + d) : make_uint4(0, 0, 0, 0);
    }
    const int d = 16 * (kKStepsPerWarp * dg + kKStepsPerWarp - 1) + 4 * c;
    q_tail_a = va ? *reinterpret_cast<const uint2*>(qa + d) : make_uint2(0, 0);
    q_tail_b = vb ? *reinterpret_cast<const uint2*>(qb + d) : make_uint2(0, 0);
  }

  // ---- which query token, heads and KV range ------------------------------
  const WorkItem work = locate_work<kBlockN>(args);
  const int t = work.t, h0 = work.h0, split = work.split, b = work.b;
  const bool orphan = work.orphan;
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kBlockN);

  float scale_log2 = p.sm_scale * 1.4426950408889634f;  // log2(e)
  if constexpr (kFp8) {
    // fp8 codes enter the mma unscaled; the per-tensor scale multiplies S and O.
    scale_log2 *= __ldg(p.fp8_scale);
  }

  // ---- stage loader --------------------------------------------------------
  const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
  // Lane n of every warp resolves the cache row of token n of the tile; rows
  // are exchanged with shuffles. -2: past the range (zero-fill), -1: bad index.
  // The contiguous layout (the competition's) needs no per-tile lookup: row =
  // kv_indptr[b] + j, with kv_indptr[b] read once here. (locate_work has read
  // it already, for the length; handing it over in WorkItem changes the fp8
  // kernel's register allocation, measured ~3% slower at the largest shape.)
  const bool contiguous = p.layout == KvLayout::kIndptr;
  const int64_t contiguous_base = (contiguous && !orphan) ? static_cast<int64_t>(__ldg(p.kv_indptr + b)) : 0;
  auto tile_row = [&](int tile_idx) -> int {
    const int j = kv_begin + tile_idx * kBlockN + lane;
    if (j >= kv_end) return -2;
    const int64_t r = contiguous ? contiguous_base + j : kv_row(p, b, j);
    return (r < 0 || r >= p.num_cache_rows) ? -1 : static_cast<int>(r);
  };
  // MXFP4: thread tid stages the E8M0 bytes of token tid / 8, blocks
  // tid % 8 + 8m, for the tile being prefetched.
  constexpr int kScalesPerThread = 3;
  uint32_t mx_raw[kScalesPerThread];
  auto load_scales = [&](int my_row) {
    if constexpr (kMx) {
      const int n = tid >> 3;
      const int r = __shfl_sync(0xffffffffu, my_row, n);
#pragma unroll
      for (int m = 0; m < kScalesPerThread; ++m) {
        const int blk = (tid & 7) + 8 * m;
        mx_raw[m] = (r >= 0 && blk < kMxBlocksPerRow)
                        ? __ldg(p.mx_scale + static_cast<int64_t>(r) * p.mx_scale_stride_row +
                                static_cast<int64_t>(blk) * p.mx_scale_stride_col)
                        : 0u;
      }
    }
  };
  auto store_scales = [&](int slot) {
    if constexpr (kMx) {
      const int n = tid >> 3;
      uint32_t* dst = smem_scale + (slot * kBlockN + n) * kScaleStride;
#pragma unroll
      for (int m = 0; m < kScalesPerThread; ++m) {
        const int blk = (tid & 7) + 8 * m;
        if (blk < kMxBlocksPerRow) dst[blk] = e8m0_to_bf16_scale_pair(mx_raw[m]);
      }
    }
  };
  auto issue_tile = [&](int tile_idx, int slot) {
    const int my_row = tile_row(tile_idx);
    // Thread tid copies token tid / 8: its 16-byte chunks tid % 8 + 8m, so the
    // 8 threads of a token read 128 contiguous bytes per step.
    constexpr int kChunks = L::kRowBytes / 16;
    constexpr int kThreadsPerToken = kThreads / kBlockN;
    static_assert(kThreadsPerToken == 8, "loader layout assumes 8 threads per token");
    const int n = tid / kThreadsPerToken;
    const int sub = tid % kThreadsPerToken;
    const int r = __shfl_sync(0xffffffffu, my_row, n);
    // One base address per thread; the chunks are constant offsets from it.
    const uint8_t* src = kv_base + static_cast<int64_t>(r >= 0 ? r : 0) * p.kv_row_stride_bytes + 16 * sub;
    const uint32_t dst = smem_u32(smem_kv + slot * L::kStageBytes + n * L::kRowSmem + 16 * sub);
    const int src_bytes = r >= 0 ? 16 : 0;
#pragma unroll
    for (int m = 0; m < (kChunks + kThreadsPerToken - 1) / kThreadsPerToken; ++m) {
      if (kChunks % kThreadsPerToken == 0 || sub + kThreadsPerToken * m < kChunks) {
        cp_async_16(dst + 16 * kThreadsPerToken * m, src + 16 * kThreadsPerToken * m, src_bytes);
      }
    }
    const uint32_t bad_rows = __ballot_sync(0xffffffffu, my_row == -1);  // same in every warp
    if (tid == 0) smem_flag[slot] = static_cast<int32_t>(bad_rows);
    load_scales(my_row);
  };

  // ---- prologue ------------------------------------------------------------
  // Tiles 0 .. kEarlyStages - 1 are issued here, the rest of the prologue
  // after Q is arranged (below). OCP fp8 issues tile 0 alone first: with all
  // of its prologue tiles at once, every CTA's first tile lands behind the
  // whole burst (up to 19 MB over the GPU) while its warps sit issuing
  // copies (measured on the H200: ~7% faster at the small shapes,
  // docs/performance.md). bf16 does the same (its 2-stage ring has one
  // prologue tile anyway; the 4-stage ring was measured this way). MXFP4
  // does not gain, so its tiles and scales are staged together.
  constexpr int kEarlyStages = (kPvRaw || (F == KvFormat::kBf16)) ? 1 : kStages - 1;
  static_assert(!kMx || kEarlyStages == kStages - 1, "the MXFP4 scales are staged with the early tiles");
#pragma unroll
  for (int s = 0; s < kEarlyStages; ++s) {
    if (s < n_tiles) {
      issue_tile(s, s);
      store_scales(s);
    }
    cp_async_commit();
  }
  trace.mark();  // 1: the row lookup's round trip is done (the early copies needed its result)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Let the combine kernel (a programmatic dependent) start launching; it
  // waits for this grid's completion before reading any partial.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif

  // ---- Q fragments (registers, whole kernel), from the loads issued above ----
  uint32_t qf[kKStepsPerWarp][4];
#pragma unroll
  for (int m = 0; m < kKStepsPerWarp / 2; ++m) {
    const uint4 x = q_raw_a[m], y = q_raw_b[m];
    if constexpr (kMx) {
      qf[2 * m][0] = prmt(x.x, x.z, 0x5410);
      qf[2 * m][1] = prmt(y.x, y.z, 0x5410);
      qf[2 * m][2] = prmt(x.x, x.z, 0x7632);
      qf[2 * m][3] = prmt(y.x, y.z, 0x7632);
      qf[2 * m + 1][0] = prmt(x.y, x.w, 0x5410);
      qf[2 * m + 1][1] = prmt(y.y, y.w, 0x5410);
      qf[2 * m + 1][2] = prmt(x.y, x.w, 0x7632);
      qf[2 * m + 1][3] = prmt(y.y, y.w, 0x7632);
    } else {
      qf[2 * m][0] = x.x;
      qf[2 * m][1] = y.x;
      qf[2 * m][2] = x.y;
      qf[2 * m][3] = y.y;
      qf[2 * m + 1][0] = x.z;
      qf[2 * m + 1][1] = y.z;
      qf[2 * m + 1][2] = x.w;
      qf[2 * m + 1][3] = y.w;
    }
  }
  {
    constexpr int kk = kKStepsPerWarp - 1;
    const uint2 x = q_tail_a, y = q_tail_b;
    if constexpr (kMx) {
      qf[kk][0] = prmt(x.x, x.y, 0x5410);
      qf[kk][1] = prmt(y.x, y.y, 0x5410);
      qf[kk][2] = prmt(x.x, x.y, 0x7632);
      qf[kk][3] = prmt(y.x, y.y, 0x7632);
    } else {
      qf[kk][0] = x.x;
      qf[kk][1] = y.x;
      qf[kk][2] = x.y;
      qf[kk][3] = y.y;
    }
  }
  if constexpr (kF16) {
    // CTA-wide max |q| (bf16 bits compare as integers; inf/NaN excluded so a
    // NaN head poisons only its own rows), then q * 2^e in fp16.
    uint32_t amax = 0;
#pragma unroll
    for (int kk = 0; kk < kKStepsPerWarp; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) amax = bf16_finite_abs_max(qf[kk][r], amax);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    uint32_t* red = reinterpret_cast<uint32_t*>(smem_alpha);
    if (lane == 0) red[warp] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) amax = max(amax, red[w]);
    __syncthreads();  // red (smem_alpha) is reused by the softmax
    const int e = pow2_scale_exponent<141>(amax);  // max |q| * 2^e in [2^14, 2^15)
    const float factor = __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
    scale_log2 *= __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
#pragma unroll
    for (int kk = 0; kk < kKStepsPerWarp; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float lo = __uint_as_float(qf[kk][r] << 16) * factor;
        const float hi = __uint_as_float(qf[kk][r] & 0xFFFF0000u) * factor;
        const __half2 h = __floats2half2_rn(lo, hi);
        qf[kk][r] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
  }

#pragma unroll
  for (int s = kEarlyStages; s < kStages - 1; ++s) {
    if (s < n_tiles) issue_tile(s, s);
    cp_async_commit();
  }
  trace.mark();  // 2: Q in registers (and the prologue issued)
  float o[kVTiles][4];
#pragma unroll
  for (int j = 0; j < kVTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  // Online-softmax state of row (tid / 16): the running max, kept identically
  // by the row's 16 threads, and each thread's running sum over its own tokens.
  float m_run = -CUDART_INF_F;
  float l_run = 0.f;
  const int sm_row = tid >> 4;
  const int sm_col = (tid & 15) * 2;

  // Barriers per tile. Formats with a decoded tile (MXFP4, e4m3fnuz) or only
  // two stages (bf16) use three:
  //   (A) tile `it` landed and is visible; every warp finished PV(it - 1), so
  //       its stage slot and the decoded tile may be rewritten;
  //   (B) partial scores visible;  (C) P and alpha visible.
  // OCP fp8 (no decoded tile, five stages) folds (A) into the other two: the
  // next tile is issued after (B), when every warp is past PV(it - 1), into
  // that tile's slot, and each thread waits for its copies of tile it + 1
  // before (C), which then also publishes them. Nothing else crosses
  // iterations: QK(it + 1) rewrites the score buffer only after (C) (the
  // softmax of `it` is done), and softmax(it + 1) rewrites P and alpha only
  // after (B) of it + 1 (PV of `it` is done).
  constexpr bool kTwoBarriers = !kDecode && kStages >= 3;
  static_assert(!kTwoBarriers || !kMx, "the MXFP4 scale staging assumes barrier (A)");
  if constexpr (kTwoBarriers) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile 0 visible
    trace.mark();     // 3: tile 0 landed
  }
  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it % kStages;
    const int next = it + kStages - 1;
    if constexpr (!kTwoBarriers) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // (A)
      if (it == 0) trace.mark();  // 3: tile 0 landed
      if (next < n_tiles) issue_tile(next, next % kStages);
      cp_async_commit();
    }

    const uint8_t* stage = smem_kv + slot * L::kStageBytes;
    // MXFP4: the two bf16 scale factors of (token, block), see e2m1_pair_bits.
    const uint32_t* scl = smem_scale + slot * kBlockN * kScaleStride;
    auto scale_word = [&](int token, int block) -> uint32_t { return scl[token * kScaleStride + block]; };

    // ---- 1. partial S = Q K^T over this warp's 144 dims and 16 tokens -------
    // Two 8-token n-tiles (jj), walked k-step outer / n-tile inner so that
    // their two accumulation chains interleave (each mma waits only on the
    // previous one of its own chain).
    //
    // B column g of n-tile jj holds token 8j + brev3(g) (j = 2 tg + jj; g's 3
    // bits reversed: 0,4,2,6,1,5,3,7), not 8j + g, so that rows sharing a
    // shared-memory phase never share a bank:
    //   16-byte accesses (bf16 K loads, decoded-row stores; 8 threads = g 2i, 2i+1
    //   per phase): rows 4 apart, 4 x 1168 = 64 mod 128 bytes;
    //   8-byte fp8 K loads (16 threads = g 4i..4i+3): rows {0,4,2,6} (+1) x 592
    //   land 32 bytes apart mod 128; MXFP4 (4 bytes, 32 threads): 8 rows x 304
    //   cover 8 distinct 16-byte slots.
    // With natural order, rows 1 apart overlap (2-way conflicts). Score column
    // 2c is token brev3(2c), column 2c + 1 is brev3(2c + 1) = brev3(2c) + 4.
    float s_acc[2][4], s_acc_odd[2][4];
    int tok[2];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      tok[jj] = 8 * (2 * tg + jj) + brev3(g);
#pragma unroll
      for (int r = 0; r < 4; ++r) s_acc[jj][r] = s_acc_odd[jj][r] = 0.f;
    }
    // Paired k-steps 2m, 2m+1 (see the Q layout above).
#pragma unroll
    for (int m = 0; m < kKStepsPerWarp / 2; ++m) {
      const int d = kKStepsPerWarp * 16 * dg + 32 * m + 8 * c;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const uint8_t* row = stage + tok[jj] * L::kRowSmem;
        uint32_t b[4];  // k-step 2m: b[0], b[1]; k-step 2m+1: b[2], b[3]
        if constexpr (F == KvFormat::kBf16) {
          const uint4 v = *reinterpret_cast<const uint4*>(row + 2 * d);
          b[0] = v.x;
          b[1] = v.y;
          b[2] = v.z;
          b[3] = v.w;
        } else if constexpr (kFp8) {
          const uint2 v = *reinterpret_cast<const uint2*>(row + d);
          b[0] = fp8x2_to_operand<F, 0>(v.x);
          b[1] = fp8x2_to_operand<F, 1>(v.x);
          b[2] = fp8x2_to_operand<F, 0>(v.y);
          b[3] = fp8x2_to_operand<F, 1>(v.y);
        } else {
          const uint32_t w = *reinterpret_cast<const uint32_t*>(row + d / 2);
          const uint32_t s2 = scale_word(tok[jj], d / kMxBlock);
          b[0] = e2m1_pair_bits<0>(w, s2);  // dims (8c, 8c+4)
          b[1] = e2m1_pair_bits<1>(w, s2);  // dims (8c+1, 8c+5)
          b[2] = e2m1_pair_bits<2>(w, s2);  // dims (8c+2, 8c+6)
          b[3] = e2m1_pair_bits<3>(w, s2);  // dims (8c+3, 8c+7)
        }
        mma_m16n8k16<kF16>(s_acc[jj], qf[2 * m], b[0], b[1]);
        mma_m16n8k16<kF16>(kSplitQk ? s_acc_odd[jj] : s_acc[jj], qf[2 * m + 1], b[2], b[3]);
        if constexpr (kDecode) {
          // Dims d..d+7 of token tok[jj], for PV: natural order (e4m3fnuz),
          // or MXFP4's pair order (position 2p = dim p, 2p + 1 = dim p + 4),
          // which the epilogue undoes (store_row's kPairOrder).
          const uint4 nat = make_uint4(b[0], b[1], b[2], b[3]);
          *reinterpret_cast<uint4*>(smem_dec + tok[jj] * L::kDecRowSmem + 2 * d) = nat;
        }
      }
    }
    {
      // The ninth k-step: 4 dims per thread.
      constexpr int kk = kKStepsPerWarp - 1;
      const int d = 16 * (kKStepsPerWarp * dg + kk) + 4 * c;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const uint8_t* row = stage + tok[jj] * L::kRowSmem;
        uint32_t b0, b1;
        if constexpr (F == KvFormat::kBf16) {
          const uint2 v = *reinterpret_cast<const uint2*>(row + 2 * d);
          b0 = v.x;
          b1 = v.y;
        } else if constexpr (kFp8) {
          const uint32_t v = *reinterpret_cast<const uint32_t*>(row + d);
          b0 = fp8x2_to_operand<F, 0>(v);
          b1 = fp8x2_to_operand<F, 1>(v);
        } else {
          const uint32_t u = *reinterpret_cast<const uint16_t*>(row + d / 2);
          const uint32_t s2 = scale_word(tok[jj], d / kMxBlock);
          const uint32_t w = prmt(u, 0u, 0x4140);  // bytes [u0, 0, u1, 0]: codes at nibbles 0,1,4,5
          b0 = e2m1_pair_bits<0>(w, s2);  // dims (4c, 4c+2)
          b1 = e2m1_pair_bits<1>(w, s2);  // dims (4c+1, 4c+3)
        }
        mma_m16n8k16<kF16>(s_acc[jj], qf[kk], b0, b1);
        if constexpr (kDecode) {
          uint2 nat;
          if constexpr (kMx) {
            nat.x = prmt(b0, b1, 0x5410);
            nat.y = prmt(b0, b1, 0x7632);
          } else {
            nat.x = b0;
            nat.y = b1;
          }
          *reinterpret_cast<uint2*>(smem_dec + tok[jj] * L::kDecRowSmem + 2 * d) = nat;
        }
      }
    }
    {
      float* red = smem_red + dg * kTileRows * kRedStride;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        if constexpr (kSplitQk) {
#pragma unroll
          for (int r = 0; r < 4; ++r) s_acc[jj][r] += s_acc_odd[jj][r];
        }
        const int col = 8 * (2 * tg + jj) + brev3(2 * c);  // tokens col, col + 4 (QK column order)
        red[g * kRedStride + col] = s_acc[jj][0];
        red[g * kRedStride + col + 4] = s_acc[jj][1];
        red[(g + 8) * kRedStride + col] = s_acc[jj][2];
        red[(g + 8) * kRedStride + col + 4] = s_acc[jj][3];
      }
    }
    if (next < n_tiles) store_scales(next % kStages);
    __syncthreads();  // (B) partial scores visible
    if constexpr (kTwoBarriers) {
      if (next < n_tiles) issue_tile(next, next % kStages);  // the slot of tile it - 1
      cp_async_commit();
    }

    // ---- 2. online softmax: 16 threads per row, 2 tokens each --------------
    {
      float sv[2] = {0.f, 0.f};
#pragma unroll
      for (int w = 0; w < kDimGroups; ++w) {
        const float2 x = *reinterpret_cast<const float2*>(smem_red + (w * kTileRows + sm_row) * kRedStride + sm_col);
        sv[0] += x.x;
        sv[1] += x.y;
      }
      const uint32_t bad_rows = static_cast<uint32_t>(smem_flag[slot]);
      const int pos0 = kv_begin + it * kBlockN + sm_col;
      float tile_max = -CUDART_INF_F;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sv[e] *= scale_log2;
        if (pos0 + e >= kv_end) sv[e] = -CUDART_INF_F;
        else if ((bad_rows >> (sm_col + e)) & 1u) sv[e] = CUDART_NAN_F;
        tile_max = fmaxf(tile_max, sv[e]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 8));
      const float m_new = fmaxf(m_run, tile_max);
      const bool none = m_new == -CUDART_INF_F;
      const float alpha = none ? 1.f : exp2f(m_run - m_new);
      float pv[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // exp2(-inf) = 0 for masked keys; a NaN score (bad index) stays NaN even
        // when it is the only key the row sees in this split.
        pv[e] = exp2f(sv[e] - (none ? 0.f : m_new));
      }
      // Each thread keeps the running sum of its own two tokens per tile; the
      // row's 16 partial sums are added once, after the loop.
      l_run = l_run * alpha + (pv[0] + pv[1]);
      m_run = m_new;
      if constexpr (kF16) {
        *reinterpret_cast<__half2*>(smem_p + sm_row * kPStride + sm_col) = __floats2half2_rn(pv[0], pv[1]);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(smem_p + sm_row * kPStride + sm_col) = __floats2bfloat162_rn(pv[0], pv[1]);
      }
      if ((tid & 15) == 0) smem_alpha[sm_row] = alpha;
    }
    if constexpr (kTwoBarriers) cp_async_wait<kStages - 2>();  // this thread's copies of tile it + 1
    __syncthreads();  // (C) P and alpha visible (two-barrier loop: and tile it + 1)

    // ---- 3. O = alpha * O + P V over this warp's 64 value dims -------------
    {
      // The A fragment (16 rows x 16 tokens from token tb) of P.
      auto load_p_fragment = [&](int tb, uint32_t(&a)[4]) {
        a[0] = *reinterpret_cast<const uint32_t*>(smem_p + g * kPStride + tb + 2 * c);
        a[1] = *reinterpret_cast<const uint32_t*>(smem_p + (g + 8) * kPStride + tb + 2 * c);
        a[2] = *reinterpret_cast<const uint32_t*>(smem_p + g * kPStride + tb + 2 * c + 8);
        a[3] = *reinterpret_cast<const uint32_t*>(smem_p + (g + 8) * kPStride + tb + 2 * c + 8);
      };
      const float alpha_a = smem_alpha[g], alpha_b = smem_alpha[g + 8];
      // Once the running max settles alpha is 1 for every row: skip the rescale.
      if (__any_sync(0xffffffffu, alpha_a != 1.f || alpha_b != 1.f)) {
#pragma unroll
        for (int j = 0; j < kVTiles; ++j) {
          o[j][0] *= alpha_a;
          o[j][1] *= alpha_a;
          o[j][2] *= alpha_b;
          o[j][3] *= alpha_b;
        }
      }
      if constexpr (kPvRaw) {
        // P fragments of both 16-token k-steps.
        uint32_t a[2][4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) load_p_fragment(16 * kk, a[kk]);
        // ldmatrix.trans on the raw rows (row = token, 16-bit column n = dims
        // 2n, 2n+1 of a 16-dim slab; lane l addresses token l = row l % 8 of
        // matrix l / 8) gives lane (g, c) of matrix m the bytes [token 8m+2c:
        // dims 2g, 2g+1 | token 8m+2c+1: dims 2g, 2g+1]. prmt 0x3120 regroups
        // them by dim: low half = dim 2g of tokens 8m+2c, +1 (the B fragment of
        // the even-dim mma), high half = dim 2g+1 (odd-dim mma).
        const uint8_t* vrow = stage + lane * L::kRowSmem + kVDimsPerWarp * warp;
#pragma unroll
        for (int q = 0; q < kVDimsPerWarp / 16; ++q) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, smem_u32(vrow + 16 * q));
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const uint32_t x0 = prmt(r[2 * kk], 0u, 0x3120), x1 = prmt(r[2 * kk + 1], 0u, 0x3120);
            mma_m16n8k16<kF16>(o[2 * q], a[kk], e4m3x2_to_f16x2<0>(x0), e4m3x2_to_f16x2<0>(x1));
            mma_m16n8k16<kF16>(o[2 * q + 1], a[kk], e4m3x2_to_f16x2<1>(x0), e4m3x2_to_f16x2<1>(x1));
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          const int tb = 16 * kk;
          uint32_t a[4];
          load_p_fragment(tb, a);
          // V rows: the raw bf16 stage, or the tile the QK warps decoded.
          const uint8_t* vsrc = kDecode ? smem_dec : stage;
          static_assert(L::kDecRowSmem == SmemLayout<KvFormat::kBf16>::kRowSmem, "V row strides must match");
          const int mi = lane >> 3, ri = lane & 7;
          const int tok = tb + ri + (mi & 1) * 8;
#pragma unroll
          for (int q = 0; q < kVDimsPerWarp / 16; ++q) {
            const int dim = kVDimsPerWarp * warp + 16 * q + (mi >> 1) * 8;
            uint32_t r[4];
            ldmatrix_x4_trans(r, smem_u32(vsrc + tok * L::kDecRowSmem + 2 * dim));
            mma_m16n8k16<kF16>(o[2 * q], a, r[0], r[1]);
            mma_m16n8k16<kF16>(o[2 * q + 1], a, r[2], r[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  trace.mark();  // 4: tile loop done

  // ---- epilogue --------------------------------------------------------------
  // The row's sum of the 16 per-thread partial sums (a row's 16 threads are
  // lanes 16 apart from the other row's, so xor offsets < 16 stay in the row).
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 4);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 8);
  if ((tid & 15) == 0) {
    smem_m[sm_row] = m_run;
    smem_l[sm_row] = l_run;
  }
  __syncthreads();
  float out_scale = 1.f;
  if constexpr (kFp8) out_scale = __ldg(p.fp8_scale);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    const int h = h0 + r;
    const bool valid = h < p.num_heads;  // no `continue`: store_row must be called by every lane
    const float l = smem_l[r];
    const float m = smem_m[r];
    float inv = l > 0.f ? out_scale / l : 0.f;
    float lse = l > 0.f ? (m + __log2f(l)) * 0.6931471805599453f : -CUDART_INF_F;
    if (isnan(l) || orphan) {
      inv = CUDART_NAN_F;
      lse = CUDART_NAN_F;
    }
    if (args.num_splits == 1) {
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                           static_cast<int64_t>(h) * p.out_stride_head;
      store_row<kPvRaw, __nv_bfloat16, kMx>(o, half, inv, dst, warp, c, valid);
      if (valid && warp == 0 && c == 0) p.lse[static_cast<int64_t>(t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] = lse;
    } else {
      const int64_t row = static_cast<int64_t>(t) * p.num_heads + h;
      const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
      float* dst = args.partial_out + (static_cast<int64_t>(split) * rows + row) * kHeadDimV;
      store_row<kPvRaw, float, kMx>(o, half, inv, dst, warp, c, valid);
      if (valid && warp == 0 && c == 0) args.partial_lse[static_cast<int64_t>(split) * rows + row] = lse;
    }
  }
  trace.mark();  // 5: outputs stored
  trace.print("split");
}

// Launches mla_decode_split_kernel<F, kStagesT> on `grid`, raising its
// dynamic shared-memory limit first (once per device).
template <KvFormat F, int kStagesT>
cudaError_t launch_ring(const DecodeLaunch& args, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = SmemLayout<F, kStagesT>::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(mla_decode_split_kernel<F, kStagesT>, grid, kThreads, kSmem, configured_devices,
                                  stream, args);
}

// Launches the split kernel of format F with the ring depth the plan chose
// (Plan::stages: the format's default or its alternative, mma_sync_layout.h);
// explicitly instantiated per format in mma_sync_<format>.cu so the formats
// compile in parallel.
template <KvFormat F>
cudaError_t launch_mma_sync(const DecodeLaunch& args, cudaStream_t stream) {
  const dim3 grid = split_grid(args);
  using T = FormatTraits<F>;
  if (args.stages == T::kStages) return launch_ring<F, T::kStages>(args, grid, stream);
  if (args.stages == T::kAltStages) return launch_ring<F, T::kAltStages>(args, grid, stream);
  return cudaErrorInvalidValue;  // not a depth built for F: a planning bug, reported by the dispatcher
}

}  // namespace cuda
}  // namespace mla_decode

// Split-KV MLA decode for an MXFP4 cache (indptr layout) on Hopper (sm_90a)
// with few heads (H < 64, head groups of 16): the register-V kernel's MXFP4
// form. K and V are both decoded from TMA-landed E2M1 codes straight into
// wgmma A fragments in registers; no decoded tile exists in shared memory.
// The plan runs it for MXFP4 whose rows TMA can address (plan/plan.cpp).
//
// Why (docs/kernels.md): the narrow kernel's MXFP4 form decodes each tile
// once, in producer warpgroups, into a bf16 stage that QK and PV then read:
// ~230 KB of shared-memory traffic per 64-key tile (the decoded tile stored,
// K and V^T read back), with the L1 / shared-memory pipe the busiest unit and
// the producers' chain setting the period at ~3 times the tile's DRAM time.
// Here a tile's codes arrive by TMA (19 KB of them, 24 KB of stage with the
// third box's zero fill) and each consumer decodes the part it multiplies:
// the scorer its K fragments, the value warpgroups their V^T fragments. The
// latent dims are decoded twice per CTA (once per product) but by all twelve
// warps, and shared memory carries ~60 KB per tile.
//
//   S^T (64 keys x 16 heads) = K Q^T: 36 x wgmma m64n16k16 bf16, A = K from
//       registers (ldmatrix of the codes, decoded with the block scales),
//       B = Q (bf16, shared, K-major, its dims permuted to the fragments').
//   O^T (dims x 16 heads) += V^T P^T: per value warpgroup 4 M blocks of 64
//       dims x 4 k-steps of wgmma m64n16k16 bf16, A = V^T from registers
//       (ldmatrix .trans of the codes, decoded), B = P^T (bf16, shared).
//
// Grid and outputs: as every split kernel (launch_contract.h), head groups of
// 16: x = query token * head_groups + head group, y = KV split; one split
// writes bf16 out and lse, several write fp32 partials for combine_kernel.
//
// Block: 384 threads, one CTA per SM (shared memory), no setmaxnreg (ptxas's
// 168 registers per thread suit every role).
//   wg 0 (scorer): Q (permuted), QK, the online softmax with lazy rescaling
//       (the narrow kernels' shared pieces), P^T (bf16) into one of two P
//       buffers with the rescale flag and per-head factors, the row sums and
//       the LSE.
//   wg 1, 2 (value warpgroups): dims 0..255 and 256..511 of O^T (32 fp32
//       registers per thread). Per tile: ldmatrix .trans of the codes, the
//       decode into the tile's A fragments (64 registers), then, once P^T is
//       stored, the optional rescale of O^T and 16 wgmma. They also stage the
//       block scales as bf16 factors, kScaleAhead tiles ahead (loaded into
//       registers at the top of tile t's iteration, stored at its end), and
//       thread 0 of wg 1 issues the TMA loads of the codes, kStages tiles
//       ahead.
//
// The decode: code n of a 32-bit word of 8 codes is nibble n. Pair P of the
// word (e2m1_pair_unscaled_bits) is the bf16x2 (code P, code P + 4), each
// |code| 2^-126 with the code's sign; two bf16 multiplies by the block's
// factors f1 = 2^floor((E - 1) / 2), f2 = 2^ceil((E - 1) / 2) (both normal
// bf16 for every E; E = 255, the NaN block, gives f1 = NaN) scale it by
// 2^(E - 127) exactly.
//
// K fragments (scorer warp w, lane (g, c), keys 16 w + g and + 8): ldmatrix
// of chunk j (16 code bytes, dims 32 j .., one MX block) gives the lane the
// codes 8c .. 8c + 7 of the key, i.e. dims 32 j + 8 c + n. Pairs 2v and 2v + 1
// of that word are a0 (k 2c, 2c + 1) and a2 (k 2c + 8, 2c + 9) of k-step
// 2 j + v. So logical dim 32 j + 16 v + 8 h + 2 c + e of QK is cache dim
// 32 j + 8 c + 2 v + h + 4 e, and Q is stored in that logical order (the dot
// product does not depend on the order of its terms).
//
// V^T fragments (value warpgroup vw, warp w, M blocks 2 hb + ab of chunk
// ch = 8 vw + 4 hb + w): ldmatrix .trans of keys 8 m .. 8 m + 7 x chunk ch
// gives lane (g, c) the codes of dims 32 ch + 4 g .. + 3 for keys 8 m + 2 c
// (low half) and 8 m + 2 c + 1 (high half), so pair P is (key 8m + 2c, key
// 8m + 2c + 1) at dim 32 ch + 4 g + P: the A element pair of row g (P = 0, 2)
// or g + 8 (P = 1, 3) of M block 2 hb + P / 2, keys 16 kk + 8 (m % 2) + 2 c
// of k-step kk = m / 2. O^T's row 16 w + g + 8 r of M block 2 hb + ab is
// therefore dim 32 ch + 4 g + 2 ab + r, which the epilogue writes back.
//
// Shared memory (Smem below; operand regions 1024-byte aligned):
//   Q         16 heads x 576 bf16 in the logical order, 9 column blocks of
//             16 rows (2 KB each)
//   codes     kStages x 3 boxes of 64 keys x 128 code bytes (TMA, 128-byte
//             swizzle; bytes 288..383 of the third box and rows past the
//             cache arrive as zeros)
//   factors   kScaleStages x 64 keys x 20 words: (f1 | f2 << 16) of (key,
//             block)
//   P^T       2 buffers of 16 heads x 64 keys bf16; per buffer the rescale
//             flag and the 16 heads' factors
//   the per-warp maxima exchange [2][4][16], the per-warp sums [4][16], the
//   heads' output factors [16], mbarriers.
//
// Synchronisation (mbarriers; named barriers only within wg 0; an arrival by
// lane 0 of a warp stands for the whole warp's reads, after a __syncwarp or
// the wgmma.wait_group that completes the warp's reads):
//   code_full[s]   TMA bytes + the issuing thread's arrival.
//   scale_full[s]  the 256 value threads: the factors of the scale stage's
//                  tile stored.
//   code_empty[s]  the 4 scorer warps (QK of the tile done, factors read) and
//                  the 8 value warps (ldmatrix and factor reads done): 12
//                  arrivals; then wg 1's thread 0 refills the codes with tile
//                  t + kStages, and at the end of their iteration t the value
//                  threads store the factors of tile t + kScaleAhead into the
//                  scale stage that tile t - 1 used (its readers are done
//                  once tile t's are).
//   p_full[b]      the 128 scorer threads (P^T, flag and factors of tile t
//                  stored and fenced).
//   p_empty[b]     the 256 value threads (PV of tile t complete).
//   epilogue       the 128 scorer threads (the heads' output factors stored).
#pragma once

#include "kernels/sm90/narrow_kernel.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {
namespace narrow_mx {

using narrow::kColBlocks;
using narrow::kLazyLog2;
using narrow::kQBlockBytes;
using narrow::kRows;
using narrow::kSwizzleGroupBytes;
using narrow::kTileTokens;
using narrow::opaque;

constexpr int kThreads = 384;
constexpr int kBoxBytes = kTileTokens * 128;                     // 8192: 64 keys x 128 code bytes
constexpr int kBoxes = 3;                                        // code bytes 0..383 (288.. zero-filled)
constexpr int kCodeStageBytes = kBoxes * kBoxBytes;              // 24576: one TMA transaction
// Code stages in flight: each holds 19.6 KB of a tile's cache bytes.
constexpr int kStages = 6;
constexpr int kFactorRowWords = 20;                              // 18 blocks, padded (16-byte loads)
constexpr int kFactorStageBytes = kTileTokens * kFactorRowWords * 4;  // 5120
// The factors of tile t + kScaleAhead are stored at the end of tile t's
// iteration, into the scale stage of tile t - 1.
constexpr int kScaleAhead = 3;
constexpr int kScaleStages = kScaleAhead + 1;
constexpr int kValueBlocks = kHeadDimV / 2 / 64;                 // 4 M blocks of 64 dims per value warpgroup
constexpr int kPvSteps = kTileTokens / 16;                       // 4 k-steps of 16 keys
constexpr int kPBufs = 2;
constexpr int kValueThreads = 256;
// The scorer decodes QK's A fragments in groups of 4 chunks (8 k-steps, 32
// registers), two groups' registers in flight: a wgmma reads its A registers
// asynchronously, so a set is rewritten only after the group that read it
// is complete.
constexpr int kQkGroupChunks = 4;
constexpr int kQkGroups = (kMxBlocksPerRow + kQkGroupChunks - 1) / kQkGroupChunks;  // 5 (the last: 2 chunks)
// (key, block) factor pairs a value thread stages per tile.
constexpr int kFactorItems = kTileTokens * kMxBlocksPerRow;                      // 1152
constexpr int kFactorsPerThread = (kFactorItems + kValueThreads - 1) / kValueThreads;  // 5

enum NamedBarrier : int {
  kBarQ = 1,    // wg 0: Q stored
  kBarMax = 2,  // wg 0: the rescale vote; the per-warp maxima exchanged
  kBarSum = 3,  // wg 0: the per-warp sums exchanged (epilogue)
};

struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kCodes = kQ + kColBlocks * kQBlockBytes;  // 18432
  static constexpr int kFactors = kCodes + kStages * kCodeStageBytes;
  static constexpr int kPt = kFactors + kScaleStages * kFactorStageBytes;
  static constexpr int kAlpha = kPt + kPBufs * kQBlockBytes;    // [kPBufs][16] fp32: rescale factors
  static constexpr int kRescale = kAlpha + kPBufs * kRows * 4;  // [kPBufs] u32: rescale flag
  static constexpr int kMaxX = kRescale + 16;                   // [2 tiles][4 warps][16] fp32
  static constexpr int kSumX = kMaxX + 2 * 4 * kRows * 4;       // [4 warps][16] fp32
  static constexpr int kOutScale = kSumX + 4 * kRows * 4;       // [16] fp32: 1 / l
  static constexpr int kBars = kOutScale + kRows * 4;
  static constexpr int kBarCodeFull = 0;                        // + stage
  static constexpr int kBarCodeEmpty = kStages;                 // + stage
  static constexpr int kBarScaleFull = 2 * kStages;             // + scale stage
  static constexpr int kBarPFull = kBarScaleFull + kScaleStages;  // + buffer
  static constexpr int kBarPEmpty = kBarPFull + kPBufs;           // + buffer
  static constexpr int kBarEpilogue = kBarPEmpty + kPBufs;
  static constexpr int kBarCount = kBarEpilogue + 1;
  static constexpr int kTotal = kBars + kBarCount * 8;
};
static_assert(Smem::kCodes % 1024 == 0 && Smem::kPt % 1024 == 0 && kQBlockBytes % 1024 == 0,
              "swizzle atoms are 1024-byte aligned");
static_assert(Smem::kFactors % 16 == 0 && kFactorStageBytes % 16 == 0, "16-byte factor loads");
static_assert(Smem::kBars % 8 == 0, "mbarrier alignment");
constexpr int kCodeEmptyArrivals = 4 + 8;  // scorer warps + value warps

// The two bf16 factors of block scale byte E, as one word f1 | f2 << 16:
// f1 = 2^floor((E - 1) / 2), f2 = 2^ceil((E - 1) / 2) (biased exponents
// floor((E + 253) / 2) and floor((E + 254) / 2), both in [126, 254]); the NaN
// block (E = 255) gets f1 = NaN.
__device__ __forceinline__ uint32_t e8m0_factor_word(uint32_t e) {
  const uint32_t f1 = e == 0xFFu ? 0x7FC0u : ((e + 253u) >> 1) << 7;
  const uint32_t f2 = ((e + 254u) >> 1) << 7;
  return f1 | (f2 << 16);
}

// Pair P of 8 codes times the factor pairs fa (f1 of the low and of the high
// element) and fb (their f2): exact, see the top.
template <int P>
__device__ __forceinline__ uint32_t mx_pair(uint32_t w, uint32_t fa, uint32_t fb) {
  const __nv_bfloat162 y = __hmul2(bits_bf16x2(e2m1_pair_unscaled_bits<P>(w)), bits_bf16x2(fa));
  return bf16x2_bits(__hmul2(y, bits_bf16x2(fb)));
}

// Q of this CTA's 16 heads into the logical order of the K fragments (see the
// top), bf16, 9 column blocks of 16 rows x 64 logical dims, 128-byte
// swizzled (B of QK: K-major). Thread tid (0..127) loads head tid / 8, cache
// chunks q = tid % 8 + 8m (dims 8q .. 8q + 7, m = 0..8); heads past H (and
// every head of an orphan token) are zero. The caller fences and syncs.
__device__ __forceinline__ void store_q_permuted(const MlaDecodeParams& p, const WorkItem& work, int tid,
                                                 uint32_t q_smem) {
  const int row = tid >> 3, c8 = tid & 7;
  const int head = work.h0 + row;
  const bool valid = !work.orphan && head < p.num_heads;
  const uint4* src = reinterpret_cast<const uint4*>(
      static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(work.t) * p.q_stride_token +
      static_cast<int64_t>(valid ? head : 0) * p.q_stride_head);
  uint4 qv[kHeadDimQK / 8 / 8];
#pragma unroll
  for (int m = 0; m < kHeadDimQK / 8 / 8; ++m) qv[m] = valid ? __ldg(src + c8 + 8 * m) : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int m = 0; m < kHeadDimQK / 8 / 8; ++m) {
    const int q = c8 + 8 * m, j = q >> 2, c = q & 3;  // cache dims 32 j + 8 c + t, t = 0..7
    // Word (v, h) = cache dims (t, t + 4), t = 2v + h, at logical dim 32 j + 16 v + 8 h + 2 c.
    const uint32_t words[4] = {prmt(qv[m].x, qv[m].z, 0x5410), prmt(qv[m].x, qv[m].z, 0x7632),
                               prmt(qv[m].y, qv[m].w, 0x5410), prmt(qv[m].y, qv[m].w, 0x7632)};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int pos = 32 * j + 8 * t + 2 * c;  // 16 v + 8 h = 8 t
      const uint32_t addr = q_smem + swizzled_offset(row, pos >> 3, kQBlockBytes) + 4 * c;
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(words[t]) : "memory");
    }
  }
}

// kv_map: the tensor map over the cache codes (dims {288, cache rows}, boxes
// {128, 64}, 128-byte swizzle; encoded per call by tensor_map.cu).
__global__ void __launch_bounds__(kThreads, 1)
    decode_narrow_mx_kernel(const DecodeLaunch args, const __grid_constant__ CodeTensorMap kv_map) {
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(1024) uint8_t smem[];
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;

  const uint32_t smem_base = smem_u32(smem);
  const uint32_t q_smem = smem_base + Smem::kQ;
  const uint32_t codes_smem = smem_base + Smem::kCodes;
  const uint32_t factors_smem = smem_base + Smem::kFactors;
  const uint32_t pt_smem = smem_base + Smem::kPt;
  float* alpha_x = reinterpret_cast<float*>(smem + Smem::kAlpha);
  uint32_t* rescale_x = reinterpret_cast<uint32_t*>(smem + Smem::kRescale);
  float* max_x = reinterpret_cast<float*>(smem + Smem::kMaxX);
  float* sum_x = reinterpret_cast<float*>(smem + Smem::kSumX);
  float* out_scale_x = reinterpret_cast<float*>(smem + Smem::kOutScale);

  const WorkItem work = locate_work<kTileTokens, kRows>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const uint32_t bars = smem_base + Smem::kBars;
  auto mbar = [&](int i) { return bars + 8 * i; };
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(mbar(Smem::kBarCodeFull + i), 1);
      mbar_init(mbar(Smem::kBarCodeEmpty + i), kCodeEmptyArrivals);
    }
    for (int i = 0; i < kScaleStages; ++i) mbar_init(mbar(Smem::kBarScaleFull + i), kValueThreads);
    for (int i = 0; i < kPBufs; ++i) {
      mbar_init(mbar(Smem::kBarPFull + i), 128);
      mbar_init(mbar(Smem::kBarPEmpty + i), kValueThreads);
    }
    mbar_init(mbar(Smem::kBarEpilogue), 128);
    fence_mbarrier_init();
  }
  // The cache rows: kv_indptr[b] + j (indptr layout only).
  const int64_t contiguous_base = work.orphan ? 0 : static_cast<int64_t>(__ldg(p.kv_indptr + work.b));
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  if (wg == 0) {
    // ============================== scorer ===================================
    store_q_permuted(p, work, tid, q_smem);
    fence_proxy_async_shared();
    bar_sync(kBarQ, 128);

    // Accumulator layout (m64n16 of fp32): s[4j + 2r + e] = (key 16 warp + g
    // + 8r, head 8j + 2c + e); this thread's heads hd[2j + e] = 8j + 2c + e.
    const int key0 = 16 * warp + g;
    const float head_scale = p.sm_scale * 1.4426950408889634f;  // log2-domain score scale
    // ldmatrix of a chunk pair: lane l gives row l % 8 of matrix l / 8, i.e.
    // key 16 warp + 8 (mi % 2) + ri of chunk 2 jj + mi / 2.
    const int mi = lane >> 3, ri = lane & 7;
    const int ld_key = 16 * warp + 8 * (mi & 1) + ri;
    float m_run[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
    float l_part[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's keys only (reduced at the end)

    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kStages;
      const int buf = t % kPBufs;
      const uint32_t phase = (t / kStages) & 1;
      float s[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] = 0.f;
      {
        mbar_wait(mbar(Smem::kBarCodeFull + stage), phase);
        mbar_wait(mbar(Smem::kBarScaleFull + t % kScaleStages), (t / kScaleStages) & 1);
        const uint32_t stage_codes = codes_smem + stage * kCodeStageBytes;
        const uint32_t fac_k0 = factors_smem + (t % kScaleStages) * kFactorStageBytes + key0 * kFactorRowWords * 4;
        const uint32_t fac_k1 = fac_k0 + 8 * kFactorRowWords * 4;
        const uint64_t desc_q0 = opaque(smem_desc_sw128(q_smem, 16, kSwizzleGroupBytes));
        uint32_t a[2][2 * kQkGroupChunks][4];  // two groups' A fragments (8 k-steps each)
#pragma unroll
        for (int grp = 0; grp < kQkGroups; ++grp) {
          uint32_t(&ag)[2 * kQkGroupChunks][4] = a[grp & 1];
          if (grp >= 2) wgmma_wait<1>();  // group grp - 2, which read this set, is complete
          constexpr int kLast = kMxBlocksPerRow - (kQkGroups - 1) * kQkGroupChunks;
          const int chunks = grp < kQkGroups - 1 ? kQkGroupChunks : kLast;
          // The 4 factors of this group's blocks for keys key0 and key0 + 8.
          uint4 f0, f1;
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(f0.x), "=r"(f0.y), "=r"(f0.z), "=r"(f0.w)
                       : "r"(fac_k0 + 16 * grp));
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(f1.x), "=r"(f1.y), "=r"(f1.z), "=r"(f1.w)
                       : "r"(fac_k1 + 16 * grp));
          const uint32_t fw0[4] = {f0.x, f0.y, f0.z, f0.w}, fw1[4] = {f1.x, f1.y, f1.z, f1.w};
#pragma unroll
          for (int pr = 0; pr < kQkGroupChunks / 2; ++pr) {
            if (2 * pr >= chunks) break;
            const int j0 = kQkGroupChunks * grp + 2 * pr;  // chunks j0, j0 + 1
            const int chunk = j0 + (mi >> 1);
            uint32_t r[4];  // r[2u]: key key0, chunk j0 + u; r[2u + 1]: key key0 + 8
            ldmatrix_x4(r, stage_codes + (chunk >> 3) * kBoxBytes + ld_key * 128 + (((chunk & 7) ^ ri) << 4));
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const uint32_t w0 = fw0[2 * pr + u], w1 = fw1[2 * pr + u];
              const uint32_t fa0 = prmt(w0, w0, 0x1010), fb0 = prmt(w0, w0, 0x3232);
              const uint32_t fa1 = prmt(w1, w1, 0x1010), fb1 = prmt(w1, w1, 0x3232);
              uint32_t(&k0)[4] = ag[4 * pr + 2 * u];      // k-step 2 (j0 + u)
              uint32_t(&k1)[4] = ag[4 * pr + 2 * u + 1];  // k-step 2 (j0 + u) + 1
              k0[0] = mx_pair<0>(r[2 * u], fa0, fb0);
              k0[1] = mx_pair<0>(r[2 * u + 1], fa1, fb1);
              k0[2] = mx_pair<1>(r[2 * u], fa0, fb0);
              k0[3] = mx_pair<1>(r[2 * u + 1], fa1, fb1);
              k1[0] = mx_pair<2>(r[2 * u], fa0, fb0);
              k1[1] = mx_pair<2>(r[2 * u + 1], fa1, fb1);
              k1[2] = mx_pair<3>(r[2 * u], fa0, fb0);
              k1[3] = mx_pair<3>(r[2 * u + 1], fa1, fb1);
            }
          }
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < 2 * kQkGroupChunks; ++k) {
            if (k >= 2 * chunks) break;
            const int ks = 2 * kQkGroupChunks * grp + k;  // logical dims 16 ks ..: column block ks / 4
            const uint64_t desc_q = desc_q0 + (((ks / 4) * kQBlockBytes + (ks % 4) * 32) >> 4);
            wgmma_m64n16k16_bf16_rs(s, ag[k], desc_q);
          }
          wgmma_commit();
        }
        wgmma_wait<0>();
        pin(s);
        __syncwarp();
        if (lane == 0) mbar_arrive(mbar(Smem::kBarCodeEmpty + stage));  // this warp's reads are done
      }

      // Masks: keys past the split -inf, rows outside the cache (their codes
      // arrived as zeros) NaN. Scores to the log2 domain.
      const int tok0 = kv_begin + t * kTileTokens;
      bool over = false;  // a score above m_run + kLazyLog2 (NaN compares false)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = key0 + 8 * r;
        const bool past = tok0 + key >= kv_end;
        const int64_t row = contiguous_base + tok0 + key;
        const bool is_bad = row < 0 || row >= p.num_cache_rows;
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // i = 2j + e
          float v = s[4 * (i >> 1) + 2 * r + (i & 1)] * head_scale;
          v = past ? -CUDART_INF_F : (is_bad ? CUDART_NAN_F : v);
          s[4 * (i >> 1) + 2 * r + (i & 1)] = v;
          over |= v > m_run[i] + kLazyLog2;
        }
      }
      // Lazy rescaling (as the narrow kernels); the factors alpha are applied
      // to O^T by the value warpgroups before tile t's PV.
      const bool rescale = bar_sync_or(kBarMax, 128, over);
      float alpha[4] = {1.f, 1.f, 1.f, 1.f};
      if (rescale) narrow::raise_reference(s, max_x + (t & 1) * 4 * kRows, kBarMax, warp, g, c, m_run, l_part, alpha);
      uint32_t p_pairs[4];
      narrow::probabilities<false>(s, m_run, l_part, p_pairs);
      // Buffer buf is free once the PV of tile t - kPBufs is complete.
      if (t >= kPBufs) mbar_wait(mbar(Smem::kBarPEmpty + buf), ((t / kPBufs) - 1) & 1);
      if (tid == 0) rescale_x[buf] = rescale ? 1u : 0u;
      if (rescale && warp == 0 && g == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) alpha_x[buf * kRows + 8 * (i >> 1) + 2 * c + (i & 1)] = alpha[i];
      }
      narrow::store_p_transposed(pt_smem + buf * kQBlockBytes, p_pairs, warp, lane);
      fence_proxy_async_shared();
      mbar_arrive(mbar(Smem::kBarPFull + buf));
    }

    // ---- epilogue: l per head over the 64 rows of keys, the LSE, and the
    // heads' output factors for the value warpgroups ------------------------
    narrow::publish_row_sums(l_part, sum_x, warp, g, c);
    bar_sync(kBarSum, 128);
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hd = 8 * (i >> 1) + 2 * c + (i & 1);
        const float l = sum_x[hd] + sum_x[kRows + hd] + sum_x[2 * kRows + hd] + sum_x[3 * kRows + hd];
        const bool nan = isnan(l) || work.orphan;
        out_scale_x[hd] = nan ? CUDART_NAN_F : (l > 0.f ? 1.f / l : 0.f);
        const int h = work.h0 + hd;
        if (h < p.num_heads) store_head_lse(args, work, h, rows, m_run[i], l);
      }
    }
    mbar_arrive(mbar(Smem::kBarEpilogue));  // the factors stored
  } else {
    // ========================== value warpgroups =============================
    const int vt = tid - 128;
    const int vwg = vt / 128;  // dims 256 vwg..

    const bool stream_kv = args.stream_kv;  // small cache: L2 evict_first (ptx_sm90.cuh)
    const uint64_t kv_policy = l2_evict_first_policy();
    auto issue_code_tile = [&](int tile) {
      const int stage = tile % kStages;
      const uint32_t bar = mbar(Smem::kBarCodeFull + stage);
      const uint32_t dst = codes_smem + stage * kCodeStageBytes;
      const int y = static_cast<int>(contiguous_base + kv_begin + tile * kTileTokens);
      mbar_arrive_expect_tx(bar, kCodeStageBytes);
#pragma unroll
      for (int box = 0; box < kBoxes; ++box) {
        tma_load_2d_maybe_stream(dst + box * kBoxBytes, &kv_map, 128 * box, y, bar, stream_kv, kv_policy);
      }
    };
    // Block scales: value thread vt stages the (key, block) items vt + 256 k
    // of a tile (key = item / 18, block = item % 18; consecutive threads read
    // consecutive bytes of a contiguous scale tensor). Keys past the split or
    // outside the cache get E = 0 (finite factors: their codes are zero or
    // masked, and their scores masked).
    auto fetch_scales = [&](int tile, uint32_t (&e)[kFactorsPerThread]) {
      const int tok0 = kv_begin + tile * kTileTokens;
#pragma unroll
      for (int k = 0; k < kFactorsPerThread; ++k) {
        const int item = vt + kValueThreads * k;
        const int key = item / kMxBlocksPerRow, blk = item % kMxBlocksPerRow;
        const int64_t row = contiguous_base + tok0 + key;
        const bool ok = item < kFactorItems && tok0 + key < kv_end && row >= 0 && row < p.num_cache_rows;
        e[k] = ok ? static_cast<uint32_t>(__ldg(p.mx_scale + row * p.mx_scale_stride_row +
                                                static_cast<int64_t>(blk) * p.mx_scale_stride_col))
                  : 0u;
      }
    };
    auto store_factors = [&](int tile, const uint32_t (&e)[kFactorsPerThread]) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(smem + Smem::kFactors + (tile % kScaleStages) * kFactorStageBytes);
#pragma unroll
      for (int k = 0; k < kFactorsPerThread; ++k) {
        const int item = vt + kValueThreads * k;
        if (item < kFactorItems) {
          dst[(item / kMxBlocksPerRow) * kFactorRowWords + item % kMxBlocksPerRow] = e8m0_factor_word(e[k]);
        }
      }
      mbar_arrive(mbar(Smem::kBarScaleFull + tile % kScaleStages));
    };
    if (vt == 0) {
      for (int tile = 0; tile < kStages && tile < n_tiles; ++tile) issue_code_tile(tile);
    }
    {
      // The first stages' scales: every load issued before the first store.
      uint32_t e0[kScaleAhead][kFactorsPerThread];
#pragma unroll
      for (int tile = 0; tile < kScaleAhead; ++tile) {
        if (tile < n_tiles) fetch_scales(tile, e0[tile]);
      }
#pragma unroll
      for (int tile = 0; tile < kScaleAhead; ++tile) {
        if (tile < n_tiles) store_factors(tile, e0[tile]);
      }
    }

    // ldmatrix .trans addresses: lane l gives row l % 8 of matrix l / 8, i.e.
    // key 8 (4 kg + mi) + ri of the chunk.
    const int mi = lane >> 3, ri = lane & 7;
    float o[kValueBlocks][8];  // O^T: o[mb][4j + 2r + e] = (row 16 warp + g + 8r of M block mb, head 8j + 2c + e)
#pragma unroll
    for (int mb = 0; mb < kValueBlocks; ++mb) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
    }
    uint32_t a[kValueBlocks][kPvSteps][4];  // the tile's A fragments (V^T in bf16)

    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kStages;
      const int buf = t % kPBufs;
      const uint32_t phase = (t / kStages) & 1;
      const bool refill = t + kStages < n_tiles;
      const bool restage = t + kScaleAhead < n_tiles;
      uint32_t e_next[kFactorsPerThread];
      if (restage) fetch_scales(t + kScaleAhead, e_next);  // into registers; stored at the end of the iteration
      mbar_wait(mbar(Smem::kBarCodeFull + stage), phase);
      mbar_wait(mbar(Smem::kBarScaleFull + t % kScaleStages), (t / kScaleStages) & 1);
      // Keys past the split (another item's, or zero-filled past the cache)
      // need no mask: E2M1 codes are finite and their factors were staged
      // from E = 0, so their V is finite, and their P is 0.
      const uint32_t stage_codes = codes_smem + stage * kCodeStageBytes;
      const uint32_t* fac =
          reinterpret_cast<const uint32_t*>(smem + Smem::kFactors + (t % kScaleStages) * kFactorStageBytes);
#pragma unroll
      for (int hb = 0; hb < 2; ++hb) {
        const int ch = 8 * vwg + 4 * hb + warp;  // this warp's chunk (dims 32 ch ..) of M blocks 2 hb, 2 hb + 1
        const uint32_t chunk_base = stage_codes + (ch >> 3) * kBoxBytes;
#pragma unroll
        for (int kg = 0; kg < 2; ++kg) {  // key groups m = 4 kg .. 4 kg + 3
          const int ld_key = 8 * (4 * kg + mi) + ri;
          uint32_t r[4];
          ldmatrix_x4_trans(r, chunk_base + ld_key * 128 + (((ch & 7) ^ ri) << 4));
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int m = 4 * kg + q;
            const int key = 8 * m + 2 * c;  // low half; key + 1 high
            const uint32_t wa = fac[key * kFactorRowWords + ch], wb = fac[(key + 1) * kFactorRowWords + ch];
            const uint32_t fa = prmt(wa, wb, 0x5410), fb = prmt(wa, wb, 0x7632);
            const int kk = m >> 1, hi = 2 * (m & 1);
            a[2 * hb][kk][hi] = mx_pair<0>(r[q], fa, fb);          // row g of M block 2 hb
            a[2 * hb][kk][hi + 1] = mx_pair<1>(r[q], fa, fb);      // row g + 8
            a[2 * hb + 1][kk][hi] = mx_pair<2>(r[q], fa, fb);      // row g of M block 2 hb + 1
            a[2 * hb + 1][kk][hi + 1] = mx_pair<3>(r[q], fa, fb);  // row g + 8
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(mbar(Smem::kBarCodeEmpty + stage));  // this warp's reads are done
      if (vt == 0 && refill) {
        // The stage takes tile t + kStages once all its readers are done
        // (the scorer's QK of tile t is, by the time P^T of tile t is stored).
        mbar_wait(mbar(Smem::kBarCodeEmpty + stage), phase);
        issue_code_tile(t + kStages);
      }

      mbar_wait(mbar(Smem::kBarPFull + buf), (t / kPBufs) & 1);  // P^T of tile t stored
      if (rescale_x[buf] != 0u) {
        float al[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) al[i] = alpha_x[buf * kRows + 8 * (i >> 1) + 2 * c + (i & 1)];
#pragma unroll
        for (int mb = 0; mb < kValueBlocks; ++mb) {
#pragma unroll
          for (int i = 0; i < 8; ++i) o[mb][i] *= al[2 * (i >> 2) + (i & 1)];
        }
      }
      wgmma_fence();
      const uint64_t desc_p0 = opaque(smem_desc_sw128(pt_smem + buf * kQBlockBytes, 16, kSwizzleGroupBytes));
#pragma unroll
      for (int mb = 0; mb < kValueBlocks; ++mb) {
#pragma unroll
        for (int kk = 0; kk < kPvSteps; ++kk) {
          // B = P^T: keys 16 kk.. (32 bytes on) x 16 heads, K-major.
          wgmma_m64n16k16_bf16_rs(o[mb], a[mb][kk], desc_p0 + ((32 * kk) >> 4));
        }
      }
      wgmma_commit();
      // PV of tile t complete before the loop's back edge (a group pending
      // across it makes ptxas serialise every wgmma, C7515; the A registers
      // are single-buffered).
      wgmma_wait<0>();
      pin(o);
      mbar_arrive(mbar(Smem::kBarPEmpty + buf));  // every value thread (its reads of the flag and factors)
      if (restage) {
        // Every reader of tile t is done (the scorer's QK arrived before P^T
        // of tile t was stored; the value warps before their PV), hence of
        // tile t - 1, whose scale stage takes tile t + kScaleAhead.
        mbar_wait(mbar(Smem::kBarCodeEmpty + stage), phase);
        store_factors(t + kScaleAhead, e_next);
      }
    }

    // ---- epilogue: O^T times the heads' factors ------------------------------
    mbar_wait(mbar(Smem::kBarEpilogue), 0);  // the scorer has stored them
    float scale[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) scale[i] = out_scale_x[8 * (i >> 1) + 2 * c + (i & 1)];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = work.h0 + 8 * (i >> 1) + 2 * c + (i & 1);
      if (h >= p.num_heads) continue;
      const int64_t out_row = static_cast<int64_t>(work.t) * p.num_heads + h;
#pragma unroll
      for (int mb = 0; mb < kValueBlocks; ++mb) {
        // Rows g, g + 8 of M block mb = 2 hb + ab: dims 32 ch + 4 g + 2 ab, + 1.
        const int ch = 8 * vwg + 4 * (mb >> 1) + warp;
        const int dim = 32 * ch + 4 * g + 2 * (mb & 1);
        const float v0 = o[mb][4 * (i >> 1) + (i & 1)] * scale[i];
        const float v1 = o[mb][4 * (i >> 1) + 2 + (i & 1)] * scale[i];
        if (args.num_splits == 1) {
          uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                          static_cast<int64_t>(h) * p.out_stride_head + dim;
          const uint32_t pair = mla_pack_bf16x2(v0, v1);
          dst[0] = static_cast<uint16_t>(pair & 0xFFFFu);
          dst[1] = static_cast<uint16_t>(pair >> 16);
        } else {
          float* dst = args.partial_out + (static_cast<int64_t>(work.split) * rows + out_row) * kHeadDimV + dim;
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        }
      }
    }
  }
#endif  // MLA_SM90A_DEVICE
}

}  // namespace narrow_mx
}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

// STATUS (session 16): an experiment kept as docs/experiments/mxfp4-register-v.patch,
// not merged. Correct (the MXFP4 child suite of test_gpu.py passed with it, including
// block scales across the E8M0 range) but slower than the narrow kernel's producers
// at every shape from 4 x 8192 up: b256/kv8192 566-588 us against 479-482 (session
// 16 runs 1, 2 and 4; performance.md). Each code is converted twice (as K by the
// scorer, as V^T by the value warpgroups) at ~2.5 integer-pipe instructions per
// code, and with three warps per scheduler the conversions' dependency chains
// leave the SM issuing ~0.55 instructions per cycle (ncu, run 3): the value
// warpgroups bind (the scorer waits for P buffers 28% of its time).
//
// Split-KV MLA decode for an MXFP4 cache (indptr layout) on Hopper (sm_90a)
// with few heads (H < 64, head groups of 16): the register-V structure of
// decode_kernel_narrow_fp8_sm90.cuh for MXFP4, where the narrow kernel
// applies and the call has the indptr layout (decode_narrow_sm90.cu).
//
// Why (session 16, docs/kernel-design.md): the narrow kernel's MXFP4 form
// has producer warpgroups decode each 64-key tile into 72 KB of bf16 in
// shared memory, which QK and PV then read (run 119: 481 us at b256/kv8192,
// 32% of MXFP4's floor). Here nothing decoded is stored: the codes land by
// TMA (18 KB of codes per tile, a quarter of the decoded tile) and every
// warpgroup converts what it reads into its own wgmma A fragments.
//
//   S^T (64 keys x 16 heads) = K Q^T: 36 x wgmma m64n16k16 bf16, A = K from
//       registers (E2M1 -> bf16 times the block scale: exact), B = Q (bf16,
//       shared), one accumulator chain per tile.
//   O^T (dims x 16 heads) += V^T P^T: per value warpgroup 4 M tiles of 64
//       dims x 4 k-steps of wgmma m64n16k16 bf16 with A in registers, B = P^T
//       (bf16, shared).
//
// E2M1 to bf16 (e2m1_pair_unscaled_bits, ptx_sm80.cuh): a code's 3 magnitude
// bits placed at bf16 bits 6-8 read as exactly |code| * 2^-126, so one
// multiply by 2^(E-1) gives code * 2^(E-127) exactly, for E <= 128 (2^(E-1) a
// normal bf16). Blocks with 128 < E < 255 take a second factor (f1 * f2 =
// 2^(E-1)); E = 255 (NaN) gives NaN. The stager below writes both factors
// per (block, key), f2 = 1 where one suffices, and a per-tile flag so the
// common tile skips the second multiply.
//
// Grid and outputs: as every split kernel (decode_common.h), head groups of
// 16: x = query token * head_groups + head group, y = KV split; one split
// writes bf16 out and lse, several write fp32 partials for combine_kernel.
//
// Block: 384 threads, one CTA per SM (shared memory).
//   wg 0 (scorer): Q (bf16, in the K order below), QK in 9 chunks of two MX
//       blocks (one ldmatrix, 16 A words, 4 wgmma; two A buffers so a
//       chunk's conversion overlaps the previous chunk's wgmma), the online
//       softmax with lazy rescaling (as the fp8 register-V kernel), P^T
//       (bf16) into one of two P buffers with the rescale flag and factors,
//       the row sums and the LSE.
//   wg 1, 2 (value warpgroups): dims 0..255 and 256..511 of O^T (32 fp32
//       registers per thread); per tile the A fragments of V^T (64
//       registers) from ldmatrix .trans of the codes, then the optional O^T
//       rescale and 16 wgmma. While a tile's PV runs they stage the block
//       scales of tile t + kStages (global loads issued one tile earlier)
//       and thread 0 issues its TMA load.
//
// K order of QK (scorer): ldmatrix (b16, not transposed) of 8 keys x one MX
// block (16 code bytes) gives lane (g, c) codes 8c..8c+7 of key g's block;
// e2m1_pair_unscaled_bits<P> makes the bf16 pair (code 8c + P, code 8c + P +
// 4). Word P = 2kk + h is A's (cols 2c, 2c + 1) of k-step kk of the block for
// h = 0 (a0 / a1), cols 8 + 2c.. for h = 1 (a2 / a3): K position 16kk + 8h +
// 2c + e of a block holds dim 8c + 2kk + h + 4e. Q is stored in that order.
//
// V^T fragments (value warpgroups; warp w of value warpgroup v owns MX blocks
// b0 = 8v + 2w and b0 + 1): ldmatrix .trans (b16 = 4 codes) of 8 keys x one
// block gives lane (g, c) dims 4g..4g+3 of keys 2c and 2c + 1 (low / high
// half); e2m1_pair_unscaled_bits<i> makes (key 2c, key 2c + 1) of dim 4g +
// i, which is A's (row, cols 2c, 2c + 1) pair. Pair i of block b0 + bb goes
// to M tile 2bb + i / 2, row g + 8 (i % 2): row g + 8r of M tile mb (warp
// w's rows) is dim 256v + 64w + 32(mb / 2) + 4g + 2(mb % 2) + r, and O^T's
// accumulator rows carry that map to the epilogue.
//
// Shared memory (Smem below, ~188 KB; operand regions 1024-byte aligned):
//   Q         9 column blocks of 16 heads x 64 bf16 (128-byte swizzle)
//   codes     kStages stages of 3 TMA boxes of 64 keys x 128 code bytes
//             (128-byte swizzle; bytes 288..383 and rows past the cache
//             arrive as zeros)
//   P^T       2 buffers of 16 heads x 64 keys bf16, their rescale flags and
//             factors
//   scales    per stage: f1 (bf16) of (block, key) as u16 and as a u32 with
//             f1 in both halves, f2 (u16), the stager warps' wide flags
//   the per-warp maxima exchange, the per-warp sums, the heads' 1 / l,
//   mbarriers.
//
// Synchronisation (mbarriers; named barriers only within wg 0):
//   code_full[s]   TMA bytes + the issuing thread's arrival + the 256 value
//                  threads' (the stage's scales stored).
//   code_empty[s]  the 4 scorer warps (QK of the tile done) and the 8 value
//                  warps (their reads done): 12 arrivals.
//   p_full[b]      the 128 scorer threads (P^T, flag and factors stored).
//   p_empty[b]     the 256 value threads (PV of the tile complete).
//   epilogue       the 128 scorer threads (the heads' 1 / l stored).
#pragma once

#include "decode_kernel_narrow_fp8_sm90.cuh"  // CodeTensorMap, the narrow kernel's softmax pieces

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
constexpr int kBoxBytes = kTileTokens * 128;         // 8192: 64 keys x 128 code bytes (8 MX blocks)
constexpr int kBoxes = 3;                            // code bytes 0..383 (288.. zero-filled)
constexpr int kStageBytes = kBoxes * kBoxBytes;      // 24576: one TMA transaction
constexpr int kStages = 4;  // 72 KB of codes in flight per SM (a power of two: cheap t % kStages)
constexpr int kBlocks = kMxBlocksPerRow;             // 18 MX blocks per key (16 of V)
constexpr int kQkChunks = kBlocks / 2;               // 9: two blocks (4 k-steps) per ldmatrix
constexpr int kValueMTiles = kHeadDimV / 2 / 64;     // 4 M tiles of 64 dims per value warpgroup
constexpr int kPvSteps = kTileTokens / 16;           // 4 k-steps of 16 keys
constexpr int kPBufs = 2;
constexpr int kValueThreads = 256;
constexpr int kValueWarps = kValueThreads / 32;
constexpr int kStagerBlocks = (kBlocks + 3) / 4;     // 5: blocks q, q + 4, .. of a stager thread
constexpr uint32_t kBf16One = 0x3F80u;
constexpr uint32_t kNoScale = 256u;                  // a key outside the split or the cache
static_assert(kBlocks % 2 == 0 && kValueThreads == 4 * kTileTokens, "the stager map");

enum NamedBarrier : int {
  kBarQ = 1,    // wg 0: Q stored
  kBarMax = 2,  // wg 0: the rescale vote; the per-warp maxima exchanged
  kBarSum = 3,  // wg 0: the per-warp sums exchanged (epilogue)
};

// One stage's block scales, as the stager writes them (offsets in bytes).
struct ScaleStage {
  static constexpr int kPair = 0;                                      // u16 [18][64]: f1 of (block, key)
  static constexpr int kSplat = kPair + kBlocks * kTileTokens * 2;     // u32 [18][64]: f1 in both halves
  static constexpr int kSecond = kSplat + kBlocks * kTileTokens * 4;   // u16 [18][64]: f2 (1 if unused)
  static constexpr int kWide = kSecond + kBlocks * kTileTokens * 2;    // u32 [8]: stager warp saw f2 != 1
  static constexpr int kBytes = kWide + kValueWarps * 4;
};
static_assert(ScaleStage::kWide % 16 == 0 && ScaleStage::kBytes % 16 == 0, "16-byte flag loads");

struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kCodes = kQ + kColBlocks * kQBlockBytes;
  static constexpr int kPt = kCodes + kStages * kStageBytes;
  static constexpr int kScales = kPt + kPBufs * kQBlockBytes;
  static constexpr int kAlpha = kScales + kStages * ScaleStage::kBytes;  // [kPBufs][16] fp32
  static constexpr int kRescale = kAlpha + kPBufs * kRows * 4;            // [kPBufs] u32
  static_assert(kPBufs >= 2 && kPBufs <= 4, "the flags take one 16-byte word");
  static constexpr int kMaxX = kRescale + 16;                             // [2 tiles][4 warps][16] fp32
  static constexpr int kSumX = kMaxX + 2 * 4 * kRows * 4;                 // [4 warps][16] fp32
  static constexpr int kOutScale = kSumX + 4 * kRows * 4;                 // [16] fp32: 1 / l
  static constexpr int kBars = kOutScale + kRows * 4;
  static constexpr int kBarCodeFull = 0;                                  // + stage
  static constexpr int kBarCodeEmpty = kStages;                           // + stage
  static constexpr int kBarPFull = 2 * kStages;                           // + buffer
  static constexpr int kBarPEmpty = 2 * kStages + kPBufs;                 // + buffer
  static constexpr int kBarEpilogue = 2 * kStages + 2 * kPBufs;
  static constexpr int kBarCount = 2 * kStages + 2 * kPBufs + 1;
  static constexpr int kTotal = kBars + kBarCount * 8;
};
static_assert(Smem::kCodes % 1024 == 0 && Smem::kPt % 1024 == 0 && kQBlockBytes % 1024 == 0 &&
                  kBoxBytes % 1024 == 0,
              "swizzle atoms are 1024-byte aligned");
static_assert(Smem::kScales % 16 == 0 && Smem::kBars % 8 == 0, "alignment");
constexpr int kCodeEmptyArrivals = 4 + kValueWarps;        // scorer warps + value warps
constexpr int kCodeFullArrivals = 1 + kValueThreads;       // the TMA issuer + the scale stagers

// Q of this CTA's 16 heads in bf16, in QK's K order (see the top): position
// 16kk + 8h + 2c + e of MX block j holds dim 32j + 8c + 2kk + h + 4e. Thread
// tid handles head tid / 8 and 8-dim chunks q = tid % 8 + 8m (m = 0..8), i.e.
// dims 8q.. = (block q / 4, c = q % 4): its pair P = (dim 8c + P, dim 8c + P
// + 4) is the 4-byte word c of the block's 8-position chunk P. Heads past H
// (and every head of an orphan token) are zero. Stored 128-byte swizzled as
// B of QK (K-major); the caller fences and syncs.
__device__ __forceinline__ void store_q_mx_order(const MlaDecodeParams& p, const WorkItem& work, int tid,
                                                 uint32_t q_smem) {
  const int row = tid >> 3, c8 = tid & 7;
  const int head = work.h0 + row;
  const bool valid = !work.orphan && head < p.num_heads;
  const uint4* src = reinterpret_cast<const uint4*>(
      static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(work.t) * p.q_stride_token +
      static_cast<int64_t>(valid ? head : 0) * p.q_stride_head);
#pragma unroll
  for (int m = 0; m < kColBlocks; ++m) {
    const int q = c8 + 8 * m;
    const uint4 v = valid ? __ldg(src + q) : make_uint4(0, 0, 0, 0);
    const uint32_t pairs[4] = {prmt(v.x, v.z, 0x5410), prmt(v.x, v.z, 0x7632), prmt(v.y, v.w, 0x5410),
                               prmt(v.y, v.w, 0x7632)};
#pragma unroll
    for (int pp = 0; pp < 4; ++pp) {
      const int chunk = 4 * (q >> 2) + pp;  // 8-position chunk of the 576 positions
      const uint32_t addr = q_smem + (chunk >> 3) * kQBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4) +
                            4 * (q & 3);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(pairs[pp]) : "memory");
    }
  }
}

// The bf16 pair (codes P, P + 4 of the 8 in w) times the bf16 pair f.
template <int P>
__device__ __forceinline__ uint32_t mx_scaled_pair(uint32_t w, uint32_t f) {
  return bf16x2_bits(__hmul2(bits_bf16x2(e2m1_pair_unscaled_bits<P>(w)), bits_bf16x2(f)));
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t x, uint32_t f) {
  return bf16x2_bits(__hmul2(bits_bf16x2(x), bits_bf16x2(f)));
}

// The two bf16 factors of an E8M0 byte e (kNoScale: a zero row): f1 * f2 =
// 2^(E-1), f2 = 1 unless 128 < E < 255 (see the top); E = 255 gives NaN.
__device__ __forceinline__ void e8m0_factors(uint32_t e, uint32_t& f1, uint32_t& f2) {
  // Selects, not branches (the stager runs this 5 times per tile).
  const bool two = e > 128u && e < 255u;
  const uint32_t t = e - 1u, e1 = t >> 1;  // two factors: 2^e1 * 2^(t - e1), both in [64, 127]
  f1 = two ? (e1 + 127u) << 7 : (e + 126u) << 7;
  f1 = e == 255u ? 0x7FC0u : f1;
  f1 = e == kNoScale ? 0u : f1;
  f2 = two ? (t - e1 + 127u) << 7 : kBf16One;
}

// kv_map: the tensor map over the cache codes (dims {288, cache rows}, boxes
// {128, 64}, 128-byte swizzle; decode_narrow_sm90.cu encodes it per call).
__global__ void __launch_bounds__(kThreads, 1)
    decode_narrow_mxfp4_kernel(const DecodeLaunch args, const __grid_constant__ CodeTensorMap kv_map) {
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
  const uint32_t pt_smem = smem_base + Smem::kPt;
  uint8_t* scales = smem + Smem::kScales;
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
      mbar_init(mbar(Smem::kBarCodeFull + i), kCodeFullArrivals);
      mbar_init(mbar(Smem::kBarCodeEmpty + i), kCodeEmptyArrivals);
    }
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

  // Whether any stager warp saw a block with a second factor in stage s.
  auto stage_is_wide = [&](int s) {
    const uint4* w = reinterpret_cast<const uint4*>(scales + s * ScaleStage::kBytes + ScaleStage::kWide);
    const uint4 x = w[0], y = w[1];
    return ((x.x | x.y | x.z | x.w) | (y.x | y.y | y.z | y.w)) != 0u;
  };

  if (wg == 0) {
    // ============================== scorer ===================================
    store_q_mx_order(p, work, tid, q_smem);
    fence_proxy_async_shared();
    bar_sync(kBarQ, 128);

    // Accumulator layout (m64n16 of fp32): s[4j + 2r + e] = (key 16 warp + g
    // + 8r, head 8j + 2c + e); this thread's heads hd[2j + e] = 8j + 2c + e.
    const int key0 = 16 * warp + g;
    const float head_scale = p.sm_scale * 1.4426950408889634f;  // log2 domain
    float m_run[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
    float l_part[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's keys only (reduced at the end)
    // ldmatrix rows: lane l gives row l % 8 of matrix l / 8 = (keys 16 warp +
    // 8 (l / 8 % 2).., block 2 ch + l / 16 of chunk ch). Block 2ch + l / 16 is
    // 16-byte chunk (2ch % 8) ^ (l / 16) of box ch / 4 (2ch % 8 is even), so
    // the lane's swizzled offset in the box is qk_off[ch % 4].
    const int mi = lane >> 3, ri = lane & 7;
    uint32_t qk_off[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) qk_off[i] = (16 * warp + 8 * (mi & 1) + ri) * 128 + (((2 * i) ^ (mi >> 1) ^ ri) << 4);

    // QK of one tile (kTwoFactors: the tile has blocks with 128 < E < 255,
    // whose K words take the second factor too; a separate copy, so the
    // common tile carries no test per chunk). Two A buffers: chunk ch + 1 is
    // converted while chunk ch's group runs.
    auto qk_tile = [&](auto two_factors, uint32_t codes, const uint8_t* sc, float(&s)[8]) {
      constexpr bool kTwoFactors = decltype(two_factors)::value;
      // Opaque per tile: the 36 descriptors hoisted out of the loop would take 72 registers.
      const uint64_t desc_q0 = opaque(smem_desc_sw128(q_smem, 16, kSwizzleGroupBytes));
      uint32_t abuf[2][16];  // A words of two chunks: [4 k-steps][a0..a3]
#pragma unroll
      for (int ch = 0; ch < kQkChunks; ++ch) {
        uint32_t(&a)[16] = abuf[ch & 1];
        uint32_t r[4];  // keys g / g + 8 of block 2ch, then of block 2ch + 1
        ldmatrix_x4(r, codes + (ch / 4) * kBoxBytes + qk_off[ch % 4]);
#pragma unroll
        for (int bb = 0; bb < 2; ++bb) {
          const int blk = 2 * ch + bb;
          const uint32_t* splat = reinterpret_cast<const uint32_t*>(sc + ScaleStage::kSplat) + blk * kTileTokens;
          const uint32_t f_lo = splat[key0], f_hi = splat[key0 + 8];
          // k-step 2bb + kk of the chunk: a0 / a1 = pair 2kk of keys g / g +
          // 8, a2 / a3 = pair 2kk + 1.
          a[8 * bb + 0] = mx_scaled_pair<0>(r[2 * bb], f_lo);
          a[8 * bb + 1] = mx_scaled_pair<0>(r[2 * bb + 1], f_hi);
          a[8 * bb + 2] = mx_scaled_pair<1>(r[2 * bb], f_lo);
          a[8 * bb + 3] = mx_scaled_pair<1>(r[2 * bb + 1], f_hi);
          a[8 * bb + 4] = mx_scaled_pair<2>(r[2 * bb], f_lo);
          a[8 * bb + 5] = mx_scaled_pair<2>(r[2 * bb + 1], f_hi);
          a[8 * bb + 6] = mx_scaled_pair<3>(r[2 * bb], f_lo);
          a[8 * bb + 7] = mx_scaled_pair<3>(r[2 * bb + 1], f_hi);
          if constexpr (kTwoFactors) {
            const uint16_t* second = reinterpret_cast<const uint16_t*>(sc + ScaleStage::kSecond) + blk * kTileTokens;
            const uint32_t s_lo = 0x10001u * second[key0], s_hi = 0x10001u * second[key0 + 8];
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
              a[8 * bb + i] = bf16x2_mul(a[8 * bb + i], s_lo);
              a[8 * bb + i + 1] = bf16x2_mul(a[8 * bb + i + 1], s_hi);
            }
          }
        }
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t(&ak)[4] = *reinterpret_cast<const uint32_t(*)[4]>(a + 4 * k);
          // Positions 64 ch + 16 k..: column block ch, 32 bytes per k-step.
          const uint64_t desc_q = desc_q0 + ((ch * kQBlockBytes + k * 32) >> 4);
          if (ch == 0 && k == 0) wgmma_m64n16k16_rs<false, false>(s, ak, desc_q);
          else wgmma_m64n16k16_rs<false, true>(s, ak, desc_q);
        }
        wgmma_commit();
        // The previous chunk's group is complete: its A buffer is free.
        if (ch >= 1 && ch + 1 < kQkChunks) wgmma_wait<1>();
      }
      wgmma_wait<0>();
      pin(s);
    };

    uint32_t stage = 0, phase = 0;  // tile t's code stage and its mbarrier parity
    for (int t = 0; t < n_tiles; ++t) {
      const int buf = t % kPBufs;
      float s[8];
      {
        mbar_wait(mbar(Smem::kBarCodeFull + stage), phase);
        const uint32_t codes = codes_smem + stage * kStageBytes;
        const uint8_t* sc = scales + stage * ScaleStage::kBytes;
        if (stage_is_wide(stage)) qk_tile(std::true_type{}, codes, sc, s);
        else qk_tile(std::false_type{}, codes, sc, s);
        __syncwarp();
        if (lane == 0) mbar_arrive(mbar(Smem::kBarCodeEmpty + stage));  // this warp's reads are done
        stage = stage + 1 == kStages ? 0 : stage + 1;
        phase ^= stage == 0 ? 1u : 0u;
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
      // Lazy rescaling, as the fp8 register-V kernel.
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

    // ---- epilogue: l per head, the LSE, the heads' 1 / l for the value
    // warpgroups ---------------------------------------------------------------
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
    const int vwg = vt / 128;          // dims 256 vwg..
    const int vwarp = vt / 32;         // 0..7: the stager's flag word
    const int b0 = 8 * vwg + 2 * warp;  // this warp's MX blocks b0, b0 + 1 (chunks 2 warp.. of box vwg)
    const int mi = lane >> 3, ri = lane & 7;

    // ---- the scale stager: thread vt takes key vt % 64 of a tile and blocks
    // vt / 64 + 4i (i < 5, block < 18; warp-uniform) --------------------------
    const int st_key = vt & (kTileTokens - 1), st_q = vt / kTileTokens;
    uint32_t st_e[kStagerBlocks];  // E8M0 bytes of the next tile to stage (kNoScale: none)
    auto load_scales = [&](int tile, uint32_t(&e)[kStagerBlocks]) {
      const int tok = kv_begin + tile * kTileTokens + st_key;
      const int64_t row = contiguous_base + tok;
      const bool ok = tile < n_tiles && tok < kv_end && row >= 0 && row < p.num_cache_rows;
      const uint8_t* src = p.mx_scale + (ok ? row : 0) * p.mx_scale_stride_row;
#pragma unroll
      for (int i = 0; i < kStagerBlocks; ++i) {
        const int blk = st_q + 4 * i;
        e[i] = (ok && blk < kBlocks) ? static_cast<uint32_t>(__ldg(src + blk * p.mx_scale_stride_col)) : kNoScale;
      }
    };
    auto store_scales = [&](int tile, const uint32_t(&e)[kStagerBlocks]) {
      uint8_t* sc = scales + (tile % kStages) * ScaleStage::kBytes;
      bool wide = false;
#pragma unroll
      for (int i = 0; i < kStagerBlocks; ++i) {
        const int blk = st_q + 4 * i;
        if (blk < kBlocks) {
          uint32_t f1, f2;
          e8m0_factors(e[i], f1, f2);
          const int idx = blk * kTileTokens + st_key;
          reinterpret_cast<uint16_t*>(sc + ScaleStage::kPair)[idx] = static_cast<uint16_t>(f1);
          reinterpret_cast<uint32_t*>(sc + ScaleStage::kSplat)[idx] = f1 * 0x10001u;
          reinterpret_cast<uint16_t*>(sc + ScaleStage::kSecond)[idx] = static_cast<uint16_t>(f2);
          wide |= f2 != kBf16One;
        }
      }
      const bool any_wide = __any_sync(0xffffffffu, wide);
      if (lane == 0) reinterpret_cast<uint32_t*>(sc + ScaleStage::kWide)[vwarp] = any_wide ? 1u : 0u;
      mbar_arrive(mbar(Smem::kBarCodeFull + tile % kStages));  // this thread's scales stored
    };
    auto issue_code_tile = [&](int tile) {
      const int stage = tile % kStages;
      const uint32_t bar = mbar(Smem::kBarCodeFull + stage);
      const uint32_t dst = codes_smem + stage * kStageBytes;
      const int y = static_cast<int>(contiguous_base + kv_begin + tile * kTileTokens);
      mbar_arrive_expect_tx(bar, kStageBytes);
#pragma unroll
      for (int box = 0; box < kBoxes; ++box) tma_load_2d(dst + box * kBoxBytes, &kv_map, 128 * box, y, bar);
    };
    {
      // The first kStages tiles: every load issued before any store.
      uint32_t e0[kStages][kStagerBlocks];
#pragma unroll
      for (int tile = 0; tile < kStages; ++tile) {
        if (vt == 0 && tile < n_tiles) issue_code_tile(tile);
        load_scales(tile, e0[tile]);
      }
#pragma unroll
      for (int tile = 0; tile < kStages; ++tile) {
        if (tile < n_tiles) store_scales(tile, e0[tile]);
      }
    }
    load_scales(kStages, st_e);

    float o[kValueMTiles][8];  // O^T: o[mb][4j + 2r + e] = (dim of row g + 8r of M tile mb, head 8j + 2c + e)
#pragma unroll
    for (int mb = 0; mb < kValueMTiles; ++mb) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
    }
    uint32_t a[kValueMTiles][kPvSteps][4];  // the tile's A fragments (V^T in bf16)

    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kStages;
      const int buf = t % kPBufs;
      mbar_wait(mbar(Smem::kBarCodeFull + stage), (t / kStages) & 1);
      const uint32_t codes = codes_smem + stage * kStageBytes + vwg * kBoxBytes;
      const uint8_t* sc = scales + stage * ScaleStage::kBytes;
#pragma unroll
      for (int bb = 0; bb < 2; ++bb) {
        const int blk = b0 + bb;
        const uint32_t* pair = reinterpret_cast<const uint32_t*>(sc + ScaleStage::kPair + 2 * blk * kTileTokens);
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // keys 32 half..: octets m = 4 half + (0..3)
          uint32_t r[4];
          ldmatrix_x4_trans(r, codes + (32 * half + 8 * mi + ri) * 128 + (((2 * warp + bb) ^ ri) << 4));
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int m = 4 * half + q, kk = m >> 1, col = 2 * (m & 1);
            const uint32_t f = pair[4 * m + c];  // keys 8m + 2c, 8m + 2c + 1
            a[2 * bb][kk][col] = mx_scaled_pair<0>(r[q], f);
            a[2 * bb][kk][col + 1] = mx_scaled_pair<1>(r[q], f);
            a[2 * bb + 1][kk][col] = mx_scaled_pair<2>(r[q], f);
            a[2 * bb + 1][kk][col + 1] = mx_scaled_pair<3>(r[q], f);
          }
        }
      }
      if (stage_is_wide(stage)) {
        // Rare: blocks with 128 < E < 255 take their second factor (f2 = 1 elsewhere).
#pragma unroll
        for (int bb = 0; bb < 2; ++bb) {
          const uint32_t* second =
              reinterpret_cast<const uint32_t*>(sc + ScaleStage::kSecond + 2 * (b0 + bb) * kTileTokens);
#pragma unroll
          for (int m = 0; m < 8; ++m) {
            const int kk = m >> 1, col = 2 * (m & 1);
            const uint32_t f2 = second[4 * m + c];
            a[2 * bb][kk][col] = bf16x2_mul(a[2 * bb][kk][col], f2);
            a[2 * bb][kk][col + 1] = bf16x2_mul(a[2 * bb][kk][col + 1], f2);
            a[2 * bb + 1][kk][col] = bf16x2_mul(a[2 * bb + 1][kk][col], f2);
            a[2 * bb + 1][kk][col + 1] = bf16x2_mul(a[2 * bb + 1][kk][col + 1], f2);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(mbar(Smem::kBarCodeEmpty + stage));  // this warp's reads are done

      mbar_wait(mbar(Smem::kBarPFull + buf), (t / kPBufs) & 1);  // P^T of tile t stored
      if (rescale_x[buf] != 0u) {
        float al[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) al[i] = alpha_x[buf * kRows + 8 * (i >> 1) + 2 * c + (i & 1)];
#pragma unroll
        for (int mb = 0; mb < kValueMTiles; ++mb) {
#pragma unroll
          for (int i = 0; i < 8; ++i) o[mb][i] *= al[2 * (i >> 2) + (i & 1)];
        }
      }
      wgmma_fence();
      const uint64_t desc_p0 = opaque(smem_desc_sw128(pt_smem + buf * kQBlockBytes, 16, kSwizzleGroupBytes));
#pragma unroll
      for (int mb = 0; mb < kValueMTiles; ++mb) {
#pragma unroll
        for (int kk = 0; kk < kPvSteps; ++kk) {
          // B = P^T: keys 16 kk.. (32 bytes on) x 16 heads, K-major.
          wgmma_m64n16k16_rs<false, true>(o[mb], a[mb][kk], desc_p0 + ((32 * kk) >> 4));
        }
      }
      wgmma_commit();
      // While PV runs: stage tile t + kStages into this stage once all its
      // readers are done (the scorer's QK of tile t is, as P^T of tile t is
      // stored), and fetch the scales of the tile after it.
      if (t + kStages < n_tiles) {
        mbar_wait(mbar(Smem::kBarCodeEmpty + stage), (t / kStages) & 1);
        if (vt == 0) issue_code_tile(t + kStages);
        store_scales(t + kStages, st_e);
        load_scales(t + kStages + 1, st_e);
      }
      // PV of tile t complete: the A registers may be overwritten and the P
      // buffer refilled (waited here: a group pending across the loop's back
      // edge makes ptxas serialise every wgmma, C7515).
      wgmma_wait<0>();
      pin(o);
      mbar_arrive(mbar(Smem::kBarPEmpty + buf));  // every value thread (its reads of the flag and factors)
    }

    // ---- epilogue: O^T times the heads' 1 / l ---------------------------------
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
      for (int mb = 0; mb < kValueMTiles; ++mb) {
        const int dim = 256 * vwg + 64 * warp + 32 * (mb >> 1) + 4 * g + 2 * (mb & 1);  // and dim + 1
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

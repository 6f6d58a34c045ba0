// Split-KV MLA decode for an OCP fp8 cache (indptr layout) on Hopper (sm_90a)
// with few heads (H < 64, head groups of 16): the narrow kernel's fp8 form
// with V in registers ("register-V"). The plan runs it for OCP fp8 whose rows
// TMA can address, above a size threshold (plan/tuning.h, plan/plan.cpp).
//
// Why (docs/kernels.md): a narrow kernel whose QK reads TMA-landed codes but
// whose PV reads V decoded to f16 in shared memory moves ~260 KB of shared
// memory per 64-key tile (the codes' TMA write 40 KB, QK's reads 36 KB + Q,
// 32 KB of codes read to decode V, 64 KB of f16 V written and 64 KB read by
// PV): ~2000 cycles of the 128 bytes per cycle an SM's shared memory moves, as
// long as the DRAM time of a tile (36 KB at ~18 bytes per cycle per SM). Here
// PV takes A = V^T from registers: the value warpgroups read the codes once
// with ldmatrix (32 KB) and convert them in registers, so no decoded V exists
// in shared memory (~140 KB per tile), and the 64 KB a decoded V stage would
// take become a fourth code stage.
//
//   S^T (64 keys x 16 heads) = K Q^T: 18 x wgmma m64n32k32 e4m3, A = the
//       codes (TMA, K-major), B = Q as two e4m3 terms (hi | mid) along N,
//       each k-step added to the scores in fp32.
//   O^T (dims x 16 heads) += V^T P^T: per value warpgroup 4 M blocks of 64
//       dims x 4 k-steps of wgmma m64n16k16 f16 with A in registers, B = P^T
//       (f16, shared).
//
// Grid and outputs: as every split kernel (launch_contract.h), head groups of
// 16: x = query token * head_groups + head group, y = KV split; one split
// writes bf16 out and lse, several write fp32 partials for combine_kernel.
//
// Block: 384 threads, one CTA per SM (shared memory).
//   wg 0 (scorer): Q's e4m3 terms, QK, the online softmax with lazy
//       rescaling (as the narrow kernel: the reference maximum stays until a
//       score exceeds it by 2^8), P^T (f16) into one of two P buffers with
//       the rescale flag and per-head factors, the row sums and the LSE.
//   wg 1, 2 (value warpgroups): dims 0..255 and 256..511 of O^T (32 fp32
//       registers per thread). Per tile: ldmatrix .trans of the codes, e4m3
//       -> f16 in registers (64 registers: the whole tile's A fragments),
//       then, once P^T is stored, the optional rescale of O^T and 16 wgmma.
//       Thread 0 of wg 1 issues the TMA loads (kCodeStages tiles ahead).
//
// A fragments from the codes (this thread: g = lane / 4, c = lane % 4; warp
// w of the value warpgroup; a 16-dim slice d0 = 256 vwg + 64 mb + 16 w):
// ldmatrix .trans of 8 keys x 16 code bytes (8 b16 "dim pairs") gives lane
// (g, c) the b16 elements (key 2c, pair g) and (key 2c + 1, pair g), i.e.
// bytes [k2c d2g, k2c d2g+1, k2c+1 d2g, k2c+1 d2g+1]. One byte permute makes
// (k2c d2g, k2c+1 d2g | k2c d2g+1, k2c+1 d2g+1), and two conversions the
// f16 pairs of A rows g and g + 8: so A row g is dim d0 + 2g and row g + 8
// dim d0 + 2g + 1, and O^T's accumulator rows follow the same map (the
// epilogue's dim = d0 + 2g + r).
//
// Shared memory (Smem below, 189,560 bytes = 185.1 KiB; operand regions
// 1024-byte aligned):
//   Q terms   5 column blocks of 32 rows x 128 codes (4 KB each)
//   codes     4 stages of 5 column blocks of 64 keys x 128 codes (TMA boxes;
//             codes 576..639 and rows past the cache arrive as zeros)
//   P^T       2 buffers of 16 heads x 64 keys f16 (one column block each)
//   per P buffer: the rescale flag and the 16 heads' factors
//   the per-warp maxima exchange [2][4][16], the per-warp sums [4][16], the
//   heads' output factors [16] (1 / l, the cache scale), Q's per-head scale,
//   mbarriers.
//
// Synchronisation (mbarriers; named barriers only within wg 0; an arrival
// by lane 0 of a warp stands for the whole warp's reads: a value warp's
// follows a __syncwarp after its ldmatrix reads, a scorer warp's follows the
// wgmma.wait_group that completes its QK):
//   code_full[s]   TMA bytes + the issuing thread's arrival.
//   code_empty[s]  the 4 scorer warps (QK of the tile done) and the 8 value
//                  warps (their ldmatrix reads done): 12 arrivals; then wg 1's
//                  thread 0 refills the stage with tile t + kCodeStages.
//   p_full[b]      the 128 scorer threads (P^T, flag and factors of tile t
//                  stored and fenced).
//   p_empty[b]     the 256 value threads (PV of tile t complete): the scorer
//                  waits before it writes tile t + 2 into buffer b.
//   epilogue       the 128 scorer threads (the heads' output factors stored;
//                  compute-sanitizer's racecheck did not accept a named
//                  barrier or __syncthreads across the two roles here).
#pragma once

#include "kernels/sm90/narrow_kernel.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {
namespace narrow_fp8 {

using narrow::kColBlocks;
using narrow::kLazyLog2;
using narrow::kQBlockBytes;
using narrow::kRows;
using narrow::kSwizzleGroupBytes;
using narrow::kTileTokens;
using narrow::opaque;

constexpr int kThreads = 384;
constexpr int kCodeBlockBytes = kTileTokens * 128;               // 8192: 64 keys x 128 codes
constexpr int kCodeBlocks = 5;                                   // codes 0..639 (576.. zero-filled)
constexpr int kCodeStageBytes = kCodeBlocks * kCodeBlockBytes;   // 40960: one TMA transaction
constexpr int kCodeStages = 4;
constexpr int kValueBlocks = kHeadDimV / 2 / 64;                 // 4 M blocks of 64 dims per value warpgroup
constexpr int kPvSteps = kTileTokens / 16;                       // 4 k-steps of 16 keys
constexpr int kQtBlockBytes = 2 * kRows * 128;                   // 4096: a column block of Q's two terms
// QK accumulation groups in flight (1 promoted while the rest run; 4 measured
// the same as 2) and P^T buffers (3 measured the same as 2).
constexpr int kQkAccs = 2;
constexpr int kPBufs = 2;
// k-steps (of 18) per tensor-core accumulation group of the e4m3 QK, and the
// scale of Q's mid term. One: each k-step's 32-code product is added to the
// scores in fp32 (the e4m3 tensor cores accumulate with reduced precision,
// ptx_sm90.cuh). Measured at fp8 H = 16 (docs/performance.md): the LSE error
// grows with the logits' magnitude (~4e-5 of the largest), up to 1.3e-3 at
// logits of standard deviation 8 with one k-step per group and 2.1e-3 with
// two, over the tests' 2e-3 (two are ~6% faster at the largest shape); the
// mma.sync kernel's f16 QK stays below 5e-6.
constexpr int kQkStepsPerGroup = 1;
constexpr int kQkGroups = kHeadDimQK / 32 / kQkStepsPerGroup;  // 18
static_assert(kQkGroups * kQkStepsPerGroup * 32 == kHeadDimQK, "whole groups");
constexpr float kQMidScale = 16.f;

enum NamedBarrier : int {
  kBarQ = 1,         // wg 0: Q's terms stored
  kBarMax = 2,       // wg 0: the rescale vote; the per-warp maxima exchanged
  kBarSum = 3,       // wg 0: the per-warp sums exchanged (epilogue)
};

struct Smem {
  static constexpr int kQt = 0;
  static constexpr int kCodes = kQt + kCodeBlocks * kQtBlockBytes;
  static constexpr int kPt = kCodes + kCodeStages * kCodeStageBytes;
  static constexpr int kAlpha = kPt + kPBufs * kQBlockBytes;   // [kPBufs][16] fp32: rescale factors
  static constexpr int kRescale = kAlpha + kPBufs * kRows * 4;  // [kPBufs] u32: rescale flag
  static_assert(kPBufs >= 2 && kPBufs <= 4, "the flags take one 16-byte word");
  static constexpr int kMaxX = kRescale + 16;                   // [2 tiles][4 warps][16] fp32
  static constexpr int kSumX = kMaxX + 2 * 4 * kRows * 4;       // [4 warps][16] fp32
  static constexpr int kOutScale = kSumX + 4 * kRows * 4;       // [16] fp32: 1 / l times the cache scale
  static constexpr int kQScale = kOutScale + kRows * 4;         // [16] fp32: Q's per-head 2^-e
  static constexpr int kBars = kQScale + kRows * 4;
  static constexpr int kBarCodeFull = 0;                  // + stage
  static constexpr int kBarCodeEmpty = kCodeStages;       // + stage
  static constexpr int kBarPFull = 2 * kCodeStages;       // + buffer
  static constexpr int kBarPEmpty = 2 * kCodeStages + kPBufs;  // + buffer
  static constexpr int kBarEpilogue = 2 * kCodeStages + 2 * kPBufs;
  static constexpr int kBarCount = 2 * kCodeStages + 2 * kPBufs + 1;
  static constexpr int kTotal = kBars + kBarCount * 8;
};
static_assert(Smem::kCodes % 1024 == 0 && Smem::kPt % 1024 == 0 && kQBlockBytes % 1024 == 0,
              "swizzle atoms are 1024-byte aligned");
static_assert(Smem::kBars % 8 == 0, "mbarrier alignment");
constexpr int kCodeEmptyArrivals = 4 + 8;  // scorer warps + value warps

// Trace builds (trace.cuh; narrow_launch.cu prints them): CtaPhases of every
// CTA (the first narrow::kPhaseCtas in grid order) at 5 points, thread 0
// (scorer: start, Q stored, QK(0) done, QK(last) done, factors and LSE
// stored) and thread 128 (values: start, first tiles requested, PV(0) done,
// PV(last) done, outputs stored). The count is the CTA's tiles.
constexpr int kPhasePoints = 5;
constexpr int kPhaseWords = CtaPhases<kPhasePoints>::kWords;
#if MLA_TRACE_ENABLED
__device__ long long narrow_fp8_cta_phases[narrow::kPhaseCtas * 2 * kPhaseWords];
__device__ __forceinline__ long long* phase_buffer() { return narrow_fp8_cta_phases; }
#else
__device__ __forceinline__ long long* phase_buffer() { return nullptr; }
#endif

// Q of this CTA's 16 heads as two e4m3 terms for the e4m3 QK: hi = e4m3(x), mid =
// e4m3(16 (x - hi)), x = q 2^e per head (q_scale[head] = 2^-e), stored as
// 5 column blocks of 32 rows (the hi terms of heads 0..15, then the mid
// terms) x 128 codes, 128-byte swizzled (B of QK: K-major). Called by the
// 128 threads of one warpgroup (tid 0..127); the caller fences and syncs.
__device__ __forceinline__ void store_q_e4m3_terms(const MlaDecodeParams& p, const WorkItem& work, int tid,
                                                   uint32_t q_smem, float* q_scale) {
  // Thread tid handles head tid / 8,
  // 8-element chunks j = tid % 8 + 8m (m = 0..8), loaded straight from
  // global memory; heads past H (and every head of an orphan token) zero.
  // The head's 8 threads (lanes 8k..8k+7) share its maximum; inf becomes
  // NaN (e4m3 has no infinity; satfinite would clamp it to 448).
  const int row = tid >> 3, c8 = tid & 7;
  const int head = work.h0 + row;
  const bool valid = !work.orphan && head < p.num_heads;
  const uint4* src = reinterpret_cast<const uint4*>(
      static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(work.t) * p.q_stride_token +
      static_cast<int64_t>(valid ? head : 0) * p.q_stride_head);
  uint4 qv[kColBlocks];
  uint32_t amax = 0;
#pragma unroll
  for (int m = 0; m < kColBlocks; ++m) {
    qv[m] = valid ? __ldg(src + c8 + 8 * m) : make_uint4(0, 0, 0, 0);
    amax = bf16x8_finite_abs_max(qv[m], amax);
  }
  const float factor = q_row_pow2_scale<8, 134>(amax, row, c8, q_scale);  // max |q| 2^e in [2^7, 2^8)
#pragma unroll
  for (int m = 0; m < kColBlocks; ++m) {
    const uint32_t w[4] = {qv[m].x, qv[m].y, qv[m].z, qv[m].w};
    uint32_t hi[2] = {0, 0}, mid[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float x0 = __uint_as_float(w[i] << 16) * factor, x1 = __uint_as_float(w[i] & 0xFFFF0000u) * factor;
      x0 = isinf(x0) ? CUDART_NAN_F : x0;
      x1 = isinf(x1) ? CUDART_NAN_F : x1;
      const uint32_t h2 = f32x2_to_e4m3x2(x0, x1);
      const uint32_t back_bits = e4m3x2_to_f16x2<0>(h2);  // hi as f16 (exact)
      const __half2 back = *reinterpret_cast<const __half2*>(&back_bits);
      const uint32_t m2 = f32x2_to_e4m3x2((x0 - __low2float(back)) * kQMidScale,
                                          (x1 - __high2float(back)) * kQMidScale);
      hi[i >> 1] |= h2 << (16 * (i & 1));
      mid[i >> 1] |= m2 << (16 * (i & 1));
    }
    // Chunk j = c8 + 8m: dims 8j..8j+7, bytes 8 (j % 16).. of column block j / 16.
    const int j = c8 + 8 * m;
    const uint32_t blk = q_smem + (j >> 4) * kQtBlockBytes + 8 * (j & 1);
    const uint32_t a_hi = blk + row * 128 + ((((j & 15) >> 1) ^ (row & 7)) << 4);
    const uint32_t a_mid = blk + (kRows + row) * 128 + ((((j & 15) >> 1) ^ ((kRows + row) & 7)) << 4);
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(a_hi), "r"(hi[0]), "r"(hi[1]) : "memory");
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(a_mid), "r"(mid[0]), "r"(mid[1]) : "memory");
  }
}

// Codes of 16 keys x 16 dims as one A fragment (f16): r_lo / r_hi from
// ldmatrix .trans of keys 0..7 / 8..15 (see the top) -> a0 / a1 (A rows g /
// g + 8, keys 2c, 2c + 1) from r_lo, a2 / a3 (keys 8 + 2c, ..) from r_hi.
__device__ __forceinline__ void codes_to_a_fragment(uint32_t r_lo, uint32_t r_hi, uint32_t (&a)[4]) {
  const uint32_t lo = prmt(r_lo, 0, 0x3120), hi = prmt(r_hi, 0, 0x3120);
  a[0] = e4m3x2_to_f16x2<0>(lo);
  a[1] = e4m3x2_to_f16x2<1>(lo);
  a[2] = e4m3x2_to_f16x2<0>(hi);
  a[3] = e4m3x2_to_f16x2<1>(hi);
}

// kv_map: the tensor map over the cache codes (dims {576, cache rows}, boxes
// {128, 64}, 128-byte swizzle; encoded per call by tensor_map.cu).
__global__ void __launch_bounds__(kThreads, 1)
    decode_narrow_fp8_kernel(const DecodeLaunch args, const __grid_constant__ CodeTensorMap kv_map) {
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(1024) uint8_t smem[];
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;
  // -DMLA_DECODE_TRACE only (trace.cuh): this CTA's phase clocks.
  CtaPhases<kPhasePoints> phases;
  phases.start(phase_buffer(), narrow::kPhaseCtas);

  const uint32_t smem_base = smem_u32(smem);
  const uint32_t q_smem = smem_base + Smem::kQt;
  const uint32_t codes_smem = smem_base + Smem::kCodes;
  const uint32_t pt_smem = smem_base + Smem::kPt;
  float* alpha_x = reinterpret_cast<float*>(smem + Smem::kAlpha);
  uint32_t* rescale_x = reinterpret_cast<uint32_t*>(smem + Smem::kRescale);
  float* max_x = reinterpret_cast<float*>(smem + Smem::kMaxX);
  float* sum_x = reinterpret_cast<float*>(smem + Smem::kSumX);
  float* out_scale_x = reinterpret_cast<float*>(smem + Smem::kOutScale);
  float* q_scale = reinterpret_cast<float*>(smem + Smem::kQScale);

  const WorkItem work = locate_work<kTileTokens, kRows>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const uint32_t bars = smem_base + Smem::kBars;
  auto mbar = [&](int i) { return bars + 8 * i; };
  if (tid == 0) {
    for (int i = 0; i < kCodeStages; ++i) {
      mbar_init(mbar(Smem::kBarCodeFull + i), 1);
      mbar_init(mbar(Smem::kBarCodeEmpty + i), kCodeEmptyArrivals);
    }
    for (int i = 0; i < kPBufs; ++i) {
      mbar_init(mbar(Smem::kBarPFull + i), 128);
      mbar_init(mbar(Smem::kBarPEmpty + i), 256);
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
    store_q_e4m3_terms(p, work, tid, q_smem, q_scale);
    fence_proxy_async_shared();
    bar_sync(kBarQ, 128);
    phases.mark(1);

    // Accumulator layout (m64n16 of fp32): s[4j + 2r + e] = (key 16 warp + g
    // + 8r, head 8j + 2c + e); this thread's heads hd[2j + e] = 8j + 2c + e.
    const int key0 = 16 * warp + g;
    float head_scale[4];  // log2-domain score scale per head: times the cache scale and Q's 2^-e
    {
      const float scale = p.sm_scale * 1.4426950408889634f * __ldg(p.fp8_scale);
#pragma unroll
      for (int i = 0; i < 4; ++i) head_scale[i] = scale * q_scale[8 * (i >> 1) + 2 * c + (i & 1)];
    }
    float m_run[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
    float l_part[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's keys only (reduced at the end)

    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kCodeStages;
      const int buf = t % kPBufs;
      // S^T = K Q^T from the codes: each k-step accumulated by the tensor
      // cores from zero into acc[step % kQkAccs] and added to s in fp32 (hi +
      // mid / 16) while the next ones run.
      float s[8];
      {
        mbar_wait(mbar(Smem::kBarCodeFull + stage), (t / kCodeStages) & 1);
        const uint64_t desc_k0 =
            opaque(smem_desc_sw128(codes_smem + stage * kCodeStageBytes, 16, kSwizzleGroupBytes));
        const uint64_t desc_q0 = opaque(smem_desc_sw128(q_smem, 16, kSwizzleGroupBytes));
        float acc[kQkAccs][16];
        auto promote = [&](float(&a)[16]) {
          pin(a);
#pragma unroll
          for (int i = 0; i < 8; ++i) s[i] += fmaf(a[8 + i], 1.f / kQMidScale, a[i]);
        };
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] = 0.f;
        // kQkAccs - 1 groups in flight: group grp's result is promoted once
        // group grp + kQkAccs - 1 is issued.
#pragma unroll
        for (int grp = 0; grp < kQkGroups; ++grp) {
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < kQkStepsPerGroup; ++k) {
            const int ks = grp * kQkStepsPerGroup + k;  // 32 codes: column block ks / 4, bytes 32 (ks % 4)..
            const uint64_t desc_k = desc_k0 + (((ks / 4) * kCodeBlockBytes + (ks % 4) * 32) >> 4);
            const uint64_t desc_q = desc_q0 + (((ks / 4) * kQtBlockBytes + (ks % 4) * 32) >> 4);
            if (k == 0) wgmma_m64n32k32_e4m3_ss_first(acc[grp % kQkAccs], desc_k, desc_q);
            else wgmma_m64n32k32_e4m3_ss<true>(acc[grp % kQkAccs], desc_k, desc_q);
          }
          wgmma_commit();
          if (grp >= kQkAccs - 1) {
            wgmma_wait<kQkAccs - 1>();  // group grp - (kQkAccs - 1) is complete
            promote(acc[(grp - (kQkAccs - 1)) % kQkAccs]);
          }
        }
        // The last kQkAccs - 1 groups.
#pragma unroll
        for (int grp = kQkGroups - (kQkAccs - 1); grp < kQkGroups; ++grp) {
          wgmma_wait_dynamic(kQkGroups - 1 - grp);
          promote(acc[grp % kQkAccs]);
        }
        if (lane == 0) mbar_arrive(mbar(Smem::kBarCodeEmpty + stage));  // this warp's QK reads are done
        if (t == 0) phases.mark(2);
        if (t == n_tiles - 1) phases.mark(3);
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
          float v = s[4 * (i >> 1) + 2 * r + (i & 1)] * head_scale[i];
          v = past ? -CUDART_INF_F : (is_bad ? CUDART_NAN_F : v);
          s[4 * (i >> 1) + 2 * r + (i & 1)] = v;
          over |= v > m_run[i] + kLazyLog2;
        }
      }
      // Lazy rescaling (as the narrow kernel): the running reference m_run
      // stays while no score exceeds it by more than kLazyLog2; otherwise a
      // head's maximum over the tile (the 8 lanes with the same c, then the
      // 4 warps through shared memory, double-buffered by tile parity) and
      // the factors alpha that the value warpgroups apply to O^T before
      // tile t's PV.
      const bool rescale = bar_sync_or(kBarMax, 128, over);
      float alpha[4] = {1.f, 1.f, 1.f, 1.f};
      if (rescale) narrow::raise_reference(s, max_x + (t & 1) * 4 * kRows, kBarMax, warp, g, c, m_run, l_part, alpha);
      uint32_t p_pairs[4];
      narrow::probabilities<true>(s, m_run, l_part, p_pairs);
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
        out_scale_x[hd] = nan ? CUDART_NAN_F : (l > 0.f ? __ldg(p.fp8_scale) / l : 0.f);  // V's dequantisation too
        const int h = work.h0 + hd;
        if (h < p.num_heads) store_head_lse(args, work, h, rows, m_run[i], l);
      }
    }
    mbar_arrive(mbar(Smem::kBarEpilogue));  // the factors stored
    phases.finish(n_tiles);
  } else {
    // ========================== value warpgroups =============================
    const int vt = tid - 128;
    const int vwg = vt / 128;  // dims 256 vwg..
    // ldmatrix addresses: lane l gives row l % 8 of matrix l / 8 (keys 8 (l /
    // 8) + l % 8 of a 32-key half tile); the 16-byte chunk of dims d0.. in
    // the swizzled 128-code row (chunk ^ key % 8). d0 % 128 / 16 = 4 (mb % 2)
    // + warp, column block 2 vwg + mb / 2.
    const int mi = lane >> 3, ri = lane & 7;
    uint32_t lane_off[2];
#pragma unroll
    for (int par = 0; par < 2; ++par) lane_off[par] = (8 * mi + ri) * 128 + (((4 * par + warp) ^ ri) << 4);

    const bool stream_kv = args.stream_kv;  // small cache: L2 evict_first (ptx_sm90.cuh)
    const uint64_t kv_policy = l2_evict_first_policy();
    auto issue_code_tile = [&](int tile) {
      const int stage = tile % kCodeStages;
      const uint32_t bar = mbar(Smem::kBarCodeFull + stage);
      const uint32_t dst = codes_smem + stage * kCodeStageBytes;
      const int y = static_cast<int>(contiguous_base + kv_begin + tile * kTileTokens);
      mbar_arrive_expect_tx(bar, kCodeStageBytes);
#pragma unroll
      for (int blk = 0; blk < kCodeBlocks; ++blk) {
        tma_load_2d_maybe_stream(dst + blk * kCodeBlockBytes, &kv_map, 128 * blk, y, bar, stream_kv, kv_policy);
      }
    };
    if (vt == 0) {
      for (int tile = 0; tile < kCodeStages && tile < n_tiles; ++tile) issue_code_tile(tile);
    }
    phases.mark(1);

    float o[kValueBlocks][8];  // O^T: o[mb][4j + 2r + e] = (dim d0(mb) + 2g + r, head 8j + 2c + e)
#pragma unroll
    for (int mb = 0; mb < kValueBlocks; ++mb) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
    }
    uint32_t a[kValueBlocks][kPvSteps][4];  // the tile's A fragments (V^T in f16)

    for (int t = 0; t < n_tiles; ++t) {
      const int stage = t % kCodeStages;
      const int buf = t % kPBufs;
      mbar_wait(mbar(Smem::kBarCodeFull + stage), (t / kCodeStages) & 1);
      // Keys of the tile inside the split (the rest: zeros, their codes may
      // be another item's or NaN).
      const int valid = kv_end - (kv_begin + t * kTileTokens);
      const uint32_t stage_base = codes_smem + stage * kCodeStageBytes + vwg * 2 * kCodeBlockBytes;
#pragma unroll
      for (int mb = 0; mb < kValueBlocks; ++mb) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // keys 32 half..
          uint32_t r[4];
          ldmatrix_x4_trans(r, stage_base + (mb >> 1) * kCodeBlockBytes + lane_off[mb & 1] + half * 32 * 128);
          if (valid < kTileTokens) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const int key = 32 * half + 8 * m + 2 * c;
              r[m] &= (key < valid ? 0x0000FFFFu : 0u) | (key + 1 < valid ? 0xFFFF0000u : 0u);
            }
          }
          codes_to_a_fragment(r[0], r[1], a[mb][2 * half]);
          codes_to_a_fragment(r[2], r[3], a[mb][2 * half + 1]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(mbar(Smem::kBarCodeEmpty + stage));  // this warp's reads are done
      if (vt == 0 && t + kCodeStages < n_tiles) {
        // The stage takes tile t + kCodeStages once all its readers are done
        // (the scorer's QK of tile t is, by the time P^T of tile t is stored).
        mbar_wait(mbar(Smem::kBarCodeEmpty + stage), (t / kCodeStages) & 1);
        issue_code_tile(t + kCodeStages);
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
          wgmma_m64n16k16_f16_rs(o[mb], a[mb][kk], desc_p0 + ((32 * kk) >> 4));
        }
      }
      wgmma_commit();
      // PV of tile t complete: the A registers may be overwritten and the P
      // buffer refilled. (Waited here, not at the next iteration's top: a
      // group pending across the loop's back edge makes ptxas serialise
      // every wgmma of the kernel, C7515. The A registers are single-buffered,
      // so the next tile's conversion could not overlap this PV anyway.)
      wgmma_wait<0>();
      pin(o);
      mbar_arrive(mbar(Smem::kBarPEmpty + buf));  // every value thread (its reads of the flag and factors)
      if (t == 0) phases.mark(2);
      if (t == n_tiles - 1) phases.mark(3);
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
        const int dim = 256 * vwg + 64 * mb + 16 * warp + 2 * g;  // and dim + 1
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
    phases.finish(n_tiles);
  }
#endif  // MLA_SM90A_DEVICE
}

}  // namespace narrow_fp8
}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

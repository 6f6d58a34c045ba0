// Split-KV MLA decode for an OCP fp8, MXFP4 or bf16 cache on Hopper (sm_90a)
// with few heads (H < 64, head groups of 16): the "narrow" kernel. The plan
// runs it above size thresholds (plan/tuning.h, narrow_pays_off in
// plan/plan.cpp); OCP fp8 whose rows TMA can address (indptr layout) takes the
// register-V kernel instead (narrow_register_v_kernel.cuh), so fp8 runs here
// only where that kernel cannot (other layouts, no tensor maps) or when forced.
// bf16 (indptr layout only) needs no decode: its tiles land by TMA straight
// into the slot's layout below (one thread of wg 1 issues them; wg 1 and 2 do
// nothing else), and the split's last tile has its rows past the end zeroed
// before PV, since they may hold another item's keys or NaN.
//
// At H = 16 a wgmma with the heads as M (64 rows) would waste 3/4 of every
// instruction, so the keys are M and the heads N:
//   S^T (64 keys x 16 heads)  = K Q^T:   36 x wgmma m64n16k16, A = the key
//                                        tile (K-major), B = Q (K-major)
//   O^T (512 dims x 16 heads) += V^T P^T: 8 M blocks x 4 k-steps of
//                                        m64n16k16, A = V^T (the same stored
//                                        tile read M-major: the transpose bit
//                                        that 16-bit types allow), B = P^T
// with the cache decoded into f16 (fp8; Q scaled per head into f16 as in the
// wide kernel) or bf16 (MXFP4) by producer warpgroups, so the cache is read
// from DRAM once, in its stored format, and decoded once per key per CTA.
// MXFP4 tiles (and Q) hold each 8-dim group in the order (0, 4, 1, 5, 2, 6,
// 3, 7) that the bit decode produces; the epilogue maps O^T's rows back.
//
// Grid and outputs: as every split kernel (launch_contract.h), with head groups
// of kNarrowRows = 16 heads: x = query token * head_groups + head group,
// y = KV split; one split writes bf16 out and lse, several write fp32
// partials for combine_kernel.
//
// Block: 384 threads (MXFP4: 512), one CTA per SM (shared memory).
//   wg 0 (consumer):  QK, the online softmax along M with lazy rescaling (the
//                     running reference maximum stays until a score exceeds
//                     it by 2^8; only then a head's maximum over the tile's 64
//                     keys: shuffles and an exchange among the 4 warps), P^T
//                     to shared memory, O^T = alpha O^T + V^T P^T (64 fp32
//                     registers), the epilogue.
//   wg 1, 2 (producers; MXFP4: wg 1-3, a third of the dims each): the codes
//                     of two tiles in flight in registers; the next tile
//                     decoded into registers, then stored into its slot once
//                     the tile that held the slot is through PV.
//
// Shared memory (operands 128-byte swizzled: tile_loader.cuh, ptx_sm90.cuh):
//   Q        16 heads x 576 dims, 9 column blocks of 16 rows (2 KB each)
//   K/V ring 2 x (64 keys x 576 dims, 16-bit), 9 column blocks of 64 rows
//   P^T      16 heads x 64 keys (one column block of 16 rows)
//   the per-warp maxima exchange [2][4][16], the per-warp sums [4][16],
//   bad-row flags, mbarriers, fp8's per-head Q scale. 168,864 bytes
//   (164.9 KiB; Smem below).
//
// Synchronisation (mbarriers; named barriers only within wg 0):
//   full[slot]   producers arrive once tile t is stored into `slot` and
//                fenced for the tensor cores (bf16: the TMA issuer's arrival
//                with the tile's byte count, completed by the copies); the
//                consumer waits before QK.
//   empty[slot]  the consumer arrives once tile t's PV is complete; the
//                producers wait before storing tile t+2 into the slot.
//
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "common/addressing.h"
#include "common/params.h"
#include "kernels/common/launch_contract.h"
#include "kernels/common/trace.cuh"
#include "kernels/common/work.cuh"
#include "kernels/sm80/ptx_sm80.cuh"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/sm90/tensor_map.h"
#include "kernels/sm90/tile_loader.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {
namespace narrow {

// Block size: the consumer warpgroup and two producer warpgroups (fp8; bf16's
// TMA issuer needs one thread of them), three for MXFP4, whose decode was
// latency-bound with two (docs/performance.md, "Where the time goes").
template <KvFormat F>
constexpr int kThreadsOf = F == KvFormat::kMxfp4 ? 512 : 384;
constexpr int kMxProducerThreads = 384;
constexpr int kRows = kNarrowRows;                      // 16 heads: the N of every wgmma
constexpr int kTileTokens = 64;                         // keys per tile: the M of QK, the K of PV
constexpr int kColBlocks = kHeadDimQK / 64;             // 9 column blocks of 64 dims (128 bytes per row)
constexpr int kQBlockBytes = kRows * 128;               // 2048: one column block of Q (or of P^T)
constexpr int kQBytes = kColBlocks * kQBlockBytes;      // 18432
constexpr int kBlockBytes = kTileTokens * 128;          // 8192: one column block of a stage
constexpr int kStageBytes = kColBlocks * kBlockBytes;   // 73728
constexpr int kStages = 2;
constexpr int kSwizzleGroupBytes = 8 * 128;             // SBO: 8 rows of 128 bytes
constexpr int kTokensPerLoaderWarp = 32 / kLoadersPerToken;         // 8: one bad-row word each
constexpr int kFlagWords = kTileTokens / kTokensPerLoaderWarp;      // 8 per stage (MXFP4 uses 4)

enum NamedBarrier : int {
  kBarQ = 1,    // wg 0: Q stored
  kBarMax = 2,  // wg 0: the per-warp maxima of a tile exchanged
  kBarP = 3,    // wg 0: P^T stored (and fenced) before PV
  kBarSum = 4,  // wg 0: the per-warp sums exchanged (epilogue)
};
enum MBarrier : int {
  kMbFull = 0,   // + slot [the producers: 256, MXFP4 384; bf16 1]
  kMbEmpty = 2,  // + slot [128: wg 0]
  kMbCount = 4,
};

struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + kQBytes;
  static constexpr int kPt = kKv + kStages * kStageBytes;   // 16 x 64 16-bit: one column block
  static constexpr int kMaxX = kPt + kQBlockBytes;          // [2 tiles][4 warps][16] fp32
  static constexpr int kSumX = kMaxX + 2 * 4 * kRows * 4;   // [4 warps][16] fp32
  static constexpr int kFlags = kSumX + 4 * kRows * 4;      // [2 stages][8] u32: bad-row bits
  static constexpr int kBars = kFlags + kStages * kFlagWords * 4;
  static constexpr int kQScale = kBars + kMbCount * 8;      // [16] fp32: fp8's per-head 2^-e of Q
  static constexpr int kTotal = kQScale + kRows * 4;
};
static_assert(Smem::kKv % 1024 == 0 && Smem::kPt % 1024 == 0, "swizzle atoms are 1024-byte aligned");
static_assert(Smem::kBars % 8 == 0, "mbarrier alignment");

// Trace builds (trace.cuh; narrow_launch.cu prints them): CtaPhases of every
// CTA (the first kPhaseCtas in grid order) at 6 points, thread 0 (consumer:
// start, Q stored, QK(0) done, QK(last) done, PV(last) done, outputs stored)
// and thread 128 (producers: start and end only). The count is the CTA's
// tiles.
constexpr int kPhasePoints = 6, kPhaseCtas = 2048;
constexpr int kPhaseWords = CtaPhases<kPhasePoints>::kWords;
#if MLA_TRACE_ENABLED
__device__ long long narrow_cta_phases[kPhaseCtas * 2 * kPhaseWords];
__device__ __forceinline__ long long* phase_buffer() { return narrow_cta_phases; }
#else
__device__ __forceinline__ long long* phase_buffer() { return nullptr; }
#endif


// A descriptor whose value the compiler must treat as unknown here, so the
// descriptors derived from it by constant adds are computed where they are
// used instead of being hoisted out of the tile loop (36 + 32 of them would
// not fit next to O).
__device__ __forceinline__ uint64_t opaque(uint64_t x) {
  asm volatile("" : "+l"(x));
  return x;
}

// Register budgets (setmaxnreg, fp8 and bf16): the consumer holds O^T (64), S
// (8) and the softmax state (ptxas allocates within the decreased budget: at
// 112 it spills); the producers two tiles of codes (2 x 36) and one decoded
// tile (72). 136 + 2 x 184 fits the 168 x 384 the launch reserves. MXFP4's 512
// threads get 128 each and keep them (its producers hold 2 x 15 registers of
// codes and a decoded third of a tile, 48).
constexpr int kConsumerRegs = 136;
// Lazy rescaling threshold (log2 domain): P = exp2(s - m_run) <= 2^8.
constexpr float kLazyLog2 = 8.f;
constexpr int kProducerRegs = 184;

// MXFP4 decode of one 16-code chunk (8 bytes) with block scale byte E into 8
// bf16x2 words: word i < 4 holds codes (i, i + 4) of the low 8 codes, word 4 + i
// those of the high 8, i.e. each 8-dim group lands in dim order (0, 4, 1, 5,
// 2, 6, 3, 7), the order e2m1_pair_bits produces without a byte permute. Q is
// stored in the same order and the epilogue maps O^T's rows back (kMxDimOrder).
struct MxChunkBf16 {
  uint32_t w[8];
};
// Pair P of the 8 codes in w (codes P and P + 4): with one factor (E <= 128,
// where 2^(E-1) is a normal bf16: the common case, block maxima below 2^4)
// or two (any E).
template <bool kOneFactor, int P>
__device__ __forceinline__ uint32_t mx_pair_to_bf16(uint32_t w, uint32_t scale) {
  if constexpr (kOneFactor) return e2m1_pair_bits_one_factor<P>(w, scale);
  else return e2m1_pair_bits<P>(w, scale);
}
template <bool kOneFactor>
__device__ __forceinline__ MxChunkBf16 mx_chunk_to_bf16(uint2 codes, uint32_t e) {
  const uint32_t scale = kOneFactor ? e8m0_to_bf16_one_factor(e) : e8m0_to_bf16_scale_pair(e);
  return MxChunkBf16{{mx_pair_to_bf16<kOneFactor, 0>(codes.x, scale), mx_pair_to_bf16<kOneFactor, 1>(codes.x, scale),
                      mx_pair_to_bf16<kOneFactor, 2>(codes.x, scale), mx_pair_to_bf16<kOneFactor, 3>(codes.x, scale),
                      mx_pair_to_bf16<kOneFactor, 0>(codes.y, scale), mx_pair_to_bf16<kOneFactor, 1>(codes.y, scale),
                      mx_pair_to_bf16<kOneFactor, 2>(codes.y, scale), mx_pair_to_bf16<kOneFactor, 3>(codes.y, scale)}};
}
// E > 128 (and the NaN block, E = 255). Not inlined: rare, and nine inlined
// copies per stored tile overflow the instruction cache (a duplicated decode
// loop was measured to add 16% of no-instruction stalls).
__device__ __noinline__ MxChunkBf16 mx_chunk_to_bf16_two_factors(uint2 codes, uint32_t e) {
  return mx_chunk_to_bf16<false>(codes, e);
}
// The dim stored at position j of an 8-dim group (MXFP4; fp8 keeps dim order).
__device__ __forceinline__ int mx_dim_of_position(int j) { return (j >> 1) + 4 * (j & 1); }

// ---- softmax pieces shared with the register-V kernel ----------------------
// Scores in the m64n16 accumulator layout: s[4j + 2r + e] = (key 16 warp + g +
// 8r, head 8j + 2c + e); this thread's heads hd[2j + e] = 8j + 2c + e.

// The lazy rescale's slow path, once the vote has fired (warpgroup-uniform):
// a head's maximum over the tile (the 8 lanes with the same c, then the 4
// warps through mx_buf, [4 warps][16], with a named barrier of the 128
// threads), the new reference m_run, its factor alpha, and l_part rescaled.
__device__ __forceinline__ void raise_reference(const float (&s)[8], float* mx_buf, int bar_id, int warp, int g,
                                                int c, float (&m_run)[4], float (&l_part)[4], float (&alpha)[4]) {
  float mx[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    mx[i] = fmaxf(s[4 * (i >> 1) + (i & 1)], s[4 * (i >> 1) + 2 + (i & 1)]);
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 4));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 8));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 16));
  }
  if (g == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) mx_buf[warp * kRows + 8 * (i >> 1) + 2 * c + (i & 1)] = mx[i];
  }
  bar_sync(bar_id, 128);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int hd = 8 * (i >> 1) + 2 * c + (i & 1);
    const float m_tile =
        fmaxf(fmaxf(mx_buf[hd], mx_buf[kRows + hd]), fmaxf(mx_buf[2 * kRows + hd], mx_buf[3 * kRows + hd]));
    const float m_new = fmaxf(m_run[i], m_tile);
    alpha[i] = exp2f(m_run[i] - (m_new == -CUDART_INF_F ? 0.f : m_new));
    m_run[i] = m_new;
    l_part[i] *= alpha[i];
  }
}

// P = exp2(s - m_run) added to the row sums l_part and packed in pairs:
// p_pairs[2j + r] = keys 16 warp + g + 8r, heads 8j + 2c, 8j + 2c + 1 (f16
// for the fp8 operands, else bf16).
template <bool kF16>
__device__ __forceinline__ void probabilities(const float (&s)[8], const float (&m_run)[4], float (&l_part)[4],
                                              uint32_t (&p_pairs)[4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float pv[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * j + e;  // head slot
        const float m_ref = m_run[i] == -CUDART_INF_F ? 0.f : m_run[i];
        pv[e] = exp2f(s[4 * j + 2 * r + e] - m_ref);
        l_part[i] += pv[e];
      }
      if constexpr (kF16) {
        const __half2 h = __floats2half2_rn(pv[0], pv[1]);
        p_pairs[2 * j + r] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        p_pairs[2 * j + r] = mla_pack_bf16x2(pv[0], pv[1]);
      }
    }
  }
}

// P^T (B of PV: keys along K, heads along N, K-major) into the 16 x 64
// 128-byte-swizzled block at pt: row = head, 16-byte chunk = key / 8,
// element key % 8. The fragment of keys 16 warp + 8r.. x heads 8j.. is an
// m8n8 matrix in the mma layout (row = key), so one stmatrix .trans per warp
// stores all four: matrix 2j + r lands as the rows of heads 8j.. (lane 8(2j
// + r) + h gives the address of head 8j + h), chunk 2 warp + r.
__device__ __forceinline__ void store_p_transposed(uint32_t pt, const uint32_t (&p_pairs)[4], int warp, int lane) {
  const int mat = lane >> 3, hd = 8 * (mat >> 1) + (lane & 7), chunk = 2 * warp + (mat & 1);
  const uint32_t addr = pt + hd * 128 + ((chunk ^ (hd & 7)) << 4);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(p_pairs[0]), "r"(p_pairs[1]), "r"(p_pairs[2]), "r"(p_pairs[3])
               : "memory");
}

// The row sums over the tile's 64 keys: l_part reduced over the 8 lanes with
// the same c, then written per warp into sum_x ([4 warps][16]); the caller
// syncs and adds the four.
__device__ __forceinline__ void publish_row_sums(float (&l_part)[4], float* sum_x, int warp, int g, int c) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 4);
    l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 8);
    l_part[i] += __shfl_xor_sync(0xffffffffu, l_part[i], 16);
  }
  if (g == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sum_x[warp * kRows + 8 * (i >> 1) + 2 * c + (i & 1)] = l_part[i];
  }
}

// kv_map (bf16 only; the other formats ignore it): the tensor map over the
// cache rows (dims {576, cache rows} bf16, boxes {64, 64}, 128-byte swizzle:
// one column block of a slot per box; encoded per call by tensor_map.cu).
template <KvFormat F>
__global__ void __launch_bounds__(kThreadsOf<F>, 1)
    decode_narrow_kernel(const DecodeLaunch args, const __grid_constant__ CodeTensorMap kv_map) {
  constexpr bool kFp8 = F == KvFormat::kFp8E4M3FN;  // f16 operands; MXFP4 and bf16: bf16
  constexpr bool kMx = F == KvFormat::kMxfp4;
  constexpr bool kBf16 = F == KvFormat::kBf16;     // tiles land by TMA, no producers' decode
  static_assert(kFp8 || kMx || kBf16, "OCP fp8, MXFP4 or bf16");
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
  const uint32_t kv_smem = smem_base + Smem::kKv;
  const uint32_t pt_smem = smem_base + Smem::kPt;
  float* max_x = reinterpret_cast<float*>(smem + Smem::kMaxX);
  float* sum_x = reinterpret_cast<float*>(smem + Smem::kSumX);
  uint32_t* flags = reinterpret_cast<uint32_t*>(smem + Smem::kFlags);
  float* q_scale = reinterpret_cast<float*>(smem + Smem::kQScale);

  // -DMLA_DECODE_TRACE only (trace.cuh): this CTA's phase clocks.
  CtaPhases<kPhasePoints> phases;
  phases.start(phase_buffer(), kPhaseCtas);

  const WorkItem work = locate_work<kTileTokens, kRows>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const uint32_t bars = smem_base + Smem::kBars;
  auto mbar = [&](int i) { return bars + 8 * i; };
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      // the producer threads; bf16: the TMA issuer (+ bytes)
      mbar_init(mbar(kMbFull + i), kBf16 ? 1 : (kMx ? kMxProducerThreads : kLoaderThreads));
      mbar_init(mbar(kMbEmpty + i), 128);
    }
    // bf16: TMA (the async proxy) completes the full barriers; make their
    // initialisation visible to it before the first load is issued.
    if constexpr (kBf16) fence_mbarrier_init();
  }
  // The indptr layout's cache rows: kv_indptr[b] + j.
  const int64_t contiguous_base =
      (p.layout == KvLayout::kIndptr && !work.orphan) ? static_cast<int64_t>(__ldg(p.kv_indptr + work.b)) : 0;
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  if (wg == 0) {
    // ============================ consumer ===================================
    if constexpr (!kMx) setmaxnreg_dec<kConsumerRegs>();  // MXFP4: 512 x 128 registers as launched
    {
      // Q: thread tid copies row tid / 8, chunks tid % 8 + 8m (m = 0..8), heads
      // past H (and every head of an orphan token) zero. fp8: scaled per head
      // into f16 as in the wide kernel (the head's 8 threads are lanes 8k..8k+7).
      const int row = tid >> 3, c8 = tid & 7;
      const int head = work.h0 + row;
      const bool valid = !work.orphan && head < p.num_heads;
      const uint8_t* src = static_cast<const uint8_t*>(p.q) +
                           2 * (static_cast<int64_t>(work.t) * p.q_stride_token +
                                static_cast<int64_t>(valid ? head : 0) * p.q_stride_head) +
                           16 * c8;
#pragma unroll
      for (int m = 0; m < kColBlocks; ++m) {
        cp_async_16(q_smem + swizzled_offset(row, c8 + 8 * m, kQBlockBytes), src + 128 * m, valid ? 16 : 0);
      }
      cp_async_commit();
      cp_async_wait<0>();
      if constexpr (kFp8) {
        scale_q_row_to_f16<8>(q_smem, row, c8, kQBlockBytes, q_scale);  // the head's 8 lanes: 8k..8k+7
      } else if constexpr (kMx) {
        // MXFP4: each 8-dim group of Q into the producers' dim order (0, 4,
        // 1, 5, 2, 6, 3, 7) (mx_chunk_to_bf16_*); this thread's own chunks.
#pragma unroll
        for (int m = 0; m < kColBlocks; ++m) {
          const uint32_t addr = q_smem + swizzled_offset(row, c8 + 8 * m, kQBlockBytes);
          uint4 v;
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                       : "r"(addr));
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(prmt(v.x, v.z, 0x5410)),
                       "r"(prmt(v.x, v.z, 0x7632)), "r"(prmt(v.y, v.w, 0x5410)), "r"(prmt(v.y, v.w, 0x7632))
                       : "memory");
        }
      }
      fence_proxy_async_shared();
      bar_sync(kBarQ, 128);
    }
    phases.mark(1);

    // Accumulator layout (m64n16): s[4j + 2r + e] = (key 16 warp + g + 8r,
    // head 8j + 2c + e); this thread's heads hd[2j + e] = 8j + 2c + e.
    const int key0 = 16 * warp + g;
    float head_scale[4];  // log2-domain score scale per head (fp8: times the cache scale and 2^-e)
    {
      const float scale_log2 = p.sm_scale * 1.4426950408889634f;
      const float kv_scale = kFp8 ? __ldg(p.fp8_scale) : 1.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hd = 8 * (i >> 1) + 2 * c + (i & 1);
        head_scale[i] = kFp8 ? scale_log2 * kv_scale * q_scale[hd] : scale_log2;
      }
    }
    float m_run[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
    float l_part[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's keys only (reduced at the end)
    float o[8][8];                           // O^T: o[mb][4j + 2r + e] = (dim 64 mb + key0-like row, head)
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
    }

    for (int t = 0; t < n_tiles; ++t) {
      const int slot = t % kStages;
      const uint32_t stage = kv_smem + slot * kStageBytes;
      float s[8];
      {
        mbar_wait(mbar(kMbFull + slot), (t / kStages) & 1);  // tile t decoded

        wgmma_fence();
        const uint64_t desc_k0 = opaque(smem_desc_sw128(stage, 16, kSwizzleGroupBytes));
        const uint64_t desc_q0 = opaque(smem_desc_sw128(q_smem, 16, kSwizzleGroupBytes));
#pragma unroll
        for (int ks = 0; ks < kHeadDimQK / 16; ++ks) {
          const uint64_t desc_k = desc_k0 + (((ks / 4) * kBlockBytes + (ks % 4) * 32) >> 4);
          const uint64_t desc_q = desc_q0 + (((ks / 4) * kQBlockBytes + (ks % 4) * 32) >> 4);
          if (ks == 0) wgmma_m64n16k16_ss<kFp8, false, false>(s, desc_k, desc_q);
          else wgmma_m64n16k16_ss<kFp8, true, false>(s, desc_k, desc_q);
        }
        wgmma_commit();
        if (t > 0) {
          // Tile t-1's PV (the older group) is complete: its slot may be refilled.
          wgmma_wait<1>();
          pin(o);
          mbar_arrive(mbar(kMbEmpty + (t - 1) % kStages));
        }
        wgmma_wait<0>();
        pin(s);
        if (t == 0) phases.mark(2);
        if (t == n_tiles - 1) phases.mark(3);
      }

      // Masks: keys past the split -inf, bad indices NaN (flag word of key k:
      // k / 8, bit 4 (k % 8), as the producers write them). Scores to the
      // log2 domain (times the head's scale).
      const int tok0 = kv_begin + t * kTileTokens;
      const uint32_t* bad_words = flags + slot * kFlagWords;
      bool over = false;  // a score above m_run + kLazyLog2 (NaN compares false)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = key0 + 8 * r;
        const bool past = tok0 + key >= kv_end;
        bool is_bad;
        if constexpr (kBf16) {
          // Rows outside the cache (TMA zero-filled them).
          const int64_t row = contiguous_base + tok0 + key;
          is_bad = row < 0 || row >= p.num_cache_rows;
        } else {
          is_bad = kMx ? (bad_words[key / 16] >> (2 * (key % 16))) & 1u  // MXFP4: 2 lanes per key
                       : (bad_words[key / kTokensPerLoaderWarp] >> (kLoadersPerToken * (key % kTokensPerLoaderWarp))) & 1u;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // i = 2j + e
          float v = s[4 * (i >> 1) + 2 * r + (i & 1)] * head_scale[i];
          v = past ? -CUDART_INF_F : (is_bad ? CUDART_NAN_F : v);
          s[4 * (i >> 1) + 2 * r + (i & 1)] = v;
          over |= v > m_run[i] + kLazyLog2;
        }
      }
      // Lazy rescaling: P = exp2(s - m_run) with the running reference m_run
      // kept while no score of the tile exceeds it by more than kLazyLog2
      // (P <= 2^8: exact enough in f16 / bf16, far from overflow), so most
      // tiles need neither the per-head maximum over the 4 warps (shuffles,
      // a shared-memory exchange, a barrier) nor the O^T rescale; the vote
      // is one barrier. The LSE is m_run + log2(l) either way.
      if (bar_sync_or(kBarMax, 128, over)) {
        float alpha[4];
        raise_reference(s, max_x + (t & 1) * 4 * kRows, kBarMax, warp, g, c, m_run, l_part, alpha);
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f || alpha[2] != 1.f || alpha[3] != 1.f)) {
#pragma unroll
          for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
            for (int i = 0; i < 8; ++i) o[mb][i] *= alpha[2 * (i >> 2) + (i & 1)];
          }
        }
      }
      if constexpr (kBf16) {
        // The split's last tile: rows past its end may hold another item's
        // keys or NaN (P = 0 times NaN would reach O^T), so dims 0..511 of
        // those rows are zeroed before PV (the fence below covers the stores).
        zero_rows_past_split(stage, kv_end - tok0, tid, kBlockBytes);
      }
      uint32_t p_pairs[4];
      probabilities<kFp8>(s, m_run, l_part, p_pairs);
      store_p_transposed(pt_smem, p_pairs, warp, lane);
      fence_proxy_async_shared();
      bar_sync(kBarP, 128);

      wgmma_fence();
      const uint64_t desc_v0 = opaque(smem_desc_sw128(stage, kBlockBytes, kSwizzleGroupBytes));
      const uint64_t desc_p0 = opaque(smem_desc_sw128(pt_smem, 16, kSwizzleGroupBytes));
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
        for (int kk = 0; kk < kTileTokens / 16; ++kk) {
          // A = V^T: dims 64 mb.. (one column block) x keys 16 kk.. (16 rows),
          // M-major; B = P^T: keys 16 kk.. (32 bytes on) x 16 heads, K-major.
          // (Start-address field steps by constant adds; no carry: < 2^18.)
          const uint64_t desc_v = desc_v0 + ((mb * kBlockBytes + kk * 16 * 128) >> 4);
          const uint64_t desc_p = desc_p0 + ((32 * kk) >> 4);
          wgmma_m64n16k16_ss<kFp8, true, true>(o[mb], desc_v, desc_p);
        }
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
    pin(o);
    phases.mark(4);

    // ---- epilogue: l per head over the 64 rows of keys, O^T / l ------------
    publish_row_sums(l_part, sum_x, warp, g, c);
    bar_sync(kBarSum, 128);
    float inv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int hd = 8 * (i >> 1) + 2 * c + (i & 1);
      const float l = sum_x[hd] + sum_x[kRows + hd] + sum_x[2 * kRows + hd] + sum_x[3 * kRows + hd];
      inv[i] = l > 0.f ? 1.f / l : 0.f;
      if constexpr (kFp8) inv[i] *= __ldg(p.fp8_scale);  // V's dequantisation
      if (isnan(l) || work.orphan) inv[i] = CUDART_NAN_F;
      const int h = work.h0 + hd;
      if (warp == 0 && g == 0 && h < p.num_heads) store_head_lse(args, work, h, rows, m_run[i], l);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = work.h0 + 8 * (i >> 1) + 2 * c + (i & 1);
      if (h >= p.num_heads) continue;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int dim = 64 * mb + 16 * warp + 8 * r + (kMx ? mx_dim_of_position(g) : g);
          const float v = o[mb][4 * (i >> 1) + 2 * r + (i & 1)] * inv[i];
          if (args.num_splits == 1) {
            uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                            static_cast<int64_t>(h) * p.out_stride_head + dim;
            *dst = static_cast<uint16_t>(mla_pack_bf16x2(v, 0.f) & 0xFFFFu);
          } else {
            const int64_t out_row = static_cast<int64_t>(work.t) * p.num_heads + h;
            args.partial_out[(static_cast<int64_t>(work.split) * rows + out_row) * kHeadDimV + dim] = v;
          }
        }
      }
    }
    phases.finish(n_tiles);
  } else {
    // ============================ producers ==================================
    if constexpr (!kMx) setmaxnreg_inc<kProducerRegs>();
    if constexpr (kBf16) {
      // bf16 needs no decode: thread 0 of wg 1 lands each tile in its slot by
      // TMA (9 boxes of 64 keys x 64 dims), tile t + 2 once tile t's PV is done.
      if (tid != 128) return;
      const bool stream_kv = args.stream_kv;  // small cache: L2 evict_first (ptx_sm90.cuh)
      const uint64_t kv_policy = l2_evict_first_policy();
      auto issue_tile = [&](int tile) {
        const int slot = tile % kStages;
        const uint32_t bar = mbar(kMbFull + slot);
        const int y = static_cast<int>(contiguous_base + kv_begin + tile * kTileTokens);
        mbar_arrive_expect_tx(bar, kStageBytes);
#pragma unroll
        for (int blk = 0; blk < kColBlocks; ++blk) {
          tma_load_2d_maybe_stream(kv_smem + slot * kStageBytes + blk * kBlockBytes, &kv_map, 64 * blk, y, bar,
                                   stream_kv, kv_policy);
        }
      };
      for (int tile = 0; tile < kStages && tile < n_tiles; ++tile) issue_tile(tile);
      for (int t = 0; t + kStages < n_tiles; ++t) {
        mbar_wait(mbar(kMbEmpty + t % kStages), (t / kStages) & 1);  // tile t's PV is done
        issue_tile(t + kStages);
      }
    } else {
      // fp8: thread lt (0..255) decodes key lt / 4 of a tile, code chunks
      // lt % 4 + 4m (m = 0..8): the wide kernel's value-warpgroup map (a warp
      // reads 8 keys x 64 bytes per instruction).
      // MXFP4: producer warpgroup w (0..2) decodes column blocks 3w..3w+2 of
      // every key (chunks 12w..12w+11): thread lw = lt % 128 key lw / 2, the
      // chunk pairs 12w + 4t + 2 (lw % 2) + {0, 1} (t = 0..2), one 16-byte load
      // and one MX block each. Chunk 4t' + q of a block row sits at 16-byte
      // positions (2q, 2q + 1) ^ (key % 8): the 8 lanes of a store phase (4
      // keys x 2 lanes) hit 8 distinct positions, so the stores are free of
      // bank conflicts.
      const int lt = tid - 128;
      const int ld_token = kMx ? (lt % 128) / 2 : lt / kLoadersPerToken;
      const int ld_c0 = kMx ? lt % 2 : lt % kLoadersPerToken;
      const int mx_wg = lt / 128;                       // MXFP4: column blocks 3 mx_wg ..
      const int mx_j0 = 12 * mx_wg + 2 * ld_c0;         // MXFP4: the thread's first chunk
      const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
      const bool contiguous = p.layout == KvLayout::kIndptr;
      const TileCodeLoader loader{p, kv_base, work.b, kv_begin, kv_end, ld_token, ld_c0, contiguous, contiguous_base};
      // Two tiles of codes in flight: buffer b holds those of the tiles of
      // parity b (36 fp8 / 15 MXFP4 registers each; with one buffer only about
      // one tile's loads are in flight per SM, measured 7% slower at MXFP4's
      // large shapes).
      constexpr int kChunks = kMx ? 6 : kCodeChunks;  // decoded chunks per thread and tile
      uint4 codes[2][kCodeChunks];     // fp8: 16 codes per chunk
      uint4 mx_pairs[2][3];            // MXFP4: 32 codes (two chunks, one block) per pair
      uint32_t mx_e[2][3];             // MXFP4: the pair's block scale byte
      uint32_t codes_bad[2] = {};
      // `buf` (an integral_constant) picks the register buffer at compile time.
      auto fetch_tile = [&](auto buf, int tile) {
        constexpr int B = decltype(buf)::value;
        if (tile < n_tiles) {
          const int64_t r = loader.key_row(tile);
          codes_bad[B] = __ballot_sync(0xffffffffu, r == -1);
          if constexpr (kMx) loader.fetch_mx_pairs(r, mx_j0, mx_pairs[B], mx_e[B]);
          else loader.fetch_codes(r, codes[B]);
        }
      };
      // fp8: chunk 4m + ld_c0 in column block m, 16-byte positions (2 ld_c0,
      // 2 ld_c0 + 1) ^ (key % 8). MXFP4: chunk 12 mx_wg + 4t + 2 ld_c0 + e in
      // column block 3 mx_wg + t, positions (2 (2 ld_c0 + e), .. + 1) ^ (key % 8).
      auto row_addr = [&](int block, int pos) {
        return kv_smem + block * kBlockBytes + ld_token * 128 + ((pos ^ (ld_token & 7)) << 4);
      };
      const uint32_t st_lo = kv_smem + ld_token * 128 + (((2 * ld_c0) ^ (ld_token & 7)) << 4);
      const uint32_t st_hi = kv_smem + ld_token * 128 + (((2 * ld_c0 + 1) ^ (ld_token & 7)) << 4);
      const uint32_t st_mx[2][2] = {{row_addr(3 * mx_wg, 4 * ld_c0), row_addr(3 * mx_wg, 4 * ld_c0 + 1)},
                                    {row_addr(3 * mx_wg, 4 * ld_c0 + 2), row_addr(3 * mx_wg, 4 * ld_c0 + 3)}};
      // A tile's codes decoded into registers (before its slot is free: only
      // the stores wait for the consumer), then stored into the slot.
      uint32_t dec[kChunks][8];
      uint32_t dec_bad = 0;
      auto decode_tile = [&](auto buf) {
        constexpr int B = decltype(buf)::value;
        dec_bad = codes_bad[B];
        if constexpr (kMx) {
#pragma unroll
          for (int t = 0; t < 3; ++t) {
            // 16 codes per chunk into dim positions (0, 4, 1, 5, 2, 6, 3, 7)
            // of each 8-dim group: no reordering instructions.
            const uint32_t e = mx_e[B][t];
            const uint2 lo = make_uint2(mx_pairs[B][t].x, mx_pairs[B][t].y);
            const uint2 hi = make_uint2(mx_pairs[B][t].z, mx_pairs[B][t].w);
            const MxChunkBf16 d0 = e <= 128u ? mx_chunk_to_bf16<true>(lo, e) : mx_chunk_to_bf16_two_factors(lo, e);
            const MxChunkBf16 d1 = e <= 128u ? mx_chunk_to_bf16<true>(hi, e) : mx_chunk_to_bf16_two_factors(hi, e);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              dec[2 * t][i] = d0.w[i];
              dec[2 * t + 1][i] = d1.w[i];
            }
          }
        } else {
#pragma unroll
          for (int m = 0; m < kCodeChunks; ++m) {
            e4m3x8_to_f16(codes[B][m].x, codes[B][m].y, dec[m]);
            e4m3x8_to_f16(codes[B][m].z, codes[B][m].w, dec[m] + 4);
          }
        }
      };
      auto store_tile = [&](int tile) {
        if (tile < n_tiles) {
          const int slot = tile % kStages;
          // The bad-row word of each warp (MXFP4: those of warpgroup 1, which
          // holds every key: 16 keys per warp, key k at bit 2 (k % 16)).
          if (lane == 0 && (!kMx || lt < 128)) flags[slot * kFlagWords + lt / 32] = dec_bad;
          const uint32_t slot_off = slot * kStageBytes;
          if constexpr (kMx) {
#pragma unroll
            for (int t = 0; t < 3; ++t) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const uint32_t off = slot_off + t * kBlockBytes;
                st_shared_v4(st_mx[e][0] + off, dec[2 * t + e]);
                st_shared_v4(st_mx[e][1] + off, dec[2 * t + e] + 4);
              }
            }
          } else {
#pragma unroll
            for (int m = 0; m < kCodeChunks; ++m) {
              const uint32_t off = slot_off + m * kBlockBytes;
              st_shared_v4(st_lo + off, dec[m]);
              st_shared_v4(st_hi + off, dec[m] + 4);
            }
          }
          fence_proxy_async_shared();
          mbar_arrive(mbar(kMbFull + slot));
        }
      };
      using Buf0 = std::integral_constant<int, 0>;
      using Buf1 = std::integral_constant<int, 1>;
      // Tiles t and t + 1 in the two buffers: decode tile t, fetch tile t + 2
      // into the buffer just emptied, store tile t into its slot once tile
      // t - 2's PV is done (slots start empty); then the same for t + 1. One
      // copy of each step per buffer, no separate prologue: in a model's
      // decode step other kernels run between two calls, so the first tiles
      // fetch every instruction from L2 or DRAM, and that cost grows with the
      // code (docs/performance.md, "Instruction cache").
      fetch_tile(Buf0{}, 0);
      fetch_tile(Buf1{}, 1);
      for (int t = 0; t < n_tiles; t += 2) {
        decode_tile(Buf0{});
        fetch_tile(Buf0{}, t + 2);
        if (t >= kStages) mbar_wait(mbar(kMbEmpty + 0), ((t - kStages) / kStages) & 1);  // tile t - 2 (slot 0)
        store_tile(t);
        if (t + 1 >= n_tiles) break;
        decode_tile(Buf1{});
        fetch_tile(Buf1{}, t + 3);
        if (t >= kStages) mbar_wait(mbar(kMbEmpty + 1), ((t - kStages) / kStages) & 1);  // tile t - 1 (slot 1)
        store_tile(t + 1);
      }
    }  // fp8 / MXFP4 producers
    phases.finish(n_tiles);
  }
#endif  // MLA_SM90A_DEVICE
}

}  // namespace narrow
}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

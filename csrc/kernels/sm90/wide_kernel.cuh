// Split-KV MLA decode for a bf16, OCP fp8 or MXFP4 cache on Hopper (sm_90a)
// with many heads (H >= 64): the "wide" kernel. 64 heads of one query token share every K/V
// tile, so each key is read and fed to the tensor cores once per 64 heads
// (the mma.sync kernel reads it once per 16, from shared memory into
// registers, for every head group). Both products run on wgmma with their
// operands in shared memory.
//
// Grid and outputs: as every split kernel (launch_contract.h), with head groups
// of kWideRows = 64 heads: x = query token * head_groups + head group, y = KV
// split; one split writes bf16 out and lse, several write fp32 partials for
// combine_kernel.
//
// Block: 384 threads, three warpgroups with fixed roles; one CTA per SM
// (shared memory).
//   wg 0 (scores):   S = Q K^T for a 64-token tile (wgmma m64n64k16, 36
//                    k-steps, Q and K both K-major in shared memory), the
//                    online softmax in registers with lazy rescaling
//                    (kLazyLog2), P (bf16; f16 for fp8) and the per-row
//                    rescale factor alpha to shared memory; in the TMA form
//                    also the rope block's box of tile t+2 (kRopeBlock).
//   wg 1, 2 (values): O = alpha O + P V for value dims [256 (wg - 1), +256)
//                    (wgmma m64n256k16, 4 k-steps, P K-major, V N-major: the
//                    same stored tile read transposed), and all the loads of
//                    K/V tiles (bf16 on the indptr layout: thread 128 issues
//                    a tile's nine TMA boxes; bf16 otherwise: cp.async of
//                    16-byte chunks by all 256 threads; fp8 and
//                    MXFP4: the codes of tile t+2 are loaded into registers
//                    while tile t's PV runs and converted into its slot after
//                    it: fp8 to f16, so both products run on f16 wgmma with Q
//                    scaled per head into f16; MXFP4 decoded with its block
//                    scales to bf16, whose range they need).
// So tile t's scores (wg 0) run while tile t-1's values (wg 1, 2) run, and
// the tensor cores see both.
//
// Shared memory (all operands 128-byte swizzled, see ptx_sm90.cuh):
//   Q        64 heads x 576 dims, 9 column blocks of 64 dims (8 KB each)
//   K/V ring 2 x (64 keys x 576 dims), the same layout; rows past the
//            split or with a bad index are zero-filled (PV multiplies every
//            row by its P, so they must hold finite values; the TMA form
//            zeroes the last tile's rows past the split after its QK)
//   P        64 heads x 64 keys bf16 (one column block), alpha[2][64]
// 230,912 bytes (225.5 KiB) in all (Smem below). The epilogue reuses the
// ring to stage O for 16-byte stores.
//
// Synchronisation. Between wg 0 and wg 1, 2: mbarriers (arrive with release,
// wait with acquire; enum MBarrier), each completing one phase per tile, and
// each waiter at most one phase behind by construction:
//   full[slot]  wg 1, 2 arrive once tile t has landed in `slot` (their own
//               copies waited for and fenced for the tensor cores); wg 0
//               waits before its QK. Tile t+2 is issued into the slot only
//               after tile t's PV, which waits for p_full of tile t, which wg 0
//               arrives at after its wait.
//   block[slot][9]  the TMA form instead of full: each box of 64 keys x 64
//               dims completes its own barrier (one arrival with its byte
//               count: thread 128's, thread 0's for the rope block from tile
//               2 on), and wg 0 waits for column block j before QK's four
//               k-steps on it, so the products start as the tile lands.
//   p_full      wg 0 arrives once P and alpha of tile t are stored (and fenced
//               for the tensor cores); wg 1, 2 wait before rescaling O and
//               issuing PV.
//   p_empty     wg 1, 2 arrive when tile t's PV is complete; wg 0 waits
//               before storing P of tile t+1 (alpha is double-buffered).
//   final       wg 0 arrives with the final (m, l) rows stored.
//   q           the TMA form: Q's nine boxes landed (thread 0's one arrival
//               with Q's byte count); wg 0 waits before its first QK.
// Named barriers only among threads running the same code: kBarValues (wg 1
// and 2 finished tile t's PV before either refills its slot) and kBarQ.
#pragma once

#include <math_constants.h>

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
namespace wide {

constexpr int kThreads = 384;     // three warpgroups
constexpr int kRows = kWideRows;  // 64 heads: the M of every wgmma
constexpr int kColBlocks = kHeadDimQK / 64;            // 9 column blocks of 64 dims (128 bytes per row)
constexpr int kQBlockBytes = kRows * 128;              // one column block of Q
constexpr int kQBytes = kColBlocks * kQBlockBytes;     // 73728
constexpr int kRingBytes = 2 * 64 * kHeadDimQK * 2;    // 147456: two 64-key tiles
constexpr int kValueBlocksPerWg = kHeadDimV / 64 / 2;  // 4 column blocks (256 dims) per value warpgroup
constexpr int kSwizzleGroupBytes = 8 * 128;            // SBO: 8 rows of 128 bytes
constexpr int kLoaderThreads = 256;                    // wg 1, 2
// The epilogue's staging rows in the ring (per value warpgroup: 64 rows of
// its 256 dims), padded by 16 / 32 bytes so that the 8 rows of a warp's store
// fall on different banks.
constexpr int kOutRowBf16 = 256 * 2 + 16;  // 528
constexpr int kOutRowF32 = 256 * 4 + 32;   // 1056
static_assert(2 * kRows * kOutRowF32 <= kRingBytes, "the epilogue's rows fit in the ring");

// The key tile: kTileTokens keys per stage, the N of QK and the K of PV.
// 64-key tiles give QK its best shape (m64n64: Q's shared-memory reads
// amortised over twice the keys) but leave room for only 2 stages. Measured
// on the H200, 32-key tiles with 4 stages in the same bytes were ~10% slower
// at every H = 128 sweep shape from 8k keys up (docs/performance.md); that
// variant is in git history (73c6c96), not here.
constexpr int kTileTokensDefault = 64;
template <int kTileTokens>
struct Tile {
  static_assert(kTileTokens == 64, "the kernel is written for 64-key tiles");
  static constexpr int kStages = kRingBytes / (kTileTokens * kHeadDimQK * 2);  // 2
  static constexpr int kBlockBytes = kTileTokens * 128;          // one column block of a stage
  static constexpr int kStageBytes = kColBlocks * kBlockBytes;
  static constexpr int kLoadersPerToken = kLoaderThreads / kTileTokens;         // 4
  static constexpr int kChunksPerLoader = (kHeadDimQK / 8) / kLoadersPerToken;  // 18
  static constexpr int kTokensPerLoaderWarp = 32 / kLoadersPerToken;            // 8: one bad-row word each
  static constexpr int kFlagWords = kTileTokens / kTokensPerLoaderWarp;         // 8 per stage
  static constexpr int kAcc = kTileTokens / 2;                                  // S accumulator registers
};

// Named barriers: only among threads that run the same code (one warpgroup,
// or wg 1 and 2). Hand-offs between wg 0 and wg 1, 2 go through mbarriers
// (Smem::kBars), which compute-sanitizer's racecheck and synccheck model;
// named barriers shared by warpgroups at different code locations are
// reported by both although the SASS orders every access.
enum NamedBarrier : int {
  kBarValues = 1,  // wg 1, 2: both finished PV of tile t before either refills its slot
  kBarQ = 2,       // wg 0: Q stored
};
// mbarriers, in this order in Smem::kBars; arrivals per phase in brackets.
enum MBarrier : int {
  kMbFull = 0,          // + slot [256: wg 1, 2]: tile landed (not the TMA form); one phase per use of the slot
  kMbPFull = 2,         // [128: wg 0]: P and alpha of tile t stored; phase t
  kMbPEmpty = 3,        // [256: wg 1, 2]: tile t's PV complete; phase t
  kMbFinal = 4,         // [128: wg 0]: the final (m, l) rows stored
  kMbBlock = 5,         // + 9 slot + column block [1 + 8 KB of TMA bytes; the TMA form only]: that
                        // block of the slot's tile landed; one phase per use of the slot
  kMbQ = kMbBlock + 2 * kColBlocks,  // [1 + Q's bytes; the TMA form only]: Q landed
  kMbCount,
};

struct Smem {
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + kQBytes;
  static constexpr int kP = kKv + kRingBytes;          // 64 x 64 bf16: one column block
  static constexpr int kAlpha = kP + kQBlockBytes;     // [2][64] fp32: tile t's at [t % 2]
  static constexpr int kFinalM = kAlpha + 2 * kRows * 4;  // [64] fp32
  static constexpr int kFinalL = kFinalM + kRows * 4;  // [64] fp32
  static constexpr int kFlags = kFinalL + kRows * 4;   // [2 stages][8] u32: bad-row bits
  static constexpr int kBars = kFlags + 2 * 8 * 4;     // [kMbCount] mbarriers
  static constexpr int kQScale = kBars + kMbCount * 8;  // [64] fp32: fp8's per-head 2^-e of Q
  static constexpr int kTotal = kQScale + kRows * 4;
};
static_assert(Smem::kKv % 1024 == 0 && Smem::kP % 1024 == 0, "swizzle atoms are 1024-byte aligned");
static_assert(Smem::kBars % 8 == 0, "mbarrier alignment");

// P (A of PV: 64 heads x 64 keys, K-major, one 128-byte-swizzled column
// block at p_smem). pk[2i + r] holds keys 8i + 2c, +1 of row 16 warp + g + 8r:
// the m8n8 fragment (rows 16 warp + 8r .., keys 8i ..) in the mma layout, so
// one stmatrix stores four of them: matrix m = lane / 8 is (i0 + m / 2, r =
// m % 2), and lane gives the address of its row lane % 8.
__device__ __forceinline__ void store_p(uint32_t p_smem, const uint32_t (&pk)[16], int warp, int lane) {
  const int mat = lane >> 3, row = 16 * warp + 8 * (mat & 1) + (lane & 7);
#pragma unroll
  for (int i0 = 0; i0 < 8; i0 += 2) {
    const int chunk = i0 + (mat >> 1);
    const uint32_t addr = p_smem + row * 128 + ((chunk ^ (row & 7)) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(pk[2 * i0]),
                 "r"(pk[2 * i0 + 1]), "r"(pk[2 * i0 + 2]), "r"(pk[2 * i0 + 3])
                 : "memory");
  }
}

// Register budgets (setmaxnreg) where the value warpgroups stage codes in
// registers (OCP fp8, MXFP4): they hold O (128) and the codes of the next
// tile (36 fp8 / 27 MXFP4) besides their loop state, the score warpgroup S
// (32) and the softmax state. 96 + 2 x 200 per thread of a warpgroup fits the
// 168 x 384 the launch reserves. (bf16 keeps the launch's 168 everywhere.)
constexpr int kFp8ScoreRegs = 96;
// Lazy rescaling (log2 domain), as in the narrow kernels: the running
// reference m_run moves only when a tile's maximum exceeds it by more than
// this, so P = exp2(s - m_run) <= 2^8 (exact enough in bf16 / f16, far from
// overflow) and most tiles need no O rescale in the value warpgroups.
constexpr float kLazyLog2 = 8.f;
// The rope column block (dims 512..575) is read by QK alone: wg 0 issues its
// box of tile t + 2 as soon as QK(t) is complete, and QK starts each tile on it.
constexpr int kRopeBlock = kColBlocks - 1;
constexpr int kFp8ValueRegs = 200;

// Trace builds (trace.cuh), both printed by wide_launch.cu:
//   TileTrace: 5 event clocks of 8 tiles for thread 0 (scores) and thread 128
//     (values) of CTA (0, 0);
//   CtaPhases: the same two threads of every CTA (the first kPhaseCtas in
//     grid order) at 5 points: scores: start, Q stored, QK(0) done, QK(last)
//     done, final (m, l) stored; values: start, first tiles requested, PV(0)
//     done, PV(last) done, outputs stored. The count is the CTA's tiles.
constexpr int kTileTraceEvents = 5, kTileTraceTiles = 8;
constexpr int kTileTraceWords = TileTrace<kTileTraceEvents, kTileTraceTiles>::kWords;
constexpr int kPhasePoints = 5, kPhaseCtas = 2048;
constexpr int kPhaseWords = CtaPhases<kPhasePoints>::kWords;
#if MLA_TRACE_ENABLED
__device__ long long wide_tile_trace[2 * kTileTraceWords];
__device__ long long wide_cta_phases[kPhaseCtas * 2 * kPhaseWords];
__device__ __forceinline__ long long* wide_trace_buffer() { return wide_tile_trace; }
__device__ __forceinline__ long long* wide_phase_buffer() { return wide_cta_phases; }
#else
__device__ __forceinline__ long long* wide_trace_buffer() { return nullptr; }
__device__ __forceinline__ long long* wide_phase_buffer() { return nullptr; }
#endif

// F: bf16 (operands as stored), OCP fp8 (e4m3fn: Q is scaled per head into
// f16 and the value warpgroups convert each tile's codes to f16 as they store
// it, so both products run on f16 wgmma) or MXFP4 (codes and block scales
// decoded to bf16 as a tile is stored). fp8 and MXFP4 load the codes of tile
// t+2 into registers one tile ahead (global loads, not cp.async: the
// conversion needs them in registers).
// kTma (bf16, the indptr layout: Plan::tma_tiles): thread 128 lands each tile
// by TMA, nine boxes of 64 keys x 64 dims through kv_map (tensor_map.h), each
// completing its own block barrier, so QK's k-steps on a column block start
// once that block is in; the split's last tile has the rows past its end
// zeroed by wg 0 before PV (they hold another item's keys, or NaN); Q lands
// by TMA too, nine boxes of 64 heads x 64 dims through q_map. Without kTma
// (kv_map and q_map unused) the value warpgroups copy tiles and wg 0 copies Q
// with cp.async.
template <int kTileTokens, KvFormat F, bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    decode_wide_kernel(const DecodeLaunch args, const __grid_constant__ CodeTensorMap kv_map,
                       const __grid_constant__ CodeTensorMap q_map) {
  using TT = Tile<kTileTokens>;
  constexpr bool kFp8 = F == KvFormat::kFp8E4M3FN;  // also: f16 operands
  constexpr bool kMx = F == KvFormat::kMxfp4;
  static_assert(F == KvFormat::kBf16 || kFp8 || kMx, "bf16, OCP fp8 or MXFP4");
#if MLA_SM90A_DEVICE
  constexpr int kStages = TT::kStages;
  constexpr bool kRegLoads = kFp8 || kMx;  // codes through registers, decoded as a tile is stored
  static_assert(!kTma || F == KvFormat::kBf16, "the TMA form is bf16's");
  extern __shared__ __align__(1024) uint8_t smem[];
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;  // within the warpgroup: accumulator rows 16 warp ..
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;
  // -DMLA_DECODE_TRACE only (trace.cuh): this CTA's phase clocks, thread 0
  // (scores) and thread 128 (values).
  CtaPhases<kPhasePoints> phases;
  phases.start(wide_phase_buffer(), kPhaseCtas);

  const uint32_t smem_base = smem_u32(smem);
  const uint32_t q_smem = smem_base + Smem::kQ;
  const uint32_t kv_smem = smem_base + Smem::kKv;
  const uint32_t p_smem = smem_base + Smem::kP;
  float* alpha_smem = reinterpret_cast<float*>(smem + Smem::kAlpha);
  float* final_m = reinterpret_cast<float*>(smem + Smem::kFinalM);
  float* final_l = reinterpret_cast<float*>(smem + Smem::kFinalL);
  uint32_t* flags = reinterpret_cast<uint32_t*>(smem + Smem::kFlags);
  float* q_scale = reinterpret_cast<float*>(smem + Smem::kQScale);

  const uint32_t bars = smem_base + Smem::kBars;
  auto mbar = [&](int i) { return bars + 8 * i; };
  // The TMA form requests Q first: its rows depend on blockIdx alone, so it
  // need not wait for the index lookups below. Thread 0 lands its nine column
  // blocks (64 heads x 64 dims each, the rope block first, as QK starts on
  // it) through q_map on one barrier; heads past H arrive as zeros (an orphan
  // token's rows come out NaN whatever its Q). Thread 128 starts fetching the
  // cache's tensor map meanwhile, for the first tiles' loads.
  if constexpr (kTma) {
    const CtaCoords cta_q = cta_coords<kRows>(args);
    if (tid == 0) {
      mbar_init(mbar(kMbQ), 1);
      fence_mbarrier_init();
      mbar_arrive_expect_tx(mbar(kMbQ), kQBytes);
      tma_load_3d(q_smem + kRopeBlock * kQBlockBytes, &q_map, 64 * kRopeBlock, cta_q.h0, cta_q.t, mbar(kMbQ));
#pragma unroll
      for (int blk = 0; blk < kRopeBlock; ++blk) {
        tma_load_3d(q_smem + blk * kQBlockBytes, &q_map, 64 * blk, cta_q.h0, cta_q.t, mbar(kMbQ));
      }
    }
    if (tid == 128) tma_prefetch_map(&kv_map);
  }

  const WorkItem work = locate_work<kTileTokens, kRows>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(mbar(kMbFull + i), kLoaderThreads);
    mbar_init(mbar(kMbPFull), 128);
    mbar_init(mbar(kMbPEmpty), kLoaderThreads);
    mbar_init(mbar(kMbFinal), 128);
    if constexpr (kTma) {
      for (int i = 0; i < kStages * kColBlocks; ++i) mbar_init(mbar(kMbBlock + i), 1);
      fence_mbarrier_init();  // TMA (the async proxy) completes them
    }
  }
  // The TMA form has no bad rows (indptr rows are checked per item): its
  // flags stay zero.
  if (kTma && tid < kStages * 8) flags[tid] = 0u;
  __syncthreads();  // the mbarriers are set up (every thread, one code location)
  // -DMLA_DECODE_TRACE only (trace.cuh): cycles of 8 mid-split tiles of CTA (0, 0)
  // at the hand-offs below, for thread 0 (scores) and thread 128 (values).
  TileTrace<kTileTraceEvents, kTileTraceTiles> tiles;
  // (Splits of at most 16 tiles: their first 8.)
  tiles.start(blockIdx.x == 0 && blockIdx.y == 0 && (tid == 0 || tid == 128), n_tiles > 16 ? n_tiles / 2 : 0);
  // Let the combine kernel (a programmatic dependent) start launching.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // The indptr layout: the item's first cache row (the TMA form's row coordinates).
  const bool contiguous = p.layout == KvLayout::kIndptr;
  const int64_t contiguous_base = (contiguous && !work.orphan) ? static_cast<int64_t>(__ldg(p.kv_indptr + work.b)) : 0;
  // The TMA form: column block `blk` of the tile at cache row y into ring
  // slot `slot`, completing that block's barrier (thread 128 issues blocks
  // 0-7, and the rope block of tiles 0 and 1; thread 0 the rope block of
  // later tiles).
  auto issue_tma_block = [&](int slot, int blk, int y) {
    const uint32_t bar = mbar(kMbBlock + kColBlocks * slot + blk);
    mbar_arrive_expect_tx(bar, TT::kBlockBytes);
    tma_load_2d(kv_smem + slot * TT::kStageBytes + blk * TT::kBlockBytes, &kv_map, 64 * blk, y, bar);
  };

  if (wg == 0) {
    // ===================== scores and softmax ===============================
    if constexpr (kRegLoads) setmaxnreg_dec<kFp8ScoreRegs>();
    if constexpr (kTma) {
      // Q, requested at the kernel's start, landed: each thread's wait orders
      // its bytes for the wgmma; the barrier brings wg 0's warps into QK(0)
      // together, as in the cp.async form.
      mbar_wait(mbar(kMbQ), 0);
      fence_proxy_async_shared();
      bar_sync(kBarQ, 128);
    } else {
      // Q: thread tid copies row tid / 2, chunks tid % 2 + 2m; heads past H
      // (and every head of an orphan token) are zero.
      const int row = tid >> 1, c2 = tid & 1;
      const int head = work.h0 + row;
      const bool valid = !work.orphan && head < p.num_heads;
      const uint8_t* src = static_cast<const uint8_t*>(p.q) +
                           2 * (static_cast<int64_t>(work.t) * p.q_stride_token +
                                static_cast<int64_t>(valid ? head : 0) * p.q_stride_head) +
                           16 * c2;
#pragma unroll
      for (int m = 0; m < kHeadDimQK / 8 / 2; ++m) {
        cp_async_16(q_smem + swizzled_offset(row, c2 + 2 * m, kQBlockBytes), src + 32 * m, valid ? 16 : 0);
      }
      cp_async_commit();
      cp_async_wait<0>();
      // fp8: f16 Q scaled per head; the head's two threads are lanes 2k, 2k + 1.
      if constexpr (kFp8) scale_q_row_to_f16<2>(q_smem, row, c2, kQBlockBytes, q_scale);
      fence_proxy_async_shared();
      bar_sync(kBarQ, 128);
    }
    phases.mark(1);

    // A thread holds accumulator rows r0 = 16 warp + g and r0 + 8, columns
    // (keys of the tile) 8i + 2c + e: s[4i + 2r + e].
    const int r0 = 16 * warp + g;
    // Score scale in the log2 domain, per accumulator row (fp8: times the
    // cache's scale and the row's 2^-e).
    float row_scale[2];
    {
      const float scale_log2 = p.sm_scale * 1.4426950408889634f;
      if constexpr (kFp8) {
        const float kv_scale = __ldg(p.fp8_scale);
        row_scale[0] = scale_log2 * kv_scale * q_scale[r0];
        row_scale[1] = scale_log2 * kv_scale * q_scale[r0 + 8];
      } else {
        row_scale[0] = row_scale[1] = scale_log2;
      }
    }
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l_run[2] = {0.f, 0.f};  // this thread's 16 columns; the quad's sum at the end
    for (int t = 0; t < n_tiles; ++t) {
      const int slot = t % kStages;
      const uint32_t stage = kv_smem + slot * TT::kStageBytes;
      const uint32_t phase = (t / kStages) & 1;
      if constexpr (!kTma) mbar_wait(mbar(kMbFull + slot), phase);  // tile t landed
      tiles.mark(t, 0);

      float s[TT::kAcc];
      wgmma_fence();
      // Descriptors of column block 0, k-step 0; k-step ks starts
      // (ks / 4) block and (ks % 4) * 32 bytes on (a constant add to the
      // start-address field, which cannot carry: addresses < 2^18).
      const uint64_t desc_q0 = smem_desc_sw128(q_smem, 16, kSwizzleGroupBytes);
      const uint64_t desc_k0 = smem_desc_sw128(stage, 16, kSwizzleGroupBytes);
      // The TMA form starts on the rope block (landed since QK(t - 2)), so
      // its first k-steps need not wait for the boxes issued after PV(t - 2).
#pragma unroll
      for (int kk = 0; kk < kHeadDimQK / 16; ++kk) {
        const int ks = kTma ? (kk + 4 * kRopeBlock) % (kHeadDimQK / 16) : kk;  // column block ks / 4, k-step ks % 4
        // (Computing each descriptor from its address instead takes ~11
        // instructions per wgmma.)
        const uint64_t desc_q = desc_q0 + (((ks / 4) * kQBlockBytes + (ks % 4) * 32) >> 4);
        const uint64_t desc_k = desc_k0 + (((ks / 4) * TT::kBlockBytes + (ks % 4) * 32) >> 4);
        if constexpr (kTma) {
          if (ks % 4 == 0) mbar_wait(mbar(kMbBlock + kColBlocks * slot + ks / 4), phase);  // block ks / 4 landed
        }
        if (kk == 0) wgmma_m64n64k16_ss<kFp8, false>(s, desc_q, desc_k);
        else wgmma_m64n64k16_ss<kFp8, true>(s, desc_q, desc_k);
      }
      wgmma_commit();
      wgmma_wait<0>();
      pin(s);
      tiles.mark(t, 1);
      if (t == 0) phases.mark(2);
      if (t == n_tiles - 1) phases.mark(3);
      if constexpr (kTma) {
        // QK(t) is done with the slot's rope block: tile t + 2's lands there now.
        if (tid == 0 && t + kStages < n_tiles) {
          issue_tma_block(slot, kRopeBlock, static_cast<int>(contiguous_base + kv_begin + (t + kStages) * kTileTokens));
        }
      }

      // Word w of the stage's flags: keys kTokensPerLoaderWarp w .., key k at bit kLoadersPerToken (k % ..).
      const uint32_t* bad_words = flags + slot * 8;
      const int tok0 = kv_begin + t * kTileTokens;
      float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
      // s stays raw (scaled inside the exponent below; the scale is positive,
      // so the maximum is the same key), and a tile whose keys are all
      // visible and none bad (the same for every thread) skips the masks.
      // (The TMA form has no bad rows: indptr rows are checked per item.)
      uint32_t any_bad = 0;
      if constexpr (!kTma) {
#pragma unroll
        for (int w = 0; w < TT::kFlagWords; ++w) any_bad |= bad_words[w];
      }
      const bool clean = tok0 + kTileTokens <= kv_end && any_bad == 0;
      if (clean) {
#pragma unroll
        for (int i = 0; i < TT::kAcc; i += 4) {
          mx[0] = fmaxf(mx[0], fmaxf(s[i], s[i + 1]));
          mx[1] = fmaxf(mx[1], fmaxf(s[i + 2], s[i + 3]));
        }
      } else {
#pragma unroll
        for (int i = 0; i < kTileTokens / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = 8 * i + 2 * c + e;
            const bool past = tok0 + col >= kv_end;
            const uint32_t bad = bad_words[col / TT::kTokensPerLoaderWarp];
            const bool is_bad = (bad >> (TT::kLoadersPerToken * (col % TT::kTokensPerLoaderWarp))) & 1u;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              float v = s[4 * i + 2 * r + e];
              v = past ? -CUDART_INF_F : (is_bad ? CUDART_NAN_F : v);
              s[4 * i + 2 * r + e] = v;
              mx[r] = fmaxf(mx[r], v);
            }
          }
        }
      }
      mx[0] *= row_scale[0];
      mx[1] *= row_scale[1];
      // Lazy rescaling (kLazyLog2): the quad's row maximum is formed only
      // when some score of the warp exceeds its reference by more than the
      // slack (NaN compares false: a NaN row keeps its reference and stays NaN).
      float alpha[2] = {1.f, 1.f};
      if (__any_sync(0xffffffffu, mx[0] > m_run[0] + kLazyLog2 || mx[1] > m_run[1] + kLazyLog2)) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          if (mx[r] > m_run[r] + kLazyLog2) {  // the same for the row's four threads
            alpha[r] = exp2f(m_run[r] - mx[r]);
            m_run[r] = mx[r];
          }
        }
      }
      // -inf only while every key so far is masked: any finite reference
      // then gives p = 0 and keeps O and l at 0.
      const float m_ref[2] = {m_run[0] == -CUDART_INF_F ? 0.f : m_run[0], m_run[1] == -CUDART_INF_F ? 0.f : m_run[1]};
      uint32_t pk[kTileTokens / 4];  // bf16 pairs: pk[2i + r] = columns 8i + 2c, +1 of row r0 + 8r
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kTileTokens / 8; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float p0 = exp2f(fmaf(s[4 * i + 2 * r], row_scale[r], -m_ref[r]));
          const float p1 = exp2f(fmaf(s[4 * i + 2 * r + 1], row_scale[r], -m_ref[r]));
          sum[r] += p0 + p1;
          if constexpr (kFp8) {
            const __half2 h = __floats2half2_rn(p0, p1);
            pk[2 * i + r] = *reinterpret_cast<const uint32_t*>(&h);
          } else {
            pk[2 * i + r] = mla_pack_bf16x2(p0, p1);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];

      if constexpr (kTma) {
        // The split's last tile: dims 0..511 of the rows past its end to zero
        // (the fence before the P hand-off covers these stores).
        zero_rows_past_split(stage, kv_end - tok0, tid, TT::kBlockBytes);
      }
      tiles.mark(t, 2);
      if (t > 0) mbar_wait(mbar(kMbPEmpty), (t - 1) & 1);  // tile t-1's PV is done with P
      tiles.mark(t, 3);
      store_p(p_smem, pk, warp, lane);
      if (c == 0) {
        alpha_smem[(t & 1) * kRows + r0] = alpha[0];
        alpha_smem[(t & 1) * kRows + r0 + 8] = alpha[1];
      }
      fence_proxy_async_shared();
      mbar_arrive(mbar(kMbPFull));
      tiles.mark(t, 4);
    }

    // Final statistics: the quad's partial sums, then (m, l) for wg 1, 2 and
    // the LSE.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
      if (c == 0) {
        const int row = r0 + 8 * r;
        final_m[row] = m_run[r];
        final_l[row] = l_run[r];
        const int h = work.h0 + row;
        if (h < p.num_heads) store_head_lse(args, work, h, rows, m_run[r], l_run[r]);
      }
    }
    mbar_arrive(mbar(kMbFinal));
    tiles.done();
    tiles.write(wide_trace_buffer());
    phases.finish(n_tiles);
  } else {
  // ===================== values and loads (wg 1, 2) ===========================
  // (wg 0 does not return early: every warp stays to the end of the kernel.)
  if constexpr (kRegLoads) setmaxnreg_inc<kFp8ValueRegs>();
  // Loader: thread lt copies key lt / kLoadersPerToken of a tile, chunks
  // lt % kLoadersPerToken + kLoadersPerToken m: a warp reads 8 rows x 64
  // contiguous bytes per instruction.
  const int lt = tid - 128;
  const int ld_token = lt / TT::kLoadersPerToken, ld_c0 = lt % TT::kLoadersPerToken;
  const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
  const TileCodeLoader loader{p, kv_base, work.b, kv_begin, kv_end, ld_token, ld_c0, contiguous, contiguous_base};
  const uint32_t ld_dst = kv_smem + ld_token * 128;
  auto issue_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int slot = tile % kStages;
      const int64_t r = loader.key_row(tile);
      const uint32_t bad = __ballot_sync(0xffffffffu, r == -1);
      if (lane == 0) flags[slot * 8 + lt / 32] = bad;
      const uint8_t* src = kv_base + (r >= 0 ? r : 0) * p.kv_row_stride_bytes + 16 * ld_c0;
      const int src_bytes = r >= 0 ? 16 : 0;
      const uint32_t dst = ld_dst + slot * TT::kStageBytes;
#pragma unroll
      for (int m = 0; m < TT::kChunksPerLoader; ++m) {
        constexpr int kStep = TT::kLoadersPerToken;
        const int within = (ld_c0 + ((kStep * m) & 7)) ^ (ld_token & 7);  // chunk % 8, swizzled
        cp_async_16(dst + ((kStep * m) >> 3) * TT::kBlockBytes + (within << 4), src + 16 * kStep * m, src_bytes);
      }
    }
    cp_async_commit();  // one group per tile, empty past the end
  };
  // The TMA form (thread 128): tile `tile`'s column blocks; from tile
  // kStages on, the rope block is wg 0's (kRopeBlock).
  auto issue_tma = [&](int tile) {
    if (tile < n_tiles) {
      const int y = static_cast<int>(contiguous_base + kv_begin + tile * kTileTokens);
#pragma unroll
      for (int blk = 0; blk < (tile < kStages ? kColBlocks : kRopeBlock); ++blk) issue_tma_block(tile % kStages, blk, y);
    }
  };
  // fp8: the same thread-to-chunk map on the codes (16-byte chunk j of a row
  // is 16 codes, dims 16j..16j+15, which become the f16 chunks 2j and 2j+1),
  // loaded into registers by fetch_tile and converted into a slot by
  // store_tile. Keys past the split or with a bad index hold zero codes.
  uint4 codes[kHeadDimQK / 16 / 4];  // 9 chunks of 16 codes
  uint32_t codes_bad = 0;            // the warp's bad-key ballot for those codes
  // MXFP4: thread lt holds 8-byte chunks j = ld_c0 + 4m of its key's 288
  // code bytes (16 codes, dims 16j..16j+15, half of MX block j / 2) and the
  // E8M0 byte of each chunk's block. (codes[] above stays unused.)
  uint2 mx_codes[kHeadDimQK / 16 / 4];
  uint32_t mx_e[kHeadDimQK / 16 / 4];
  auto fetch_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int64_t r = loader.key_row(tile);
      codes_bad = __ballot_sync(0xffffffffu, r == -1);
      if constexpr (kMx) loader.fetch_mx(r, mx_codes, mx_e);
      else loader.fetch_codes(r, codes);
    }
  };
  // f16 / bf16 chunks 2j and 2j + 1 of code chunk j = ld_c0 + 4m sit in
  // column block m at the same swizzled positions for every m.
  const uint32_t st_lo = kv_smem + ld_token * 128 + (((2 * ld_c0) ^ (ld_token & 7)) << 4);
  const uint32_t st_hi = kv_smem + ld_token * 128 + (((2 * ld_c0 + 1) ^ (ld_token & 7)) << 4);
  // MXFP4: 8 codes (one 32-bit word, dims 8x..8x+7) to 4 bf16x2 words in dim
  // order. e2m1_pair_bits<P> gives the pair (code P, code P+4); prmt
  // regroups them into (0, 1), (2, 3), (4, 5), (6, 7).
  auto mx_word_to_bf16 = [&](uint32_t w, uint32_t scales, uint32_t (&out)[4]) {
    const uint32_t d0 = e2m1_pair_bits<0>(w, scales), d1 = e2m1_pair_bits<1>(w, scales);
    const uint32_t d2 = e2m1_pair_bits<2>(w, scales), d3 = e2m1_pair_bits<3>(w, scales);
    out[0] = prmt(d0, d1, 0x5410);
    out[1] = prmt(d2, d3, 0x5410);
    out[2] = prmt(d0, d1, 0x7632);
    out[3] = prmt(d2, d3, 0x7632);
  };
  auto store_tile = [&](int tile) {
    if (tile < n_tiles) {
      const int slot = tile % kStages;
      if (lane == 0) flags[slot * 8 + lt / 32] = codes_bad;
      const uint32_t slot_off = slot * TT::kStageBytes;
#pragma unroll
      for (int m = 0; m < kHeadDimQK / 16 / 4; ++m) {
        uint32_t lo[4], hi[4];
        if constexpr (kMx) {
          const uint32_t scales = e8m0_to_bf16_scale_pair(mx_e[m]);
          mx_word_to_bf16(mx_codes[m].x, scales, lo);
          mx_word_to_bf16(mx_codes[m].y, scales, hi);
        } else {
          e4m3x8_to_f16(codes[m].x, codes[m].y, lo);
          e4m3x8_to_f16(codes[m].z, codes[m].w, hi);
        }
        const uint32_t off = slot_off + m * TT::kBlockBytes;
        st_shared_v4(st_lo + off, lo);
        st_shared_v4(st_hi + off, hi);
      }
      fence_proxy_async_shared();
      mbar_arrive(mbar(kMbFull + slot));
    }
  };
  // Tiles 0 .. kStages-1 fill the ring; tile t + kStages is issued into tile
  // t's slot once tile t's PV is done.
  if constexpr (kRegLoads) {
    static_assert(kStages == 2, "tiles 0 and 1 stored, tile 2 fetched ahead");
    fetch_tile(0);
    store_tile(0);
    fetch_tile(1);
    store_tile(1);
    fetch_tile(2);
  } else if constexpr (kTma) {
    // Tile 1 is requested once tile 0 has landed: at the start every CTA asks
    // for Q and its first tiles at once (28 MB at B = 64), and DRAM serves
    // them in no useful order, so QK(0) would wait for tile 1's bytes too.
    static_assert(kStages == 2, "tiles 0 and 1 fill the ring");
    if (tid == 128) {
      issue_tma(0);
      if (n_tiles > 1) {
        for (int blk = 0; blk < kColBlocks; ++blk) mbar_wait(mbar(kMbBlock + blk), 0);
        issue_tma(1);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kStages; ++j) issue_tile(j);
    if (n_tiles > 0) {
      cp_async_wait<kStages - 1>();
      fence_proxy_async_shared();
      mbar_arrive(mbar(kMbFull + 0));
    }
  }

  phases.mark(1);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const int vwg = wg - 1;
  const int r0 = 16 * warp + g;
  const int v_block0 = vwg * kValueBlocksPerWg;
  for (int t = 0; t < n_tiles; ++t) {
    const int slot = t % kStages;
    mbar_wait(mbar(kMbPFull), t & 1);  // P and alpha of tile t stored
    tiles.mark(t, 0);
    const float a0 = alpha_smem[(t & 1) * kRows + r0], a1 = alpha_smem[(t & 1) * kRows + r0 + 8];
    // Skipped when no row of the warp changed its maximum (alpha = 1), the
    // usual case after the first tiles (a warp-uniform branch).
    if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        o[4 * i] *= a0;
        o[4 * i + 1] *= a0;
        o[4 * i + 2] *= a1;
        o[4 * i + 3] *= a1;
      }
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileTokens / 16; ++kk) {
      const uint64_t desc_p = smem_desc_sw128(p_smem + 32 * kk, 16, kSwizzleGroupBytes);
      const uint64_t desc_v = smem_desc_sw128(kv_smem + slot * TT::kStageBytes + v_block0 * TT::kBlockBytes + kk * 16 * 128,
                                              TT::kBlockBytes, kSwizzleGroupBytes);
      wgmma_m64n256k16_ss_tnspb<kFp8, true>(o, desc_p, desc_v);
    }
    wgmma_commit();
    tiles.mark(t, 1);
    if (!kRegLoads && !kTma && t + 1 < n_tiles) {  // tile t+1 landed (tiles up to t + kStages - 1 may be pending): hand it to wg 0
      cp_async_wait<kStages - 2>();
      fence_proxy_async_shared();
      mbar_arrive(mbar(kMbFull + (t + 1) % kStages));
    }
    wgmma_wait<0>();
    pin(o);
    tiles.mark(t, 2);
    if (t == 0) phases.mark(2);
    if (t == n_tiles - 1) phases.mark(3);
    bar_sync(kBarValues, kLoaderThreads);  // both value warpgroups are done with tile t
    tiles.mark(t, 3);
    if (t + 1 < n_tiles) mbar_arrive(mbar(kMbPEmpty));
    if constexpr (kRegLoads) {
      store_tile(t + 2);  // into tile t's slot, from the codes fetched one iteration ago
      fetch_tile(t + 3);
    } else {
      if constexpr (kTma) {
        if (tid == 128) issue_tma(t + kStages);  // into tile t's slot
      } else {
        issue_tile(t + kStages);  // into tile t's slot
      }
    }
    tiles.mark(t, 4);
  }
  cp_async_wait<0>();

  // ---- epilogue: O / l -------------------------------------------------------
  // Each thread holds two rows x 64 dims; written straight to global memory
  // that is 64 stores of 4 or 8 bytes per thread, each warp store touching 8
  // rows: ~12k cycles per CTA at 1 split (trace build, B = 64, kv 1024). So
  // the rows go through the free ring in shared memory (padded rows, no bank
  // conflicts) and leave as 16-byte stores of consecutive threads (full lines).
  // The ring is free: wg 0 waited for every tile to land before its QK and
  // arrives on final after its last; every product reading it is complete.
  mbar_wait(mbar(kMbFinal), 0);
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = final_l[r0 + 8 * r];
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    if constexpr (kFp8) inv[r] *= __ldg(p.fp8_scale);  // V's dequantisation
    if (isnan(l) || work.orphan) inv[r] = CUDART_NAN_F;
  }
  const bool partials = args.num_splits > 1;
  // bf16 out takes 16-byte stores only where its rows are 16-byte aligned.
  const bool staged = partials || ((reinterpret_cast<uintptr_t>(p.out) & 15) == 0 && p.out_stride_token % 8 == 0 &&
                                   p.out_stride_head % 8 == 0);
  if (staged) {
    uint8_t* const stage_out = smem + Smem::kKv;
    if (!partials) {
      uint8_t* const half = stage_out + vwg * kRows * kOutRowBf16;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          *reinterpret_cast<uint32_t*>(half + (r0 + 8 * r) * kOutRowBf16 + (8 * i + 2 * c) * 2) =
              mla_pack_bf16x2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
        }
      }
    } else {
      uint8_t* const half = stage_out + vwg * kRows * kOutRowF32;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          *reinterpret_cast<float2*>(half + (r0 + 8 * r) * kOutRowF32 + (8 * i + 2 * c) * 4) =
              make_float2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
        }
      }
    }
    bar_sync(kBarValues, kLoaderThreads);  // both halves of every row staged
    // 16-byte chunk j of row `row`: chunks of one row are consecutive threads.
    if (!partials) {
      constexpr int kChunks = kHeadDimV * 2 / 16;  // 64 per row
#pragma unroll 4
      for (int j = lt; j < kRows * kChunks; j += kLoaderThreads) {
        const int row = j / kChunks, chunk = j % kChunks, h = work.h0 + row;
        if (h >= p.num_heads) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(stage_out + (chunk / (kChunks / 2)) * kRows * kOutRowBf16 +
                                                        row * kOutRowBf16 + (chunk % (kChunks / 2)) * 16);
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                                  static_cast<int64_t>(h) * p.out_stride_head + 8 * chunk) = v;
      }
    } else {
      constexpr int kChunks = kHeadDimV * 4 / 16;  // 128 per row
#pragma unroll 4
      for (int j = lt; j < kRows * kChunks; j += kLoaderThreads) {
        const int row = j / kChunks, chunk = j % kChunks, h = work.h0 + row;
        if (h >= p.num_heads) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(stage_out + (chunk / (kChunks / 2)) * kRows * kOutRowF32 +
                                                        row * kOutRowF32 + (chunk % (kChunks / 2)) * 16);
        const int64_t out_row = static_cast<int64_t>(work.t) * p.num_heads + h;
        *reinterpret_cast<uint4*>(args.partial_out + (static_cast<int64_t>(work.split) * rows + out_row) * kHeadDimV +
                                  4 * chunk) = v;
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = work.h0 + r0 + 8 * r;
      if (h >= p.num_heads) continue;  // no shuffles below: skipping is safe
      uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(work.t) * p.out_stride_token +
                      static_cast<int64_t>(h) * p.out_stride_head + 256 * vwg + 2 * c;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        *reinterpret_cast<uint32_t*>(dst + 8 * i) = mla_pack_bf16x2(o[4 * i + 2 * r] * inv[r], o[4 * i + 2 * r + 1] * inv[r]);
      }
    }
  }
  tiles.done();
  tiles.write(wide_trace_buffer() + kTileTraceWords);
  phases.finish(n_tiles);
  }  // wg 1, 2
#endif  // MLA_SM90A_DEVICE
}

}  // namespace wide
}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

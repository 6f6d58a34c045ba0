// Split-KV MLA decode for a bf16 cache on Hopper (sm_90a) with many heads
// (H >= 64), the tiles landed by TMA (the indptr layout, Plan::tma_tiles):
// the wide kernel's TMA form. 64 heads of one query token share every K/V
// tile, as in wide_kernel.cuh, but Q's first 448 dims live in the score
// warpgroup's registers instead of shared memory, which frees the room for a
// five-stage ring of 32-key tiles:
//
//   S (64 heads x 32 keys) = Q K^T   36 x wgmma m64n32k16: 28 k-steps with Q's
//                                    dims 0..447 as the A fragment in registers,
//                                    8 on dims 448..575 (Q_smem)
//   O (64 x 512) += P V              per value warpgroup 2 x wgmma m64n256k16,
//                                    P from shared memory, V the stored tile
//                                    read N-major
//
// Why: with Q in shared memory only two 64-key stages fit beside it, and a
// tile can load only after the PV two tiles back, so the load latency under
// full load (2000-4000 cycles on the H200, docs/performance.md) sits on a
// chain with QK, the softmax and PV. Here a tile is requested five tiles
// before its QK, and the score warpgroup issues QK(t + 1) before the softmax
// of tile t, so the tensor cores have QK(t + 1) and PV(t) to run while it
// computes exponentials. (32-key tiles with Q in shared memory lost ~10%:
// m64n32 reads Q from shared memory twice as often per key; from registers
// QK reads only K.)
//
// Grid and outputs: as every split kernel (launch_contract.h), with head
// groups of kWideRows = 64 heads; the split's chunk is a multiple of 64 keys
// (two tiles), as for the other Hopper kernels.
//
// Block: 384 threads, one CTA per SM (shared memory).
//   wg 0 (scores, kScoreRegs registers): Q's dims 0..447 in registers (112),
//        S of two tiles (QK(t + 1) in flight while tile t's softmax runs), the
//        online softmax with lazy rescaling (wide_common.cuh), P (bf16) and
//        the rows' rescale factors alpha into one of two P buffers.
//   wg 1, 2 (values, kValueRegs registers each): O = alpha O + P V for value
//        dims [256 (wg - 1), +256), 128 fp32 accumulators per thread; thread
//        128 issues the TMA loads (nine boxes of 32 keys x 64 dims per tile,
//        one mbarrier per stage); the epilogue (wide_common.cuh).
//
// Shared memory (every wgmma operand 128-byte swizzled, ptx_sm90.cuh):
//   ring    5 stages x 9 column blocks of 32 keys x 128 bytes (36 KB a stage);
//           at the start, stages 3-4 stage Q's register blocks on their way
//           into wg 0's registers; at the end, O on its way out
//   Q_smem  Q's column blocks 7 and 8 (dims 448..575), 64 heads each (16 KB)
//   P       2 buffers of 64 heads x 64 keys (a 32-key tile uses half of
//           each row), alpha [2][64], the final (m, l) [64] each
//   mbarriers
//
// Synchronisation (mbarriers; arrive with release, wait with acquire):
//   full[s]      thread 128's arrive.expect_tx with the stage's bytes, completed
//                by the TMA unit; wg 0 waits before QK. Tile t + 5 is issued into
//                tile t's stage once both value warpgroups finished PV(t)
//                (named barrier kBarValues); wg 0's QK(t) was complete before it
//                published P(t), which PV(t) waited for.
//   q_staged     wg 0 (128) once Q's register blocks are in registers: stages
//                3-4 may be loaded (tiles 0-2 are issued at once).
//   p_full[b]    wg 0 (128) with P, alpha of tile t (b = t % 2) stored and fenced
//                for the tensor cores; wg 1, 2 wait before rescaling O and PV(t).
//   p_empty[b]   wg 1, 2 (256) once PV(t) is complete; wg 0 waits before storing
//                P of tile t + 2 into the same buffer.
//   final        wg 0 (128) with the final (m, l) rows stored.
#pragma once

#include <math_constants.h>

#include "common/params.h"
#include "kernels/common/launch_contract.h"
#include "kernels/common/work.cuh"
#include "kernels/sm80/ptx_sm80.cuh"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/sm90/tensor_map.h"
#include "kernels/sm90/tile_loader.cuh"
#include "kernels/sm90/wide_common.cuh"

namespace mla_decode {
namespace cuda {
namespace sm90 {
namespace wide_tma {

constexpr int kThreads = 384;     // three warpgroups
constexpr int kRows = kWideRows;  // 64 heads: the M of every wgmma
constexpr int kTileTokens = 32;   // keys per tile: the N of QK, the K of PV
constexpr int kStages = 5;
constexpr int kSplitAlign = 64;   // the plan's split chunks: multiples of 64 keys (kHopperTileTokens)
constexpr int kColBlocks = kHeadDimQK / 64;      // 9 column blocks of 64 dims (128 bytes per row)
constexpr int kLatentBlocks = kHeadDimV / 64;    // 8: the latent (value) dims
constexpr int kRopeBlock = kColBlocks - 1;       // dims 512..575
constexpr int kBlockBytes = kTileTokens * 128;   // one column block of a stage: 4096
constexpr int kStageBytes = kColBlocks * kBlockBytes;  // 36864
constexpr int kQBlockBytes = kRows * 128;        // one column block of Q or P: 8192
// Q's column blocks 0..kRegBlocks-1 are held in wg 0's registers (the A
// fragments of their k-steps); the last latent block and the rope block stay
// in shared memory (Q_smem), which keeps wg 0 within its register budget.
constexpr int kRegBlocks = kLatentBlocks - 1;    // 7
constexpr int kSmemQBlocks = kColBlocks - kRegBlocks;  // 2: latent block 7, rope block 8
constexpr int kRegSteps = kRegBlocks * 4;        // 28 k-steps of QK on Q's registers
constexpr int kSmemSteps = kSmemQBlocks * 4;     // 8 on Q_smem
constexpr int kSwizzleGroupBytes = 8 * 128;      // SBO: 8 rows of 128 bytes
constexpr int kAcc = kTileTokens / 2;            // S registers of one tile: 16
constexpr int kValueBlocksPerWg = kLatentBlocks / 2;  // 4 column blocks (256 dims) per value warpgroup
// Register budgets (setmaxnreg; 184 + 2 x 160 = 3 x 168, what the launch
// reserves): wg 0 holds Q's register blocks (112), two S tiles (32) and P
// (8); wg 1, 2 hold O (128). With all eight latent blocks in registers wg 0
// needs more than 184, and the value warpgroups spill below 160 (ptxas 13.0).
constexpr int kScoreRegs = 184;
constexpr int kValueRegs = 160;
// Q's register blocks are staged in stages kQStageFirst.. on their way into
// registers; those stages are loaded once wg 0 has read them (q_staged).
constexpr int kQStageFirst = 3;
static_assert((kStages - kQStageFirst) * kStageBytes >= kRegBlocks * kQBlockBytes, "Q's register blocks fit");
static_assert(kStages * kStageBytes >= kWideStageOutBytes, "the epilogue's rows fit in the ring");
static_assert(kSplitAlign % kTileTokens == 0, "a split holds whole tiles");

// Named barriers, each among threads that run the same code.
enum NamedBarrier : int {
  kBarValues = 1,  // wg 1, 2: both finished PV(t) before its stage is refilled
  kBarQ = 2,       // wg 0: Q staged
};
// mbarriers, in this order in Smem::kBars; arrivals per phase in brackets.
enum MBarrier : int {
  kMbFull = 0,                   // + stage [1 + the stage's TMA bytes]: one phase per use of the stage
  kMbPFull = kStages,            // + buffer [128: wg 0]: P, alpha of tile t stored; phase t / 2
  kMbPEmpty = kMbPFull + 2,      // + buffer [256: wg 1, 2]: PV(t) complete; phase t / 2
  kMbFinal = kMbPEmpty + 2,      // [128: wg 0]: the final (m, l) rows stored
  kMbQStaged = kMbFinal + 1,     // [128: wg 0]: Q's register blocks read into registers
  kMbCount = kMbQStaged + 1,
};

struct Smem {
  static constexpr int kRing = 0;
  static constexpr int kQ = kRing + kStages * kStageBytes;      // Q_smem: 2 column blocks of 64 x 64 bf16
  static constexpr int kP = kQ + kSmemQBlocks * kQBlockBytes;   // [2] x 64 x 64 bf16
  static constexpr int kAlpha = kP + 2 * kQBlockBytes;          // [2][64] fp32: tile t's at [t % 2]
  static constexpr int kFinalM = kAlpha + 2 * kRows * 4;        // [64] fp32
  static constexpr int kFinalL = kFinalM + kRows * 4;           // [64] fp32
  static constexpr int kBars = kFinalL + kRows * 4;             // [kMbCount] mbarriers
  static constexpr int kTotal = kBars + kMbCount * 8;
};
static_assert(Smem::kQ % 1024 == 0 && Smem::kP % 1024 == 0 && kStageBytes % 1024 == 0,
              "swizzle atoms are 1024-byte aligned");
static_assert(Smem::kBars % 8 == 0, "mbarrier alignment");

__global__ void __launch_bounds__(kThreads, 1)
    decode_wide_tma_kernel(const DecodeLaunch args, const __grid_constant__ CodeTensorMap kv_map) {
#if MLA_SM90A_DEVICE
  extern __shared__ __align__(1024) uint8_t smem[];
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;  // within the warpgroup: accumulator rows 16 warp ..
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int r0 = 16 * warp + g;  // this thread's accumulator rows: r0, r0 + 8

  const uint32_t smem_base = smem_u32(smem);
  const uint32_t ring = smem_base + Smem::kRing;
  const uint32_t q_smem = smem_base + Smem::kQ;
  float* alpha_smem = reinterpret_cast<float*>(smem + Smem::kAlpha);
  float* final_m = reinterpret_cast<float*>(smem + Smem::kFinalM);
  float* final_l = reinterpret_cast<float*>(smem + Smem::kFinalL);
  auto p_buf = [&](int b) { return smem_base + Smem::kP + b * kQBlockBytes; };
  auto stage_of = [&](int slot) { return ring + slot * kStageBytes; };

  const WorkItem work = locate_work<kSplitAlign, kRows>(args);
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kTileTokens);
  const uint32_t bars = smem_base + Smem::kBars;
  auto mbar = [&](int i) { return bars + 8 * i; };
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(mbar(kMbFull + i), 1);
    for (int b = 0; b < 2; ++b) {
      mbar_init(mbar(kMbPFull + b), 128);
      mbar_init(mbar(kMbPEmpty + b), kWideValueThreads);
    }
    mbar_init(mbar(kMbFinal), 128);
    mbar_init(mbar(kMbQStaged), 128);
    fence_mbarrier_init();  // TMA (the async proxy) completes the full barriers
  }
  __syncthreads();  // the mbarriers are set up (every thread, one code location)
  // Let the combine kernel (a programmatic dependent) start launching.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  if (wg == 0) {
    // ===================== scores and softmax ===============================
    setmaxnreg_inc<kScoreRegs>();
    // Q: thread tid copies row tid / 2, 16-byte chunks j = tid % 2 + 2m (dims
    // 8j..8j+7, column block j / 8): the register blocks into stages
    // kQStageFirst.., blocks 7 and 8 into Q_smem. Heads past H (and every
    // head of an orphan token) are zero.
    const uint32_t q_stage = stage_of(kQStageFirst);
    {
      const int row = tid >> 1, c2 = tid & 1;
      const int head = work.h0 + row;
      const bool valid = !work.orphan && head < p.num_heads;
      const uint8_t* src = static_cast<const uint8_t*>(p.q) +
                           2 * (static_cast<int64_t>(work.t) * p.q_stride_token +
                                static_cast<int64_t>(valid ? head : 0) * p.q_stride_head) +
                           16 * c2;
#pragma unroll
      for (int m = 0; m < kHeadDimQK / 8 / 2; ++m) {
        const int j = c2 + 2 * m, blk = j >> 3;
        const uint32_t dst = (blk < kRegBlocks ? q_stage + blk * kQBlockBytes : q_smem + (blk - kRegBlocks) * kQBlockBytes) + row * 128 +
                             (((j & 7) ^ (row & 7)) << 4);
        cp_async_16(dst, src + 32 * m, valid ? 16 : 0);
      }
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async_shared();  // Q_smem is read by the tensor cores
      bar_sync(kBarQ, 128);
    }
    // The A fragments of the register blocks' 28 k-steps (ptx_sm90.cuh,
    // wgmma_m64n32k16_bf16_rs): one ldmatrix.x4 each, matrix m = lane / 8
    // being rows 16 warp + 8 (m % 2) .., dims 8 (m / 2) .. of the k-step.
    uint32_t qa[kRegSteps][4];
    {
      const int mat = lane >> 3, row = 16 * warp + 8 * (mat & 1) + (lane & 7);
#pragma unroll
      for (int ks = 0; ks < kRegSteps; ++ks) {
        const int chunk = 2 * (ks % 4) + (mat >> 1);
        ldmatrix_x4(qa[ks], q_stage + (ks / 4) * kQBlockBytes + row * 128 + ((chunk ^ (row & 7)) << 4));
      }
    }
    // Those stages are the TMA unit's from here (the fence orders these
    // reads before its writes).
    fence_proxy_async_shared();
    mbar_arrive(mbar(kMbQStaged));

    const float row_scale[2] = {p.sm_scale * 1.4426950408889634f, p.sm_scale * 1.4426950408889634f};
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float l_run[2] = {0.f, 0.f};  // this thread's 8 columns; the quad's sum at the end

    // QK(t) into s, committed as one wgmma group: Q_smem's blocks first (the
    // last latent block and the rope block), then Q's register blocks.
    // Descriptors of k-step 0, stepped by constant adds to the start-address
    // field (which cannot carry: shared addresses < 2^18).
    auto issue_qk = [&](int t, float(&s)[kAcc]) {
      const int slot = t % kStages;
      mbar_wait_warp(mbar(kMbFull + slot), (t / kStages) & 1);  // tile t landed
      const uint64_t desc_k0 = smem_desc_sw128(stage_of(slot), 16, kSwizzleGroupBytes);
      const uint64_t desc_q0 = smem_desc_sw128(q_smem, 16, kSwizzleGroupBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSmemSteps; ++kk) {
        const uint64_t desc_q = desc_q0 + (((kk / 4) * kQBlockBytes + (kk % 4) * 32) >> 4);
        const uint64_t desc_k = desc_k0 + (((kRegBlocks + kk / 4) * kBlockBytes + (kk % 4) * 32) >> 4);
        if (kk == 0) wgmma_m64n32k16_bf16_ss_first(s, desc_q, desc_k);
        else wgmma_m64n32k16_bf16_ss(s, desc_q, desc_k);
      }
#pragma unroll
      for (int ks = 0; ks < kRegSteps; ++ks) {
        wgmma_m64n32k16_bf16_rs(s, qa[ks], desc_k0 + (((ks / 4) * kBlockBytes + (ks % 4) * 32) >> 4));
      }
      wgmma_commit();
    };

    // Tile t's softmax (QK(t) complete, in `cur`); P(t) and alpha into
    // buffer t % 2.
    auto softmax_step = [&](int t, float(&cur)[kAcc]) {
      pin(cur);
      const int tok0 = kv_begin + t * kTileTokens;
      float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
      // The TMA form has no bad rows (indptr rows are checked per item); the
      // split's last tile masks the keys past its end.
      if (tok0 + kTileTokens <= kv_end) {
#pragma unroll
        for (int i = 0; i < kAcc; i += 4) {
          mx[0] = fmaxf(mx[0], fmaxf(cur[i], cur[i + 1]));
          mx[1] = fmaxf(mx[1], fmaxf(cur[i + 2], cur[i + 3]));
        }
      } else {
#pragma unroll
        for (int i = 0; i < kTileTokens / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool past = tok0 + 8 * i + 2 * c + e >= kv_end;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float v = past ? -CUDART_INF_F : cur[4 * i + 2 * r + e];
              cur[4 * i + 2 * r + e] = v;
              mx[r] = fmaxf(mx[r], v);
            }
          }
        }
        // Dims 0..511 of the rows past the split to zero (they hold another
        // item's keys, or NaN); the fence before the P hand-off covers it.
        zero_rows_past_split<kTileTokens>(stage_of(t % kStages), kv_end - tok0, tid, kBlockBytes);
      }
      float alpha[2];
      uint32_t pk[kAcc / 2];
      wide_softmax_tile<false>(cur, mx, row_scale, m_run, l_run, alpha, pk);
      const int b = t & 1;
      if (t >= 2) mbar_wait_warp(mbar(kMbPEmpty + b), ((t - 2) >> 1) & 1);  // PV(t - 2) is done with buffer b
      store_p<kTileTokens / 8>(p_buf(b), pk, warp, lane);
      if (c == 0) {
        alpha_smem[b * kRows + r0] = alpha[0];
        alpha_smem[b * kRows + r0 + 8] = alpha[1];
      }
      fence_proxy_async_shared();
      mbar_arrive(mbar(kMbPFull + b));
    };

    // Tile t: QK(t + 1) is issued (into the other S buffer) before QK(t) is
    // waited for, so QK(t + 1) and PV(t - 1) keep the tensor cores busy while
    // the softmax of tile t runs. The loop takes two tiles per iteration (the
    // two buffers are distinct register arrays) and has no branch between a
    // wgmma's issue and its wait (ptxas would serialise them); the last one or
    // two tiles follow it.
    if (n_tiles > 0) {
      float s0[kAcc], s1[kAcc];
      issue_qk(0, s0);
      int t = 0;
      for (; t + 2 < n_tiles; t += 2) {
        issue_qk(t + 1, s1);
        wgmma_wait<1>();
        softmax_step(t, s0);
        issue_qk(t + 2, s0);
        wgmma_wait<1>();
        softmax_step(t + 1, s1);
      }
      if (t + 1 < n_tiles) {
        issue_qk(t + 1, s1);
        wgmma_wait<1>();
        softmax_step(t, s0);
        wgmma_wait<0>();
        softmax_step(t + 1, s1);
      } else {
        wgmma_wait<0>();
        softmax_step(t, s0);
      }
    }

    // Final statistics: the quad's partial sums, then (m, l) for wg 1, 2 and
    // the LSE.
    const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
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
  } else {
    // ===================== values and loads (wg 1, 2) ===========================
    // (wg 0 does not return early: every warp stays to the end of the kernel.)
    setmaxnreg_dec<kValueRegs>();
    const int lt = tid - 128;
    const int vwg = wg - 1;
    // Thread 128: tile `tile` into its stage, nine boxes of 32 keys x 64 dims
    // at the split's rows (the item's first cache row + the key).
    const int64_t row0 = work.orphan ? 0 : static_cast<int64_t>(__ldg(p.kv_indptr + work.b)) + kv_begin;
    auto issue_tile = [&](int tile) {
      if (tile < n_tiles) {
        const int slot = tile % kStages;
        const uint32_t bar = mbar(kMbFull + slot);
        const int y = static_cast<int>(row0 + tile * kTileTokens);
        mbar_arrive_expect_tx(bar, kStageBytes);
#pragma unroll
        for (int blk = 0; blk < kColBlocks; ++blk) tma_load_2d(stage_of(slot) + blk * kBlockBytes, &kv_map, 64 * blk, y, bar);
      }
    };
    if (tid == 128) {
      for (int j = 0; j < kQStageFirst; ++j) issue_tile(j);
      mbar_wait(mbar(kMbQStaged), 0);  // Q has left stages kQStageFirst..
      for (int j = kQStageFirst; j < kStages; ++j) issue_tile(j);
    }

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    const int v_block0 = vwg * kValueBlocksPerWg;
    for (int t = 0; t < n_tiles; ++t) {
      const int slot = t % kStages, b = t & 1;
      mbar_wait(mbar(kMbPFull + b), (t >> 1) & 1);  // P and alpha of tile t stored
      const float a0 = alpha_smem[b * kRows + r0], a1 = alpha_smem[b * kRows + r0 + 8];
      // Skipped when no row of the warp changed its reference (alpha = 1), the
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
        const uint64_t desc_p = smem_desc_sw128(p_buf(b) + 32 * kk, 16, kSwizzleGroupBytes);
        const uint64_t desc_v = smem_desc_sw128(stage_of(slot) + v_block0 * kBlockBytes + kk * 16 * 128, kBlockBytes,
                                                kSwizzleGroupBytes);
        wgmma_m64n256k16_ss_tnspb<false, true>(o, desc_p, desc_v);
      }
      wgmma_commit();
      wgmma_wait<0>();
      pin(o);
      if (t + 2 < n_tiles) mbar_arrive(mbar(kMbPEmpty + b));  // buffer b is free for P(t + 2)
      bar_sync(kBarValues, kWideValueThreads);                // both value warpgroups are done with tile t
      if (tid == 128) issue_tile(t + kStages);                // into tile t's stage
    }

    // ---- epilogue: O / l (wide_common.cuh) ------------------------------------
    // The ring is free: wg 0 waited for every tile to land before its QK and
    // arrives on final after its last; every product reading it is complete.
    mbar_wait(mbar(kMbFinal), 0);
    float inv[2];
    wide_output_factors(final_l, r0, 1.f, work.orphan, inv);
    store_wide_output(args, work, o, inv, smem + Smem::kRing, vwg, lt, r0, c, kBarValues);
  }
#endif  // MLA_SM90A_DEVICE
}

}  // namespace wide_tma
}  // namespace sm90
}  // namespace cuda
}  // namespace mla_decode

// Every measured threshold of the plan, in one place. Each value was tuned on
// an H200 (132 SMs, 227 KB of shared memory per block, 50 MiB L2); the
// measurements behind them are in docs/performance.md ("Plan thresholds").
// "Work" is query tokens x expected keys per item, from shapes only.
#pragma once

#include <stdint.h>

namespace mla_decode {
namespace plan {

// Most KV splits the automatic plan uses. NVIDIA: beyond 32 the combine costs
// more than the extra CTAs save (B = 4, kv = 8192). AMD: not measured.
constexpr int kMaxPlannedSplitsNvidia = 32;
constexpr int kMaxPlannedSplitsAmd = 128;

// Wide kernel (H >= 64): the least work that pays for its fixed costs (each
// CTA's 72 KB Q load, the three-warpgroup chain per tile). bf16 and MXFP4
// with two or more head groups break even far earlier than fp8 or one group.
constexpr int64_t kWideMinWorkManyGroups = 2048;
constexpr int64_t kWideMinWorkOneGroup = 16384;
// Wide and narrow kernels: at least this many 64-key tiles per split (with
// one, a CTA loads its Q for one tile and writes a whole partial).
constexpr int kHopperMinTilesPerSplit = 2;
// Wide kernel: splits of one tile where even they would put CTAs on at most
// 1 / kWideOneTileGridDivisor of the SMs (H = 128, 2 x 1024: 64 CTAs, 7-11%
// faster than 32 of two tiles in bf16 and MXFP4; 4 x 1024, 128 CTAs: slower).
// OCP fp8 reaches the wide kernel only at sizes where the split cap binds.
constexpr int kWideOneTileGridDivisor = 2;

// Narrow kernels (H < 64).
constexpr int64_t kNarrowMinWorkMxfp4 = 16384;         // MXFP4: faster from here on
constexpr int64_t kNarrowMinWorkRegisterV = 65536;     // OCP fp8 on the register-V kernel
constexpr int64_t kNarrowLongSequenceKeys = 4096;      // fp8 (f16 QK) and bf16: long sequences only,
constexpr int64_t kNarrowLongSequenceWork = 131072;    //   and at least this much work
constexpr int64_t kNarrowMinWorkBf16Streamed = 32768;  // bf16 with the L2 stream hint: from here

// L2 stream hint (TMA loads with evict_first): caches of at most this many
// times L2 (above, the hinted stream is slower), one head group only (with
// more, later head groups re-read tiles from L2).
constexpr int64_t kStreamHintMaxL2Multiple = 3;
constexpr int kStreamHintMaxHeads = 16;

// mma.sync kernel, one head group: when a wave of two CTAs per SM leaves each
// split at most this many 32-key tiles, one CTA per SM is faster (fewer
// per-CTA fixed costs and partials). OCP fp8 up to 8 tiles, bf16 up to 4.
constexpr int64_t kOneWaveMaxTilesFp8 = 8;
constexpr int64_t kOneWaveMaxTilesBf16 = 4;
// mma.sync, several head groups (H > 16, or more than one token's heads):
// the same one-CTA-per-SM wave when the wave of two per SM would leave a
// split fewer than this many half tiles (32-key tiles) on average. bf16 and
// fp8 (e4m3fnuz as OCP fp8, not measured): below 2 tiles (with one tile,
// 256 CTAs at 1 x 1024, H = 128: 15-20% faster with 128; with 1.9 tiles,
// 5-7%); MXFP4 below 1.5 (faster by 13% at 1.0 and 1.5 tiles, slower by
// 2-6% at 1.9, where it keeps the two-per-SM wave).
constexpr int64_t kOneWaveManyGroupsHalfTiles = 4;
constexpr int64_t kOneWaveManyGroupsHalfTilesMxfp4 = 3;
// OCP fp8 on mma.sync: splits of at most this many 32-key tiles take the
// shallower 4-stage ring (faster unless a split is long).
constexpr int64_t kFp8ShortSplitTiles = 64;

}  // namespace plan
}  // namespace mla_decode

// Shared-memory layout of the NVIDIA mma.sync split kernel (mma_sync_kernel.cuh)
// per cache format and cp.async ring depth. Plain constexpr, visible to host
// code, so the plan (csrc/plan/plan.cpp, mma_sync_plan) can pick a ring depth
// that fits the device before anything launches.
//
// Each format is built with up to two ring depths (FormatTraits):
//   kStages     the default: two CTAs per SM fit on sm_90 (228 KB per SM),
//               which is what the tile loop is tuned for;
//   kAltStages  bf16: 4, deeper, for grids of at most one CTA per SM (two
//               stages alone on an SM expose every tile's load latency);
//               OCP fp8: 4, for splits of at most kFp8ShortSplitTiles tiles
//               (plan/tuning.h; faster there on the H200) and for devices
//               whose per-block opt-in limit is below the default's 103 KB
//               (sm_86 / sm_89 / sm_120: 99 KB); e4m3fnuz: 2, for those
//               devices; MXFP4: the same 4 (95 KB fits them).
// split_kernel_smem_bytes() gives the bytes of each; the plan chooses.
#pragma once

#include "common/params.h"
#include "kernels/common/geometry.h"

namespace mla_decode {
namespace cuda {

constexpr int kDimGroups = 4;            // QK: warps split the 576 dims four ways
constexpr int kRedStride = kBlockN + 4;  // floats per row of a partial score tile
constexpr int kPStride = kBlockN + 8;    // bf16 per row of the P tile
constexpr int kScaleStride = 20;         // u32 per token of the MXFP4 scale table (18 used)

template <KvFormat F>
struct FormatTraits;
template <>
struct FormatTraits<KvFormat::kBf16> {
  static constexpr int kRowBytes = 1152;
  static constexpr int kStages = 2;     // 83.5 KB
  static constexpr int kAltStages = 4;  // 156.5 KB: grids of at most one CTA per SM (Plan::stages)
};
template <>
struct FormatTraits<KvFormat::kFp8E4M3FN> {
  static constexpr int kRowBytes = 576;
  static constexpr int kStages = 5;     // 103 KB: no decoded tile (PV reads the raw stage), so deeper prefetch fits
  static constexpr int kAltStages = 4;  // 84.5 KB: short splits, and 99 KB devices
};
template <>
struct FormatTraits<KvFormat::kFp8E4M3FNUZ> {
  static constexpr int kRowBytes = 576;
  static constexpr int kStages = 3;     // 102.5 KB
  static constexpr int kAltStages = 2;  // 84 KB
};
template <>
struct FormatTraits<KvFormat::kMxfp4> {
  static constexpr int kRowBytes = 288;
  // 95 KB with the decoded tile, so it fits 99 KB devices too: no second ring.
  // Faster than 5 stages (107 KB) or equal at every competition shape on the
  // H200 (docs/performance.md).
  static constexpr int kStages = 4;
  static constexpr int kAltStages = 4;
};

// Byte offsets of each region; kTotal is the dynamic shared memory a CTA needs.
template <KvFormat F, int kStagesT = FormatTraits<F>::kStages>
struct SmemLayout {
  static constexpr int kRowBytes = FormatTraits<F>::kRowBytes;
  static constexpr int kStages = kStagesT;
  static constexpr int kRowSmem = kRowBytes + 16;
  static constexpr int kStageBytes = kBlockN * kRowSmem;
  static constexpr int kKvOffset = 0;
  static constexpr int kScaleOffset = kKvOffset + kStages * kStageBytes;
  // MXFP4: the two bf16 factors of each (token, block) scale, one u32.
  static constexpr int kScaleBytes = (F == KvFormat::kMxfp4) ? kStages * kBlockN * kScaleStride * 4 : 0;
  // MXFP4 and e4m3fnuz: the QK warps write the K rows they decoded (bf16,
  // 576 values + 16 bytes of padding per token) here, and PV reads V from it,
  // so every cache element is decoded once. (OCP fp8 decodes V again in PV:
  // one instruction per two codes costs less than this tile's traffic.)
  static constexpr int kDecRowSmem = 2 * kHeadDimQK + 16;
  static constexpr int kDecOffset = kScaleOffset + kScaleBytes;
  static constexpr int kDecBytes = (F == KvFormat::kBf16 || F == KvFormat::kFp8E4M3FN) ? 0 : kBlockN * kDecRowSmem;
  static constexpr int kFlagOffset = kDecOffset + kDecBytes;
  static constexpr int kFlagBytes = kStages * 16;  // one 32-bit bad-row mask per stage (16-byte aligned)
  static constexpr int kRedOffset = kFlagOffset + kFlagBytes;
  static constexpr int kRedBytes = kDimGroups * kTileRows * kRedStride * 4;
  static constexpr int kPOffset = kRedOffset + kRedBytes;
  static constexpr int kPBytes = kTileRows * kPStride * 2;
  static constexpr int kStatOffset = kPOffset + kPBytes;
  static constexpr int kStatBytes = 3 * kTileRows * 4;  // alpha, m, l per row
  static constexpr int kTotal = kStatOffset + kStatBytes;
};

// The ring depths built for a format and the shared memory of each.
struct RingDepths {
  int stages = 0;      // the default (FormatTraits::kStages)
  int alt_stages = 0;  // the alternative (FormatTraits::kAltStages)
  int bytes = 0;       // SmemLayout::kTotal of each
  int alt_bytes = 0;
};
template <KvFormat F>
constexpr RingDepths ring_depths_of() {
  using T = FormatTraits<F>;
  return {T::kStages, T::kAltStages, SmemLayout<F>::kTotal, SmemLayout<F, T::kAltStages>::kTotal};
}
constexpr RingDepths ring_depths(KvFormat format) {
  switch (format) {
    case KvFormat::kBf16: return ring_depths_of<KvFormat::kBf16>();
    case KvFormat::kFp8E4M3FN: return ring_depths_of<KvFormat::kFp8E4M3FN>();
    case KvFormat::kFp8E4M3FNUZ: return ring_depths_of<KvFormat::kFp8E4M3FNUZ>();
    case KvFormat::kMxfp4: return ring_depths_of<KvFormat::kMxfp4>();
    default: return {};
  }
}

// Dynamic shared memory of the split kernel for `format` with a ring of
// `stages` stages; 0 when that depth is not built for the format.
constexpr int split_kernel_smem_bytes(KvFormat format, int stages) {
  const RingDepths r = ring_depths(format);
  return stages == r.stages ? r.bytes : stages == r.alt_stages ? r.alt_bytes : 0;
}

}  // namespace cuda
}  // namespace mla_decode

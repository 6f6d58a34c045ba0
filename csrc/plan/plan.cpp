// The decode plan (plan.h): kernel choice, split count, ring depth, L2 hint.
#include "plan/plan.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "plan/kernel_geometry.h"
#include "plan/tuning.h"

namespace mla_decode {
namespace plan {

using cuda::kBlockN;
using cuda::kHopperTileTokens;
using cuda::kNarrowRows;
using cuda::kTileRows;
using cuda::kWideRows;

namespace {

const char* const kKernelNames[kNumKernels] = {"mma_sync", "wide", "narrow", "narrow_register_v", "mfma"};

// Expected KV tokens per batch item, from shapes only (no device reads).
int64_t estimated_kv_len(const MlaDecodeParams& p) {
  const int64_t batch = std::max<int32_t>(p.batch, 1);
  if (p.layout == KvLayout::kPaged) return static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  if (p.layout == KvLayout::kIndptrIndices) return p.num_kv_indices / batch;
  return p.num_cache_rows / batch;
}

int64_t work_of(const MlaDecodeParams& p) { return static_cast<int64_t>(p.total_q) * estimated_kv_len(p); }

// Cache and query rows that start on 16-byte boundaries: what the Hopper
// kernels' 16-byte copies and code loads need. Validation already requires it
// of every GPU call; the plan checks it rather than rely on that.
bool rows_16_byte_aligned(const MlaDecodeParams& p) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return aligned(p.kv) && p.kv_row_stride_bytes % 16 == 0 && aligned(p.q) && (p.q_stride_token * 2) % 16 == 0 &&
         (p.q_stride_head * 2) % 16 == 0;
}

// Whether the TMA forms (bf16 on the narrow kernel, the register-V kernel)
// can describe the cache to a tensor map: contiguous rows (a tile is rows
// kv_indptr[b] + j) addressed by int32 coordinates, at least one row (an
// empty tensor map is invalid), a row stride of at least the format's row
// (a multiple of 16, checked with the alignment) that the encoder accepts.
const char* why_not_tma_rows(const MlaDecodeParams& p, const DeviceFacts& d) {
  if (!d.tensor_maps) return "the driver does not encode TMA tensor maps";
  if (p.layout != KvLayout::kIndptr) return "its tiles land by TMA, which needs the indptr layout (contiguous rows)";
  if (p.num_cache_rows <= 0) return "the cache has no rows (an empty tensor map is invalid)";
  if (p.num_cache_rows > INT_MAX - 2 * kHopperTileTokens) return "the cache has more rows than int32 TMA coordinates reach";
  if (p.kv_row_stride_bytes < row_bytes(p.format) || p.kv_row_stride_bytes >= (int64_t{1} << 40)) {
    return "the cache's row stride is outside what a TMA tensor map can describe";
  }
  return nullptr;
}

// Whether the wide kernel's TMA form can describe the query to a tensor map
// (tensor_map.h, encode_q_map): head and token strides of 16 to 2^40 bytes in
// multiples of 16 (a dimension of size 1, whose stride validation records as
// 0, is never stepped along: encode_q_map gives it a valid one).
const char* why_not_tma_query(const MlaDecodeParams& p) {
  auto ok = [](int64_t stride_elems, int64_t size) {
    const int64_t bytes = stride_elems * 2;
    return size == 1 || (bytes >= 16 && bytes % 16 == 0 && bytes < (int64_t{1} << 40));
  };
  if (!ok(p.q_stride_head, p.num_heads) || !ok(p.q_stride_token, p.total_q)) {
    return "the query's strides are outside what a TMA tensor map can describe";
  }
  return nullptr;
}

// What every Hopper kernel needs: an sm_90a build on an sm_90 device, 16-byte
// aligned rows, `smem` bytes of shared memory per block.
const char* why_not_hopper(const MlaDecodeParams& p, const DeviceFacts& d, int smem) {
  if (d.vendor != Vendor::kNvidia) return "it is an NVIDIA Hopper kernel";
  if (!d.sm90a_kernels) return "it needs an sm_90a build (TORCH_CUDA_ARCH_LIST with 9.0a) on a compute capability 9.0 device";
  if (d.smem_per_block_optin < smem) return "the device's per-block shared memory is smaller than its layout";
  if (!rows_16_byte_aligned(p)) return "the cache and query rows must start on 16-byte boundaries";
  return nullptr;
}

bool one_of(KvFormat f, KvFormat a, KvFormat b, KvFormat c) { return f == a || f == b || f == c; }

// The split count and head groups, from shapes only.
//   ctas_per_sm:   CTAs of the split kernel that fit on an SM;
//   tile_tokens:   the split granularity (keys): the fewest keys a split gets;
//   chunk_align:   the kernel's keys per tile, to which a split's chunk is
//                  rounded up (kernels/common/work.cuh, locate_work);
//   one_wave_rule: the mma.sync kernel may take the one-CTA-per-SM wave below;
//   rows_per_cta:  heads per CTA;
//   whole_sm:      the Hopper kernels, whose CTA takes a whole SM: the wave
//                  is rounded down (never more CTAs than SMs).
Plan split_count(const MlaDecodeParams& p, const DeviceFacts& d, int requested_splits, int ctas_per_sm,
                 int tile_tokens, int chunk_align, bool one_wave_rule, int rows_per_cta, bool whole_sm = false) {
  Plan plan;
  plan.head_groups = (p.num_heads + rows_per_cta - 1) / rows_per_cta;
  if (requested_splits > 0) {
    plan.num_splits = requested_splits;
    return plan;
  }
  const int64_t tiles = static_cast<int64_t>(p.total_q) * plan.head_groups;
  if (tiles == 0) return plan;
  const int64_t max_tiles = std::max<int64_t>(1, estimated_kv_len(p) / tile_tokens);
  // Splits that fill `slots` CTA slots with the nearest whole wave, and leave
  // each split at least one tile. A kernel whose CTA takes a whole SM rounds
  // down instead: a CTA past the SM count waits for a whole split of the first
  // wave (the nearest wave put 136 CTAs on 132 SMs at 4 x 8192, H = 128, the
  // 17th split of each row empty only because of the tile rounding).
  auto one_wave_of = [&](int64_t slots) {
    const int64_t round = whole_sm ? 0 : tiles / 2;
    return std::min<int64_t>((slots + round) / tiles, max_tiles);
  };
  int64_t splits = one_wave_of(static_cast<int64_t>(d.num_sms) * ctas_per_sm);
  // mma.sync, one head group: when two CTAs per SM leave a split few tiles,
  // their per-CTA fixed costs outweigh the second CTA (tuning.h).
  const int64_t one_wave_max_tiles = p.format == KvFormat::kFp8E4M3FN ? kOneWaveMaxTilesFp8 : kOneWaveMaxTilesBf16;
  if (d.vendor == Vendor::kNvidia && one_wave_rule && ctas_per_sm > 1 && plan.head_groups == 1 && splits > 1 &&
      max_tiles / splits <= one_wave_max_tiles) {
    splits = one_wave_of(d.num_sms);
  }
  // mma.sync, several head groups: when two CTAs per SM leave a split fewer
  // than two tiles (MXFP4: 1.5) on average, each CTA's Q load and partial
  // cost about as much as its tiles, and one CTA per SM is faster (tuning.h).
  // Counted in half tiles, before the split cap and the chunk rounding.
  const int64_t many_groups_half_tiles =
      p.format == KvFormat::kMxfp4 ? kOneWaveManyGroupsHalfTilesMxfp4 : kOneWaveManyGroupsHalfTiles;
  if (d.vendor == Vendor::kNvidia && ctas_per_sm > 1 && plan.head_groups > 1 && splits > 1 &&
      2 * max_tiles < many_groups_half_tiles * splits) {
    splits = one_wave_of(d.num_sms);
  }
  const int64_t cap = d.vendor == Vendor::kAmd ? kMaxPlannedSplitsAmd : kMaxPlannedSplitsNvidia;
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, cap));
  // Only the splits that hold keys: split s gets keys [s chunk, (s + 1) chunk)
  // with chunk = ceil(ceil(L / splits) / chunk_align) chunk_align, so the
  // rounding may leave the last ones empty (17 splits of 1024 keys by 32:
  // chunks of 64, 16 splits with keys). An empty split still takes a CTA and
  // a partial for the combine, and the count can push the combine into its
  // larger variant (measured at H = 16, 8 x 1024: 17 splits 15.1 us, 16
  // splits 14.2, bf16).
  const int64_t kv_len = estimated_kv_len(p);
  if (splits > 1 && kv_len > 0) {
    const int64_t per_split = (kv_len + splits - 1) / splits;
    const int64_t chunk = (per_split + chunk_align - 1) / chunk_align * chunk_align;
    splits = (kv_len + chunk - 1) / chunk;
  }
  plan.num_splits = static_cast<int32_t>(splits);
  return plan;
}

// Whether a call the wide kernel can run is big enough for it (tuning.h).
bool wide_pays_off(const MlaDecodeParams& p) {
  const bool one_head_group = p.num_heads <= kWideRows;
  const int64_t min_work =
      (p.format == KvFormat::kFp8E4M3FN || one_head_group) ? kWideMinWorkOneGroup : kWideMinWorkManyGroups;
  return work_of(p) >= min_work;
}

// Whether an H < 64 call that a narrow kernel can run is big enough for it
// (tuning.h); `register_v`: OCP fp8 would run the register-V kernel;
// `stream_hint`: its tiles would take the L2 stream hint.
bool narrow_pays_off(const MlaDecodeParams& p, bool register_v, bool stream_hint) {
  const int64_t kv_len = estimated_kv_len(p);
  const int64_t work = work_of(p);
  const bool long_sequences = kv_len >= kNarrowLongSequenceKeys && work >= kNarrowLongSequenceWork;
  if (p.format == KvFormat::kFp8E4M3FN) return register_v ? work >= kNarrowMinWorkRegisterV : long_sequences;
  if (p.format == KvFormat::kBf16) return long_sequences || (stream_hint && work >= kNarrowMinWorkBf16Streamed);
  return work >= kNarrowMinWorkMxfp4;
}

// Whether a TMA-landed narrow form's tile loads take the L2 evict_first
// policy: a call that follows a large write (the competition's flush, another
// layer's outputs) finds L2 full of dirty lines, and streaming tiles with
// evict_first mostly displace each other instead of those lines; above 3x L2
// the hinted stream is slower, and with several head groups the later groups
// re-read tiles from L2, where evict_first lines go first.
bool stream_hint_pays_off(const MlaDecodeParams& p, const DeviceFacts& d) {
  return p.num_heads <= kStreamHintMaxHeads && d.l2_bytes > 0 &&
         p.num_cache_rows * row_bytes(p.format) <= kStreamHintMaxL2Multiple * d.l2_bytes;
}

// The plan of each kernel, once the kernel is chosen.
Plan wide_plan(const MlaDecodeParams& p, const DeviceFacts& d, int requested_splits) {
  // Splits of one tile on a grid so small that even they leave most SMs idle:
  // the extra CTAs run on SMs that would have nothing to do (tuning.h).
  const int64_t rows = static_cast<int64_t>(p.total_q) * ((p.num_heads + kWideRows - 1) / kWideRows);
  const int64_t one_tile_splits =
      std::min<int64_t>(kMaxPlannedSplitsNvidia, std::max<int64_t>(1, estimated_kv_len(p) / kHopperTileTokens));
  const int min_tiles = rows * one_tile_splits <= d.num_sms / kWideOneTileGridDivisor ? 1 : kHopperMinTilesPerSplit;
  Plan plan = split_count(p, d, requested_splits, 1, min_tiles * kHopperTileTokens, kHopperTileTokens, false,
                          kWideRows, true);
  plan.kernel = Kernel::kWide;
  plan.smem_bytes = kWideSmemBytes;
  // bf16 tiles by TMA where the rows allow it: one thread issues a tile's nine
  // boxes, where cp.async would take the value warpgroups ~1500 cycles of
  // issue per tile (docs/performance.md). That form lands Q by TMA too.
  plan.tma_tiles =
      p.format == KvFormat::kBf16 && why_not_tma_rows(p, d) == nullptr && why_not_tma_query(p) == nullptr;
  return plan;
}

Plan narrow_plan(const MlaDecodeParams& p, const DeviceFacts& d, int requested_splits, Kernel kernel, bool stream) {
  Plan plan = split_count(p, d, requested_splits, 1, kHopperMinTilesPerSplit * kHopperTileTokens, kHopperTileTokens,
                          false, kNarrowRows, true);
  plan.kernel = kernel;
  plan.stream_kv = stream;
  plan.tma_tiles = kernel == Kernel::kNarrowRegisterV || p.format == KvFormat::kBf16;
  plan.smem_bytes = kernel == Kernel::kNarrowRegisterV ? kNarrowRegisterVSmemBytes : kNarrowSmemBytes;
  return plan;
}

// The mma.sync kernel: its default ring where the device allows it, else the
// format's shallower one. When neither fits, the plan keeps the default and
// the dispatcher reports the shortfall.
Plan mma_sync_plan(const MlaDecodeParams& p, const DeviceFacts& d, int requested_splits) {
  using cuda::ring_depths;
  using cuda::split_kernel_smem_bytes;
  auto fits = [&](int stages) {
    const int bytes = split_kernel_smem_bytes(p.format, stages);
    return bytes > 0 && bytes <= d.smem_per_block_optin;
  };
  const cuda::RingDepths rings = ring_depths(p.format);
  int stages = rings.stages;
  if (!fits(rings.stages) && rings.alt_stages < rings.stages && fits(rings.alt_stages)) stages = rings.alt_stages;
  // CTAs per SM by shared memory (1 KB per CTA is reserved by the hardware):
  // two on sm_90 for every format, one on sm_80 (164 KB) and on 100 KB parts.
  const int per_cta = split_kernel_smem_bytes(p.format, stages) + 1024;
  const int ctas_per_sm = std::max<int>(1, std::min<int>(2, d.smem_per_sm / per_cta));
  // bf16's one-wave rule was tuned with its deeper ring, so it applies only
  // where that ring fits.
  const bool bf16_deep_fits = p.format == KvFormat::kBf16 && fits(rings.alt_stages);
  const bool one_wave_rule = p.format == KvFormat::kFp8E4M3FN || bf16_deep_fits;
  Plan plan = split_count(p, d, requested_splits, ctas_per_sm, kBlockN, kBlockN, one_wave_rule, kTileRows);
  // bf16 grids of at most one CTA per SM take the deeper ring: with two
  // stages and no second CTA on the SM, each tile's load latency is exposed.
  const int64_t ctas = static_cast<int64_t>(p.total_q) * plan.head_groups * plan.num_splits;
  if (bf16_deep_fits && ctas <= d.num_sms) stages = rings.alt_stages;
  // OCP fp8: the 4-stage ring is faster than the default 5 unless a split is long.
  if (p.format == KvFormat::kFp8E4M3FN && stages == rings.stages && fits(rings.alt_stages) &&
      estimated_kv_len(p) / kBlockN <= kFp8ShortSplitTiles * plan.num_splits) {
    stages = rings.alt_stages;
  }
  plan.kernel = Kernel::kMmaSync;
  plan.stages = stages;
  plan.smem_bytes = split_kernel_smem_bytes(p.format, stages);
  return plan;
}

Plan mfma_plan(const MlaDecodeParams& p, const DeviceFacts& d, int requested_splits) {
  // Two workgroups per CU, LDS within the 64 KB every CDNA part has.
  Plan plan = split_count(p, d, requested_splits, 2, kBlockN, kBlockN, false, kTileRows);
  plan.kernel = Kernel::kMfma;
  return plan;
}

// The plan of `kernel`, which applies to the call.
Plan plan_of(Kernel kernel, const MlaDecodeParams& p, const DeviceFacts& d, int requested_splits) {
  switch (kernel) {
    case Kernel::kWide: return wide_plan(p, d, requested_splits);
    case Kernel::kNarrow:
    case Kernel::kNarrowRegisterV: {
      const bool tma = kernel == Kernel::kNarrowRegisterV || p.format == KvFormat::kBf16;
      return narrow_plan(p, d, requested_splits, kernel, tma && stream_hint_pays_off(p, d));
    }
    case Kernel::kMfma: return mfma_plan(p, d, requested_splits);
    case Kernel::kMmaSync:
    default: return mma_sync_plan(p, d, requested_splits);
  }
}

}  // namespace

const char* kernel_name(Kernel k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kNumKernels ? kKernelNames[i] : "unknown";
}

bool kernel_from_name(const char* name, Kernel* k) {
  for (int i = 0; i < kNumKernels; ++i) {
    if (std::strcmp(name, kKernelNames[i]) == 0) {
      *k = static_cast<Kernel>(i);
      return true;
    }
  }
  return false;
}

const char* why_not(Kernel kernel, const MlaDecodeParams& p, const DeviceFacts& d) {
  const KvFormat f = p.format;
  switch (kernel) {
    case Kernel::kMmaSync:
      return d.vendor == Vendor::kNvidia ? nullptr : "it is an NVIDIA kernel";
    case Kernel::kMfma:
      return d.vendor == Vendor::kAmd ? nullptr : "it is an AMD CDNA kernel";
    case Kernel::kWide:
      if (!one_of(f, KvFormat::kBf16, KvFormat::kFp8E4M3FN, KvFormat::kMxfp4)) return "it has no e4m3fnuz variant";
      if (p.num_heads < kWideRows) return "it needs H >= 64 (64 heads per CTA)";
      return why_not_hopper(p, d, kWideSmemBytes);
    case Kernel::kNarrow: {
      if (!one_of(f, KvFormat::kBf16, KvFormat::kFp8E4M3FN, KvFormat::kMxfp4)) return "it has no e4m3fnuz variant";
      if (p.num_heads >= kWideRows) return "it needs H < 64 (the wide kernel's range starts at 64)";
      const char* hopper = why_not_hopper(p, d, kNarrowSmemBytes);
      if (hopper != nullptr || f != KvFormat::kBf16) return hopper;
      return why_not_tma_rows(p, d);  // bf16 tiles land by TMA
    }
    case Kernel::kNarrowRegisterV: {
      if (f != KvFormat::kFp8E4M3FN) return "it reads OCP fp8 (e4m3fn) codes only";
      if (p.num_heads >= kWideRows) return "it needs H < 64 (the wide kernel's range starts at 64)";
      const char* hopper = why_not_hopper(p, d, kNarrowRegisterVSmemBytes);
      return hopper != nullptr ? hopper : why_not_tma_rows(p, d);
    }
  }
  return "unknown kernel";
}

Plan make_plan(const MlaDecodeParams& p, const DeviceFacts& device, const Overrides& ov) {
  DeviceFacts d = device;
  if (ov.smem_limit > 0) d.smem_per_block_optin = std::min(d.smem_per_block_optin, ov.smem_limit);
  const int splits = ov.num_splits;
  Plan plan;
  if (ov.force_kernel) {
    const char* no = why_not(ov.kernel, p, d);
    if (no != nullptr) {
      plan.kernel = ov.kernel;
      plan.error = no;
      plan.why = "forced by the overrides";
    } else {
      plan = plan_of(ov.kernel, p, d, splits);
      plan.why = "forced by the overrides";
    }
  } else if (d.vendor == Vendor::kAmd) {
    plan = mfma_plan(p, d, splits);
    plan.why = "AMD CDNA: the MFMA kernel runs every call";
  } else if (why_not(Kernel::kWide, p, d) == nullptr && wide_pays_off(p)) {
    plan = wide_plan(p, d, splits);
    plan.why = "H >= 64 on Hopper, and enough query tokens x keys per item to pay for the wide kernel's fixed costs";
  } else {
    const bool narrow_ok = why_not(Kernel::kNarrow, p, d) == nullptr;
    const bool register_v = why_not(Kernel::kNarrowRegisterV, p, d) == nullptr;
    const bool tma = p.format == KvFormat::kBf16 || register_v;
    const bool stream = narrow_ok && tma && stream_hint_pays_off(p, d);
    if (narrow_ok && narrow_pays_off(p, register_v, stream)) {
      plan = narrow_plan(p, d, splits, register_v ? Kernel::kNarrowRegisterV : Kernel::kNarrow, stream);
      plan.why = register_v ? "OCP fp8 with H < 64 on Hopper, rows TMA can address, enough work for the register-V kernel"
                            : "H < 64 on Hopper, and enough work (size thresholds in plan/tuning.h) for the narrow kernel";
    } else {
      plan = mma_sync_plan(p, d, splits);
      plan.why = "no Hopper kernel applies, or the call is below their size thresholds: the mma.sync kernel";
    }
  }
  plan.smem_limit = d.smem_per_block_optin;
  plan.programmatic_combine = d.vendor == Vendor::kNvidia && d.arch >= 90;
  return plan;
}

size_t workspace_bytes(const MlaDecodeParams& p, const Plan& plan) {
  if (plan.num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(p.total_q) * p.num_heads;
  return static_cast<size_t>(plan.num_splits) * rows * (kHeadDimV + 1) * sizeof(float);
}

}  // namespace plan
}  // namespace mla_decode

// Split planning, the split-combine kernel, and the format dispatch. Shared
// by CUDA and HIP (hipified): vendor differences go through portability.h.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "../mla_decode/portability.h"
#include "decode_common.h"
#include "decode_launch.h"
#include "decode_smem.h"
#include "trace.cuh"

namespace mla_decode {
namespace cuda {

#if !MLA_PLATFORM_HIP
KernelSwitch kernel_switch(KvFormat format) {
  auto read = [](const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr) return KernelSwitch::kByPlan;
    if (std::strcmp(v, "mma") == 0) return KernelSwitch::kMma;
    if (std::strcmp(v, "wide") == 0) return KernelSwitch::kWide;
    if (std::strcmp(v, "narrow") == 0) return KernelSwitch::kNarrow;
    if (std::strcmp(v, "wgmma") == 0) return KernelSwitch::kWgmma;
    return KernelSwitch::kByPlan;
  };
  static const KernelSwitch bf16 = read("MLA_DECODE_BF16_KERNEL");
  static const KernelSwitch fp8 = read("MLA_DECODE_FP8_KERNEL");
  static const KernelSwitch mxfp4 = read("MLA_DECODE_MXFP4_KERNEL");
  switch (format) {
    case KvFormat::kBf16: return bf16;
    case KvFormat::kFp8E4M3FN: return fp8;
    case KvFormat::kMxfp4: return mxfp4;
    default: return KernelSwitch::kByPlan;
  }
}
#endif

template <KvFormat F>
cudaError_t launch_split_kernel(const DecodeLaunch& args, cudaStream_t stream);
extern template cudaError_t launch_split_kernel<KvFormat::kBf16>(const DecodeLaunch&, cudaStream_t);
extern template cudaError_t launch_split_kernel<KvFormat::kFp8E4M3FN>(const DecodeLaunch&, cudaStream_t);
extern template cudaError_t launch_split_kernel<KvFormat::kFp8E4M3FNUZ>(const DecodeLaunch&, cudaStream_t);
extern template cudaError_t launch_split_kernel<KvFormat::kMxfp4>(const DecodeLaunch&, cudaStream_t);

namespace {

// OCP fp8 splits of at most this many 32-token tiles run the 4-stage ring.
constexpr int kFp8ShortSplitTiles = 64;

constexpr int kCombineRowThreads = kHeadDimV / 4;  // 128: thread t owns dims 4t..4t+3 of a row
// The two variants of combine_kernel: splits per L2 round trip, rows per block.
constexpr int kFewSplitsChunk = 8, kFewSplitsRows = 2;
constexpr int kManySplitsChunk = 32, kManySplitsRows = 1;

// Merges the split partials of each (token, head) row:
//   out = sum_s exp(lse_s - M) O_s / sum_s exp(lse_s - M),  lse = M + log(sum)
// (natural log). Partials are normalised (O_s = sum p v / sum p); an empty
// split has lse -inf and O_s = 0 and weighs nothing; any NaN lse makes the row
// NaN (a bad cache index). Grid: ceil(total_q * H / kRows) blocks of 128 kRows
// threads, 128 per row.
//
// Latency, not bandwidth, bounds this kernel (the partials were just written
// and sit in L2), so it is laid out for the fewest dependent round trips and
// no block-wide synchronisation: every thread reads the row's LSEs itself (the
// same addresses for all 128, served as broadcasts) together with its own
// float4 of each split, kChunk splits per round trip, and folds them into a
// running (max, sum, acc) as in the online softmax. The launcher picks
//   kChunk 8, kRows 2 (64 registers, four blocks per SM) for plans of up to 8
//     splits, which have many rows;
//   kChunk 32, kRows 1 (~190 registers) for more splits, which have few rows:
//     one round trip where chunks of 8 took four (measured: 4.5 -> 3.7 us
//     after the split kernel at 32 splits), and one row per block so the
//     rows' 64 KB of partials are read by as many SMs as there are rows.
// There are no cross-lane operations, so the code is the same for 32- and
// 64-wide warps.
template <int kChunk, int kRows>
__global__ void __launch_bounds__(kCombineRowThreads * kRows) combine_kernel(const MlaDecodeParams p,
                                                                  const float* __restrict__ partial_out,
                                                                  const float* __restrict__ partial_lse,
                                                                  int num_splits) {
  TraceProbe<3> trace;  // -DMLA_DECODE_TRACE only (trace.cuh)
  trace.start(blockIdx.x == 0 || blockIdx.x == gridDim.x - 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the split kernel (sm_90+): wait
  // here until that grid has finished and its writes are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  trace.mark();  // 1: the split grid is done
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kCombineRowThreads;
  const int t4 = threadIdx.x % kCombineRowThreads;
  if (row >= rows) return;

  float m = -MLA_INF, wsum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  bool has_nan = false;
  for (int base = 0; base < num_splits; base += kChunk) {
    float lse[kChunk];
    float4 x[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int s = base + u;
      if (s < num_splits) {
        lse[u] = partial_lse[s * rows + row];
        x[u] = reinterpret_cast<const float4*>(partial_out + (s * rows + row) * kHeadDimV)[t4];
      } else {
        lse[u] = -MLA_INF;
        x[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      has_nan |= isnan(lse[u]);
      m_new = fmaxf(m_new, lse[u]);
    }
    if (m_new == -MLA_INF) continue;  // nothing but empty splits so far
    const float rescale = m == -MLA_INF ? 0.f : __expf(m - m_new);
    wsum *= rescale;
    acc.x *= rescale;
    acc.y *= rescale;
    acc.z *= rescale;
    acc.w *= rescale;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const float w = lse[u] == -MLA_INF ? 0.f : __expf(lse[u] - m_new);
      wsum += w;
      acc.x += w * x[u].x;
      acc.y += w * x[u].y;
      acc.z += w * x[u].z;
      acc.w += w * x[u].w;
    }
    m = m_new;
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const float nan_or_zero = has_nan ? MLA_NAN : 0.f;
  const int t = static_cast<int>(row / p.num_heads), h = static_cast<int>(row % p.num_heads);
  uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                  static_cast<int64_t>(h) * p.out_stride_head;  // bf16 bits
  uint2 packed;
  packed.x = mla_pack_bf16x2(acc.x * inv + nan_or_zero, acc.y * inv + nan_or_zero);
  packed.y = mla_pack_bf16x2(acc.z * inv + nan_or_zero, acc.w * inv + nan_or_zero);
  *reinterpret_cast<uint2*>(dst + 4 * t4) = packed;
  if (t4 == 0) {
    p.lse[static_cast<int64_t>(t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] =
        has_nan ? MLA_NAN : (wsum > 0.f ? m + __logf(wsum) : -MLA_INF);
  }
  trace.mark();  // 2: stored
  trace.print("combine");
}

// Expected KV tokens per batch item, from shapes only (no device reads).
int64_t estimated_kv_len(const MlaDecodeParams& p) {
  if (p.layout == KvLayout::kPaged) return static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  if (p.layout == KvLayout::kIndptrIndices) return p.num_kv_indices / std::max<int32_t>(p.batch, 1);
  return p.num_cache_rows / std::max<int32_t>(p.batch, 1);
}

#if !MLA_PLATFORM_HIP
// Whether a call that the wide kernel can run is big enough for it: query
// tokens x expected keys per item, from shapes only. Below this the wide
// kernel's fixed costs (each CTA's 72 KB Q load, the three-warpgroup chain per
// key tile, fp8's two-tile conversion prologue) cost more than its tensor-core
// rate saves. Measured on the H200 (graph replay, us, wide against mma.sync;
// docs/performance.md, runs 78-84):
//   H = 128 (two wide head groups against eight mma.sync ones):
//     bf16   1 x 1024 13.2 / 11.1, 4 x 1024 14.3 / 16.7
//     MXFP4  1 x 1024 13.8 / 11.6, 4 x 1024 15.6 / 18.3
//     fp8    4 x 1024 18.2 / 15.9, 1 x 8192 24.0 / 22.9, 4 x 8192 38.8 / 58.9
//   H = 64 (one wide head group against four):
//     bf16   4 x 1024 13.6 / 13.2, 1 x 8192 19.2 / 17.6, 4 x 8192 27.3 / 41.3
//     MXFP4  4 x 1024 14.8 / 14.1, 1 x 8192 21.8 / 21.2, 4 x 8192 27.0 / 46.6
//     fp8    4 x 1024 17.4 / 14.0, 1 x 8192 23.1 / 16.9, 4 x 8192 29.0 / 35.1
// hence thresholds between the measured crossovers.
bool wide_kernel_pays_off(const MlaDecodeParams& p) {
  const bool one_head_group = p.num_heads <= kWideRows;
  const int64_t min_work = (p.format == KvFormat::kFp8E4M3FN || one_head_group) ? 16384 : 2048;
  return static_cast<int64_t>(p.total_q) * estimated_kv_len(p) >= min_work;
}

// Whether an H < 64 call that the narrow kernel can run is big enough for it,
// from shapes only. Competition protocol at H = 16 (us, narrow / mma.sync):
// MXFP4 (docs/performance.md session 11): 4 x 1024 13.5 / 11.9, 4 x 8192
// 20.9 / 25.0, 32 x 1024 20.5 / 22.0, and faster at every larger shape; hence
// the wide kernel's fp8 threshold.
// OCP fp8 (us, narrow / mma.sync, runs 91 and 93): 32 x 8192 65-66 / 68,
// 64 x 8192 115 / 119-122, 256 x 8192 401 / 404-409; slower at 4 x 8192 and
// at every kv = 1024 shape (the narrow kernel's longer prologue is paid per
// split); hence long sequences and at least 131072 query tokens x keys.
// The fp8 calls that run its register-V form (narrow_register_v_applies: the
// indptr layout) take it from 65536 query tokens x keys (session 15, run 3,
// forced narrow / planned, us): 64 x 1024 27.6, 25.7 / 29.6, 29.2;
// 256 x 1024 63.8, 62.8 / 66.3; slower at 4 x 8192 (20.9-21.9 / 19.8-20.3)
// and 32 x 1024 (20.6-21.5 / 19.3).
// bf16 (TMA-landed tiles, indptr layout; session 16, run 6, forced narrow /
// mma.sync, us): 32 x 8192 88.6, 90.4 / 93.4, 95.3; 64 x 8192 158.9, 160.8 /
// 165.5, 166.2; 256 x 8192 578.8, 581.0 / 587.3, 588.5; the same within noise
// at 4 x 8192, 32 x 1024 and 64 x 1024, slower at 256 x 1024 (91.6, 92.9 /
// 90.1, 92.1): hence long sequences and at least 131072 query tokens x keys.
// With the L2 stream hint (kv_stream_hint_pays_off) bf16 also gains at the
// smaller shapes (session 17, run138, us, narrow with the hint / mma.sync):
// 4 x 8192 23.4 / 25.0, 32 x 1024 23.1 / 24.2, 64 x 1024 33.4 / 37.0; the same
// at 4 x 1024 (12.7-12.9 / 12.4-12.7); hence from 32768 query tokens x keys
// (the smallest measured gain; not measured between 4096 and 32768).
bool narrow_kernel_pays_off(const MlaDecodeParams& p, bool stream_hint) {
  const int64_t kv_len = estimated_kv_len(p);
  const int64_t work = static_cast<int64_t>(p.total_q) * kv_len;
  if (p.format == KvFormat::kFp8E4M3FN) {
    return narrow_register_v_applies(p) ? work >= 65536 : kv_len >= 4096 && work >= 131072;
  }
  if (p.format == KvFormat::kBf16) return (kv_len >= 4096 && work >= 131072) || (stream_hint && work >= 32768);
  return work >= 16384;
}

// Whether the TMA-landed narrow forms (bf16; the OCP fp8 register-V kernel)
// should load their tiles with the L2 evict_first policy (ptx_sm90.cuh): when
// the cache is at most 3x L2's size. A call that follows a large write (the
// competition's flush, another layer's outputs) finds L2 full of dirty lines;
// streaming cache tiles with evict_first mostly displace each other rather
// than those lines, which saves their write-back while the call runs. Measured
// on the H200 (scripts/l2_hint_probe.cu, run 137; 132 CTAs streaming after a
// 256 MB write, us, evict_first / none): 37 MB 15.2 / 16.5, 74 MB 24.7 / 27.4,
// 149 MB 44.0 / 46.1, 160 MB 46.6 / 48.4; but 301 MB 81.5 / 79.4, 603 MB
// 152.3 / 144.8, 2.4 GB 554 / 538. In the decode kernels (run138): bf16 4 x
// 8192 -1.6 us, 32 x 1024 -1.1, 64 x 1024 -3.6; 64 x 8192 +8 (not taken).
// One head group only (H <= 16, as measured): with more, the head groups'
// CTAs read the same tiles, the later ones from L2, where evict_first lines
// are the first to go.
bool kv_stream_hint_pays_off(const MlaDecodeParams& p, const DeviceLimits& device) {
  const bool bf16 = p.format == KvFormat::kBf16;
  if (!(bf16 || narrow_register_v_applies(p)) || p.num_heads > kNarrowRows || device.l2_bytes <= 0) return false;
  const int64_t row_bytes =
      bf16 ? FormatTraits<KvFormat::kBf16>::kRowBytes : FormatTraits<KvFormat::kFp8E4M3FN>::kRowBytes;
  return p.num_cache_rows * row_bytes <= 3 * device.l2_bytes;  // the whole cache
}
#endif

// The split count (and head groups) from shapes only; plan_splits adds the
// kernel variant.
//   ctas_per_sm:   CTAs of the split kernel that fit on an SM (shared memory);
//   tile_tokens:   keys per pipeline stage (the kernel's split granularity);
//   one_wave_rule: the mma.sync kernel may take the one-CTA-per-SM wave below.
//   rows_per_cta:  heads per CTA (kTileRows, or kWideRows for the wide kernel).
SplitPlan plan_split_count(const MlaDecodeParams& p, int num_sms, int requested_splits, int ctas_per_sm,
                           int tile_tokens, bool one_wave_rule, int rows_per_cta = kTileRows) {
  SplitPlan plan;
  plan.head_groups = (p.num_heads + rows_per_cta - 1) / rows_per_cta;
  if (requested_splits > 0) {
    plan.num_splits = requested_splits;
    return plan;
  }
  const int64_t tiles = static_cast<int64_t>(p.total_q) * plan.head_groups;
  if (tiles == 0) return plan;
  const int64_t max_tiles = std::max<int64_t>(1, estimated_kv_len(p) / tile_tokens);
  // Splits that fill `slots` CTA slots with the nearest whole wave, and leave
  // each split at least one tile.
  auto one_wave_of = [&](int64_t slots) { return std::min<int64_t>((slots + tiles / 2) / tiles, max_tiles); };
  int64_t splits = one_wave_of(static_cast<int64_t>(num_sms) * ctas_per_sm);
#if !MLA_PLATFORM_HIP
  // OCP fp8 and bf16 on the mma.sync kernel, one head group (H <= 16): when a
  // wave of two CTAs per SM leaves a split at most 4 tiles, the per-CTA fixed
  // costs (lookups, Q, prologue, one more partial to write and combine)
  // outweigh the second CTA, and a wave of one CTA per SM is faster, provided
  // that CTA keeps several tiles in flight (fp8: 4 or 5 stages; bf16: the
  // 4-stage ring, which such a grid selects where it fits, see plan_splits;
  // the caller passes one_wave_rule false where it does not).
  // Measured on the H200: fp8 B=32, kv=1024 21.4 us with 4 splits against
  // 24.0 with 8 (forced split counts, docs/perf_runs/run39-split-sweep.txt);
  // bf16 24.6 against 25.3 (session 5, run47, with the deep ring; with two
  // stages 4 splits were slower, 26.5 against 25.0). MXFP4 is faster with
  // 8 (25.4 against 26.5). B=4 stays at the 32-split cap. Not measured at
  // H > 16, so not applied there. fp8 takes the rule up to 8 tiles per split
  // (session 6 split sweep, docs/perf_runs/run50-split-sweep.txt: B=64,
  // kv=1024 28.8 us with 2 splits against 29.9 with 4); bf16 does not (37.4
  // against 36.8).
  const int64_t one_wave_max_tiles = p.format == KvFormat::kFp8E4M3FN ? 8 : 4;
  if (one_wave_rule && ctas_per_sm > 1 && plan.head_groups == 1 && splits > 1 &&
      max_tiles / splits <= one_wave_max_tiles) {
    splits = one_wave_of(num_sms);
  }
#else
  (void)one_wave_rule;
#endif
  // At most kMaxPlannedSplits (decode_common.h). NVIDIA, 32: beyond that the
  // combine (one row per block, reading every split's 2 KB partial) costs
  // more than the extra CTAs save. Measured on the H200
  // (scripts/split_sweep.py, docs/performance.md): B=4, kv=8192
  // takes 24.5 us (fp8) / 28.1 us (bf16) with 32 splits against 28.3 / 29.8
  // with the 64 that a full wave would ask for; no other competition shape
  // plans more than 32.
  plan.num_splits = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(splits, kMaxPlannedSplits)));
  return plan;
}
}  // namespace

SplitPlan plan_splits(const MlaDecodeParams& p, const DeviceLimits& device, int requested_splits) {
#if MLA_PLATFORM_HIP
  // The MFMA kernel: two workgroups per CU, LDS within the 64 KB every CDNA
  // part has.
  return plan_split_count(p, device.num_sms, requested_splits, 2, kBlockN, false);
#else
  if (fp8_uses_wgmma(p)) {
    // One CTA per SM (8 warps, 212 KB of shared memory), 64-token stages.
    SplitPlan plan = plan_split_count(p, device.num_sms, requested_splits, 1, kBlockNWgmma, false);
    plan.fp8_wgmma = true;
    return plan;
  }
  if (wide_kernel_applies(p, device.smem_per_block_optin) &&
      (wide_kernel_forced(p.format) || wide_kernel_pays_off(p))) {
    // One CTA per SM (384 threads, ~225 KB of shared memory), 64 heads per CTA,
    // and at least two key tiles per split: with one, each CTA loads its 72 KB
    // of Q for one tile and writes 128 KB of partials. Measured on the H200
    // (scripts/split_sweep.py --heads 128, run74): b4/kv1024 17.0 us with 8
    // splits against 21.9 with the 16 of one tile each; b1/kv1024 15.0 against
    // 14.6, the other sweep shapes already planned two or more.
    SplitPlan plan =
        plan_split_count(p, device.num_sms, requested_splits, 1, 2 * wide_tile_tokens(), false, kWideRows);
    plan.wide = true;
    plan.smem_bytes = wide_smem_bytes();
    return plan;
  }
  const bool narrow_applies = narrow_kernel_applies(p, device.smem_per_block_optin);
  const bool stream_hint = narrow_applies && kv_stream_hint_pays_off(p, device);
  if (narrow_applies && (narrow_kernel_forced(p.format) || narrow_kernel_pays_off(p, stream_hint))) {
    // One CTA per SM (~169 KB of shared memory), 16 heads per CTA, at least
    // two 64-key tiles per split (as the wide kernel; not tuned).
    SplitPlan plan =
        plan_split_count(p, device.num_sms, requested_splits, 1, 2 * narrow_tile_tokens(), false, kNarrowRows);
    plan.narrow = true;
    plan.stream_kv = stream_hint;
    plan.smem_bytes = narrow_smem_bytes();
    return plan;
  }
  // The mma.sync kernel. Its default ring where the device allows it, else
  // the format's shallower one (sm_86 / sm_89 / sm_120 allow 99 KB per block;
  // fp8's default needs 103 KB, e4m3fnuz's 102.5 KB). When neither fits, the plan
  // keeps the default and the dispatcher reports the shortfall.
  auto fits = [&](int stages) {
    const int bytes = split_kernel_smem_bytes(p.format, stages);
    return bytes > 0 && bytes <= device.smem_per_block_optin;
  };
  const RingDepths rings = ring_depths(p.format);
  const int default_stages = rings.stages;
  const int alt_stages = rings.alt_stages;
  int stages = default_stages;
  if (!fits(default_stages) && alt_stages < default_stages && fits(alt_stages)) stages = alt_stages;
  // CTAs per SM by shared memory (1 KB per CTA is reserved by the hardware):
  // two on sm_90 for every format; one on sm_80 (164 KB) and on 100 KB parts.
  const int per_cta = split_kernel_smem_bytes(p.format, stages) + 1024;
  const int ctas_per_sm = std::max<int>(1, std::min<int>(2, device.smem_per_sm / per_cta));
  // bf16's one-wave rule was tuned with its deeper ring (a lone CTA with two
  // stages is slower), so it applies only where that ring fits.
  const bool bf16_deep_fits = p.format == KvFormat::kBf16 && fits(alt_stages);
  const bool one_wave_rule = p.format == KvFormat::kFp8E4M3FN || bf16_deep_fits;
  SplitPlan plan = plan_split_count(p, device.num_sms, requested_splits, ctas_per_sm, kBlockN, one_wave_rule);
  // bf16 grids of at most one CTA per SM take the deeper ring: with two stages
  // and no second CTA on the SM, each tile's load latency is exposed.
  const int64_t ctas = static_cast<int64_t>(p.total_q) * plan.head_groups * plan.num_splits;
  if (bf16_deep_fits && ctas <= device.num_sms) stages = alt_stages;
  // OCP fp8: the 4-stage ring is faster than the default 5 unless a split is
  // long. Measured on the H200 in alternating runs (session 7): run58, all
  // splits on 4 stages: b32/kv8192 67.7 against 69.0 us, b256/kv1024 64.6
  // against 65.8, b64/kv8192 118.8 against 119.6, but b256/kv8192 (256 tiles
  // per split) 409-415 against 405; run59, this rule: fp8 geomean 47.8 / 48.0
  // against 48.2 / 48.1.
  if (p.format == KvFormat::kFp8E4M3FN && stages == default_stages && fits(alt_stages) &&
      estimated_kv_len(p) / kBlockN <= static_cast<int64_t>(kFp8ShortSplitTiles) * plan.num_splits) {
    stages = alt_stages;
  }
  plan.stages = stages;
  plan.smem_bytes = split_kernel_smem_bytes(p.format, stages);
  return plan;
#endif
}

size_t workspace_bytes(const MlaDecodeParams& p, const SplitPlan& plan) {
  if (plan.num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(p.total_q) * p.num_heads;
  return static_cast<size_t>(plan.num_splits) * rows * (kHeadDimV + 1) * sizeof(float);
}

cudaError_t launch_decode(const MlaDecodeParams& p, const SplitPlan& plan, void* workspace, cudaStream_t stream) {
  if (p.total_q == 0) return cudaSuccess;
  DecodeLaunch args;
  args.p = p;
  args.num_splits = plan.num_splits;
  args.head_groups = plan.head_groups;
  args.q_per_item = (p.batch > 0 && p.total_q % p.batch == 0) ? p.total_q / p.batch : 0;
  args.stages = plan.stages;
  args.fp8_wgmma = plan.fp8_wgmma;
  args.wide = plan.wide;
  args.narrow = plan.narrow;
  args.stream_kv = plan.stream_kv;
  args.partial_out = nullptr;
  args.partial_lse = nullptr;
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(p.total_q) * p.num_heads;
    args.partial_out = static_cast<float*>(workspace);
    args.partial_lse = args.partial_out + static_cast<size_t>(plan.num_splits) * rows * kHeadDimV;
  }
  cudaError_t err;
  switch (p.format) {
    case KvFormat::kBf16: err = launch_split_kernel<KvFormat::kBf16>(args, stream); break;
    case KvFormat::kFp8E4M3FN: err = launch_split_kernel<KvFormat::kFp8E4M3FN>(args, stream); break;
    case KvFormat::kFp8E4M3FNUZ: err = launch_split_kernel<KvFormat::kFp8E4M3FNUZ>(args, stream); break;
    case KvFormat::kMxfp4: err = launch_split_kernel<KvFormat::kMxfp4>(args, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || plan.num_splits == 1) return err;
  // See combine_kernel for the two variants.
  const bool many_splits = plan.num_splits > kFewSplitsChunk;
  const int rows_per_block = many_splits ? kManySplitsRows : kFewSplitsRows;
  auto* const combine = many_splits ? combine_kernel<kManySplitsChunk, kManySplitsRows>
                                    : combine_kernel<kFewSplitsChunk, kFewSplitsRows>;
  const unsigned blocks = static_cast<unsigned>(
      (static_cast<int64_t>(p.total_q) * p.num_heads + rows_per_block - 1) / rows_per_block);
  const unsigned threads = static_cast<unsigned>(kCombineRowThreads * rows_per_block);
#if !MLA_PLATFORM_HIP
  // Programmatic dependent launch (sm_90+): the combine grid is launched while
  // the split kernel runs and waits for it in griddepcontrol.wait, which hides
  // the launch gap between the two kernels. Also valid inside CUDA graphs.
  return launch_programmatic(combine, dim3(blocks), dim3(threads), 0, stream, p,
                             static_cast<const float*>(args.partial_out), static_cast<const float*>(args.partial_lse),
                             static_cast<int>(plan.num_splits));
#else
  combine<<<blocks, threads, 0, stream>>>(p, args.partial_out, args.partial_lse, plan.num_splits);
  return cudaGetLastError();
#endif
}

}  // namespace cuda
}  // namespace mla_decode

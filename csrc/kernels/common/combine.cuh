// The split-combine kernel: merges the KV splits' partial outputs of each
// (query token, head) row by log-sum-exp. Launched by launch.cu after a split
// kernel with more than one split. Shared by CUDA and HIP (hipified).
#pragma once

#include "common/params.h"
#include "common/portability.h"
#include "kernels/common/trace.cuh"

namespace mla_decode {
namespace cuda {
namespace {

constexpr int kCombineRowThreads = kHeadDimV / 4;  // 128: thread t owns dims 4t..4t+3 of a row
// The three variants of combine_kernel: splits per L2 round trip, rows per block.
constexpr int kFewSplitsChunk = 8, kFewSplitsRows = 2;
constexpr int kMidSplitsChunk = 16, kMidSplitsRows = 1;
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
//   kChunk 16, kRows 1 (123 registers, four blocks per SM) for 9 to 16
//     splits: one round trip, and the 512 rows of 4 tokens x 128 heads in one
//     wave of blocks (at 194 registers two blocks fit an SM: two waves);
//   kChunk 32, kRows 1 (194 registers) for more splits, which have few rows:
//     one round trip where chunks of 8 take four (measured faster at 32
//     splits, docs/performance.md), and one row per block so the rows' 64 KB
//     of partials are read by as many SMs as there are rows.
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

}  // namespace
}  // namespace cuda
}  // namespace mla_decode

// The combine folded into the split kernel (NVIDIA mma.sync kernel): the last
// split CTA of each (query token, head group) to finish merges the group's
// partials itself, so no combine kernel runs. Used for plans of 2 ..
// kFusedMaxSplits splits (SplitPlan::fused_combine): the merging CTA reads the
// other splits' partials alone (at most 7 x 32 KB from L2), which stops paying
// well before the 32 splits of the B = 4 shapes (1 MB), where combine_kernel
// spreads the reading over many CTAs.
//
// Tickets: one int32 per (token, head group) = per blockIdx.x, zero when the
// grid starts. Every CTA adds one after its partials are written (release);
// the CTA that draws num_splits - 1 merges (acquire) and sets the ticket back
// to zero, so the next call, or the next replay of a CUDA graph, finds it
// zero. The dispatcher owns the buffer (persistent, zeroed once, one per
// device and stream).
//
// The merge is combine_kernel's arithmetic (decode_launch.cu): out = sum_s
// exp(lse_s - M) O_s / sum_s exp(lse_s - M), lse = M + log(sum); an empty
// split (lse -inf) weighs nothing, any NaN lse makes the row NaN.
#pragma once

#include "../mla_decode/params.h"
#include "../mla_decode/portability.h"
#include "decode_common.h"

namespace mla_decode {
namespace cuda {

// Called by all kThreadsT threads of a split CTA after it has stored its
// partials. `is_last` is a shared-memory int. Rows: kTileRows heads h0 ..
// of token t; thread tid merges dims [32 (tid % 16), +32) of row tid / 16.
template <int kThreadsT>
__device__ __forceinline__ void merge_if_last(const DecodeLaunch& args, int t, int h0, int* is_last) {
  static_assert(kThreadsT == kTileRows * 16, "16 threads per row, 32 dims each");
  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  __syncthreads();  // every thread's partial stores precede thread 0's fence (CTA scope)
  if (tid == 0) {
    __threadfence();  // release: this CTA's partials before its ticket
    const int drawn = atomicAdd(args.tickets + blockIdx.x, 1);
    *is_last = drawn == args.num_splits - 1;
  }
  __syncthreads();
  if (!*is_last) return;
  __threadfence();  // acquire: the other CTAs' partials after their tickets

  constexpr int kDims = kHeadDimV / 16;  // 32 per thread
  const int r = tid / 16, d0 = kDims * (tid % 16);
  const int h = h0 + r;
  if (h < p.num_heads) {
    const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
    const int64_t row = static_cast<int64_t>(t) * p.num_heads + h;
    float lse[kFusedMaxSplits];
    float m = -MLA_INF;
    bool has_nan = false;
#pragma unroll
    for (int s = 0; s < kFusedMaxSplits; ++s) {
      // __ldcg: from L2; the partials were written by other SMs.
      lse[s] = s < args.num_splits ? __ldcg(args.partial_lse + s * rows + row) : -MLA_INF;
      has_nan |= isnan(lse[s]);
      m = fmaxf(m, lse[s]);
    }
    float4 acc[kDims / 4];
#pragma unroll
    for (int i = 0; i < kDims / 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    if (m != -MLA_INF) {
#pragma unroll
      for (int s = 0; s < kFusedMaxSplits; ++s) {
        const float w = lse[s] == -MLA_INF ? 0.f : __expf(lse[s] - m);
        if (s >= args.num_splits || w == 0.f) continue;
        wsum += w;
        const float4* src = reinterpret_cast<const float4*>(args.partial_out + (s * rows + row) * kHeadDimV + d0);
#pragma unroll
        for (int i = 0; i < kDims / 4; ++i) {
          const float4 x = __ldcg(src + i);
          acc[i].x += w * x.x;
          acc[i].y += w * x.y;
          acc[i].z += w * x.z;
          acc[i].w += w * x.w;
        }
      }
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    const float nan_or_zero = has_nan ? MLA_NAN : 0.f;
    uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                    static_cast<int64_t>(h) * p.out_stride_head + d0;  // bf16 bits
#pragma unroll
    for (int i = 0; i < kDims / 4; ++i) {  // 8-byte stores, as combine_kernel (rows are 8-byte aligned)
      uint2 packed;
      packed.x = mla_pack_bf16x2(acc[i].x * inv + nan_or_zero, acc[i].y * inv + nan_or_zero);
      packed.y = mla_pack_bf16x2(acc[i].z * inv + nan_or_zero, acc[i].w * inv + nan_or_zero);
      *reinterpret_cast<uint2*>(dst + 4 * i) = packed;
    }
    if (tid % 16 == 0) {
      p.lse[static_cast<int64_t>(t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] =
          has_nan ? MLA_NAN : (wsum > 0.f ? m + __logf(wsum) : -MLA_INF);
    }
  }
  if (tid == 0) args.tickets[blockIdx.x] = 0;  // for the next call / graph replay
}

}  // namespace cuda
}  // namespace mla_decode

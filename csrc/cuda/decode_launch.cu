// Split planning, the split-combine kernel, and the format dispatch.
#include <math_constants.h>

#include <algorithm>

#include "decode_kernel.cuh"
#include "decode_launch.h"

namespace mla_decode {
namespace cuda {

template <KvFormat F>
cudaError_t launch_split_kernel(const DecodeLaunch& args, cudaStream_t stream);
extern template cudaError_t launch_split_kernel<KvFormat::kBf16>(const DecodeLaunch&, cudaStream_t);
extern template cudaError_t launch_split_kernel<KvFormat::kFp8E4M3FN>(const DecodeLaunch&, cudaStream_t);
extern template cudaError_t launch_split_kernel<KvFormat::kFp8E4M3FNUZ>(const DecodeLaunch&, cudaStream_t);
extern template cudaError_t launch_split_kernel<KvFormat::kMxfp4>(const DecodeLaunch&, cudaStream_t);

namespace {

constexpr int kCombineRowsPerBlock = 4;  // one warp per (token, head) row

// Merges the split partials of one (token, head) row per warp:
//   out = sum_s exp(lse_s - M) * O_s / sum_s exp(lse_s - M),  lse = M + log(sum).
// Partials are normalised (O_s = sum p v / sum p); empty splits have lse -inf.
// Grid: ceil(total_q * H / 4) blocks of 128 threads; lane k handles dims
// 4k + 128 i (i = 0..3) as float4.
__global__ void __launch_bounds__(128) combine_kernel(const MlaDecodeParams p, const float* __restrict__ partial_out,
                                                      const float* __restrict__ partial_lse, int num_splits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineRowsPerBlock + warp;
  if (row >= rows) return;

  float mx = -CUDART_INF_F;
  bool has_nan = false;
  for (int s = lane; s < num_splits; s += 32) {
    const float v = partial_lse[s * rows + row];
    has_nan |= isnan(v);
    mx = fmaxf(mx, v);
  }
  for (int off = 16; off > 0; off >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    has_nan |= __shfl_xor_sync(0xffffffffu, static_cast<int>(has_nan), off) != 0;
  }
  float4 acc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (mx != -CUDART_INF_F) {
    for (int s = 0; s < num_splits; ++s) {
      const float l = partial_lse[s * rows + row];
      if (l == -CUDART_INF_F) continue;
      const float w = __expf(l - mx);
      wsum += w;
      const float4* src = reinterpret_cast<const float4*>(partial_out + (s * rows + row) * kHeadDimV);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 x = src[lane + 32 * i];
        acc[i].x += w * x.x;
        acc[i].y += w * x.y;
        acc[i].z += w * x.z;
        acc[i].w += w * x.w;
      }
    }
  }
  const int t = static_cast<int>(row / p.num_heads), h = static_cast<int>(row % p.num_heads);
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const float nan_or_zero = has_nan ? CUDART_NAN_F : 0.f;
  __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                       static_cast<int64_t>(h) * p.out_stride_head;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int d = 4 * (lane + 32 * i);
    const float4 x = acc[i];
    __nv_bfloat162 lo = __floats2bfloat162_rn(x.x * inv + nan_or_zero, x.y * inv + nan_or_zero);
    __nv_bfloat162 hi = __floats2bfloat162_rn(x.z * inv + nan_or_zero, x.w * inv + nan_or_zero);
    uint2 packed;
    packed.x = bf16x2_bits(lo);
    packed.y = bf16x2_bits(hi);
    *reinterpret_cast<uint2*>(dst + d) = packed;
  }
  if (lane == 0) {
    float lse = wsum > 0.f ? mx + __logf(wsum) : -CUDART_INF_F;
    if (has_nan) lse = CUDART_NAN_F;
    p.lse[static_cast<int64_t>(t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] = lse;
  }
}

}  // namespace

SplitPlan plan_splits(const MlaDecodeParams& p, int num_sms, int requested_splits) {
  SplitPlan plan;
  plan.head_groups = (p.num_heads + kTileRows - 1) / kTileRows;
  if (requested_splits > 0) {
    plan.num_splits = requested_splits;
    return plan;
  }
  const int64_t tiles = static_cast<int64_t>(p.total_q) * plan.head_groups;
  if (tiles == 0) return plan;
  // Expected KV tokens per item, from shapes only (no device reads).
  int64_t est_len;
  if (p.layout == KvLayout::kPaged) {
    est_len = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  } else if (p.layout == KvLayout::kIndptrIndices) {
    est_len = p.num_kv_indices / std::max(p.batch, 1);
  } else {
    est_len = p.num_cache_rows / std::max(p.batch, 1);
  }
  const int64_t slots = static_cast<int64_t>(num_sms) * 2;  // two CTAs per SM fit in shared memory
  int64_t splits = (slots + tiles / 2) / tiles;              // round to the nearest whole wave
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, est_len / kBlockN));
  plan.num_splits = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(splits, 128)));
  return plan;
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
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const unsigned blocks = static_cast<unsigned>((rows + kCombineRowsPerBlock - 1) / kCombineRowsPerBlock);
  combine_kernel<<<blocks, 128, 0, stream>>>(p, args.partial_out, args.partial_lse, plan.num_splits);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla_decode

// Split planning, the split-combine kernel, and the format dispatch. Shared
// by CUDA and HIP (hipified): vendor differences go through portability.h.
#include <algorithm>

#include "../mla_decode/portability.h"
#include "decode_common.h"
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

// The combine kernel works in groups of 32 lanes ("warps" below) on both
// vendors: on wave64 a wavefront holds two groups, and every shuffle stays in
// its group (xor offsets < 32; mla_shfl with width 32).
constexpr int kMaxSplits = 256;          // kMaxNumSplits of csrc/ops/validation.h

// Merges the split partials of one (token, head) row per block:
//   out = sum_s exp(lse_s - M) * O_s / sum_s exp(lse_s - M),  lse = M + log(sum).
// Partials are normalised (O_s = sum p v / sum p); empty splits have lse -inf
// and O_s = 0. Grid: total_q * H blocks of 128 threads; 32-lane group w owns
// dims [128w, 128w + 128), lane k the float4 at 128w + 4k.
//
// Latency, not bandwidth, bounds this kernel (the partials were just written
// and sit in L2), so it spreads over many SMs, every group computes all split
// weights at once (lane s holds split s, s + 32, ...), and partial rows are
// read kCombineUnroll splits at a time with all loads in flight together.
constexpr int kCombineMaxSplitsPerLane = (kMaxSplits + 31) / 32;
constexpr int kCombineUnroll = 8;

__global__ void __launch_bounds__(128) combine_kernel(const MlaDecodeParams p, const float* __restrict__ partial_out,
                                                      const float* __restrict__ partial_lse, int num_splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the split kernel (sm_90+): wait
  // here until that grid has finished and its writes are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const int64_t row = blockIdx.x;

  float lse_l[kCombineMaxSplitsPerLane];
  float mx = -MLA_INF;
  bool has_nan = false;
#pragma unroll
  for (int k = 0; k < kCombineMaxSplitsPerLane; ++k) {
    const int s = lane + 32 * k;
    lse_l[k] = s < num_splits ? partial_lse[s * rows + row] : -MLA_INF;
    has_nan |= isnan(lse_l[k]);
    mx = fmaxf(mx, lse_l[k]);
  }
  for (int off = 16; off > 0; off >>= 1) {
    mx = fmaxf(mx, mla_shfl_xor(mx, off));
    has_nan |= mla_shfl_xor(static_cast<int>(has_nan), off) != 0;
  }
  float w_l[kCombineMaxSplitsPerLane];
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kCombineMaxSplitsPerLane; ++k) {
    w_l[k] = (lse_l[k] == -MLA_INF || mx == -MLA_INF) ? 0.f : __expf(lse_l[k] - mx);
    wsum += w_l[k];
  }
  for (int off = 16; off > 0; off >>= 1) wsum += mla_shfl_xor(wsum, off);

  const int dim = 128 * warp + 4 * lane;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int k = 0; k < kCombineMaxSplitsPerLane; ++k) {
    if (32 * k >= num_splits) break;
    for (int s0 = 0; s0 < 32 && 32 * k + s0 < num_splits; s0 += kCombineUnroll) {
      float4 x[kCombineUnroll];
      float w[kCombineUnroll];
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
        const int s = 32 * k + s0 + u;
        w[u] = mla_shfl(w_l[k], (s0 + u) & 31, 32);
        x[u] = *reinterpret_cast<const float4*>(partial_out + (min(s, num_splits - 1) * rows + row) * kHeadDimV + dim);
        if (s >= num_splits) w[u] = 0.f;
      }
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
        acc.x += w[u] * x[u].x;
        acc.y += w[u] * x[u].y;
        acc.z += w[u] * x[u].z;
        acc.w += w[u] * x[u].w;
      }
    }
  }
  const int t = static_cast<int>(row / p.num_heads), h = static_cast<int>(row % p.num_heads);
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const float nan_or_zero = has_nan ? MLA_NAN : 0.f;
  uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                  static_cast<int64_t>(h) * p.out_stride_head;  // bf16 bits
  {
    uint2 packed;
    packed.x = mla_pack_bf16x2(acc.x * inv + nan_or_zero, acc.y * inv + nan_or_zero);
    packed.y = mla_pack_bf16x2(acc.z * inv + nan_or_zero, acc.w * inv + nan_or_zero);
    *reinterpret_cast<uint2*>(dst + dim) = packed;
  }
  if (warp == 0 && lane == 0) {
    float lse = wsum > 0.f ? mx + __logf(wsum) : -MLA_INF;
    if (has_nan) lse = MLA_NAN;
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
    est_len = p.num_kv_indices / std::max<int32_t>(p.batch, 1);
  } else {
    est_len = p.num_cache_rows / std::max<int32_t>(p.batch, 1);
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
  args.q_per_item = (p.batch > 0 && p.total_q % p.batch == 0) ? p.total_q / p.batch : 0;
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
  const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(p.total_q) * p.num_heads);
#if !MLA_PLATFORM_HIP
  // Programmatic dependent launch (sm_90+): the combine grid is launched while
  // the split kernel runs and waits for it in griddepcontrol.wait, which hides
  // the launch gap between the two kernels. Also valid inside CUDA graphs.
  static int cc_major[64] = {0};
  int dev = 0;
  err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 64 && cc_major[dev] == 0) {
    err = cudaDeviceGetAttribute(&cc_major[dev], cudaDevAttrComputeCapabilityMajor, dev);
    if (err != cudaSuccess) return err;
  }
  if (dev < 64 && cc_major[dev] >= 9) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, combine_kernel, p, static_cast<const float*>(args.partial_out),
                              static_cast<const float*>(args.partial_lse), static_cast<int>(plan.num_splits));
  }
#endif
  combine_kernel<<<blocks, 128, 0, stream>>>(p, args.partial_out, args.partial_lse, plan.num_splits);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla_decode

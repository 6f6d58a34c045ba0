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

// The combine kernel works in groups of 32 lanes on both vendors: on wave64 a
// wavefront holds two groups, and every shuffle stays in its group (xor
// offsets < 32).
constexpr int kMaxSplits = kMaxNumSplits;  // csrc/mla_decode/params.h

constexpr int kCombineThreads = 256;  // 8 groups of 32 lanes per (token, head) row
constexpr int kCombineGroups = kCombineThreads / 32;
constexpr int kCombineMaxSplitsPerLane = (kMaxSplits + 31) / 32;

// Merges the split partials of one (token, head) row per block:
//   out = sum_s exp(lse_s - M) * O_s / sum_s exp(lse_s - M),  lse = M + log(sum).
// Partials are normalised (O_s = sum p v / sum p); empty splits have lse -inf
// and O_s = 0. Grid: total_q * H blocks of 256 threads.
//
// Latency, not bandwidth, bounds this kernel (the partials were just written
// and sit in L2), so it is laid out for the fewest dependent round trips:
// group w issues its loads of splits w, w + 8, w + 16, w + 24 for all 512 dims
// (lane k: the float4s at 4k + 128i) first, while group 0 also loads the S
// partial LSEs (one per lane) and turns them into weights; one L2 round trip
// covers both. The 8 group sums meet in shared memory. Splits beyond 32 take
// further passes.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MlaDecodeParams p,
                                                                  const float* __restrict__ partial_out,
                                                                  const float* __restrict__ partial_lse,
                                                                  int num_splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the split kernel (sm_90+): wait
  // here until that grid has finished and its writes are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  __shared__ float smem_w[kMaxSplits];
  __shared__ float smem_stat[2];  // lse, nan flag
  __shared__ float4 smem_acc[kCombineGroups][kHeadDimV / 4];
  const int group = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const int64_t row = blockIdx.x;

  // First pass's partials, in flight before the weights are known.
  constexpr int kUnroll = 4;
  float4 x[kUnroll][4];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int s = group + u * kCombineGroups;
    const int sc = s < num_splits ? s : 0;  // a valid address; its weight is 0
    const float4* src = reinterpret_cast<const float4*>(partial_out + (sc * rows + row) * kHeadDimV);
#pragma unroll
    for (int i = 0; i < 4; ++i) x[u][i] = src[lane + 32 * i];
  }

  if (group == 0) {
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
    float wsum = 0.f;
    float w_l[kCombineMaxSplitsPerLane];
#pragma unroll
    for (int k = 0; k < kCombineMaxSplitsPerLane; ++k) {
      w_l[k] = (lse_l[k] == -MLA_INF || mx == -MLA_INF) ? 0.f : __expf(lse_l[k] - mx);
      wsum += w_l[k];
    }
    for (int off = 16; off > 0; off >>= 1) wsum += mla_shfl_xor(wsum, off);
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
#pragma unroll
    for (int k = 0; k < kCombineMaxSplitsPerLane; ++k) {
      const int s = lane + 32 * k;
      if (s < num_splits) smem_w[s] = w_l[k] * inv;  // normalised weights
    }
    if (lane == 0) {
      smem_stat[0] = has_nan ? MLA_NAN : (wsum > 0.f ? mx + __logf(wsum) : -MLA_INF);
      smem_stat[1] = has_nan ? 1.f : 0.f;
    }
  }
  __syncthreads();

  float4 acc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = group;; s0 += kUnroll * kCombineGroups) {
    float w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s0 + u * kCombineGroups;
      w[u] = s < num_splits ? smem_w[s] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[i].x += w[u] * x[u][i].x;
        acc[i].y += w[u] * x[u][i].y;
        acc[i].z += w[u] * x[u][i].z;
        acc[i].w += w[u] * x[u][i].w;
      }
    }
    const int s_next = s0 + kUnroll * kCombineGroups;
    if (s_next >= num_splits) break;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s_next + u * kCombineGroups;
      const int sc = s < num_splits ? s : 0;
      const float4* src = reinterpret_cast<const float4*>(partial_out + (sc * rows + row) * kHeadDimV);
#pragma unroll
      for (int i = 0; i < 4; ++i) x[u][i] = src[lane + 32 * i];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) smem_acc[group][lane + 32 * i] = acc[i];
  __syncthreads();

  if (threadIdx.x < kHeadDimV / 4) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int g = 0; g < kCombineGroups; ++g) {
      const float4 v = smem_acc[g][threadIdx.x];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const float nan_or_zero = smem_stat[1] != 0.f ? MLA_NAN : 0.f;
    const int t = static_cast<int>(row / p.num_heads), h = static_cast<int>(row % p.num_heads);
    uint16_t* dst = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t) * p.out_stride_token +
                    static_cast<int64_t>(h) * p.out_stride_head;  // bf16 bits
    uint2 packed;
    packed.x = mla_pack_bf16x2(sum.x + nan_or_zero, sum.y + nan_or_zero);
    packed.y = mla_pack_bf16x2(sum.z + nan_or_zero, sum.w + nan_or_zero);
    *reinterpret_cast<uint2*>(dst + 4 * threadIdx.x) = packed;
    if (threadIdx.x == 0) {
      p.lse[static_cast<int64_t>(t) * p.lse_stride_token + static_cast<int64_t>(h) * p.lse_stride_head] =
          smem_stat[0];
    }
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
    cfg.blockDim = dim3(kCombineThreads);
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
  combine_kernel<<<blocks, kCombineThreads, 0, stream>>>(p, args.partial_out, args.partial_lse, plan.num_splits);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace mla_decode

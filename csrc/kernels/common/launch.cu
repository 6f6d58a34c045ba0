// launch_decode: runs a plan (csrc/plan) on the GPU. Shared by CUDA and HIP
// (hipified); the kernels each vendor builds are named in launch_contract.h.
#include "kernels/common/launch.h"

#include "common/portability.h"
#include "kernels/common/combine.cuh"
#include "kernels/common/launch_contract.h"

namespace mla_decode {
namespace cuda {

namespace {

using plan::Kernel;

// The plan's split kernel for format F.
template <KvFormat F>
cudaError_t launch_split_kernel(Kernel kernel, const DecodeLaunch& args, cudaStream_t stream) {
#if MLA_PLATFORM_HIP
  if (kernel == Kernel::kMfma) return launch_mfma<F>(args, stream);
#else
  constexpr bool kHopperFormat = F == KvFormat::kBf16 || F == KvFormat::kFp8E4M3FN || F == KvFormat::kMxfp4;
  switch (kernel) {
    case Kernel::kMmaSync: return launch_mma_sync<F>(args, stream);
    case Kernel::kWide:
      if (kHopperFormat) return launch_wide(args, stream);
      break;
    case Kernel::kNarrow:
      if (kHopperFormat) return launch_narrow(args, stream);
      break;
    case Kernel::kNarrowRegisterV:
      if (F == KvFormat::kFp8E4M3FN) return launch_narrow_register_v(args, stream);
      break;
    default: break;
  }
#endif
  return cudaErrorInvalidValue;  // not a kernel of this build or format: a planning bug
}

}  // namespace

#if !MLA_PLATFORM_HIP
bool built_with_sm90a_kernels() {
#if defined(MLA_DECODE_SM90A)
  return true;
#else
  return false;  // TORCH_CUDA_ARCH_LIST lacks 9.0a
#endif
}
#endif

cudaError_t launch_decode(const MlaDecodeParams& p, const plan::Plan& plan, void* workspace, cudaStream_t stream) {
  if (p.total_q == 0) return cudaSuccess;
  DecodeLaunch args;
  args.p = p;
  args.num_splits = plan.num_splits;
  args.head_groups = plan.head_groups;
  args.q_per_item = (p.batch > 0 && p.total_q % p.batch == 0) ? p.total_q / p.batch : 0;
  args.stages = plan.stages;
  args.stream_kv = plan.stream_kv;
  args.tma_tiles = plan.tma_tiles;
  args.partial_out = nullptr;
  args.partial_lse = nullptr;
  if (plan.num_splits > 1) {
    const size_t rows = static_cast<size_t>(p.total_q) * p.num_heads;
    args.partial_out = static_cast<float*>(workspace);
    args.partial_lse = args.partial_out + static_cast<size_t>(plan.num_splits) * rows * kHeadDimV;
  }
  cudaError_t err;
  switch (p.format) {
    case KvFormat::kBf16: err = launch_split_kernel<KvFormat::kBf16>(plan.kernel, args, stream); break;
    case KvFormat::kFp8E4M3FN: err = launch_split_kernel<KvFormat::kFp8E4M3FN>(plan.kernel, args, stream); break;
    case KvFormat::kFp8E4M3FNUZ: err = launch_split_kernel<KvFormat::kFp8E4M3FNUZ>(plan.kernel, args, stream); break;
    case KvFormat::kMxfp4: err = launch_split_kernel<KvFormat::kMxfp4>(plan.kernel, args, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || plan.num_splits == 1) return err;
  // See combine_kernel for the three variants.
  const bool few_splits = plan.num_splits <= kFewSplitsChunk;
  const bool mid_splits = !few_splits && plan.num_splits <= kMidSplitsChunk;
  const int rows_per_block = few_splits ? kFewSplitsRows : mid_splits ? kMidSplitsRows : kManySplitsRows;
  auto* const combine = few_splits   ? combine_kernel<kFewSplitsChunk, kFewSplitsRows>
                        : mid_splits ? combine_kernel<kMidSplitsChunk, kMidSplitsRows>
                                     : combine_kernel<kManySplitsChunk, kManySplitsRows>;
  const unsigned blocks = static_cast<unsigned>(
      (static_cast<int64_t>(p.total_q) * p.num_heads + rows_per_block - 1) / rows_per_block);
  const unsigned threads = static_cast<unsigned>(kCombineRowThreads * rows_per_block);
#if !MLA_PLATFORM_HIP
  // Programmatic dependent launch (sm_90+): the combine grid is launched while
  // the split kernel runs and waits for it in griddepcontrol.wait, which hides
  // the launch gap between the two kernels.
  return launch_programmatic(combine, dim3(blocks), dim3(threads), 0, plan.programmatic_combine, stream, p,
                             static_cast<const float*>(args.partial_out), static_cast<const float*>(args.partial_lse),
                             static_cast<int>(plan.num_splits));
#else
  combine<<<blocks, threads, 0, stream>>>(p, args.partial_out, args.partial_lse, plan.num_splits);
  return cudaGetLastError();
#endif
}

}  // namespace cuda
}  // namespace mla_decode

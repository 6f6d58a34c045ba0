// The Hopper (sm_90a) wide kernel's launcher (bf16, OCP fp8 and MXFP4 caches with
// H >= 64), and the test of whether a call takes it. NVIDIA only: on a ROCm
// build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include "decode_kernel_wide_sm90.cuh"

namespace mla_decode {
namespace cuda {

namespace {

// The wide kernel's choice for a format: "mma" turns it off, "wide" forces
// it, anything else leaves it to the plan (e4m3fnuz has no wide variant).
// Measured on the H200: docs/performance.md, sessions 9 and 10.
HopperChoice wide_choice(KvFormat format) {
  const bool has_variant =
      format == KvFormat::kBf16 || format == KvFormat::kFp8E4M3FN || format == KvFormat::kMxfp4;
  return hopper_kernel_choice(format, has_variant, KernelSwitch::kWide);
}

template <KvFormat F>
cudaError_t launch_wide_format(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kTileTokens = sm90::wide::kTileTokensDefault;
  constexpr int kSmem = sm90::wide::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(sm90::wide::decode_wide_kernel<kTileTokens, F>, split_grid(args),
                                  sm90::wide::kThreads, kSmem, configured_devices, stream, args);
}

}  // namespace

int wide_smem_bytes() { return sm90::wide::Smem::kTotal; }

int wide_tile_tokens() { return sm90::wide::kTileTokensDefault; }

bool wide_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.num_heads < kWideRows || wide_choice(p.format) == HopperChoice::kOff) return false;
  return hopper_kernel_fits(p, wide_smem_bytes(), smem_per_block_optin);
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;  // built without an sm_90a target (TORCH_CUDA_ARCH_LIST lacks 9.0a)
#endif
}

bool wide_kernel_forced(KvFormat format) { return wide_choice(format) == HopperChoice::kForced; }

cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kBf16: return launch_wide_format<KvFormat::kBf16>(args, stream);
    case KvFormat::kFp8E4M3FN: return launch_wide_format<KvFormat::kFp8E4M3FN>(args, stream);
    case KvFormat::kMxfp4: return launch_wide_format<KvFormat::kMxfp4>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

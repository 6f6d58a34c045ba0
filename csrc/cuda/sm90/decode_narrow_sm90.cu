// The Hopper (sm_90a) narrow kernel's launcher (OCP fp8 and MXFP4 caches with
// H < 64), and the test of whether a call can take it.
// NVIDIA only: on a ROCm build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include "decode_kernel_narrow_sm90.cuh"

namespace mla_decode {
namespace cuda {

namespace {

// The narrow kernel's choice for a format: "mma" turns it off, "narrow"
// forces it, anything else leaves it to the plan's size thresholds
// (narrow_kernel_pays_off: MXFP4 from 16k query tokens x keys, OCP fp8 on
// long sequences only).
HopperChoice narrow_choice(KvFormat format) {
  return hopper_kernel_choice(format, format == KvFormat::kFp8E4M3FN || format == KvFormat::kMxfp4,
                              KernelSwitch::kNarrow);
}

template <KvFormat F>
cudaError_t launch_narrow_format(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kSmem = sm90::narrow::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(sm90::narrow::decode_narrow_kernel<F>, split_grid(args), sm90::narrow::kThreads,
                                  kSmem, configured_devices, args, stream);
}

}  // namespace

int narrow_smem_bytes() { return sm90::narrow::Smem::kTotal; }

int narrow_tile_tokens() { return sm90::narrow::kTileTokens; }

bool narrow_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.num_heads >= kWideRows || narrow_choice(p.format) == HopperChoice::kOff) return false;
  return hopper_kernel_fits(p, narrow_smem_bytes(), smem_per_block_optin);
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;
#endif
}

bool narrow_kernel_forced(KvFormat format) { return narrow_choice(format) == HopperChoice::kForced; }

cudaError_t launch_narrow(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kFp8E4M3FN: return launch_narrow_format<KvFormat::kFp8E4M3FN>(args, stream);
    case KvFormat::kMxfp4: return launch_narrow_format<KvFormat::kMxfp4>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

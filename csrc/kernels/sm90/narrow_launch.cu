// Launchers of the Hopper (sm_90a) narrow kernels (H < 64; the plan decides
// when they run): the narrow kernel (bf16 tiles landed by TMA, OCP fp8 and
// MXFP4 decoded by producer warpgroups) and its register-V form for OCP fp8.
// NVIDIA only: on a ROCm build this translation unit is empty.
#include "common/portability.h"
#if !MLA_PLATFORM_HIP

#include "kernels/sm90/narrow_register_v_kernel.cuh"  // includes the narrow kernel
#include "plan/kernel_geometry.h"

namespace mla_decode {
namespace cuda {

namespace {

static_assert(sm90::narrow::Smem::kTotal == plan::kNarrowSmemBytes, "plan/kernel_geometry.h: the narrow layout");
static_assert(sm90::narrow_fp8::Smem::kTotal == plan::kNarrowRegisterVSmemBytes,
              "plan/kernel_geometry.h: the register-V layout");
static_assert(sm90::narrow::kTileTokens == kHopperTileTokens, "the plan splits by 64-key tiles");

// The narrow kernel proper (fp8 with the f16 QK and MXFP4: producers' decode;
// bf16: TMA-landed tiles, `map` over the cache; the others ignore it).
template <KvFormat F>
cudaError_t launch_narrow_f16(const DecodeLaunch& args, const sm90::CodeTensorMap& map, cudaStream_t stream) {
  constexpr int kSmem = sm90::narrow::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  const cudaError_t err = launch_with_dynamic_smem(sm90::narrow::decode_narrow_kernel<F>, split_grid(args),
                                                   sm90::narrow::kThreadsOf<F>, kSmem, configured_devices, stream,
                                                   args, map);
#if MLA_TRACE_ENABLED
  // Trace builds: every CTA's phase clocks (trace.cuh, CtaPhases).
  if (err == cudaSuccess) {
    print_cta_phases_after<sm90::narrow::kPhasePoints>(sm90::narrow::narrow_cta_phases, PhaseKernel::kNarrow,
                                                       split_grid(args), sm90::narrow::kPhaseCtas, stream);
  }
#endif
  return err;
}

template <KvFormat F>
cudaError_t launch_narrow_format(const DecodeLaunch& args, cudaStream_t stream) {
  sm90::CodeTensorMap map{};
  if (F == KvFormat::kBf16) {
    const cudaError_t err = sm90::encode_code_map(args.p, &map);
    if (err != cudaSuccess) return err;
  }
  return launch_narrow_f16<F>(args, map, stream);
}

}  // namespace

cudaError_t launch_narrow(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kFp8E4M3FN: return launch_narrow_format<KvFormat::kFp8E4M3FN>(args, stream);
    case KvFormat::kMxfp4: return launch_narrow_format<KvFormat::kMxfp4>(args, stream);
    case KvFormat::kBf16: return launch_narrow_format<KvFormat::kBf16>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

cudaError_t launch_narrow_register_v(const DecodeLaunch& args, cudaStream_t stream) {
  if (args.p.format != KvFormat::kFp8E4M3FN) return cudaErrorInvalidValue;  // a planning bug
  sm90::CodeTensorMap map{};
  const cudaError_t err = sm90::encode_code_map(args.p, &map);
  if (err != cudaSuccess) return err;
  constexpr int kSmem = sm90::narrow_fp8::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  const cudaError_t launched = launch_with_dynamic_smem(sm90::narrow_fp8::decode_narrow_fp8_kernel, split_grid(args),
                                                        sm90::narrow_fp8::kThreads, kSmem, configured_devices, stream,
                                                        args, map);
#if MLA_TRACE_ENABLED
  // Trace builds: every CTA's phase clocks (trace.cuh, CtaPhases).
  if (launched == cudaSuccess) {
    print_cta_phases_after<sm90::narrow_fp8::kPhasePoints>(sm90::narrow_fp8::narrow_fp8_cta_phases,
                                                           PhaseKernel::kNarrowRegisterV, split_grid(args),
                                                           sm90::narrow::kPhaseCtas, stream);
  }
#endif
  return launched;
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

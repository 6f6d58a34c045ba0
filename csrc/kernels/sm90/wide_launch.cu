// Launcher of the Hopper (sm_90a) wide kernel (bf16, OCP fp8 and MXFP4 caches
// with H >= 64; the plan decides when it runs). NVIDIA only: on a ROCm build
// this translation unit is empty.
#include "common/portability.h"
#if !MLA_PLATFORM_HIP

#include "kernels/sm90/wide_kernel.cuh"
#include "plan/kernel_geometry.h"

namespace mla_decode {
namespace cuda {

namespace {

static_assert(sm90::wide::Smem::kTotal == plan::kWideSmemBytes, "plan/kernel_geometry.h: the wide kernel's layout");
static_assert(sm90::wide::kTileTokensDefault == kHopperTileTokens, "the plan splits by 64-key tiles");

// kTma: bf16 tiles and Q by TMA (Plan::tma_tiles), through maps of the cache
// rows and of the query encoded here for each call; the other forms get unused
// zero maps.
template <KvFormat F, bool kTma>
cudaError_t launch_wide_format(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kTileTokens = sm90::wide::kTileTokensDefault;
  constexpr int kSmem = sm90::wide::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  sm90::CodeTensorMap map{}, q_map{};
  if (kTma) {
    cudaError_t err = sm90::encode_code_map(args.p, &map);
    if (err == cudaSuccess) err = sm90::encode_q_map(args.p, &q_map);
    if (err != cudaSuccess) return err;
  }
  static unsigned long long configured_devices = 0;
  const cudaError_t err =
      launch_with_dynamic_smem(sm90::wide::decode_wide_kernel<kTileTokens, F, kTma>, split_grid(args),
                               sm90::wide::kThreads, kSmem, configured_devices, stream, args, map, q_map);
#if MLA_TRACE_ENABLED
  // Trace builds: print CTA (0, 0)'s tile clocks (trace.cuh, TileTrace) and
  // every CTA's phase clocks (CtaPhases; scripts/cta_phases.py reads them).
  if (err == cudaSuccess) {
    void* buf = nullptr;
    if (cudaGetSymbolAddress(&buf, sm90::wide::wide_tile_trace) == cudaSuccess) {
      print_tile_trace<sm90::wide::kTileTraceEvents, sm90::wide::kTileTraceTiles>
          <<<1, 1, 0, stream>>>(static_cast<const long long*>(buf), 2);
    }
    print_cta_phases_after<sm90::wide::kPhasePoints>(sm90::wide::wide_cta_phases, PhaseKernel::kWide, split_grid(args),
                                                     sm90::wide::kPhaseCtas, stream);
  }
#endif
  return err;
}

}  // namespace

cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kBf16:
      return args.tma_tiles ? launch_wide_format<KvFormat::kBf16, true>(args, stream)
                            : launch_wide_format<KvFormat::kBf16, false>(args, stream);
    case KvFormat::kFp8E4M3FN: return launch_wide_format<KvFormat::kFp8E4M3FN, false>(args, stream);
    case KvFormat::kMxfp4: return launch_wide_format<KvFormat::kMxfp4, false>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

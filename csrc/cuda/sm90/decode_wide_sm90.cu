// The Hopper (sm_90a) wide kernel's launcher (bf16, OCP fp8 and MXFP4 caches with
// H >= 64), and the test of whether a call takes it. NVIDIA only: on a ROCm
// build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include <cstdlib>
#include <cstring>

#include "decode_kernel_wide_sm90.cuh"

namespace mla_decode {
namespace cuda {

namespace {

// The wide kernel's switch for a format, from the environment (read once per
// process): MLA_DECODE_BF16_KERNEL, MLA_DECODE_FP8_KERNEL (OCP fp8) and
// MLA_DECODE_MXFP4_KERNEL. "mma" keeps the format on the mma.sync kernel,
// "wide" puts every call that the wide kernel can run on it (tests, A/B
// runs), anything else leaves the choice to the plan. MLA_DECODE_FP8_KERNEL=
// wgmma selects session 4's fp8 kernel, which the plan checks first.
// Measured on the H200: docs/performance.md, sessions 9 and 10.
enum class WideSwitch { kOff, kByPlan, kForced };
WideSwitch read_wide_switch(const char* name) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "mma") == 0) return WideSwitch::kOff;
  if (v != nullptr && std::strcmp(v, "wide") == 0) return WideSwitch::kForced;
  return WideSwitch::kByPlan;
}
WideSwitch wide_switch(KvFormat format) {
  static const WideSwitch bf16 = read_wide_switch("MLA_DECODE_BF16_KERNEL");
  static const WideSwitch fp8 = read_wide_switch("MLA_DECODE_FP8_KERNEL");
  static const WideSwitch mxfp4 = read_wide_switch("MLA_DECODE_MXFP4_KERNEL");
  if (format == KvFormat::kBf16) return bf16;
  if (format == KvFormat::kFp8E4M3FN) return fp8;
  if (format == KvFormat::kMxfp4) return mxfp4;
  return WideSwitch::kOff;  // e4m3fnuz has no wide variant
}

template <KvFormat F>
cudaError_t launch_wide_format(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kTileTokens = sm90::wide::kTileTokensDefault;
  constexpr int kSmem = sm90::wide::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  const cudaError_t err =
      opt_in_dynamic_smem(sm90::wide::decode_wide_kernel<kTileTokens, F>, kSmem, configured_devices);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(args.p.total_q) * args.head_groups, args.num_splits);
  sm90::wide::decode_wide_kernel<kTileTokens, F><<<grid, sm90::wide::kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

int wide_smem_bytes() { return sm90::wide::Smem::kTotal; }

int wide_tile_tokens() { return sm90::wide::kTileTokensDefault; }

bool wide_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.num_heads < kWideRows || wide_switch(p.format) == WideSwitch::kOff) return false;
  if (smem_per_block_optin < wide_smem_bytes()) return false;
  if (!rows_16_byte_aligned(p)) return false;
  return current_device_runs_sm90a();
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;  // built without an sm_90a target (TORCH_CUDA_ARCH_LIST lacks 9.0a)
#endif
}

bool wide_kernel_forced(KvFormat format) { return wide_switch(format) == WideSwitch::kForced; }

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

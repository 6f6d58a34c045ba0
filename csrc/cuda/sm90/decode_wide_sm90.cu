// The Hopper (sm_90a) wide kernel's launcher (bf16 and OCP fp8 caches with
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

// Whether the wide kernel may take a call of this format, from the
// environment (read once per process): MLA_DECODE_BF16_KERNEL=mma keeps bf16
// on the mma.sync kernel; MLA_DECODE_FP8_KERNEL=mma keeps OCP fp8 on it (and
// =wgmma selects session 4's fp8 kernel, which the plan checks first).
// Measured on the H200: docs/performance.md, session 9.
bool env_value_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
bool wide_allowed_by_env(KvFormat format) {
  static const bool bf16 = !env_value_is("MLA_DECODE_BF16_KERNEL", "mma");
  static const bool fp8 = !env_value_is("MLA_DECODE_FP8_KERNEL", "mma");
  if (format == KvFormat::kBf16) return bf16;
  if (format == KvFormat::kFp8E4M3FN) return fp8;
  return false;  // e4m3fnuz and MXFP4 have no wide variant
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

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int wide_smem_bytes() { return sm90::wide::Smem::kTotal; }

int wide_tile_tokens() { return sm90::wide::kTileTokensDefault; }

bool wide_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.num_heads < kWideRows || !wide_allowed_by_env(p.format)) return false;
  if (smem_per_block_optin < wide_smem_bytes()) return false;
  // 16-byte chunks of cache rows (cp.async, or 16-byte loads of fp8 codes)
  // and query rows.
  if (!aligned16(p.kv) || p.kv_row_stride_bytes % 16 != 0) return false;
  if (!aligned16(p.q) || (p.q_stride_token * 2) % 16 != 0 || (p.q_stride_head * 2) % 16 != 0) return false;
  return current_device_runs_sm90a();
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;  // built without an sm_90a target (TORCH_CUDA_ARCH_LIST lacks 9.0a)
#endif
}

cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream) {
  switch (args.p.format) {
    case KvFormat::kBf16: return launch_wide_format<KvFormat::kBf16>(args, stream);
    case KvFormat::kFp8E4M3FN: return launch_wide_format<KvFormat::kFp8E4M3FN>(args, stream);
    default: return cudaErrorInvalidValue;  // a planning bug, reported by the dispatcher
  }
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

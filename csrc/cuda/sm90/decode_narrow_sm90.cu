// The Hopper (sm_90a) narrow kernel's launcher (OCP fp8 and MXFP4 caches with
// H < 64), and the test of whether a call can take it.
// NVIDIA only: on a ROCm build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include <cstdlib>
#include <cstring>

#include "decode_kernel_narrow_sm90.cuh"

namespace mla_decode {
namespace cuda {

namespace {

// Per format, read once per process. MXFP4: on by the plan's size threshold
// (narrow_kernel_pays_off), MLA_DECODE_MXFP4_KERNEL=narrow forces it, =mma
// turns it off. OCP fp8 the same with MLA_DECODE_FP8_KERNEL, on a stricter
// threshold (long sequences only: narrow_kernel_pays_off).
enum class NarrowSwitch { kOff, kByPlan, kForced };
NarrowSwitch narrow_switch(KvFormat format) {
  auto read = [](const char* name, NarrowSwitch unset) {
    const char* v = std::getenv(name);
    if (v != nullptr && std::strcmp(v, "narrow") == 0) return NarrowSwitch::kForced;
    if (v != nullptr && std::strcmp(v, "mma") == 0) return NarrowSwitch::kOff;
    return unset;
  };
  static const NarrowSwitch fp8 = read("MLA_DECODE_FP8_KERNEL", NarrowSwitch::kByPlan);
  static const NarrowSwitch mxfp4 = read("MLA_DECODE_MXFP4_KERNEL", NarrowSwitch::kByPlan);
  if (format == KvFormat::kFp8E4M3FN) return fp8;
  if (format == KvFormat::kMxfp4) return mxfp4;
  return NarrowSwitch::kOff;
}

template <KvFormat F>
cudaError_t launch_narrow_format(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kSmem = sm90::narrow::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  const cudaError_t err = opt_in_dynamic_smem(sm90::narrow::decode_narrow_kernel<F>, kSmem, configured_devices);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(args.p.total_q) * args.head_groups, args.num_splits);
  sm90::narrow::decode_narrow_kernel<F><<<grid, sm90::narrow::kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

int narrow_smem_bytes() { return sm90::narrow::Smem::kTotal; }

int narrow_tile_tokens() { return sm90::narrow::kTileTokens; }

bool narrow_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.num_heads >= kWideRows || narrow_switch(p.format) == NarrowSwitch::kOff) return false;
  if (smem_per_block_optin < narrow_smem_bytes()) return false;
  if (!rows_16_byte_aligned(p)) return false;
  return current_device_runs_sm90a();
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;
#endif
}

bool narrow_kernel_forced(KvFormat format) { return narrow_switch(format) == NarrowSwitch::kForced; }

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

// The Hopper (sm_90a) bf16 wide kernel's launcher, and the test of whether a
// call takes it. NVIDIA only: on a ROCm build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include <cstdlib>
#include <cstring>

#include "decode_kernel_wide_sm90.cuh"

namespace mla_decode {
namespace cuda {

namespace {

// MLA_DECODE_BF16_KERNEL=wide / =mma picks the kernel of bf16 calls with
// H >= 64 (where the wide kernel applies); unset or anything else: the default
// below. Read once per process.
constexpr bool kWideByDefault = true;  // 1.9x the mma.sync kernel on the H = 128 sweep (docs/performance.md, run70-run76)
bool wide_selected_by_env() {
  static const bool selected = [] {
    const char* v = std::getenv("MLA_DECODE_BF16_KERNEL");
    if (v != nullptr && std::strcmp(v, "wide") == 0) return true;
    if (v != nullptr && std::strcmp(v, "mma") == 0) return false;
    return kWideByDefault;
  }();
  return selected;
}

cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kTileTokens = sm90::wide::kTileTokensDefault;
  constexpr int kSmem = sm90::wide::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  const cudaError_t err =
      opt_in_dynamic_smem(sm90::wide::decode_bf16_wide_kernel<kTileTokens>, kSmem, configured_devices);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(args.p.total_q) * args.head_groups, args.num_splits);
  sm90::wide::decode_bf16_wide_kernel<kTileTokens><<<grid, sm90::wide::kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int bf16_wide_smem_bytes() { return sm90::wide::Smem::kTotal; }

bool bf16_uses_wide_kernel(const MlaDecodeParams& p, int smem_per_block_optin) {
#if defined(MLA_DECODE_SM90A)
  if (p.format != KvFormat::kBf16 || p.num_heads < kWideRows || !wide_selected_by_env()) return false;
  if (smem_per_block_optin < bf16_wide_smem_bytes()) return false;
  // cp.async copies 16-byte chunks of cache rows and query rows.
  if (!aligned16(p.kv) || p.kv_row_stride_bytes % 16 != 0) return false;
  if (!aligned16(p.q) || (p.q_stride_token * 2) % 16 != 0 || (p.q_stride_head * 2) % 16 != 0) return false;
  int dev = 0, cc = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || device_compute_capability(dev, &cc) != cudaSuccess) return false;
  return cc == 90;  // sm_90a machine code runs on compute capability 9.0 only
#else
  (void)p;
  (void)smem_per_block_optin;
  return false;  // built without an sm_90a target (TORCH_CUDA_ARCH_LIST lacks 9.0a)
#endif
}

int bf16_wide_tile_tokens() { return sm90::wide::kTileTokensDefault; }

cudaError_t launch_bf16_wide(const DecodeLaunch& args, cudaStream_t stream) { return launch_wide(args, stream); }

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

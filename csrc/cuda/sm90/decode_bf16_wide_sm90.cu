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
constexpr bool kWideByDefault = true;  // 2.8-3x the mma.sync kernel at H = 128 (docs/performance.md, run70-71)
bool wide_selected_by_env() {
  static const bool selected = [] {
    const char* v = std::getenv("MLA_DECODE_BF16_KERNEL");
    if (v != nullptr && std::strcmp(v, "wide") == 0) return true;
    if (v != nullptr && std::strcmp(v, "mma") == 0) return false;
    return kWideByDefault;
  }();
  return selected;
}

// MLA_DECODE_WIDE_TILE=32 runs the 32-key-tile variant (4 stages) instead of
// the default 64-key tiles (2 stages), which measured faster on the H200 at
// every H = 128 sweep shape from B x kv = 8k keys up (run71: b256/kv8192 1391
// against 1528 us). Read once per process.
int wide_tile_from_env() {
  static const int tile = [] {
    const char* v = std::getenv("MLA_DECODE_WIDE_TILE");
    return (v != nullptr && std::strcmp(v, "32") == 0) ? 32 : 64;
  }();
  return tile;
}

// MLA_DECODE_EXP=0 runs the kernel without its lean steps (an A/B switch
// while they are measured). Read once per process.
bool wide_lean_from_env() {
  static const bool lean = [] {
    const char* v = std::getenv("MLA_DECODE_EXP");
    return !(v != nullptr && std::strcmp(v, "0") == 0);
  }();
  return lean;
}

template <int kTileTokens, bool kLean>
cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kSmem = sm90::wide::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  const cudaError_t err =
      opt_in_dynamic_smem(sm90::wide::decode_bf16_wide_kernel<kTileTokens, kLean>, kSmem, configured_devices);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(args.p.total_q) * args.head_groups, args.num_splits);
  sm90::wide::decode_bf16_wide_kernel<kTileTokens, kLean><<<grid, sm90::wide::kThreads, kSmem, stream>>>(args);
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

int bf16_wide_tile_tokens() { return wide_tile_from_env(); }

cudaError_t launch_bf16_wide(const DecodeLaunch& args, cudaStream_t stream) {
  if (wide_tile_from_env() == 32) return launch_wide<32, true>(args, stream);
  return wide_lean_from_env() ? launch_wide<64, true>(args, stream) : launch_wide<64, false>(args, stream);
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

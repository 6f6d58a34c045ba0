// The Hopper (sm_90a) fp8 decode kernel's launcher, and the test of whether a
// call takes it. NVIDIA only: on a ROCm build this translation unit is empty.
#include "../../mla_decode/portability.h"
#if !MLA_PLATFORM_HIP

#include "decode_kernel_sm90.cuh"

namespace mla_decode {
namespace cuda {

// MLA_DECODE_FP8_KERNEL=wgmma opts in to this kernel. It is correct (the whole
// fp8 GPU suite passes on it) but, as of session 4, slower than the mma.sync
// kernel on every benchmark shape (docs/performance.md, v22-v26), so it is not
// the default.
bool fp8_uses_wgmma(const MlaDecodeParams& p) {
#if defined(MLA_DECODE_SM90A)
  if (p.format != KvFormat::kFp8E4M3FN || kernel_switch(p.format) != KernelSwitch::kWgmma) return false;
  // Its cp.async copies 16-byte chunks of each row.
  if (reinterpret_cast<uintptr_t>(p.kv) % 16 != 0 || p.kv_row_stride_bytes % 16 != 0) return false;
  return current_device_runs_sm90a();
#else
  (void)p;
  return false;  // built without an sm_90a target (TORCH_CUDA_ARCH_LIST lacks 9.0a)
#endif
}

cudaError_t launch_fp8_wgmma(const DecodeLaunch& args, cudaStream_t stream) {
  constexpr int kSmem = sm90::Smem::kTotal;
  static_assert(kSmem <= MLA_MAX_SMEM_BYTES, "shared memory budget exceeded");
  static unsigned long long configured_devices = 0;
  return launch_with_dynamic_smem(sm90::decode_fp8_wgmma_kernel, split_grid(args), sm90::kThreads, kSmem,
                                  configured_devices, stream, args);
}

}  // namespace cuda
}  // namespace mla_decode

#endif  // !MLA_PLATFORM_HIP

// The launch contract of the split-KV kernels (kernels/sm80, kernels/sm90,
// kernels/cdna) and the launcher (launch.cu):
//   grid x = query token * head_groups + head group (the kernel's heads per
//   CTA: kernels/common/geometry.h), grid y = KV split; split s covers the
//   visible keys [s * chunk, min((s + 1) * chunk, visible)) with
//   chunk = ceil(ceil(visible / num_splits) / T) * T for the kernel's tile of
//   T keys (work.cuh). With one split a kernel writes bf16 out and
//   natural-log lse; otherwise, for row = token * H + head,
//     partial_out[(split * total_q * H + row) * 512 + d]  fp32, normalised O
//     partial_lse[split * total_q * H + row]              fp32, natural-log LSE
//   (-inf for an empty split, NaN for a bad cache index), merged by the
//   combine kernel (combine.cuh).
// Every kernel takes one DecodeLaunch by value: plain data, no ATen.
#pragma once

#include <utility>

#include "common/params.h"
#include "common/portability.h"
#include "kernels/common/geometry.h"
#include "kernels/common/launch.h"

namespace mla_decode {
namespace cuda {

struct DecodeLaunch {
  MlaDecodeParams p;
  float* partial_out;  // (num_splits, total_q * H, 512) when num_splits > 1
  float* partial_lse;  // (num_splits, total_q * H)
  int32_t num_splits;
  int32_t head_groups;
  int32_t q_per_item;  // total_q / batch when it divides evenly (a guess for the
                       // token -> item lookup, checked on the device), else 0
  int32_t stages;      // Plan::stages (the mma.sync kernel's ring depth)
  bool stream_kv;      // Plan::stream_kv (TMA tile loads with L2 evict_first)
  bool tma_tiles;      // Plan::tma_tiles (the wide kernel's bf16 form: tiles by TMA)
};

// The per-kernel launchers launch.cu dispatches to (each returns the launch
// error, or cudaErrorInvalidValue for a format it has no variant for: a
// planning bug, reported by the dispatcher).
#if MLA_PLATFORM_HIP
template <KvFormat F>
cudaError_t launch_mfma(const DecodeLaunch& args, cudaStream_t stream);  // kernels/cdna
#else
template <KvFormat F>
cudaError_t launch_mma_sync(const DecodeLaunch& args, cudaStream_t stream);  // kernels/sm80
cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream);      // kernels/sm90/wide_launch.cu
// kernels/sm90/narrow_launch.cu: the narrow kernel, and its register-V form
// (OCP fp8, codes landed by TMA).
cudaError_t launch_narrow(const DecodeLaunch& args, cudaStream_t stream);
cudaError_t launch_narrow_register_v(const DecodeLaunch& args, cudaStream_t stream);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current
// device. The opt-in is per device, so each kernel keeps a bitmask of the
// devices it has set (`configured`, a function-local static of the caller)
// and the driver is asked once per device. (AMD needs no opt-in below 64 KB.)
template <typename Kernel>
inline cudaError_t opt_in_dynamic_smem(Kernel kernel, int bytes, unsigned long long& configured) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 64 && !(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & (1ull << dev))) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
    __atomic_fetch_or(&configured, 1ull << dev, __ATOMIC_ACQ_REL);
  }
  return cudaSuccess;
}

// The split kernels' grid: x = query token * head groups + head group,
// y = KV split.
inline dim3 split_grid(const DecodeLaunch& args) {
  return dim3(static_cast<unsigned>(args.p.total_q) * args.head_groups, args.num_splits);
}

// Launches `kernel(args...)` on `stream` and `grid` with `threads` per block
// and `smem_bytes` of dynamic shared memory, after opt_in_dynamic_smem
// (`configured`: a function-local static of the caller, one per kernel); the
// launch is checked.
template <typename Kernel, typename... Args>
inline cudaError_t launch_with_dynamic_smem(Kernel kernel, dim3 grid, int threads, int smem_bytes,
                                            unsigned long long& configured, cudaStream_t stream,
                                            const Args&... args) {
  const cudaError_t err = opt_in_dynamic_smem(kernel, smem_bytes, configured);
  if (err != cudaSuccess) return err;
  kernel<<<grid, threads, smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

// Launches `kernel` on `stream`; with `programmatic` (sm_90+, Plan::
// programmatic_combine) as a programmatic dependent of the work before it
// (PDL): its CTAs may be scheduled while the previous kernel still runs, and
// each must execute `griddepcontrol.wait` before it touches memory that
// kernel may write. Valid inside CUDA graphs.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_programmatic(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, int smem_bytes,
                                       bool programmatic, cudaStream_t stream, Args&&... args) {
  if (programmatic) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  }
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}
#endif

}  // namespace cuda
}  // namespace mla_decode

// The launch contract shared by the split-KV kernels of both vendors and the
// launcher:
//   * decode_kernel.cuh       NVIDIA sm_80+ (mma.sync), included when CUDA
//   * decode_kernel_mfma.cuh  AMD CDNA3/CDNA4 (MFMA, wave64), included when HIP
//   * decode_launch.cu        split planning, combine kernel, format dispatch
// Each kernel header defines
//   template <KvFormat F> cudaError_t launch_split_kernel(const DecodeLaunch&, cudaStream_t);
// (hipify turns cudaError_t / cudaStream_t into hipError_t / hipStream_t) with
// the same semantics: grid x = query token * head_groups + head group of
// kTileRows heads, grid y = KV split; split s covers the visible keys
// [s * chunk, min((s + 1) * chunk, visible)) with
// chunk = ceil(ceil(visible / num_splits) / kBlockN) * kBlockN; with one split
// the kernel writes bf16 out and natural-log lse, otherwise it writes, for
// row = token * H + head,
//   partial_out[(split * total_q * H + row) * 512 + d]  fp32, normalised O
//   partial_lse[split * total_q * H + row]              fp32, natural-log LSE
// (-inf for an empty split, NaN for a bad cache index), merged by the combine
// kernel of decode_launch.cu.
#pragma once

#include <utility>

#include "../mla_decode/params.h"
#include "../mla_decode/portability.h"
#include "decode_launch.h"

namespace mla_decode {
namespace cuda {

constexpr int kBlockN = 32;  // tokens per pipeline stage; splits are whole multiples of it

// Most splits the automatic plan uses. NVIDIA: 32, measured on the H200 (see
// plan_splits). AMD: not measured (no hardware here), the original 128.
#if MLA_PLATFORM_HIP
constexpr int kMaxPlannedSplits = 128;
#else
constexpr int kMaxPlannedSplits = 32;
#endif

struct DecodeLaunch {
  MlaDecodeParams p;
  float* partial_out;  // (num_splits, total_q * H, 512) when num_splits > 1
  float* partial_lse;  // (num_splits, total_q * H)
  int32_t num_splits;
  int32_t head_groups;
  int32_t q_per_item;  // total_q / batch when it divides evenly (a guess for the
                       // token -> item lookup, checked on the device), else 0
  int32_t stages;      // SplitPlan::stages (host-side kernel choice)
  bool fp8_wgmma;      // SplitPlan::fp8_wgmma (host-side kernel choice)
  bool wide;           // SplitPlan::wide (host-side kernel choice)
  bool narrow;         // SplitPlan::narrow (host-side kernel choice)
  bool stream_kv;      // SplitPlan::stream_kv (TMA tile loads with L2 evict_first)
};

constexpr int kBlockNWgmma = 64;  // tokens per stage of the Hopper fp8 kernel (below)

#if !MLA_PLATFORM_HIP
// Hopper (sm90/decode_fp8_sm90.cu): whether an OCP fp8 call runs on the wgmma
// kernel (opted in with MLA_DECODE_FP8_KERNEL=wgmma, built with an sm_90a
// target, a compute capability 9.0 device, 16-byte aligned cache rows), and
// its launcher. Its splits are multiples of kBlockNWgmma tokens.
bool fp8_uses_wgmma(const MlaDecodeParams& p);
cudaError_t launch_fp8_wgmma(const DecodeLaunch& args, cudaStream_t stream);

// Cache and query rows that start on 16-byte boundaries: what the Hopper wide
// and narrow kernels' 16-byte chunk copies and code loads need. The operator's
// validation already requires it of every GPU call (csrc/ops/validation.cpp);
// the kernels' applicability tests check it again rather than rely on that.
inline bool rows_16_byte_aligned(const MlaDecodeParams& p) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return aligned(p.kv) && p.kv_row_stride_bytes % 16 == 0 && aligned(p.q) && (p.q_stride_token * 2) % 16 == 0 &&
         (p.q_stride_head * 2) % 16 == 0;
}

// The kernel switches, read once per process: MLA_DECODE_BF16_KERNEL,
// MLA_DECODE_FP8_KERNEL (OCP fp8) and MLA_DECODE_MXFP4_KERNEL (other formats:
// kByPlan). "mma" keeps the format on the mma.sync kernel; "wide" / "narrow"
// put every call that Hopper kernel can run on it (tests, A/B runs); "wgmma"
// (fp8) selects session 4's fp8 kernel; unset or anything else leaves the
// choice to the plan (decode_launch.cu). Measured: docs/performance.md.
enum class KernelSwitch { kByPlan, kMma, kWide, kNarrow, kWgmma };
KernelSwitch kernel_switch(KvFormat format);

// A Hopper kernel's choice for calls of `format`: off where it has no variant
// for the format or the format's switch is "mma", forced where the switch is
// `forcing` (kWide / kNarrow), else left to the plan's size threshold.
enum class HopperChoice { kOff, kByPlan, kForced };
inline HopperChoice hopper_kernel_choice(KvFormat format, bool has_variant, KernelSwitch forcing) {
  if (!has_variant) return HopperChoice::kOff;
  const KernelSwitch s = kernel_switch(format);
  if (s == KernelSwitch::kMma) return HopperChoice::kOff;
  return s == forcing ? HopperChoice::kForced : HopperChoice::kByPlan;
}

// Hopper (sm90/decode_wide_sm90.cu): whether a bf16, OCP fp8 or MXFP4 call
// may run on the wide kernel (64 heads per CTA on wgmma: H >= 64, built with
// an sm_90a target, a compute capability 9.0 device whose per-block shared
// memory holds its wide_smem_bytes(), 16-byte aligned cache and query rows,
// and MLA_DECODE_BF16_KERNEL / MLA_DECODE_FP8_KERNEL / MLA_DECODE_MXFP4_KERNEL
// not "mma"); whether the format's switch is "wide", which makes every such
// call take it (the plan otherwise keeps small calls on the mma.sync kernel);
// and its launcher. Its splits are multiples of wide_tile_tokens() keys and
// its head groups kWideRows heads.
int wide_smem_bytes();
int wide_tile_tokens();
bool wide_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin);
bool wide_kernel_forced(KvFormat format);
cudaError_t launch_wide(const DecodeLaunch& args, cudaStream_t stream);

// Hopper (sm90/decode_narrow_sm90.cu): whether an OCP fp8 or MXFP4 call with
// H < 64 can run on the narrow kernel (an sm_90a build and device, per-block
// shared memory for narrow_smem_bytes(), 16-byte aligned rows, and the
// format's switch not "mma"), whether the switch ("narrow") makes every such
// call take it (the plan otherwise decides by size: narrow_kernel_pays_off),
// and its launcher. Splits are multiples of narrow_tile_tokens() keys,
// head groups kNarrowRows heads.
int narrow_smem_bytes();
int narrow_tile_tokens();
bool narrow_kernel_applies(const MlaDecodeParams& p, int smem_per_block_optin);
bool narrow_kernel_forced(KvFormat format);
// Whether a call the narrow kernel runs takes its register-V form (OCP fp8,
// indptr layout, tensor maps available, MLA_DECODE_NARROW_QK not "f16").
bool narrow_register_v_applies(const MlaDecodeParams& p);
// Whether a bf16 call may run on the narrow kernel (its tiles land by TMA: the
// indptr layout, tensor maps available; session 16 on, hence the macro for
// scripts/plan_harness, which builds older trees too).
#define MLA_DECODE_NARROW_BF16 1
bool narrow_bf16_applies(const MlaDecodeParams& p);
cudaError_t launch_narrow(const DecodeLaunch& args, cudaStream_t stream);

// The compute capability of `dev` as 10 * major + minor in `cc`, queried once
// per device and cached.
inline cudaError_t device_compute_capability(int dev, int* cc) {
  static int cached[64] = {0};
  if (dev >= 0 && dev < 64 && cached[dev] != 0) {
    *cc = cached[dev];
    return cudaSuccess;
  }
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (err != cudaSuccess) return err;
  *cc = 10 * major + minor;
  if (dev >= 0 && dev < 64) cached[dev] = *cc;
  return cudaSuccess;
}

// Whether the current device runs sm_90a machine code, which needs compute
// capability 9.0 exactly (the Hopper kernels' launch condition).
inline bool current_device_runs_sm90a() {
  int dev = 0, cc = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || device_compute_capability(dev, &cc) != cudaSuccess) return false;
  return cc == 90;
}

// What the Hopper wide and narrow kernels need of a call and the device:
// `smem_bytes` of shared memory per block, 16-byte aligned rows, an sm_90a
// device (checked last: it queries the driver).
inline bool hopper_kernel_fits(const MlaDecodeParams& p, int smem_bytes, int smem_per_block_optin) {
  return smem_per_block_optin >= smem_bytes && rows_16_byte_aligned(p) && current_device_runs_sm90a();
}

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

// Launches `kernel` as a programmatic dependent of the work before it on
// `stream` (PDL, sm_90+): its CTAs may be scheduled while the previous kernel
// is still running, and each must execute `griddepcontrol.wait` before it
// touches memory that kernel may write. Below sm_90 it is a plain launch.
template <typename... KernelArgs, typename... Args>
inline cudaError_t launch_programmatic(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, int smem_bytes,
                                       cudaStream_t stream, Args&&... args) {
  int dev = 0, cc = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = device_compute_capability(dev, &cc);
  if (err != cudaSuccess) return err;
  if (cc >= 90) {
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

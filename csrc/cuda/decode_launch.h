// Host-side entry points of the CUDA kernels. Plain C++ (no ATen): the
// dispatcher in csrc/ops/dispatch_cuda.cpp validates tensors, fills
// MlaDecodeParams, allocates the split workspace and calls these.
#pragma once

#include <cuda_runtime.h>

#include "../mla_decode/params.h"

namespace mla_decode {
namespace cuda {

// Geometry shared by the launcher and the kernels.
constexpr int kTileRows = 16;  // query rows per CTA: 16 heads of one query token
// Query rows per CTA of the Hopper wide kernel (sm90/decode_kernel_wide_sm90.cuh):
// 64 heads of one query token, the M of its wgmma.
constexpr int kWideRows = 64;
// Heads per CTA of the Hopper narrow kernel (sm90/decode_kernel_narrow_sm90.cuh,
// a draft): 16 heads of one query token, the N of its wgmma.
constexpr int kNarrowRows = 16;

// What the plan needs to know about the device; the dispatcher fills it from
// the device properties (cached by PyTorch, so no driver call per decode).
struct DeviceLimits {
  int num_sms = 1;
  int smem_per_block_optin = 0;  // bytes a block may opt in to (99 KB on sm_86/89/120, 227 KB on sm_90)
  int smem_per_sm = 0;           // bytes of shared memory per SM
  int64_t l2_bytes = 0;          // L2 cache size (0: unknown, no L2 stream hint)
};

struct SplitPlan {
  int32_t head_groups = 1;  // ceil(H / 16), or ceil(H / 64) on the wide kernel
  int32_t num_splits = 1;   // KV splits per (query token, head group)
  // NVIDIA mma.sync kernel: its cp.async ring depth, one of the two built per
  // format (decode_smem.h: the default, or bf16's deeper ring for grids of at
  // most one CTA per SM, or the others' shallower ring for devices whose
  // per-block shared memory is below the default's). 0: another kernel runs
  // (the Hopper fp8 kernel, or AMD's).
  int32_t stages = 0;
  // Dynamic shared memory the split kernel needs with that ring (0 when
  // stages is 0). Above DeviceLimits::smem_per_block_optin when no built ring
  // fits the device: the dispatcher reports that instead of launching.
  int32_t smem_bytes = 0;
  // NVIDIA OCP fp8: the call runs on the Hopper wgmma kernel (fp8_uses_wgmma,
  // decided once here, so the plan and the launch cannot disagree).
  bool fp8_wgmma = false;
  // NVIDIA bf16 / OCP fp8 / MXFP4 with H >= 64 on Hopper, above the size
  // threshold: the call runs on the wide kernel (64 heads per CTA, wgmma;
  // wide_kernel_applies, wide_kernel_pays_off).
  bool wide = false;
  // NVIDIA OCP fp8 / MXFP4 with H < 64 on Hopper: the narrow kernel (16 heads
  // per CTA, keys as the M of wgmma; narrow_kernel_applies, narrow_kernel_pays_off).
  bool narrow = false;
  // The TMA-landed narrow forms (bf16; OCP fp8's register-V kernel): the tile
  // loads carry an L2 evict_first policy, because the cache is small next to
  // L2 and one head group reads it (kv_stream_hint_pays_off in decode_launch.cu).
  bool stream_kv = false;
};
// The plan harness (scripts/plan_harness) prints SplitPlan::stream_kv where this is defined.
#define MLA_DECODE_L2_STREAM_HINT 1

// Chooses the kernel variant and the split count from shapes and `device`
// only (no device memory reads): enough CTAs to fill the SMs with whole
// waves, at least one pipeline stage of keys (32 tokens, 64 for the Hopper
// fp8 kernel) per split.
SplitPlan plan_splits(const MlaDecodeParams& p, const DeviceLimits& device, int requested_splits);

// Bytes of fp32 workspace the plan needs (0 when num_splits == 1):
// partial outputs (splits, total_q * H, 512) followed by partial LSE (splits, total_q * H).
size_t workspace_bytes(const MlaDecodeParams& p, const SplitPlan& plan);

// Launches the split-KV kernel and, when num_splits > 1, the combine kernel
// on `stream`. `workspace` must hold workspace_bytes() (16-byte aligned).
// Returns the first launch error (cudaSuccess otherwise).
cudaError_t launch_decode(const MlaDecodeParams& p, const SplitPlan& plan, void* workspace,
                          cudaStream_t stream);

}  // namespace cuda
}  // namespace mla_decode

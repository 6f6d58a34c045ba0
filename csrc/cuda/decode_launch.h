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

struct SplitPlan {
  int32_t head_groups = 1;  // ceil(H / 16)
  int32_t num_splits = 1;   // KV splits per (query token, head group)
  // NVIDIA bf16: the grid is at most one CTA per SM, so the kernel variant with
  // a deeper cp.async ring (one CTA per SM by shared memory) runs.
  bool deep_pipeline = false;
  // NVIDIA OCP fp8: the call runs on the Hopper wgmma kernel (fp8_uses_wgmma,
  // decided once here, so the plan and the launch cannot disagree).
  bool fp8_wgmma = false;
};

// Chooses the split count from shapes only (no device reads): enough CTAs to
// fill `num_sms`, at least one pipeline stage of keys (32 tokens, 64 for the
// Hopper fp8 kernel) per split.
SplitPlan plan_splits(const MlaDecodeParams& p, int num_sms, int requested_splits);

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

// CUDA (and, through hipify, HIP) registrations of the mla_decode operators:
// validate, plan the KV split from shapes alone (no device reads, so no host
// sync and CUDA-graph safe), allocate the split workspace from PyTorch's
// caching allocator, and launch on the current stream under a device guard.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>

#include "../cuda/decode_launch.h"
#include "../mla_decode/portability.h"
#include "check.h"
#include "validation.h"

namespace mla_decode {
namespace {

// MLA_DECODE_SMEM_LIMIT=<bytes> (read once per process): plan as if the
// device allowed at most that much shared memory per block. For testing the
// shallower rings of 99 KB devices (sm_86 / sm_89 / sm_120) on a larger GPU;
// 0 or unset: the device's own limit.
int smem_limit_from_env() {
  static const long limit = [] {
    const char* v = std::getenv("MLA_DECODE_SMEM_LIMIT");
    if (v == nullptr || *v == '\0') return 0L;
    char* end = nullptr;
    const long bytes = std::strtol(v, &end, 10);
    return (*end == '\0' && bytes >= 0 && bytes <= (1L << 30)) ? bytes : -1L;  // -1: not a byte count
  }();
  MLA_CHECK(limit >= 0, "mla_decode: MLA_DECODE_SMEM_LIMIT must be a number of bytes (0 for the device's own "
            "limit), but it is '", std::getenv("MLA_DECODE_SMEM_LIMIT"), "'.");
  return static_cast<int>(limit);
}

// The current device's limits; env_limit > 0 caps the per-block opt-in.
cuda::DeviceLimits current_device_limits(int env_limit) {
  const auto* prop = at::cuda::getCurrentDeviceProperties();  // cached by PyTorch per device
  cuda::DeviceLimits dev;
  dev.num_sms = prop->multiProcessorCount;
  dev.l2_bytes = prop->l2CacheSize;
#if MLA_PLATFORM_HIP
  // The MFMA kernel stays within the 64 KB of LDS every CDNA part has.
  dev.smem_per_block_optin = static_cast<int>(prop->sharedMemPerBlock);
  dev.smem_per_sm = static_cast<int>(prop->sharedMemPerBlock);
#else
  dev.smem_per_block_optin = static_cast<int>(prop->sharedMemPerBlockOptin);
  dev.smem_per_sm = static_cast<int>(prop->sharedMemPerMultiprocessor);
#endif
  if (env_limit > 0) dev.smem_per_block_optin = std::min(dev.smem_per_block_optin, env_limit);
  return dev;
}

void decode_out_cuda(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                     const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                     const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                     const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale, int64_t num_splits,
                     at::Tensor& out, at::Tensor& lse) {
  const c10::cuda::CUDAGuard device_guard(q.device());
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  const int env_limit = smem_limit_from_env();
  const cuda::DeviceLimits dev = current_device_limits(env_limit);
  const cuda::SplitPlan plan = cuda::plan_splits(p, dev, static_cast<int>(num_splits));
  const bool env_limited = env_limit > 0 && env_limit == dev.smem_per_block_optin;
  MLA_CHECK(plan.smem_bytes <= dev.smem_per_block_optin, "mla_decode: the ", format_name(p.format),
            " decode kernel needs ", plan.smem_bytes, " bytes of shared memory per block, but ", q.device(),
            " allows ", dev.smem_per_block_optin, " (", env_limited ? "MLA_DECODE_SMEM_LIMIT" :
            "the device's opt-in limit", "); no built variant of this kernel fits it.");
  const size_t ws_bytes = cuda::workspace_bytes(p, plan);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, q.options().dtype(at::kByte));
  const cudaError_t err = cuda::launch_decode(p, plan, ws_bytes > 0 ? workspace.data_ptr() : nullptr,
                                              at::cuda::getCurrentCUDAStream());
  MLA_CHECK(err == cudaSuccess, "mla_decode: the decode kernel failed to launch on ", q.device(), ": ",
              cudaGetErrorString(err), " (format ", format_name(p.format), ", ", p.total_q, " query tokens, ",
              p.num_heads, " heads, ", plan.num_splits, " splits).");
}

}  // namespace
}  // namespace mla_decode

TORCH_LIBRARY_IMPL(mla_decode, CUDA, m) {
  m.impl("decode", &mla_decode::decode_functional<&mla_decode::decode_out_cuda>);
  m.impl("decode_out", &mla_decode::decode_out_cuda);
}

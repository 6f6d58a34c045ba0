// CUDA (and, through hipify, HIP) registrations of the mla_decode operators:
// validate, plan the KV split from shapes alone (no device reads, so no host
// sync and CUDA-graph safe), allocate the split workspace from PyTorch's
// caching allocator, and launch on the current stream under a device guard.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../cuda/decode_launch.h"
#include "check.h"
#include "validation.h"

namespace mla_decode {
namespace {

void decode_out_cuda(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                     const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                     const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                     const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale, int64_t num_splits,
                     at::Tensor& out, at::Tensor& lse) {
  const c10::cuda::CUDAGuard device_guard(q.device());
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cuda::SplitPlan plan = cuda::plan_splits(p, num_sms, static_cast<int>(num_splits));
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

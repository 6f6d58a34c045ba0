// CUDA (and, through hipify, HIP) registrations of the mla_decode operators:
// validate, plan the KV split from shapes alone (no device reads, so no host
// sync and CUDA-graph safe), allocate the split workspace from PyTorch's
// caching allocator, and launch on the current stream under a device guard.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../cuda/decode_launch.h"
#include "check.h"
#include "validation.h"

namespace mla_decode {
namespace {

// The tickets of the fused combine (csrc/cuda/fused_combine.cuh): `count`
// int32 that are zero when the call's kernel starts; the kernel leaves them
// zero. Outside a CUDA graph capture they come from a persistent buffer, one
// per (device, stream) so that calls on two streams never share them, zeroed
// when it is allocated or grown (on the stream, so in order before the kernel)
// and never again. Inside a capture the call gets zeroed tickets of its own
// from the graph's memory pool: the zeroing is captured and runs before the
// kernel at every replay, and the graph owns the memory like the split
// workspace. (A persistent buffer would be wrong there: the capture stream is
// not the stream the graph replays on.) An undefined tensor: no tickets.
at::Tensor fused_combine_tickets(const at::Device& device, cudaStream_t stream, int64_t count) {
  if (count <= 0) return at::Tensor();
  const auto options = at::TensorOptions().dtype(at::kInt).device(device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MLA_CHECK(cudaStreamIsCapturing(stream, &status) == cudaSuccess,
            "mla_decode: could not query the capture status of the current stream.");
  if (status != cudaStreamCaptureStatusNone) return at::zeros({count}, options);
  static std::mutex mutex;
  static auto* buffers = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();  // never freed (exit order)
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& buf = (*buffers)[{device.index(), stream}];
  if (!buf.defined() || buf.numel() < count) buf = at::zeros({std::max<int64_t>(count, 4096)}, options);
  return buf;
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
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cuda::SplitPlan plan = cuda::plan_splits(p, num_sms, static_cast<int>(num_splits));
  const size_t ws_bytes = cuda::workspace_bytes(p, plan);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, q.options().dtype(at::kByte));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor tickets = fused_combine_tickets(q.device(), stream, cuda::fused_combine_ticket_count(p, plan));
  const cudaError_t err = cuda::launch_decode(p, plan, ws_bytes > 0 ? workspace.data_ptr() : nullptr,
                                              tickets.defined() ? tickets.data_ptr<int32_t>() : nullptr, stream);
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

// CUDA (and, through hipify, HIP) registrations of the mla_decode operators:
// validate, plan from shapes and the device's facts (no device reads, so no
// host sync and CUDA-graph safe), allocate the split workspace from PyTorch's
// caching allocator, and launch on the current stream under a device guard.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <mutex>

#include "api/check.h"
#include "api/checked.h"
#include "api/overrides.h"
#include "api/validation.h"
#include "common/portability.h"
#include "kernels/common/launch.h"
#if !MLA_PLATFORM_HIP
#include "kernels/bench/stream_read.h"
#endif
#include "plan/plan.h"

namespace mla_decode {
namespace {

constexpr int kMaxDevices = 64;

int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&value, attr, device);
  MLA_CHECK(err == cudaSuccess, "mla_decode: reading an attribute of GPU ", device, " failed: ",
            cudaGetErrorString(err), ".");
  return value;
}

plan::DeviceFacts gather_facts(int device) {
  plan::DeviceFacts f;
  f.num_sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  f.l2_bytes = device_attribute(cudaDevAttrL2CacheSize, device);
#if MLA_PLATFORM_HIP
  f.vendor = plan::Vendor::kAmd;
  // The MFMA kernel stays within the 64 KB of LDS every CDNA part has.
  f.smem_per_block_optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlock, device);
  f.smem_per_sm = f.smem_per_block_optin;
#else
  f.vendor = plan::Vendor::kNvidia;
  f.arch = 10 * device_attribute(cudaDevAttrComputeCapabilityMajor, device) +
           device_attribute(cudaDevAttrComputeCapabilityMinor, device);
  f.sm90a_kernels = cuda::built_with_sm90a_kernels() && f.arch == 90;
  f.tensor_maps = cuda::driver_encodes_tensor_maps();
  f.smem_per_block_optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  f.smem_per_sm = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
#endif
  return f;
}

// The facts of `device`, gathered on its first call and kept for the process.
const plan::DeviceFacts& device_facts(int device) {
  static std::once_flag once[kMaxDevices];
  static plan::DeviceFacts facts[kMaxDevices];
  MLA_CHECK(device >= 0 && device < kMaxDevices, "mla_decode: device index ", device, " is outside the ",
            kMaxDevices, " devices this build supports.");
  std::call_once(once[device], [device] { facts[device] = gather_facts(device); });
  return facts[device];
}

// `overrides`: empty for the public operators; the private one's string
// (overrides.h), whose device facts replace the device's own.
void run_decode(const DecodeInputs& in, const at::Tensor& out, const at::Tensor& lse, const std::string& overrides) {
  check_devices(in, &out, &lse);  // before the guard, which a CPU q would fail without naming it
  const c10::cuda::CUDAGuard device_guard(in.q.device());
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  if (checked_mode_from_env()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MLA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(), &capture) == cudaSuccess &&
                  capture == cudaStreamCaptureStatusNone,
              "mla_decode: MLA_DECODE_CHECKED=1 copies the index tensors to the host at every call, which CUDA graph "
              "capture forbids; unset it to capture.");
    check_index_values_on_host(in, p);
  }
  const plan::DeviceFacts& own = device_facts(in.q.device().index());
  plan::Overrides po;
  plan::DeviceFacts facts = own;
  if (!overrides.empty()) {
    const ParsedOverrides ov = parse_overrides(overrides);
    po = ov.plan;
    if (ov.has_facts) facts = merge_facts(overrides, own);
  }
  po.num_splits = static_cast<int>(in.num_splits);
  const plan::Plan plan = plan::make_plan(p, facts, po);
  MLA_CHECK(plan.error == nullptr, "mla_decode: the overrides force the ", plan::kernel_name(plan.kernel),
            " kernel, which cannot run this call on ", in.q.device(), ": ", plan.error ? plan.error : "", ".");
  MLA_CHECK_SUPPORTED(plan.smem_bytes <= plan.smem_limit, "mla_decode: the ", format_name(p.format), " ",
            plan::kernel_name(plan.kernel), " kernel needs ", plan.smem_bytes, " bytes of shared memory per block, "
            "but ", in.q.device(), " allows ", plan.smem_limit, po.smem_limit > 0 ? " (the smem_limit override)" : "",
            "; no built variant of this kernel fits it.");
  const size_t ws_bytes = plan::workspace_bytes(p, plan);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, in.q.options().dtype(at::kByte));
  const cudaError_t err = cuda::launch_decode(p, plan, ws_bytes > 0 ? workspace.data_ptr() : nullptr,
                                              c10::cuda::getCurrentCUDAStream());
  // No kernel image for this device: a platform limit (NotImplementedError), not bad input.
  MLA_CHECK_SUPPORTED(err != cudaErrorNoKernelImageForDevice && err != cudaErrorInvalidDeviceFunction, "mla_decode: "
                      "this build has no ", plan::kernel_name(plan.kernel), " kernel for ", in.q.device(), ": ",
                      cudaGetErrorString(err), " (format ", format_name(p.format), ").");
  MLA_CHECK(err == cudaSuccess, "mla_decode: the ", plan::kernel_name(plan.kernel), " decode kernel failed to "
            "launch on ", in.q.device(), ": ", cudaGetErrorString(err), " (format ", format_name(p.format), ", ",
            p.total_q, " query tokens, ", p.num_heads, " heads, ", plan.num_splits, " splits).");
}

void decode_out_cuda(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                     const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                     const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                     const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale, int64_t num_splits,
                     at::Tensor& out, at::Tensor& lse) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  run_decode(in, out, lse, std::string());
}

void decode_out_with_cuda(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                          const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                          const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                          const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale,
                          int64_t num_splits, at::Tensor& out, at::Tensor& lse, c10::string_view overrides) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  run_decode(in, out, lse, std::string(overrides));
}

std::string explain_cuda(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                         const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                         const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                         const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale,
                         int64_t num_splits, c10::string_view overrides) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  check_devices(in, nullptr, nullptr);
  const c10::cuda::CUDAGuard device_guard(q.device());
  const std::string text(overrides);
  ParsedOverrides ov = parse_overrides(text);
  auto [out, lse] = allocate_outputs(q);
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  const plan::DeviceFacts facts = merge_facts(text, device_facts(q.device().index()));
  ov.plan.num_splits = static_cast<int>(num_splits);
  return describe_plan(plan::make_plan(p, facts, ov.plan), p, facts);
}

#if !MLA_PLATFORM_HIP
void stream_read_cuda(const at::Tensor& data, at::Tensor& sink) {
  MLA_CHECK(data.is_cuda() && data.is_contiguous(), "mla_decode._stream_read: data must be a contiguous GPU "
            "tensor, but it is a ", data.is_contiguous() ? "contiguous" : "non-contiguous", " tensor on ",
            data.device(), ".");
  MLA_CHECK(reinterpret_cast<uintptr_t>(data.data_ptr()) % 16 == 0, "mla_decode._stream_read: data must start "
            "on a 16-byte boundary.");
  MLA_CHECK(sink.device() == data.device() && sink.scalar_type() == at::kLong && sink.numel() == 1,
            "mla_decode._stream_read: sink must be one int64 on ", data.device(), ", but it is ", sink.numel(),
            " ", sink.scalar_type(), " on ", sink.device(), ".");
  const c10::cuda::CUDAGuard device_guard(data.device());
  const cudaError_t err = cuda::launch_stream_read(data.data_ptr(), data.numel() * data.element_size(),
                                                   device_facts(data.device().index()).num_sms,
                                                   reinterpret_cast<unsigned long long*>(sink.data_ptr()),
                                                   c10::cuda::getCurrentCUDAStream());
  MLA_CHECK(err == cudaSuccess, "mla_decode._stream_read failed to launch on ", data.device(), ": ",
            cudaGetErrorString(err), ".");
}
#endif

}  // namespace
}  // namespace mla_decode

TORCH_LIBRARY_IMPL(mla_decode, CUDA, m) {
#if !MLA_PLATFORM_HIP
  m.impl("_stream_read", &mla_decode::stream_read_cuda);
#endif
  m.impl("decode", &mla_decode::decode_functional<&mla_decode::decode_out_cuda>);
  m.impl("decode_out", &mla_decode::decode_out_cuda);
  m.impl("_decode_out_with", &mla_decode::decode_out_with_cuda);
  m.impl("explain", &mla_decode::explain_cuda);
}

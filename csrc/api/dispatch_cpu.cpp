// CPU registrations of the mla_decode operators: validate (every index value
// too: the data is on the host), then run the kernel of csrc/cpu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "api/check.h"
#include "api/overrides.h"
#include "api/validation.h"
#include "cpu/decode_cpu.h"
#include "plan/plan.h"

namespace mla_decode {
namespace {

void run_decode(const DecodeInputs& in, const at::Tensor& out, const at::Tensor& lse, const CpuOptions& opt) {
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  check_index_values(in, p);
  decode_cpu(p, opt);
}

void decode_out_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                    const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                    const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                    const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale, int64_t num_splits,
                    at::Tensor& out, at::Tensor& lse) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  run_decode(in, out, lse, CpuOptions{});
}

void decode_out_with_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                         const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                         const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                         const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale,
                         int64_t num_splits, at::Tensor& out, at::Tensor& lse, c10::string_view overrides) {
  const ParsedOverrides ov = parse_overrides(std::string(overrides));
  MLA_CHECK(!ov.plan.force_kernel && ov.plan.smem_limit == 0 && !ov.has_facts, "mla_decode: the overrides kernel, "
            "smem_limit and the device facts plan GPU calls, but these tensors are on the CPU (its override is "
            "cpu_path).");
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  run_decode(in, out, lse, ov.cpu);
}

// With device facts in the overrides: the GPU plan for such a device (the
// plan needs shapes only, so it is computed here for CPU tensors); without:
// what the CPU kernel runs.
std::string explain_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                        const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                        const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                        const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale,
                        int64_t num_splits, c10::string_view overrides) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  ParsedOverrides ov = parse_overrides(std::string(overrides));
  auto [out, lse] = allocate_outputs(q);
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  if (!ov.has_facts) {
    MLA_CHECK(!ov.plan.force_kernel && ov.plan.smem_limit == 0, "mla_decode: explain() of CPU tensors describes "
              "the CPU kernel; to plan a GPU call, give the GPU's facts (mla_decode.DeviceFacts).");
    return describe_cpu_plan(p, ov.cpu);
  }
  ov.plan.num_splits = static_cast<int>(num_splits);
  return describe_plan(plan::make_plan(p, ov.facts, ov.plan), p, ov.facts);
}

}  // namespace
}  // namespace mla_decode

TORCH_LIBRARY_IMPL(mla_decode, CPU, m) {
  m.impl("decode", &mla_decode::decode_functional<&mla_decode::decode_out_cpu>);
  m.impl("decode_out", &mla_decode::decode_out_cpu);
  m.impl("_decode_out_with", &mla_decode::decode_out_with_cpu);
  m.impl("explain", &mla_decode::explain_cpu);
}

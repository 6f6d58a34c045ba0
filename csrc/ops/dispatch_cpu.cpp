// CPU registrations of the mla_decode operators: validate, then run the
// host kernel of csrc/cpu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../cpu/decode_cpu.h"
#include "check.h"
#include "validation.h"

namespace mla_decode {
namespace {

void decode_out_cpu(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                    const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                    const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                    const c10::optional<at::Tensor>& kv_lens, int64_t page_size, double sm_scale, int64_t num_splits,
                    at::Tensor& out, at::Tensor& lse) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, sm_scale, num_splits};
  const MlaDecodeParams p = check_and_make_params(in, out, lse);
  check_index_values(in, p);
  decode_cpu(p);
}

}  // namespace
}  // namespace mla_decode

TORCH_LIBRARY_IMPL(mla_decode, CPU, m) {
  m.impl("decode", &mla_decode::decode_functional<&mla_decode::decode_out_cpu>);
  m.impl("decode_out", &mla_decode::decode_out_cpu);
}

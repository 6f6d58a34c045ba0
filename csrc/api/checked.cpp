// The checked mode (checked.h): the environment switch and the private
// operator _check_index_values, which validates a call's arguments and every
// index value, on the host, without running the call.
#include "api/checked.h"

#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "api/check.h"
#include "api/validation.h"

namespace mla_decode {
namespace {

bool parse_checked_env() {
  const char* v = std::getenv("MLA_DECODE_CHECKED");
  if (v == nullptr) return false;
  for (const char* on : {"1", "true", "yes", "on"}) {
    if (std::strcmp(v, on) == 0) return true;
  }
  for (const char* off : {"", "0", "false", "no", "off"}) {
    if (std::strcmp(v, off) == 0) return false;
  }
  MLA_CHECK(false, "mla_decode: MLA_DECODE_CHECKED must be 0 or 1, but it is '", std::string(v), "'.");
  return false;
}

// _check_index_values(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices,
// block_table, kv_lens, page_size): decode's checks of these arguments, then
// every index value (check_index_values_on_host: one host sync for GPU
// tensors). sm_scale and num_splits play no part in them.
void check_index_values_op(const at::Tensor& q, const at::Tensor& kv_cache, const c10::optional<at::Tensor>& kv_scale,
                           const at::Tensor& qo_indptr, const c10::optional<at::Tensor>& kv_indptr,
                           const c10::optional<at::Tensor>& kv_indices, const c10::optional<at::Tensor>& block_table,
                           const c10::optional<at::Tensor>& kv_lens, int64_t page_size) {
  const DecodeInputs in{q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens,
                        page_size, 1.0, 0};
  const MlaDecodeParams p = check_inputs(in);
  check_index_values_on_host(in, p);
}

}  // namespace

bool checked_mode_from_env() {
  static const bool checked = parse_checked_env();  // a value that raises is read again next call
  return checked;
}

}  // namespace mla_decode

TORCH_LIBRARY_IMPL(mla_decode, CPU, m) { m.impl("_check_index_values", &mla_decode::check_index_values_op); }
TORCH_LIBRARY_IMPL(mla_decode, CUDA, m) { m.impl("_check_index_values", &mla_decode::check_index_values_op); }

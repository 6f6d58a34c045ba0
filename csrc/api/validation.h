// Argument checking for the mla_decode operators, shared by every backend.
//
// check_and_make_params() validates shapes, dtypes, devices, strides and
// sizes with TORCH_CHECK sentences that name the argument, what was expected
// and what was given, and returns the raw-pointer parameter block that the
// kernels consume. It never reads tensor data, so it costs no device sync.
// It is check_inputs() (everything but the outputs) then check_outputs().
// The fake (meta) kernels of mla_decode/_ops.py repeat these checks, with
// the same messages, for what needs no memory.
//
// check_index_values() reads the int32 addressing tensors (qo_indptr,
// kv_indptr, kv_indices, block_table, kv_lens) and checks that every index is
// in range. The CPU backend always calls it (the data is already on the host);
// GPU backends cannot without a device sync, so their kernels guard every
// index instead (common/addressing.h: item_address, kv_row) and write NaN
// rows for the items whose values are malformed. The checked mode
// (checked=True, MLA_DECODE_CHECKED=1) runs the same checks on a GPU call
// through check_index_values_on_host(), at the cost of one host sync.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <tuple>
#include <utility>

#include "common/params.h"

namespace mla_decode {

struct DecodeInputs {
  const at::Tensor& q;
  const at::Tensor& kv_cache;
  const c10::optional<at::Tensor>& kv_scale;
  const at::Tensor& qo_indptr;
  const c10::optional<at::Tensor>& kv_indptr;
  const c10::optional<at::Tensor>& kv_indices;
  const c10::optional<at::Tensor>& block_table;
  const c10::optional<at::Tensor>& kv_lens;
  int64_t page_size;
  double sm_scale;
  int64_t num_splits;
};

MlaDecodeParams check_and_make_params(const DecodeInputs& in, const at::Tensor& out,
                                      const at::Tensor& lse);

// Every tensor argument is on q's device (out / lse when not null). Called
// first by check_inputs; a GPU backend calls it before its device guard, so
// a CPU q with a GPU cache is reported by argument name.
void check_devices(const DecodeInputs& in, const at::Tensor* out, const at::Tensor* lse);

// The checks and parameters of the inputs (no output fields set).
MlaDecodeParams check_inputs(const DecodeInputs& in);

// The checks of (out, lse), including that neither overlaps itself, the
// other or an input; fills p's output fields.
void check_outputs(const DecodeInputs& in, const at::Tensor& out, const at::Tensor& lse, MlaDecodeParams& p);

// q's own checks (dtype, shape, strides, the int32 row limit).
void check_q(const at::Tensor& q);

// Allocates (out, lse) of the right shape, dtype and device for `in.q`,
// after check_q (so a huge q is refused before anything is allocated).
std::pair<at::Tensor, at::Tensor> allocate_outputs(const at::Tensor& q);

// Reads index tensors (must be CPU tensors) and checks every value.
void check_index_values(const DecodeInputs& in, const MlaDecodeParams& params);

// check_index_values for tensors on any device: GPU index tensors are copied
// to the host together (one concatenation, one device-to-host copy: one host
// sync) and checked there, with the CPU's messages.
void check_index_values_on_host(const DecodeInputs& in, const MlaDecodeParams& params);

// "float8_e4m3fn" etc., for messages.
const char* format_name(KvFormat f);

// The operator signature of `decode_out` (the schema in schema.cpp).
using DecodeOutFn = void (*)(const at::Tensor& q, const at::Tensor& kv_cache,
                             const c10::optional<at::Tensor>& kv_scale, const at::Tensor& qo_indptr,
                             const c10::optional<at::Tensor>& kv_indptr, const c10::optional<at::Tensor>& kv_indices,
                             const c10::optional<at::Tensor>& block_table, const c10::optional<at::Tensor>& kv_lens,
                             int64_t page_size, double sm_scale, int64_t num_splits, at::Tensor& out, at::Tensor& lse);

// The functional `decode` op of a backend, from its `decode_out`: allocates
// (out, lse) and fills them.
template <DecodeOutFn kDecodeOut>
std::tuple<at::Tensor, at::Tensor> decode_functional(const at::Tensor& q, const at::Tensor& kv_cache,
                                                     const c10::optional<at::Tensor>& kv_scale,
                                                     const at::Tensor& qo_indptr,
                                                     const c10::optional<at::Tensor>& kv_indptr,
                                                     const c10::optional<at::Tensor>& kv_indices,
                                                     const c10::optional<at::Tensor>& block_table,
                                                     const c10::optional<at::Tensor>& kv_lens, int64_t page_size,
                                                     double sm_scale, int64_t num_splits) {
  auto [out, lse] = allocate_outputs(q);
  kDecodeOut(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size, sm_scale,
             num_splits, out, lse);
  return {out, lse};
}

}  // namespace mla_decode

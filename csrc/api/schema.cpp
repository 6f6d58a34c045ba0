// Operator schemas of the mla_decode library. Implementations are registered
// per dispatch key in dispatch_cpu.cpp and dispatch_cuda.cpp; the fake
// (meta) implementations used by torch.compile live in mla_decode/_ops.py.
//
// decode(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices,
//        block_table, kv_lens, page_size, sm_scale, num_splits) -> (out, lse)
//
//   q          (total_q, H, 576) bfloat16, last dim contiguous, 1 <= H <= 128
//   kv_cache   the latent cache; its dtype selects the format:
//                bfloat16            rows of 576 values
//                float8_e4m3fn(uz)   rows of 576 codes, kv_scale = fp32 tensor of shape (1,)
//                uint8 / float4_e2m1fn_x2
//                                    rows of 288 bytes (two E2M1 codes per byte,
//                                    even element in the low nibble), kv_scale =
//                                    2-D E8M0 bytes (uint8 / float8_e8m0fnu) with at
//                                    least as many rows as the cache and >= 18 columns
//              shapes: (rows, D), (rows, 1, D), or paged (pages, page_size, D) /
//              (pages, page_size, 1, D); consecutive tokens must be evenly strided.
//   qo_indptr  (B + 1) int32: item b owns query rows [qo_indptr[b], qo_indptr[b+1])
//   kv_indptr  (B + 1) int32 or None: item b owns KV tokens [kv_indptr[b], kv_indptr[b+1])
//              (cache rows directly, or positions in kv_indices when it is given)
//   kv_indices (N) int32 or None: cache row of each token of the indptr layout
//   block_table (B, max_pages) int32 or None: pages of each item (paged layout)
//   kv_lens    (B) int32 or None: tokens of each item (paged layout)
//   page_size  tokens per page (paged layout; must be 1 for the indptr layouts)
//   sm_scale   softmax scale (1/sqrt(576) for DeepSeek)
//   num_splits KV splits per item on the GPU; 0 chooses automatically; ignored on CPU
//
//   out (total_q, H, 512) bfloat16;  lse (total_q, H) float32, natural log,
//   -inf for rows that see no key (out is 0 there).
//
// decode_out(...same..., out, lse) writes into caller-provided tensors.
//
// explain(...decode's arguments..., overrides="") -> str describes the plan a
// decode call with these arguments runs (kernel, splits, ring, why, and why
// not each other kernel), as "key=value;..." (mla_decode.explain parses it).
// _decode_out_with(...decode_out's arguments..., overrides) is decode_out with
// explicit plan overrides (api/overrides.h): tests and A/B runs force kernels
// through it, in-process.
//
// _check_index_values(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices,
// block_table, kv_lens, page_size) checks decode's arguments and every index
// value, on the host (one host sync on a GPU): decode(..., checked=True).
#include <torch/library.h>

#include <string>

namespace mla_decode {
namespace {

// Which backends this build compiled (set by setup.py), for mla_decode.info().
std::string compiled_backends() {
  std::string s = "cpu";
#if defined(MLA_DECODE_WITH_CUDA)
  s += ",cuda";
#endif
#if defined(MLA_DECODE_WITH_HIP)
  s += ",hip";
#endif
  return s;
}

}  // namespace
}  // namespace mla_decode

TORCH_LIBRARY(mla_decode, m) {
  m.def(
      "decode(Tensor q, Tensor kv_cache, Tensor? kv_scale, Tensor qo_indptr, "
      "Tensor? kv_indptr, Tensor? kv_indices, Tensor? block_table, Tensor? kv_lens, "
      "int page_size, float sm_scale, int num_splits=0) -> (Tensor out, Tensor lse)");
  m.def(
      "decode_out(Tensor q, Tensor kv_cache, Tensor? kv_scale, Tensor qo_indptr, "
      "Tensor? kv_indptr, Tensor? kv_indices, Tensor? block_table, Tensor? kv_lens, "
      "int page_size, float sm_scale, int num_splits, Tensor(a!) out, Tensor(b!) lse) -> ()");
  m.def(
      "_decode_out_with(Tensor q, Tensor kv_cache, Tensor? kv_scale, Tensor qo_indptr, "
      "Tensor? kv_indptr, Tensor? kv_indices, Tensor? block_table, Tensor? kv_lens, "
      "int page_size, float sm_scale, int num_splits, Tensor(a!) out, Tensor(b!) lse, str overrides) -> ()");
  m.def(
      "explain(Tensor q, Tensor kv_cache, Tensor? kv_scale, Tensor qo_indptr, "
      "Tensor? kv_indptr, Tensor? kv_indices, Tensor? block_table, Tensor? kv_lens, "
      "int page_size, float sm_scale, int num_splits=0, str overrides=\"\") -> str");
  // The benchmark's streaming floor (CUDA only): reads every byte of `data`
  // once and XORs them into `sink` (kernels/bench/stream_read.cu).
  m.def("_stream_read(Tensor data, Tensor(a!) sink) -> ()");
  m.def(
      "_check_index_values(Tensor q, Tensor kv_cache, Tensor? kv_scale, Tensor qo_indptr, Tensor? kv_indptr, "
      "Tensor? kv_indices, Tensor? block_table, Tensor? kv_lens, int page_size) -> ()");
  // Build information, for mla_decode.info(): "cpu", "cpu,cuda", "cpu,hip".
  m.def("backends() -> str", &mla_decode::compiled_backends);
}

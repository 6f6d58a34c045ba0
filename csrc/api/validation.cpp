#include "validation.h"

#include "check.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/addressing.h"

namespace mla_decode {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string shape_str(const at::Tensor& t) { return detail::message(t.sizes()); }

bool is_fp8(at::ScalarType t) {
  return t == at::ScalarType::Float8_e4m3fn || t == at::ScalarType::Float8_e4m3fnuz;
}

bool is_byte_like(at::ScalarType t) {
  return t == at::ScalarType::Byte || t == at::ScalarType::Float4_e2m1fn_x2;
}

void check_same_device(const at::Tensor& t, const at::Tensor& q, const char* name) {
  if (!t.defined()) return;  // reported by the argument's own check
  MLA_CHECK(t.device() == q.device(), "mla_decode: ", name, " must be on the same device as q (",
              q.device(), "), but it is on ", t.device(), ".");
}

void check_same_device(const c10::optional<at::Tensor>& t, const at::Tensor& q, const char* name) {
  if (t.has_value() && t->defined()) check_same_device(*t, q, name);
}

// Checks dtype, rank and contiguity of an int32 index vector (its length is
// checked by the caller, against the other index tensors).
void check_int32_vector(const at::Tensor& t, const char* name) {
  MLA_CHECK(t.scalar_type() == at::kInt, "mla_decode: ", name, " must be int32, but it is ",
              t.scalar_type(), ".");
  MLA_CHECK(t.dim() == 1, "mla_decode: ", name, " must be 1-D, but it has shape ", shape_str(t),
              ".");
  MLA_CHECK(t.stride(0) == 1 || t.size(0) <= 1, "mla_decode: ", name,
              " must be contiguous, but its stride is ", t.stride(0), ".");
}

// The stride of dimension d as the kernels use it: a dimension of size 1 is
// never stepped along, so its stride (which may be anything) is recorded as 0.
int64_t used_stride(const at::Tensor& t, int64_t d) { return t.size(d) > 1 ? t.stride(d) : 0; }

// Whether two elements of `t` may share an address. Sufficient test: with the
// dimensions of size > 1 sorted by stride, each stride must exceed the span of
// the smaller ones (this accepts every permuted and padded dense layout).
bool overlaps_itself(const at::Tensor& t) {
  if (t.numel() == 0) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements spanned by the dimensions checked so far
  for (const auto& [stride, size] : dims) {
    if (stride < span) return true;
    span += stride * (size - 1);
  }
  return false;
}

// Byte range [first, last] of t's elements, as offsets into its storage.
std::pair<int64_t, int64_t> byte_range(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const int64_t first = t.storage_offset() * static_cast<int64_t>(t.element_size());
  return {first, first + (last + 1) * static_cast<int64_t>(t.element_size()) - 1};
}

// Output `name` must not share memory with tensor `other` (another output or an input).
void check_apart(const at::Tensor& out, const char* name, const at::Tensor& other, const char* other_name) {
  if (!other.defined() || out.numel() == 0 || other.numel() == 0 || !out.is_alias_of(other)) return;
  const auto a = byte_range(out);
  const auto b = byte_range(other);
  MLA_CHECK(a.second < b.first || b.second < a.first, "mla_decode: ", name, " must not overlap ", other_name,
            " in memory, but it does: ", name, " spans bytes ", a.first, "..", a.second, " of their storage and ",
            other_name, " bytes ", b.first, "..", b.second, "; give each output memory of its own.");
}

void check_apart(const at::Tensor& out, const char* name, const c10::optional<at::Tensor>& other,
                 const char* other_name) {
  if (other.has_value()) check_apart(out, name, *other, other_name);
}

}  // namespace

const char* format_name(KvFormat f) {
  switch (f) {
    case KvFormat::kBf16: return "bfloat16";
    case KvFormat::kFp8E4M3FN: return "float8_e4m3fn";
    case KvFormat::kFp8E4M3FNUZ: return "float8_e4m3fnuz";
    case KvFormat::kMxfp4: return "mxfp4";
  }
  return "unknown";
}

void check_q(const at::Tensor& q) {
  MLA_CHECK(q.defined(), "mla_decode: q must be a tensor, but it is undefined (None).");
  MLA_CHECK(q.scalar_type() == at::kBFloat16, "mla_decode: q must be bfloat16, but it is ",
              q.scalar_type(), ".");
  MLA_CHECK(q.dim() == 3, "mla_decode: q must be 3-D (total_q, num_heads, 576), but it has shape ",
              shape_str(q), ".");
  MLA_CHECK(q.size(2) == kHeadDimQK, "mla_decode: q's last dim must be ", kHeadDimQK,
              " (kv_lora_rank 512 + rope 64), but it is ", q.size(2), ".");
  MLA_CHECK(q.size(1) >= 1 && q.size(1) <= kMaxHeads, "mla_decode: q must have 1 to ", kMaxHeads,
              " heads, but it has ", q.size(1), ".");
  MLA_CHECK(q.stride(2) == 1, "mla_decode: q's last dim must be contiguous (stride 1), but its stride is ",
              q.stride(2), ".");
  MLA_CHECK(q.size(0) * q.size(1) <= kInt32Max, "mla_decode: q has ", q.size(0), " x ", q.size(1),
              " query rows, more than the int32 limit of ", kInt32Max, ".");
}

std::pair<at::Tensor, at::Tensor> allocate_outputs(const at::Tensor& q) {
  check_q(q);  // before allocating: the outputs' size follows from q's shape
  auto out = at::empty({q.size(0), q.size(1), kHeadDimV}, q.options().dtype(at::kBFloat16));
  auto lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  return {out, lse};
}

void check_devices(const DecodeInputs& in, const at::Tensor* out, const at::Tensor* lse) {
  const at::Tensor& q = in.q;
  MLA_CHECK(q.defined(), "mla_decode: q must be a tensor, but it is undefined (None).");
  check_same_device(in.kv_cache, q, "kv_cache");
  check_same_device(in.kv_scale, q, "kv_scale");
  check_same_device(in.qo_indptr, q, "qo_indptr");
  check_same_device(in.kv_indptr, q, "kv_indptr");
  check_same_device(in.kv_indices, q, "kv_indices");
  check_same_device(in.block_table, q, "block_table");
  check_same_device(in.kv_lens, q, "kv_lens");
  if (out != nullptr && out->defined()) check_same_device(*out, q, "out");
  if (lse != nullptr && lse->defined()) check_same_device(*lse, q, "lse");
}

MlaDecodeParams check_inputs(const DecodeInputs& in) {
  const at::Tensor& q = in.q;
  MlaDecodeParams p;
  MLA_CHECK(q.defined(), "mla_decode: q must be a tensor, but it is undefined (None).");
  MLA_CHECK(in.kv_cache.defined(), "mla_decode: kv_cache must be a tensor, but it is undefined (None).");
  MLA_CHECK(in.qo_indptr.defined(), "mla_decode: qo_indptr must be a tensor, but it is undefined (None).");
  check_devices(in, nullptr, nullptr);

  check_q(q);
  p.total_q = static_cast<int32_t>(q.size(0));
  p.num_heads = static_cast<int32_t>(q.size(1));
  p.q = q.data_ptr();
  p.q_stride_token = used_stride(q, 0);
  p.q_stride_head = used_stride(q, 1);

  // ---- qo_indptr ------------------------------------------------------------------
  // It sets the batch size; the other index tensors' lengths are checked against it.
  const at::Tensor& qo = in.qo_indptr;
  check_int32_vector(qo, "qo_indptr");
  MLA_CHECK(qo.size(0) >= 2, "mla_decode: qo_indptr must have batch_size + 1 >= 2 entries, but it has ",
              qo.size(0), ".");
  MLA_CHECK(qo.size(0) - 1 <= kInt32Max, "mla_decode: qo_indptr has ", qo.size(0), " entries, a batch of ",
            qo.size(0) - 1, " items, more than the int32 limit of ", kInt32Max, ".");
  p.batch = static_cast<int32_t>(qo.size(0) - 1);
  p.qo_indptr = qo.data_ptr<int32_t>();

  // ---- layout -----------------------------------------------------------------------
  const bool paged = in.block_table.has_value();
  if (paged) {
    MLA_CHECK(in.kv_lens.has_value(), "mla_decode: block_table was given without kv_lens; the paged layout "
                "needs both (kv_lens[b] = tokens of item b).");
    MLA_CHECK(!in.kv_indptr.has_value() && !in.kv_indices.has_value(),
                "mla_decode: give either kv_indptr (with optional kv_indices) or block_table with kv_lens, "
                "not both.");
    MLA_CHECK(in.page_size >= 1 && in.page_size <= (1 << 16), "mla_decode: page_size must be in [1, 65536], but it is ",
                in.page_size, ".");
    const at::Tensor& bt = *in.block_table;
    MLA_CHECK(bt.scalar_type() == at::kInt, "mla_decode: block_table must be int32, but it is ",
                bt.scalar_type(), ".");
    MLA_CHECK(bt.dim() == 2, "mla_decode: block_table must be 2-D (batch_size, max_pages), but it has shape ",
              shape_str(bt), ".");
    MLA_CHECK(bt.size(0) == p.batch, "mla_decode: block_table must have one row per item, batch_size = ", p.batch,
              " (qo_indptr has ", qo.size(0), " entries), but it has shape ", shape_str(bt), ".");
    MLA_CHECK(bt.stride(1) == 1 || bt.size(1) <= 1, "mla_decode: block_table rows must be contiguous, but its "
                "column stride is ", bt.stride(1), ".");
    MLA_CHECK(bt.size(1) * in.page_size <= kInt32Max, "mla_decode: block_table's ", bt.size(1), " pages of ",
              in.page_size, " tokens cover ", bt.size(1) * in.page_size, " tokens per item, more than the int32 "
              "limit of ", kInt32Max, ".");
    const at::Tensor& lens = *in.kv_lens;
    check_int32_vector(lens, "kv_lens");
    MLA_CHECK(lens.size(0) == p.batch, "mla_decode: kv_lens must have batch_size entries and qo_indptr "
              "batch_size + 1, but qo_indptr has ", qo.size(0), " entries (batch_size ", p.batch, ") and kv_lens has ",
              lens.size(0), ".");
    p.layout = KvLayout::kPaged;
    p.page_size = static_cast<int32_t>(in.page_size);
    p.block_table = bt.data_ptr<int32_t>();
    p.block_table_stride = bt.size(0) > 1 ? bt.stride(0) : bt.size(1);
    p.max_pages_per_seq = static_cast<int32_t>(bt.size(1));
    p.kv_lens = lens.data_ptr<int32_t>();
  } else {
    MLA_CHECK(in.kv_indptr.has_value(), "mla_decode: neither kv_indptr nor block_table was given; pass "
                "kv_indptr (batch_size + 1 int32) or block_table with kv_lens.");
    MLA_CHECK(!in.kv_lens.has_value(), "mla_decode: kv_lens is only used with block_table; with kv_indptr "
                "the lengths are kv_indptr[b+1] - kv_indptr[b].");
    MLA_CHECK(in.page_size == 1, "mla_decode: page_size must be 1 with kv_indptr (rows are tokens), but it is ",
                in.page_size, "; use block_table for paged caches.");
    const at::Tensor& kp = *in.kv_indptr;
    check_int32_vector(kp, "kv_indptr");
    MLA_CHECK(kp.size(0) == qo.size(0), "mla_decode: qo_indptr and kv_indptr must have the same length, "
              "batch_size + 1, but qo_indptr has ", qo.size(0), " entries (batch_size ", qo.size(0) - 1,
              ") and kv_indptr has ", kp.size(0), " (batch_size ", kp.size(0) - 1, ").");
    p.kv_indptr = kp.data_ptr<int32_t>();
    p.layout = KvLayout::kIndptr;
    if (in.kv_indices.has_value()) {
      check_int32_vector(*in.kv_indices, "kv_indices");
      p.layout = KvLayout::kIndptrIndices;
      p.kv_indices = in.kv_indices->data_ptr<int32_t>();
      p.num_kv_indices = in.kv_indices->size(0);
    }
  }

  // ---- cache --------------------------------------------------------------------------
  const at::Tensor& kv = in.kv_cache;
  const auto kv_dtype = kv.scalar_type();
  int64_t row_elems;
  int64_t elem_bytes = kv.element_size();
  if (kv_dtype == at::kBFloat16) {
    p.format = KvFormat::kBf16;
    row_elems = kHeadDimQK;
  } else if (kv_dtype == at::ScalarType::Float8_e4m3fn) {
    p.format = KvFormat::kFp8E4M3FN;
    row_elems = kHeadDimQK;
  } else if (kv_dtype == at::ScalarType::Float8_e4m3fnuz) {
    p.format = KvFormat::kFp8E4M3FNUZ;
    row_elems = kHeadDimQK;
  } else if (is_byte_like(kv_dtype)) {
    p.format = KvFormat::kMxfp4;
    row_elems = kMxfp4RowBytes;
  } else {
    MLA_CHECK(false, "mla_decode: kv_cache must be bfloat16, float8_e4m3fn, float8_e4m3fnuz, or uint8 / "
                "float4_e2m1fn_x2 (MXFP4), but it is ", kv_dtype, ".");
  }
  MLA_CHECK(kv.dim() >= 2 && kv.dim() <= 4, "mla_decode: kv_cache must be 2-D (rows, D), 3-D (rows, 1, D) or "
              "(pages, page_size, D), or 4-D (pages, page_size, 1, D), but it has shape ", shape_str(kv), ".");
  MLA_CHECK(kv.size(-1) == row_elems, "mla_decode: a ", format_name(p.format), " kv_cache must have ",
              row_elems, " elements per row (last dim), but it has ", kv.size(-1), ".");
  MLA_CHECK(kv.stride(-1) == 1, "mla_decode: kv_cache's last dim must be contiguous (stride 1), but its stride is ",
              kv.stride(-1), ".");
  if (kv.dim() == 4) {
    MLA_CHECK(kv.size(2) == 1, "mla_decode: a 4-D kv_cache must be (pages, page_size, 1, D) with one KV head, "
                "but dim 2 is ", kv.size(2), ".");
  }
  // Reduce to evenly strided token rows: (num_rows, row_elems) with one stride.
  // A cache whose dim 1 has size 1 ((rows, 1, D), (pages, 1, 1, D)) is a list
  // of rows whatever the layout; dims of size 1 are never stepped along, so
  // their strides are not read.
  int64_t row_stride;
  int64_t num_rows;
  if (kv.dim() == 2 || (kv.size(1) == 1 && !(paged && in.page_size != 1))) {
    row_stride = kv.stride(0);
    num_rows = kv.size(0);
  } else {
    // (pages, page_size, [1,] D)
    MLA_CHECK(paged, "mla_decode: kv_cache of shape ", shape_str(kv), " is paged (pages, page_size, ...) but no "
                "block_table was given; pass (rows, D) or (rows, 1, D) with kv_indptr.");
    MLA_CHECK(kv.size(1) == in.page_size, "mla_decode: kv_cache's dim 1 is the page size (", in.page_size,
                "), but it is ", kv.size(1), ".");
    row_stride = kv.stride(1);
    MLA_CHECK(kv.size(0) <= 1 || kv.stride(0) == in.page_size * row_stride,
                "mla_decode: kv_cache pages must be evenly strided token rows (page stride = page_size x row "
                "stride = ", in.page_size * row_stride, "), but the page stride is ", kv.stride(0), ".");
    num_rows = kv.size(0) * kv.size(1);
  }
  if (num_rows <= 1) row_stride = row_elems;  // one row: its stride is never used
  MLA_CHECK(row_stride >= row_elems, "mla_decode: kv_cache rows overlap (row stride ", row_stride,
              " < ", row_elems, " elements per row).");
  MLA_CHECK(num_rows <= kInt32Max, "mla_decode: kv_cache has ", num_rows, " token rows, more than the int32 "
              "index limit of ", kInt32Max, ".");
  p.kv = kv.data_ptr();
  p.kv_row_stride_bytes = row_stride * elem_bytes;
  p.num_cache_rows = num_rows;
  if (!kv.is_cpu()) {
    // The GPU kernels move 16-byte chunks of rows and of q.
    MLA_CHECK(reinterpret_cast<uintptr_t>(p.kv) % 16 == 0 && p.kv_row_stride_bytes % 16 == 0,
                "mla_decode: on the GPU, kv_cache rows must start on 16-byte boundaries, but the row stride is ",
                p.kv_row_stride_bytes, " bytes and the data pointer is ", reinterpret_cast<uintptr_t>(p.kv) % 16,
                " bytes past a boundary.");
    MLA_CHECK(reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_stride_token % 8 == 0 && p.q_stride_head % 8 == 0,
                "mla_decode: on the GPU, q's rows must start on 16-byte boundaries (strides multiple of 8 elements), "
                "but its strides are (", q.stride(0), ", ", q.stride(1), ", 1) and its data pointer is ",
                reinterpret_cast<uintptr_t>(p.q) % 16, " bytes past a boundary.");
  }

  // ---- kv_scale -------------------------------------------------------------------------
  if (p.format == KvFormat::kBf16) {
    MLA_CHECK(!in.kv_scale.has_value(), "mla_decode: kv_scale must be None for a bfloat16 kv_cache.");
  } else if (p.format == KvFormat::kMxfp4) {
    MLA_CHECK(in.kv_scale.has_value(), "mla_decode: an MXFP4 kv_cache needs kv_scale, the E8M0 block scales "
                "(rows >= ", num_rows, ", columns >= ", kMxBlocksPerRow, ").");
    const at::Tensor& s = *in.kv_scale;
    MLA_CHECK(s.scalar_type() == at::kByte || s.scalar_type() == at::ScalarType::Float8_e8m0fnu,
                "mla_decode: MXFP4 kv_scale must be uint8 or float8_e8m0fnu, but it is ", s.scalar_type(), ".");
    MLA_CHECK(s.dim() == 2, "mla_decode: MXFP4 kv_scale must be 2-D (rows, blocks), but it has shape ",
                shape_str(s), ".");
    MLA_CHECK(s.size(0) >= num_rows && s.size(1) >= kMxBlocksPerRow, "mla_decode: MXFP4 kv_scale must have at "
                "least ", num_rows, " rows and ", kMxBlocksPerRow, " columns, but it has shape ", shape_str(s), ".");
    p.mx_scale = reinterpret_cast<const uint8_t*>(s.data_ptr());
    p.mx_scale_stride_row = used_stride(s, 0);
    p.mx_scale_stride_col = s.stride(1);
  } else {
    MLA_CHECK(in.kv_scale.has_value(), "mla_decode: an fp8 kv_cache needs kv_scale, a float32 tensor of shape (1,) "
                "holding the per-tensor dequantisation scale.");
    const at::Tensor& s = *in.kv_scale;
    MLA_CHECK(s.scalar_type() == at::kFloat, "mla_decode: fp8 kv_scale must be float32, but it is ",
                s.scalar_type(), ".");
    MLA_CHECK(s.numel() == 1, "mla_decode: fp8 kv_scale must hold one value (per-tensor scale), but it has shape ",
                shape_str(s), ".");
    p.fp8_scale = s.data_ptr<float>();
  }

  // ---- scalars ----------------------------------------------------------------------------
  // The kernels take it as a float: it must stay finite and nonzero there.
  p.sm_scale = static_cast<float>(in.sm_scale);
  MLA_CHECK(std::isfinite(p.sm_scale) && p.sm_scale != 0.f, "mla_decode: sm_scale must be finite and nonzero in "
            "float32, but it is ", in.sm_scale, ".");
  MLA_CHECK(in.num_splits >= 0 && in.num_splits <= kMaxNumSplits, "mla_decode: num_splits must be in [0, ",
              kMaxNumSplits, "] (0 = automatic), but it is ", in.num_splits, ".");
  return p;
}

void check_outputs(const DecodeInputs& in, const at::Tensor& out, const at::Tensor& lse, MlaDecodeParams& p) {
  const at::Tensor& q = in.q;
  MLA_CHECK(out.defined() && lse.defined(), "mla_decode: out and lse must be defined.");
  check_same_device(out, q, "out");
  check_same_device(lse, q, "lse");
  MLA_CHECK(out.scalar_type() == at::kBFloat16, "mla_decode: out must be bfloat16, but it is ", out.scalar_type(),
              ".");
  MLA_CHECK(out.dim() == 3 && out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == kHeadDimV,
              "mla_decode: out must have shape (", q.size(0), ", ", q.size(1), ", ", kHeadDimV, "), but it has shape ",
              shape_str(out), ".");
  MLA_CHECK(out.stride(2) == 1, "mla_decode: out's last dim must be contiguous, but its stride is ", out.stride(2),
              ".");
  MLA_CHECK(lse.scalar_type() == at::kFloat, "mla_decode: lse must be float32, but it is ", lse.scalar_type(), ".");
  MLA_CHECK(lse.dim() == 2 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1), "mla_decode: lse must have "
              "shape (", q.size(0), ", ", q.size(1), "), but it has shape ", shape_str(lse), ".");
  // Every output element is written once, by one thread: outputs whose
  // elements share memory would keep one of several results.
  MLA_CHECK(!overlaps_itself(out), "mla_decode: out's elements must not overlap in memory, but its strides ",
            out.strides(), " (shape ", out.sizes(), ") map several of them to one address; pass a tensor of "
            "distinct elements (such as torch.empty's).");
  MLA_CHECK(!overlaps_itself(lse), "mla_decode: lse's elements must not overlap in memory, but its strides ",
            lse.strides(), " (shape ", lse.sizes(), ") map several of them to one address; pass a tensor of "
            "distinct elements (such as torch.empty's).");
  check_apart(out, "out", lse, "lse");
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&out, "out"}, {&lse, "lse"}}) {
    check_apart(*t, name, q, "q");
    check_apart(*t, name, in.kv_cache, "kv_cache");
    check_apart(*t, name, in.kv_scale, "kv_scale");
    check_apart(*t, name, in.qo_indptr, "qo_indptr");
    check_apart(*t, name, in.kv_indptr, "kv_indptr");
    check_apart(*t, name, in.kv_indices, "kv_indices");
    check_apart(*t, name, in.block_table, "block_table");
    check_apart(*t, name, in.kv_lens, "kv_lens");
  }
  p.out = out.data_ptr();
  p.out_stride_token = used_stride(out, 0);
  p.out_stride_head = used_stride(out, 1);
  // The GPU kernels store out in groups of up to four bf16 values (8 bytes):
  // every group must be 8-byte aligned (a misaligned store faults and leaves
  // the context unusable).
  const uintptr_t out_misalignment = reinterpret_cast<uintptr_t>(p.out) % 8;
  MLA_CHECK(out.is_cpu() || (out_misalignment == 0 && p.out_stride_token % 4 == 0 && p.out_stride_head % 4 == 0),
            "mla_decode: on ", out.device(), " out's rows must start at 8-byte aligned addresses (an element "
            "offset and strides that are multiples of 4), but out starts ", out_misalignment, " bytes past an "
            "8-byte boundary with strides ", out.strides(), "; pass an aligned tensor (such as torch.empty's) and "
            "copy from it.");
  p.lse = lse.data_ptr<float>();
  p.lse_stride_token = used_stride(lse, 0);
  p.lse_stride_head = used_stride(lse, 1);
}

MlaDecodeParams check_and_make_params(const DecodeInputs& in, const at::Tensor& out,
                                      const at::Tensor& lse) {
  MlaDecodeParams p = check_inputs(in);
  check_outputs(in, out, lse, p);
  return p;
}

void check_index_values(const DecodeInputs& in, const MlaDecodeParams& p) {
  const int32_t* qo = p.qo_indptr;
  MLA_CHECK(qo[0] == 0, "mla_decode: qo_indptr[0] must be 0, but it is ", qo[0], ".");
  for (int64_t b = 0; b < p.batch; ++b) {
    MLA_CHECK(qo[b + 1] >= qo[b], "mla_decode: qo_indptr must be non-decreasing, but qo_indptr[", b + 1, "] = ",
                qo[b + 1], " < qo_indptr[", b, "] = ", qo[b], ".");
  }
  MLA_CHECK(qo[p.batch] == p.total_q, "mla_decode: qo_indptr[-1] must equal q.size(0) = ", p.total_q,
              ", but it is ", qo[p.batch], ".");

  if (p.layout == KvLayout::kPaged) {
    const int64_t num_pages = p.num_cache_rows / p.page_size;
    const int64_t table_tokens = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t len = p.kv_lens[b];
      MLA_CHECK(len >= 0 && len <= table_tokens, "mla_decode: kv_lens[", b, "] = ", len,
                  " must be in [0, max_pages x page_size = ", table_tokens, "].");
      const int64_t pages = (len + p.page_size - 1) / p.page_size;
      const int32_t* row = p.block_table + b * p.block_table_stride;
      for (int64_t i = 0; i < pages; ++i) {
        MLA_CHECK(row[i] >= 0 && row[i] < num_pages, "mla_decode: block_table[", b, "][", i, "] = ", row[i],
                    " is not a page of kv_cache (", num_pages, " pages).");
      }
      MLA_CHECK(len <= kMaxKvLength, "mla_decode: kv_lens[", b, "] = ", len, " is more than the ", kMaxKvLength,
                " keys one item may have.");
    }
    return;
  }
  const int32_t* kp = p.kv_indptr;
  MLA_CHECK(kp[0] >= 0, "mla_decode: kv_indptr[0] must be >= 0, but it is ", kp[0], ".");
  for (int64_t b = 0; b < p.batch; ++b) {
    MLA_CHECK(kp[b + 1] >= kp[b], "mla_decode: kv_indptr must be non-decreasing, but kv_indptr[", b + 1, "] = ",
                kp[b + 1], " < kv_indptr[", b, "] = ", kp[b], ".");
  }
  if (p.layout == KvLayout::kIndptr) {
    MLA_CHECK(kp[p.batch] <= p.num_cache_rows, "mla_decode: kv_indptr[-1] = ", kp[p.batch],
                " exceeds the kv_cache's ", p.num_cache_rows, " rows.");
  } else {
    MLA_CHECK(kp[p.batch] <= p.num_kv_indices, "mla_decode: kv_indptr[-1] = ", kp[p.batch],
                " exceeds the length of kv_indices (", p.num_kv_indices, ").");
    for (int64_t i = kp[0]; i < kp[p.batch]; ++i) {
      const int32_t r = p.kv_indices[i];
      MLA_CHECK(r >= 0 && r < p.num_cache_rows, "mla_decode: kv_indices[", i, "] = ", r,
                  " is not a row of kv_cache (", p.num_cache_rows, " rows).");
    }
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = static_cast<int64_t>(kp[b + 1]) - kp[b];
    MLA_CHECK(len <= kMaxKvLength, "mla_decode: item ", b, " has kv_indptr[", b + 1, "] - kv_indptr[", b, "] = ",
              len, " keys, more than the ", kMaxKvLength, " one item may have.");
  }
  (void)in;
}

void check_index_values_on_host(const DecodeInputs& in, const MlaDecodeParams& p) {
  if (in.qo_indptr.is_cpu()) {
    check_index_values(in, p);
    return;
  }
  // One buffer of every index tensor, copied to the host at once.
  std::vector<at::Tensor> parts{in.qo_indptr};
  if (p.layout == KvLayout::kPaged) {
    parts.push_back(in.block_table->contiguous().reshape({-1}));
    parts.push_back(*in.kv_lens);
  } else {
    parts.push_back(*in.kv_indptr);
    if (in.kv_indices.has_value()) parts.push_back(*in.kv_indices);
  }
  const at::Tensor host = at::cat(parts).cpu();
  const int32_t* base = host.data_ptr<int32_t>();
  MlaDecodeParams h = p;
  int64_t offset = 0;
  auto next = [&](const at::Tensor& t) {
    const int32_t* ptr = base + offset;
    offset += t.numel();
    return ptr;
  };
  h.qo_indptr = next(parts[0]);
  if (p.layout == KvLayout::kPaged) {
    h.block_table = next(parts[1]);
    h.block_table_stride = in.block_table->size(1);
    h.kv_lens = next(parts[2]);
  } else {
    h.kv_indptr = next(parts[1]);
    if (in.kv_indices.has_value()) h.kv_indices = next(parts[2]);
  }
  check_index_values(in, h);
}

}  // namespace mla_decode

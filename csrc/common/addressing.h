// Token -> cache-row lookup, shared by the CPU and GPU kernels, and the GPU's
// reading of the addressing tensors' values.
//
// The CPU validates every index value before it runs (api/validation.cpp,
// check_index_values), so there these functions see consistent values. The
// GPU cannot raise without a host sync, so the kernels read the values
// through item_address(), which says whether an item's values can be
// trusted: a token of an item they cannot becomes an orphan (NaN rows), and
// a key whose row is outside the cache makes NaN the rows that see it
// (kv_row returns -1). Values are read as int32 and combined in int64, so no
// user value overflows on the way.
#pragma once

#include "params.h"
#include "portability.h"

namespace mla_decode {

// Keys one item may have: a key position plus any tile step of a kernel stays
// within int32 (2^31 - 2^16). Longer items are an error on the CPU and NaN
// rows on the GPU.
constexpr int32_t kMaxKvLength = 2147418112;

// One index value, read through the read-only cache on the GPU.
MLA_HOST_DEVICE inline int32_t load_index(const int32_t* ptr) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __ldg(ptr);
#else
  return *ptr;
#endif
}

// Number of KV tokens of batch item b (values already validated: the CPU).
MLA_HOST_DEVICE inline int32_t kv_length(const MlaDecodeParams& p, int32_t b) {
  if (p.layout == KvLayout::kPaged) return p.kv_lens[b];
  return p.kv_indptr[b + 1] - p.kv_indptr[b];
}

// Cache row of token j (0 <= j < kv_length) of item b, or -1 when the
// addressing tensors point outside the cache (the GPU kernels cannot raise;
// they turn such a row into NaN output instead of reading out of bounds).
MLA_HOST_DEVICE inline int64_t kv_row(const MlaDecodeParams& p, int32_t b, int32_t j) {
  int64_t row;
  if (p.layout == KvLayout::kPaged) {
    const int32_t page_idx = j / p.page_size;
    if (page_idx >= p.max_pages_per_seq) return -1;
    const int32_t page = p.block_table[static_cast<int64_t>(b) * p.block_table_stride + page_idx];
    row = static_cast<int64_t>(page) * p.page_size + (j - page_idx * p.page_size);
  } else if (p.layout == KvLayout::kIndptrIndices) {
    const int64_t pos = static_cast<int64_t>(p.kv_indptr[b]) + j;
    if (pos < 0 || pos >= p.num_kv_indices) return -1;
    row = p.kv_indices[pos];
  } else {
    row = static_cast<int64_t>(p.kv_indptr[b]) + j;
  }
  return (row >= 0 && row < p.num_cache_rows) ? row : -1;
}

// Keys visible to query token i of an item with q_len queries and kv_len keys
// (bottom-right causal mask), clamped to [0, kv_len]. int64 inside: no sum of
// the arguments overflows.
MLA_HOST_DEVICE inline int32_t visible_keys(int32_t kv_len, int32_t q_len, int32_t i) {
  int64_t v = static_cast<int64_t>(kv_len) - q_len + i + 1;
  v = v < 0 ? 0 : v;
  return static_cast<int32_t>(v > kv_len ? kv_len : v);
}

// Whether item b's entries of an indptr array x (batch + 1 entries; item b
// reads x[b] and x[b+1]) can be trusted: both lie in [0, bound] and x does not
// decrease at or next to them, x[b-1] <= x[b] <= x[b+1] <= x[b+2] (where those
// entries exist). A decrease means that one of the two entries around it is
// wrong, and either may be, so it condemns every item that reads one of them:
// the item whose range is inverted and its two neighbours.
MLA_HOST_DEVICE inline bool indptr_item_trusted(const int32_t* x, int32_t batch, int32_t b, int64_t bound) {
  const int32_t begin = load_index(x + b);
  const int32_t end = load_index(x + b + 1);
  const int32_t before = b > 0 ? load_index(x + b - 1) : begin;
  const int32_t after = b + 1 < batch ? load_index(x + b + 2) : end;
  return begin >= 0 && static_cast<int64_t>(end) <= bound && before <= begin && begin <= end && end <= after;
}

// The largest value a kv_indptr entry may hold: the length of kv_indices, or
// the cache's rows (the indptr layout: entries are rows).
MLA_HOST_DEVICE inline int64_t kv_indptr_bound(const MlaDecodeParams& p) {
  return p.layout == KvLayout::kIndptrIndices ? p.num_kv_indices : p.num_cache_rows;
}

// Item b as the GPU kernels read it: its query rows [q_begin, q_end) and its
// number of keys, and whether every value it reads can be trusted (ok):
//   * qo_indptr: indptr_item_trusted with bound total_q;
//   * kv_indptr (both indptr layouts): indptr_item_trusted with bound
//     kv_indptr_bound (entries past kv_indices or past the cache);
//   * kv_lens[b] (paged): in [0, max_pages_per_seq x page_size];
//   * the item has at most kMaxKvLength keys.
// Cache rows (kv_indices, block_table values) are checked per key by kv_row.
// kv_len is 0 when !ok. q_begin / q_end are the stored values either way.
struct ItemAddress {
  int32_t q_begin;
  int32_t q_end;
  int32_t kv_len;
  bool ok;
};

MLA_HOST_DEVICE inline ItemAddress item_address(const MlaDecodeParams& p, int32_t b) {
  ItemAddress a;
  a.q_begin = load_index(p.qo_indptr + b);
  a.q_end = load_index(p.qo_indptr + b + 1);
  bool ok = indptr_item_trusted(p.qo_indptr, p.batch, b, p.total_q);
  int64_t len;
  if (p.layout == KvLayout::kPaged) {
    len = load_index(p.kv_lens + b);
    ok = ok && len >= 0 && len <= static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  } else {
    ok = ok && indptr_item_trusted(p.kv_indptr, p.batch, b, kv_indptr_bound(p));
    len = static_cast<int64_t>(load_index(p.kv_indptr + b + 1)) - load_index(p.kv_indptr + b);
  }
  ok = ok && len <= kMaxKvLength;
  a.kv_len = ok ? static_cast<int32_t>(len) : 0;
  a.ok = ok;
  return a;
}

}  // namespace mla_decode

// Token -> cache-row lookup, shared by the CPU and GPU kernels.
#pragma once

#include "params.h"
#include "portability.h"

namespace mla_decode {

// Number of KV tokens of batch item b.
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
// (bottom-right causal mask), clamped to [0, kv_len].
MLA_HOST_DEVICE inline int32_t visible_keys(int32_t kv_len, int32_t q_len, int32_t i) {
  int32_t v = kv_len - q_len + i + 1;
  v = v < 0 ? 0 : v;
  return v > kv_len ? kv_len : v;
}

}  // namespace mla_decode

// Plain parameter block shared by every mla_decode kernel (CPU, CUDA, HIP).
//
// No ATen, no torch headers: this file is included by device code. The host
// side (csrc/ops/validation.cpp) fills it from checked tensors; kernels only
// read it. Strides are in elements of the pointed-to type unless the name says
// "_bytes".
//
// Problem (absorbed MLA decode, one shared latent KV head):
//   for batch item b, query token i (0 <= i < Q_b) and head h:
//     s_j      = sm_scale * dot(q[i, h, 0:576], K[j, 0:576])     j < visible(i)
//     out[i,h] = sum_j softmax(s)_j * K[j, 0:512]
//     lse[i,h] = log(sum_j exp(s_j))                              (natural log)
//   visible(i) = L_b - Q_b + i + 1 (bottom-right causal), clamped to [0, L_b].
//   An empty row (visible <= 0) gives out = 0 and lse = -inf.
#pragma once

#include <stdint.h>

namespace mla_decode {

constexpr int kHeadDimQK = 576;   // kv_lora_rank (512) + qk_rope_head_dim (64)
constexpr int kHeadDimV = 512;    // V is the first 512 dims of the same row
constexpr int kMxBlock = 32;      // OCP MX block size along the head dim
constexpr int kMxBlocksPerRow = kHeadDimQK / kMxBlock;   // 18
constexpr int kMxfp4RowBytes = kHeadDimQK / 2;           // 288: two E2M1 codes per byte
constexpr int kMaxHeads = 128;
constexpr int kMaxNumSplits = 256;  // largest num_splits the operators accept

// How the cache rows are stored. The value is part of no public ABI; the op
// derives it from the cache dtype.
enum class KvFormat : int32_t {
  kBf16 = 0,          // 576 bf16 per row
  kFp8E4M3FN = 1,     // 576 OCP e4m3 (max 448) per row, one fp32 scale per tensor
  kFp8E4M3FNUZ = 2,   // 576 e4m3fnuz (MI300 flavour, max 240) per row, same scale
  kMxfp4 = 3,         // 288 bytes of E2M1 pairs per row + 18 E8M0 block scales
};

// How token j of batch item b is found in the cache.
enum class KvLayout : int32_t {
  kIndptr = 0,        // row = kv_indptr[b] + j            (page size 1, contiguous)
  kIndptrIndices = 1, // row = kv_indices[kv_indptr[b] + j]
  kPaged = 2,         // row = block_table[b][j / page] * page + j % page, L_b = kv_lens[b]
};

struct MlaDecodeParams {
  // ---- sizes ----------------------------------------------------------------
  int32_t batch = 0;           // number of batch items (qo_indptr has batch + 1 entries)
  int32_t num_heads = 0;       // H, 1..128
  int32_t total_q = 0;         // rows of q / out
  int64_t num_cache_rows = 0;  // token rows addressable in the cache (bounds for indices)
  int32_t page_size = 1;       // tokens per page (kPaged), 1 otherwise
  int32_t max_pages_per_seq = 0;  // columns of block_table (kPaged)
  int64_t num_kv_indices = 0;  // length of kv_indices (kIndptrIndices)
  float sm_scale = 0.f;

  // ---- query: (total_q, H, 576) bf16, last dim contiguous ---------------------
  const void* q = nullptr;
  int64_t q_stride_token = 0;  // elements between consecutive query tokens
  int64_t q_stride_head = 0;   // elements between consecutive heads

  // ---- cache ------------------------------------------------------------------
  KvFormat format = KvFormat::kBf16;
  const void* kv = nullptr;        // row r starts at (const char*)kv + r * kv_row_stride_bytes
  int64_t kv_row_stride_bytes = 0; // >= 1152 (bf16), 576 (fp8), 288 (mxfp4)
  const float* fp8_scale = nullptr;  // fp8: device pointer to one fp32 (dequant = code * scale)
  const uint8_t* mx_scale = nullptr; // mxfp4: E8M0 byte of (row r, block k) at
                                     //   mx_scale[r * mx_scale_stride_row + k * mx_scale_stride_col]
  int64_t mx_scale_stride_row = 0;
  int64_t mx_scale_stride_col = 0;

  // ---- addressing (int32 everywhere) -------------------------------------------
  KvLayout layout = KvLayout::kIndptr;
  const int32_t* qo_indptr = nullptr;   // (batch + 1)
  const int32_t* kv_indptr = nullptr;   // (batch + 1), kIndptr / kIndptrIndices
  const int32_t* kv_indices = nullptr;  // (num_kv_indices), kIndptrIndices
  const int32_t* block_table = nullptr; // (batch, max_pages_per_seq), kPaged
  int64_t block_table_stride = 0;       // elements between rows of block_table
  const int32_t* kv_lens = nullptr;     // (batch), kPaged

  // ---- outputs -----------------------------------------------------------------
  void* out = nullptr;                  // (total_q, H, 512) bf16
  int64_t out_stride_token = 0;
  int64_t out_stride_head = 0;
  float* lse = nullptr;                 // (total_q, H) fp32, natural log
  int64_t lse_stride_token = 0;
  int64_t lse_stride_head = 0;
};

}  // namespace mla_decode

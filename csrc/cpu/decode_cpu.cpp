// CPU implementation of absorbed MLA decode for every cache format.
//
// Work item: one (batch item, query token, group of up to 16 heads). Visible
// keys are taken 32 at a time: their rows are dequantised once into fp32
// scratch rows (never the whole cache), every head of the group scores them,
// then updates its running max / sum (online softmax, one rescale per block)
// and its 512-float accumulator. Accumulation is fp32; the output is rounded
// to bf16 once at the end.
#include "decode_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../mla_decode/addressing.h"
#include "../mla_decode/formats.h"

namespace mla_decode {
namespace {

constexpr int kHeadsPerTask = 16;
constexpr int kKeysPerBlock = 32;  // keys dequantised together (72 KB of fp32 rows)

// Decode tables, built once per call: every fp8 code (times the tensor
// scale, the same fp32 product the per-element decode made), and both E2M1
// values of every MXFP4 byte (low nibble first).
struct DecodeTables {
  float fp8[256];
  float e2m1_pair[256][2];
};

DecodeTables make_tables(const MlaDecodeParams& p) {
  DecodeTables t{};
  if (p.format == KvFormat::kFp8E4M3FN || p.format == KvFormat::kFp8E4M3FNUZ) {
    const float s = *p.fp8_scale;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      t.fp8[c] = (p.format == KvFormat::kFp8E4M3FN ? e4m3fn_to_float(code) : e4m3fnuz_to_float(code)) * s;
    }
  } else if (p.format == KvFormat::kMxfp4) {
    for (int c = 0; c < 256; ++c) {
      t.e2m1_pair[c][0] = e2m1_to_float(c & 0xF);  // even element in the low nibble
      t.e2m1_pair[c][1] = e2m1_to_float(c >> 4);
    }
  }
  return t;
}

// Dequantises cache row `row` into dst[0:576].
void load_row(const MlaDecodeParams& p, const DecodeTables& tables, int64_t row, float* dst) {
  const uint8_t* base = static_cast<const uint8_t*>(p.kv) + row * p.kv_row_stride_bytes;
  switch (p.format) {
    case KvFormat::kBf16: {
      const uint16_t* v = reinterpret_cast<const uint16_t*>(base);
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = bf16_bits_to_float(v[d]);
      break;
    }
    case KvFormat::kFp8E4M3FN:
    case KvFormat::kFp8E4M3FNUZ:
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = tables.fp8[base[d]];
      break;
    case KvFormat::kMxfp4: {
      const uint8_t* sc = p.mx_scale + row * p.mx_scale_stride_row;
      for (int blk = 0; blk < kMxBlocksPerRow; ++blk) {
        const float s = e8m0_to_float(sc[blk * p.mx_scale_stride_col]);
        const uint8_t* bytes = base + blk * (kMxBlock / 2);
        float* d = dst + blk * kMxBlock;
        for (int k = 0; k < kMxBlock / 2; ++k) {
          d[2 * k] = tables.e2m1_pair[bytes[k]][0] * s;
          d[2 * k + 1] = tables.e2m1_pair[bytes[k]][1] * s;
        }
      }
      break;
    }
  }
}

// Dot product of two 576-float rows with 8 independent partial sums, so the
// compiler can vectorise it without reassociating a single sum (no fast-math).
float dot576(const float* a, const float* b) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int d = 0; d < kHeadDimQK; d += 8) {
    for (int u = 0; u < 8; ++u) part[u] += a[d + u] * b[d + u];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// One task: query token qi of item b, heads h0 .. h0 + nh - 1. Keys are taken
// kKeysPerBlock at a time: the block's rows are dequantised once into
// `kblock`, every head scores them, and each head's running max / sum and
// accumulator are rescaled once per block (not once per key).
void run_task(const MlaDecodeParams& p, const DecodeTables& tables, int32_t b, int32_t qi, int32_t h0, int32_t nh,
              float* kblock, float* qbuf, float* acc) {
  const int32_t q_begin = p.qo_indptr[b];
  const int32_t q_len = p.qo_indptr[b + 1] - q_begin;
  const int32_t kv_len = kv_length(p, b);
  const int32_t visible = visible_keys(kv_len, q_len, qi);
  const int64_t t = static_cast<int64_t>(q_begin) + qi;

  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  for (int h = 0; h < nh; ++h) {
    const uint16_t* qh = qbase + t * p.q_stride_token + static_cast<int64_t>(h0 + h) * p.q_stride_head;
    for (int d = 0; d < kHeadDimQK; ++d) qbuf[h * kHeadDimQK + d] = bf16_bits_to_float(qh[d]);
  }
  float m[kHeadsPerTask], l[kHeadsPerTask];
  for (int h = 0; h < nh; ++h) {
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.f;
  }
  std::fill(acc, acc + nh * kHeadDimV, 0.f);

  float score[kKeysPerBlock];
  for (int32_t j0 = 0; j0 < visible; j0 += kKeysPerBlock) {
    const int nk = std::min<int32_t>(kKeysPerBlock, visible - j0);
    // Out-of-range rows are rejected by check_index_values before we get here.
    for (int k = 0; k < nk; ++k) load_row(p, tables, kv_row(p, b, j0 + k), kblock + k * kHeadDimQK);
    for (int h = 0; h < nh; ++h) {
      const float* qh = qbuf + h * kHeadDimQK;
      float block_max = -std::numeric_limits<float>::infinity();
      for (int k = 0; k < nk; ++k) {
        score[k] = dot576(qh, kblock + k * kHeadDimQK) * p.sm_scale;
        block_max = std::max(block_max, score[k]);  // a NaN score is skipped here, and poisons l below
      }
      const float m_new = std::max(m[h], block_max);
      float* a = acc + h * kHeadDimV;
      if (m_new > m[h]) {
        const float alpha = std::exp(m[h] - m_new);  // exp(-inf) = 0 on the first block
        l[h] *= alpha;
        for (int d = 0; d < kHeadDimV; ++d) a[d] *= alpha;
        m[h] = m_new;
      }
      for (int k = 0; k < nk; ++k) {
        const float w = std::exp(score[k] - m[h]);  // NaN scores propagate into l and acc
        l[h] += w;
        const float* v = kblock + k * kHeadDimQK;
        for (int d = 0; d < kHeadDimV; ++d) a[d] += w * v[d];
      }
    }
  }

  uint16_t* obase = static_cast<uint16_t*>(p.out);
  for (int h = 0; h < nh; ++h) {
    uint16_t* o = obase + t * p.out_stride_token + static_cast<int64_t>(h0 + h) * p.out_stride_head;
    float* lse = p.lse + t * p.lse_stride_token + static_cast<int64_t>(h0 + h) * p.lse_stride_head;
    if (visible == 0) {
      for (int d = 0; d < kHeadDimV; ++d) o[d] = 0;
      *lse = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv = 1.f / l[h];
    const float* a = acc + h * kHeadDimV;
    for (int d = 0; d < kHeadDimV; ++d) o[d] = c10::BFloat16(a[d] * inv).x;
    *lse = m[h] + std::log(l[h]);
  }
}

}  // namespace

void decode_cpu(const MlaDecodeParams& p) {
  const int32_t head_groups = (p.num_heads + kHeadsPerTask - 1) / kHeadsPerTask;
  // Flatten (query row, head group); qo_indptr maps a query row to its item.
  const int64_t tasks = static_cast<int64_t>(p.total_q) * head_groups;
  const DecodeTables tables = make_tables(p);
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kblock(kKeysPerBlock * kHeadDimQK);
    std::vector<float> qbuf(kHeadsPerTask * kHeadDimQK);
    std::vector<float> acc(kHeadsPerTask * kHeadDimV);
    int32_t b = 0;
    for (int64_t task = begin; task < end; ++task) {
      const int32_t t = static_cast<int32_t>(task / head_groups);
      const int32_t g = static_cast<int32_t>(task % head_groups);
      // Items are few; a forward scan from the last position is cheap.
      if (t < p.qo_indptr[b]) b = 0;
      while (b < p.batch && t >= p.qo_indptr[b + 1]) ++b;
      const int32_t h0 = g * kHeadsPerTask;
      const int32_t nh = std::min(kHeadsPerTask, p.num_heads - h0);
      run_task(p, tables, b, t - p.qo_indptr[b], h0, nh, kblock.data(), qbuf.data(), acc.data());
    }
  });
}

}  // namespace mla_decode

// CPU implementation of absorbed MLA decode for every cache format.
//
// Work item: one (batch item, query token, group of heads). For each visible
// key the row is dequantised once into a 576-float scratch row (never the
// whole cache), then every head of the group takes its dot product, updates
// its running max / sum (online softmax) and its 512-float accumulator.
// Accumulation is fp32; the output is rounded to bf16 once at the end.
#include "decode_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../mla_decode/addressing.h"
#include "../mla_decode/formats.h"

namespace mla_decode {
namespace {

constexpr int kHeadsPerTask = 16;

// Dequantises cache row `row` into dst[0:576].
void load_row(const MlaDecodeParams& p, int64_t row, float* dst) {
  const uint8_t* base = static_cast<const uint8_t*>(p.kv) + row * p.kv_row_stride_bytes;
  switch (p.format) {
    case KvFormat::kBf16: {
      const uint16_t* v = reinterpret_cast<const uint16_t*>(base);
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = bf16_bits_to_float(v[d]);
      break;
    }
    case KvFormat::kFp8E4M3FN: {
      const float s = *p.fp8_scale;
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = e4m3fn_to_float(base[d]) * s;
      break;
    }
    case KvFormat::kFp8E4M3FNUZ: {
      const float s = *p.fp8_scale;
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = e4m3fnuz_to_float(base[d]) * s;
      break;
    }
    case KvFormat::kMxfp4: {
      const uint8_t* sc = p.mx_scale + row * p.mx_scale_stride_row;
      for (int blk = 0; blk < kMxBlocksPerRow; ++blk) {
        const float s = e8m0_to_float(sc[blk * p.mx_scale_stride_col]);
        for (int k = 0; k < kMxBlock / 2; ++k) {
          const uint8_t byte = base[blk * (kMxBlock / 2) + k];
          float* d = dst + blk * kMxBlock + 2 * k;
          d[0] = e2m1_to_float(byte & 0xF) * s;  // even element in the low nibble
          d[1] = e2m1_to_float(byte >> 4) * s;
        }
      }
      break;
    }
  }
}

void run_task(const MlaDecodeParams& p, int32_t b, int32_t qi, int32_t h0, int32_t nh, float* krow,
              float* qbuf, float* acc) {
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

  for (int32_t j = 0; j < visible; ++j) {
    const int64_t row = kv_row(p, b, j);
    // Out-of-range rows are rejected by check_index_values before we get here.
    load_row(p, row, krow);
    for (int h = 0; h < nh; ++h) {
      const float* qh = qbuf + h * kHeadDimQK;
      float s = 0.f;
      for (int d = 0; d < kHeadDimQK; ++d) s += qh[d] * krow[d];
      s *= p.sm_scale;
      float* a = acc + h * kHeadDimV;
      if (s > m[h]) {
        const float alpha = std::exp(m[h] - s);  // exp(-inf) = 0 on the first key
        l[h] *= alpha;
        for (int d = 0; d < kHeadDimV; ++d) a[d] *= alpha;
        m[h] = s;
      }
      const float w = std::exp(s - m[h]);  // NaN scores propagate into l and acc
      l[h] += w;
      for (int d = 0; d < kHeadDimV; ++d) a[d] += w * krow[d];
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
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> krow(kHeadDimQK);
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
      run_task(p, b, t - p.qo_indptr[b], h0, nh, krow.data(), qbuf.data(), acc.data());
    }
  });
}

}  // namespace mla_decode

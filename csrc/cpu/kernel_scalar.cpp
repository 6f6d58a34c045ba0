// The portable path: plain C++ that any compiler vectorises as it can.
//
// Keys are taken 32 at a time: their rows are dequantised once into fp32
// scratch rows (72 KB, never the whole cache), then every head of every group
// of the piece scores them and updates its running max / sum (online softmax,
// one rescale per block) and its 512-float accumulator. All arithmetic is fp32
// on the dequantised values (code * scale, as in docs/formats.md).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/addressing.h"
#include "common/formats.h"
#include "cpu/kernel_common.h"

namespace mla_decode {
namespace cpu {
namespace {

constexpr int kKeysPerBlock = 32;

// Every fp8 code times the tensor scale (the same fp32 product the
// per-element decode makes), and both E2M1 values of every MXFP4 byte.
struct DecodeTables {
  float fp8[256];
  float e2m1_pair[256][2];
};

void make_tables(const MlaDecodeParams& p, DecodeTables* t) {
  if (p.format == KvFormat::kFp8E4M3FN || p.format == KvFormat::kFp8E4M3FNUZ) {
    const float s = *p.fp8_scale;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      t->fp8[c] = (p.format == KvFormat::kFp8E4M3FN ? e4m3fn_to_float(code) : e4m3fnuz_to_float(code)) * s;
    }
  } else if (p.format == KvFormat::kMxfp4) {
    for (int c = 0; c < 256; ++c) {
      t->e2m1_pair[c][0] = e2m1_to_float(c & 0xF);  // even element in the low nibble
      t->e2m1_pair[c][1] = e2m1_to_float(c >> 4);
    }
  }
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

struct ScalarScratch {
  std::vector<float> kblock = std::vector<float>(kKeysPerBlock * kHeadDimQK);
  std::vector<float> qbuf = std::vector<float>(kMaxGroupsPerPiece * kGroupRows * kHeadDimQK);
  DecodeTables tables;
};

}  // namespace

void piece_scalar(const PieceArgs& a, const CallScales& s) {
  const MlaDecodeParams& p = *a.p;
  static thread_local ScalarScratch scratch;
  make_tables(p, &scratch.tables);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  for (int g = 0; g < a.ng; ++g) {
    const GroupDesc& gd = a.groups[g];
    for (int h = 0; h < kGroupRows; ++h) {
      a.m[g * kGroupRows + h] = kNegInf;
      a.l[g * kGroupRows + h] = 0.f;
    }
    std::fill(a.O + g * kOFloats, a.O + (g + 1) * kOFloats, 0.f);
    for (int h = 0; h < gd.nh; ++h) {
      const uint16_t* qh = qbase + static_cast<int64_t>(gd.q_row) * p.q_stride_token +
                           static_cast<int64_t>(gd.h0 + h) * p.q_stride_head;
      float* dst = scratch.qbuf.data() + (g * kGroupRows + h) * kHeadDimQK;
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = bf16_bits_to_float(qh[d]);
    }
  }
  const int32_t key_end = std::min(a.key_end, a.groups[a.ng - 1].visible);
  float score[kKeysPerBlock];
  for (int32_t j0 = a.key_begin; j0 < key_end; j0 += kKeysPerBlock) {
    const int nk = std::min<int32_t>(kKeysPerBlock, key_end - j0);
    // Out-of-range rows are rejected by check_index_values before we get here.
    for (int k = 0; k < nk; ++k) {
      load_row(p, scratch.tables, kv_row(p, a.b, j0 + k), scratch.kblock.data() + k * kHeadDimQK);
    }
    for (int g = 0; g < a.ng; ++g) {
      const GroupDesc& gd = a.groups[g];
      const int nkg = std::min<int32_t>(nk, gd.visible - j0);  // this token's keys in the block
      if (nkg <= 0) continue;
      for (int h = 0; h < gd.nh; ++h) {
        const int r = g * kGroupRows + h;
        const float* qh = scratch.qbuf.data() + r * kHeadDimQK;
        float block_max = kNegInf;
        for (int k = 0; k < nkg; ++k) {
          score[k] = dot576(qh, scratch.kblock.data() + k * kHeadDimQK) * s.qk;
          block_max = std::max(block_max, score[k]);  // a NaN score is skipped here, and poisons l below
        }
        const float m_new = std::max(a.m[r], block_max);
        float* acc = a.O + static_cast<int64_t>(r) * kORow;
        if (m_new > a.m[r]) {
          const float alpha = std::exp(a.m[r] - m_new);  // exp(-inf) = 0 on the first block
          a.l[r] *= alpha;
          for (int d = 0; d < kHeadDimV; ++d) acc[d] *= alpha;
          a.m[r] = m_new;
        }
        for (int k = 0; k < nkg; ++k) {
          const float w = std::exp(score[k] - a.m[r]);  // NaN scores propagate into l and acc
          a.l[r] += w;
          const float* v = scratch.kblock.data() + k * kHeadDimQK;
          for (int d = 0; d < kHeadDimV; ++d) acc[d] += w * v[d];
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace mla_decode

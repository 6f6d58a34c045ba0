// The portable path: plain C++ on a four-lane float type (GCC / clang vector
// extensions, which become SSE2 on a baseline x86-64 build and NEON on
// AArch64; a plain struct elsewhere), no intrinsics.
//
// Keys are taken 32 at a time: their rows are dequantised once into fp32
// scratch rows (72 KB, never the whole cache). Per group of the piece:
//   QK  the rows of heads as the lanes (Qt: the group's queries as fp32
//       [dim][16 rows], rows past the group's heads zero), register blocks of
//       8 / (R / 4) keys x R rows (R: the heads rounded up to 4, 8 or 16), one
//       pass over the 576 dims with each key value broadcast against Qt's
//       row vectors; a group of 1 or 2 heads instead runs each head's dot
//       products over the dims (4 keys x 8 dims a step), where rows as lanes
//       would compute 4 rows for 1 or 2;
//   softmax, online, one rescale per block where a row's max grows;
//   PV  register blocks of 4 rows x 8 dims of O (then single rows x 32 dims
//       for the heads past a multiple of 4), over the block's keys with each
//       probability broadcast against a row of V.
// Eight accumulators per block: with the operands, 16 vector registers (SSE2).
// All arithmetic is fp32 on the dequantised values (code * scale, as in
// docs/formats.md).
#include <algorithm>
#include <cmath>
#include <cstring>
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

// Four fp32 lanes: GCC / clang vector extensions (SSE2, NEON, VSX, ...), or a
// plain struct that any compiler handles lane by lane (also where
// MLA_CPU_PLAIN_V4 is defined: a test build, tests/test_cpu_tools.py).
#if (defined(__GNUC__) || defined(__clang__)) && !defined(MLA_CPU_PLAIN_V4)
typedef float V4 __attribute__((vector_size(16)));
inline V4 splat(float x) { return V4{x, x, x, x}; }
#else
struct V4 {
  float e[4];
  V4& operator+=(const V4& o) {
    for (int i = 0; i < 4; ++i) e[i] += o.e[i];
    return *this;
  }
  friend V4 operator*(const V4& a, const V4& b) {
    V4 r;
    for (int i = 0; i < 4; ++i) r.e[i] = a.e[i] * b.e[i];
    return r;
  }
  friend V4 operator+(V4 a, const V4& b) { return a += b; }
};
inline V4 splat(float x) { return V4{{x, x, x, x}}; }
#endif
inline V4 load4(const float* p) {
  V4 v;
  memcpy(&v, p, sizeof(v));
  return v;
}
inline void store4(float* p, const V4& v) { memcpy(p, &v, sizeof(v)); }
inline float lane_sum(const V4& v) {
  float e[4];
  memcpy(e, &v, sizeof(e));
  return (e[0] + e[1]) + (e[2] + e[3]);
}

constexpr int kAccumulators = 8;  // V4 accumulators of a register block (16 vector registers on SSE2)
constexpr int kFewRows = 2;       // groups of at most this many heads take QK by dims (qk_by_dims)

struct ScalarScratch {
  std::vector<float> kblock = std::vector<float>(kKeysPerBlock * kHeadDimQK);
  std::vector<float> qt = std::vector<float>(kMaxGroupsPerPiece * kHeadDimQK * kGroupRows);  // per group [d][row]
  std::vector<float> qrow = std::vector<float>(kMaxGroupsPerPiece * kFewRows * kHeadDimQK);  // [row][d], few rows
  float p[kKeysPerBlock * kGroupRows];  // [key][row]: the block's logits, then probabilities
  DecodeTables tables;
};

// p[k][r] = qk * dot(K[k], Q[r]) for keys k < nk of the block (kb: their
// dequantised rows) and rows r < R (qt: the group's Qt), in blocks of
// kAccumulators / (R / 4) keys x R rows.
template <int R>
void qk_block(const float* kb, int nk, const float* qt, float qk, float* p) {
  constexpr int kVecs = R / 4;
  constexpr int kKeys = kAccumulators / kVecs;
  static_assert(kKeysPerBlock % kKeys == 0, "QK blocks");
  for (int k0 = 0; k0 < nk; k0 += kKeys) {
    V4 acc[kKeys][kVecs];
    for (int kk = 0; kk < kKeys; ++kk) {
      for (int v = 0; v < kVecs; ++v) acc[kk][v] = splat(0.f);
    }
    const float* k_rows = kb + k0 * kHeadDimQK;  // rows past nk (stale or zero) are never stored
    for (int d = 0; d < kHeadDimQK; ++d) {
      V4 q[kVecs];
      for (int v = 0; v < kVecs; ++v) q[v] = load4(qt + d * kGroupRows + 4 * v);
      for (int kk = 0; kk < kKeys; ++kk) {
        const V4 kv = splat(k_rows[kk * kHeadDimQK + d]);
        for (int v = 0; v < kVecs; ++v) acc[kk][v] += kv * q[v];
      }
    }
    const V4 scale = splat(qk);
    for (int kk = 0; kk < kKeys && k0 + kk < nk; ++kk) {
      for (int v = 0; v < kVecs; ++v) store4(p + (k0 + kk) * kGroupRows + 4 * v, acc[kk][v] * scale);
    }
  }
}

// A group of at most kFewRows heads: p[k][r] = qk * dot(K[k], Q[r]) for keys
// k < nk and rows r < nh (q: the rows [row][576]), vectorised over the dims
// (where lanes = rows would compute 4 rows for 1 or 2): blocks of 4 keys x 2
// V4 partial sums, Q's dims loaded once per block.
void qk_by_dims(const float* kb, int nk, const float* q, int nh, float qk, float* p) {
  for (int r = 0; r < nh; ++r) {
    const float* qr = q + r * kHeadDimQK;
    for (int k0 = 0; k0 < nk; k0 += 4) {
      V4 acc[4][2];
      for (int kk = 0; kk < 4; ++kk) acc[kk][0] = acc[kk][1] = splat(0.f);
      for (int d = 0; d < kHeadDimQK; d += 8) {
        const V4 q0 = load4(qr + d), q1 = load4(qr + d + 4);
        for (int kk = 0; kk < 4; ++kk) {
          acc[kk][0] += load4(kb + (k0 + kk) * kHeadDimQK + d) * q0;
          acc[kk][1] += load4(kb + (k0 + kk) * kHeadDimQK + d + 4) * q1;
        }
      }
      for (int kk = 0; kk < 4 && k0 + kk < nk; ++kk) {
        p[(k0 + kk) * kGroupRows + r] = lane_sum(acc[kk][0] + acc[kk][1]) * qk;
      }
    }
  }
}

// Rows [r0, r0 + PR) of O (kORow apart) = alpha[r] O[r] + sum over keys
// k < nk of p[k][r] V[k] (kb: the keys' dequantised rows, V their first 512
// values), in blocks of PR rows x 4 kAccumulators / PR dims.
template <int PR>
void pv_rows(const float* kb, int nk, const float* p, const float* alpha, int r0, float* O) {
  constexpr int kVecs = kAccumulators / PR;
  static_assert(kHeadDimV % (4 * kVecs) == 0, "PV blocks");
  for (int d0 = 0; d0 < kHeadDimV; d0 += 4 * kVecs) {
    V4 acc[PR][kVecs];
    for (int i = 0; i < PR; ++i) {
      const V4 a = splat(alpha[r0 + i]);
      for (int v = 0; v < kVecs; ++v) acc[i][v] = load4(O + (r0 + i) * kORow + d0 + 4 * v) * a;
    }
    for (int k = 0; k < nk; ++k) {
      V4 vk[kVecs];
      for (int v = 0; v < kVecs; ++v) vk[v] = load4(kb + k * kHeadDimQK + d0 + 4 * v);
      for (int i = 0; i < PR; ++i) {
        const V4 w = splat(p[k * kGroupRows + r0 + i]);
        for (int v = 0; v < kVecs; ++v) acc[i][v] += w * vk[v];
      }
    }
    for (int i = 0; i < PR; ++i) {
      for (int v = 0; v < kVecs; ++v) store4(O + (r0 + i) * kORow + d0 + 4 * v, acc[i][v]);
    }
  }
}

// Rows [0, rows) of O: blocks of four rows, then one at a time.
void pv_block(const float* kb, int nk, const float* p, const float* alpha, int rows, float* O) {
  int r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) pv_rows<4>(kb, nk, p, alpha, r0, O);
  for (; r0 < rows; ++r0) pv_rows<1>(kb, nk, p, alpha, r0, O);
}

}  // namespace

void piece_scalar(const PieceArgs& a, const CallScales& s) {
  const MlaDecodeParams& p = *a.p;
  static thread_local ScalarScratch scratch;
  make_tables(p, &scratch.tables);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  for (int g = 0; g < a.ng; ++g) {
    const GroupDesc& gd = a.groups[g];
    std::fill(a.m + g * kGroupRows, a.m + (g + 1) * kGroupRows, kNegInf);
    std::fill(a.l + g * kGroupRows, a.l + (g + 1) * kGroupRows, 0.f);
    std::fill(a.O + g * kOFloats, a.O + (g + 1) * kOFloats, 0.f);
    // The group's queries in the layout its QK reads: [row][d] for a few
    // rows (qk_by_dims), else Qt [d][16 rows] with the rows past nh zero.
    const bool few = gd.nh <= kFewRows;
    float* qt = scratch.qt.data() + g * (kHeadDimQK * kGroupRows);
    float* qrow = scratch.qrow.data() + g * (kFewRows * kHeadDimQK);
    if (!few) std::fill(qt, qt + kHeadDimQK * kGroupRows, 0.f);
    for (int h = 0; h < gd.nh; ++h) {
      const uint16_t* qh = qbase + static_cast<int64_t>(gd.q_row) * p.q_stride_token +
                           static_cast<int64_t>(gd.h0 + h) * p.q_stride_head;
      for (int d = 0; d < kHeadDimQK; ++d) {
        const float v = bf16_bits_to_float(qh[d]);
        if (few) qrow[h * kHeadDimQK + d] = v;
        else qt[d * kGroupRows + h] = v;
      }
    }
  }
  const int32_t key_end = std::min(a.key_end, a.groups[a.ng - 1].visible);
  float* pr = scratch.p;
  for (int32_t j0 = a.key_begin; j0 < key_end; j0 += kKeysPerBlock) {
    const int nk = std::min<int32_t>(kKeysPerBlock, key_end - j0);
    // Out-of-range rows are rejected by check_index_values before we get here.
    for (int k = 0; k < nk; ++k) {
      load_row(p, scratch.tables, kv_row(p, a.b, j0 + k), scratch.kblock.data() + k * kHeadDimQK);
    }
    const float* kb = scratch.kblock.data();
    for (int g = 0; g < a.ng; ++g) {
      const GroupDesc& gd = a.groups[g];
      const int nkg = std::min<int32_t>(nk, gd.visible - j0);  // this token's keys in the block
      if (nkg <= 0) continue;
      const float* qt = scratch.qt.data() + g * (kHeadDimQK * kGroupRows);
      // Logits of the group's rows (qk_block also of the zero rows up to R,
      // which nothing below reads).
      if (gd.nh <= kFewRows) {
        qk_by_dims(kb, nkg, scratch.qrow.data() + g * (kFewRows * kHeadDimQK), gd.nh, s.qk, pr);
      } else if (gd.nh <= 4) {
        qk_block<4>(kb, nkg, qt, s.qk, pr);
      } else if (gd.nh <= 8) {
        qk_block<8>(kb, nkg, qt, s.qk, pr);
      } else {
        qk_block<16>(kb, nkg, qt, s.qk, pr);
      }
      float* m = a.m + g * kGroupRows;
      float* l = a.l + g * kGroupRows;
      float alpha[kGroupRows];
      for (int r = 0; r < gd.nh; ++r) {
        float block_max = kNegInf;
        for (int k = 0; k < nkg; ++k) block_max = std::max(block_max, pr[k * kGroupRows + r]);  // skips a NaN logit
        alpha[r] = 1.f;
        if (block_max > m[r]) {
          alpha[r] = std::exp(m[r] - block_max);  // exp(-inf) = 0 on the row's first block
          l[r] *= alpha[r];
          m[r] = block_max;
        }
        for (int k = 0; k < nkg; ++k) {
          const float w = std::exp(pr[k * kGroupRows + r] - m[r]);  // a NaN logit poisons l and O
          pr[k * kGroupRows + r] = w;
          l[r] += w;
        }
      }
      pv_block(kb, nkg, pr, alpha, gd.nh, a.O + static_cast<int64_t>(g) * kOFloats);
    }
  }
}

}  // namespace cpu
}  // namespace mla_decode

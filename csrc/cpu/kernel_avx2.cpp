// The AVX2 + FMA path, for x86-64 CPUs without AVX-512 BF16: fp32 products
// (8 lanes, 16 registers), fp32 accumulation. Tiles of 64 keys (Kf 147 KB,
// in L2; the PV blocks run 64 keys between their loads and stores of O).
//   Qtf  once per piece and group: the 16 query rows transposed, [d][16] fp32.
//   Kf   each tile: its keys decoded in registers to fp32 (fp8 codes without
//        the tensor scale, which is folded into the logit and output scales;
//        MXFP4 as E2M1 value x 2^(e-127), the fp32 product of formats.h),
//        row-major [key][576]. V is its first 512 columns.
//   QK   lanes are rows: blocks of up to 6 keys x 16 rows (12 accumulators),
//        each dim one pair of Qtf vectors times the key's value broadcast.
//   PV   lanes are dims: blocks of up to 6 rows x 16 dims (12 accumulators),
//        each key two Kf vectors times each row's probability broadcast from S.
//   (Blocks of near-equal size: 64 keys 6 x 9 and 5 x 2; 16 rows 6, 5, 5.)
// Softmax as in vec_avx512.h: online in the log2 domain, lazy rescale.
#include "cpu/kernel_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <type_traits>

#include "common/addressing.h"
#include "common/formats.h"

#define MLA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))

namespace mla_decode {
namespace cpu {
namespace {

constexpr int kTile = 64;

struct alignas(64) Avx2Scratch {
  float qt[kMaxGroupsPerPiece * kHeadDimQK * 16];
  float kf[kTile * kHeadDimQK];
  float s[kTile * 16];
  float m2[kMaxGroupsPerPiece * 16];
};

// 2^x for x <= ~9 (relative error ~2e-7); below -126 gives 0; NaN stays NaN.
MLA_TARGET_AVX2 static inline __m256 exp2_ps(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-126.f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-126.f), x);  // second operand returned for NaN
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 y = _mm256_set1_ps(1.5403530393381608e-4f);
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.3333558146428443e-3f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(9.6181291076284772e-3f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.5504108664821580e-2f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.4022650695910071e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(6.9314718055994531e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.f));
  // 2^n for n in [-126, 9] from the exponent bits (NaN lanes give garbage bits,
  // replaced below by y, which is NaN there).
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  r = _mm256_blendv_ps(r, y, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_andnot_ps(tiny, r);
}

// 16 fp8 codes to fp32 (without the tensor scale), through f16: the code's
// sign at f16 bit 15 and its exponent and mantissa (bits 0-6) at bits 7-13
// make the f16 of the code's value times 2^-8 (e4m3fn, bias 7 against f16's
// 15; 2^-7 for e4m3fnuz, bias 8), subnormals included, exactly; F16C widens
// it and one multiply restores the power of two. The NaN codes (e4m3fn: |c| =
// 0x7F; e4m3fnuz: 0x80) become an f16 NaN first.
template <bool kFnuz>
MLA_TARGET_AVX2 static inline void decode_fp8_16(const uint8_t* src, float* dst) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  const __m256i h = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(w, 8), _mm256_set1_epi16(static_cast<short>(0x8000))),
                                    _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(0x3F80)));
  const __m256i nan = kFnuz ? _mm256_cmpeq_epi16(w, _mm256_set1_epi16(0x80))
                            : _mm256_cmpeq_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
  const __m256i hn = _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00), nan);
  const __m256 pow2 = _mm256_set1_ps(kFnuz ? 128.f : 256.f);
  _mm256_store_ps(dst, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(hn)), pow2));
  _mm256_store_ps(dst + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(hn, 1)), pow2));
}

// 8 E2M1 values (4 bytes, even element in the low nibble) times `scale`.
MLA_TARGET_AVX2 static inline __m256 decode_e2m1_8(const uint8_t* src, __m256 scale) {
  uint32_t raw;
  memcpy(&raw, src, 4);
  const __m256i nib = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(raw)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(0xF));
  const __m256 mag = _mm256_permutevar8x32_ps(_mm256_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f), nib);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
  return _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), scale);
}

MLA_TARGET_AVX2 static inline void decode_row(const MlaDecodeParams& p, int64_t row, float* dst) {
  const uint8_t* src = static_cast<const uint8_t*>(p.kv) + row * p.kv_row_stride_bytes;
  switch (p.format) {
    case KvFormat::kBf16:
      for (int d = 0; d < kHeadDimQK; d += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * d)));
        _mm256_store_ps(dst + d, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
      break;
    case KvFormat::kFp8E4M3FN:
      for (int d = 0; d < kHeadDimQK; d += 16) decode_fp8_16<false>(src + d, dst + d);
      break;
    case KvFormat::kFp8E4M3FNUZ:
      for (int d = 0; d < kHeadDimQK; d += 16) decode_fp8_16<true>(src + d, dst + d);
      break;
    case KvFormat::kMxfp4: {
      const uint8_t* sc = p.mx_scale + row * p.mx_scale_stride_row;
      for (int blk = 0; blk < kMxBlocksPerRow; ++blk) {
        const __m256 s = _mm256_set1_ps(e8m0_to_float(sc[blk * p.mx_scale_stride_col]));
        for (int k = 0; k < 4; ++k) {
          _mm256_store_ps(dst + 32 * blk + 8 * k, decode_e2m1_8(src + 16 * blk + 4 * k, s));
        }
      }
      break;
    }
  }
}

// Qtf of one group (rows >= nh are zero): 8 rows x 8 dims at a time, widened
// to fp32 and transposed in registers.
MLA_TARGET_AVX2 static void build_qt(const MlaDecodeParams& p, const GroupDesc& gd, float* qt) {
  alignas(32) static const uint16_t kZeroRow[kHeadDimQK] = {};
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  const uint16_t* rows[16];
  for (int r = 0; r < 16; ++r) {
    rows[r] = r < gd.nh ? qbase + static_cast<int64_t>(gd.q_row) * p.q_stride_token +
                              static_cast<int64_t>(gd.h0 + r) * p.q_stride_head
                        : kZeroRow;
  }
  for (int h = 0; h < 2; ++h) {
    for (int d0 = 0; d0 < kHeadDimQK; d0 += 8) {
      __m256 v[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[8 * h + i] + d0)));
        v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      }
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      // u[j] (j < 4): dim d0 + j of rows 0-3 (low half) and, from u[4 + j], rows 4-7
      for (int j = 0; j < 4; ++j) {
        _mm256_store_ps(qt + (d0 + j) * 16 + 8 * h, _mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
        _mm256_store_ps(qt + (d0 + 4 + j) * 16 + 8 * h, _mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
      }
    }
  }
}

// S rows k0 .. k0 + NK - 1: NK keys x 16 rows, 2 NK accumulators; each dim
// two Qtf vectors times each key's value broadcast.
template <int NK>
MLA_TARGET_AVX2 static inline void qk_block(const float* qt, const float* kr, float* s) {
  __m256 acc[NK][2];
#pragma GCC unroll 6
  for (int k = 0; k < NK; ++k) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
  for (int d = 0; d < kHeadDimQK; ++d) {
    const __m256 q0 = _mm256_load_ps(qt + 16 * d), q1 = _mm256_load_ps(qt + 16 * d + 8);
#pragma GCC unroll 6
    for (int k = 0; k < NK; ++k) {
      const __m256 b = _mm256_broadcast_ss(kr + k * kHeadDimQK + d);
      acc[k][0] = _mm256_fmadd_ps(q0, b, acc[k][0]);
      acc[k][1] = _mm256_fmadd_ps(q1, b, acc[k][1]);
    }
  }
#pragma GCC unroll 6
  for (int k = 0; k < NK; ++k) {
    _mm256_store_ps(s + 16 * k, acc[k][0]);
    _mm256_store_ps(s + 16 * k + 8, acc[k][1]);
  }
}

// Calls f(std::integral_constant<int, size>(), first) for n items cut into
// ceil(n / 6) blocks of near-equal size (16 -> 6, 5, 5; 32 -> 6, 6, 5, 5, 5, 5):
// 6 items are 12 accumulators of the 16 registers, and no block drops to the
// few accumulators that would leave the FMA latency exposed.
template <class F>
MLA_TARGET_AVX2 static inline void for_blocks_of_6(int n, F&& f) {
  const int nb = (n + 5) / 6;
  int first = 0;
  for (int i = 0; i < nb; ++i) {
    const int size = n / nb + (i < n % nb ? 1 : 0);
    switch (size) {
      case 6: f(std::integral_constant<int, 6>(), first); break;
      case 5: f(std::integral_constant<int, 5>(), first); break;
      case 4: f(std::integral_constant<int, 4>(), first); break;
      case 3: f(std::integral_constant<int, 3>(), first); break;
      case 2: f(std::integral_constant<int, 2>(), first); break;
      default: f(std::integral_constant<int, 1>(), first); break;
    }
    first += size;
  }
}

// S[k][0:16] for keys k < nk.
MLA_TARGET_AVX2 static void qk(const float* qt, const float* kf, int nk, float* s) {
  for_blocks_of_6(nk, [&](auto nkb, int k0) { qk_block<decltype(nkb)::value>(qt, kf + k0 * kHeadDimQK, s + 16 * k0); });
}

// Softmax step (see vec_avx512.h softmax_update); leaves p in S (0 beyond nk).
MLA_TARGET_AVX2 static void softmax(int nk, float logit_scale_log2, float* s, float* m2, float* l, float* O,
                                    bool first) {
  const __m256 scale = _mm256_set1_ps(logit_scale_log2);
  for (int half = 0; half < 2; ++half) {
    __m256 bm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int k = 0; k < nk; ++k) {
      const __m256 x = _mm256_mul_ps(_mm256_load_ps(s + 16 * k + 8 * half), scale);
      _mm256_store_ps(s + 16 * k + 8 * half, x);
      bm = _mm256_max_ps(bm, x);
    }
    __m256 m = _mm256_loadu_ps(m2 + 8 * half);
    __m256 lsum = _mm256_loadu_ps(l + 8 * half);
    const __m256 move = _mm256_cmp_ps(bm, _mm256_add_ps(m, _mm256_set1_ps(kLazyRescale)), _CMP_GT_OQ);
    const int move_bits = _mm256_movemask_ps(move);
    if (move_bits) {
      const __m256 m_new = _mm256_blendv_ps(m, bm, move);
      const __m256 alpha = exp2_ps(_mm256_sub_ps(m, m_new));
      lsum = _mm256_mul_ps(lsum, alpha);
      alignas(32) float al[8];
      _mm256_store_ps(al, alpha);
      for (int r = 0; r < 8 && !first; ++r) {
        if (!((move_bits >> r) & 1)) continue;
        const __m256 ar = _mm256_set1_ps(al[r]);
        float* o = O + (8 * half + r) * kORow;
        for (int d = 0; d < kHeadDimV; d += 8) _mm256_store_ps(o + d, _mm256_mul_ps(_mm256_load_ps(o + d), ar));
      }
      m = m_new;
      _mm256_storeu_ps(m2 + 8 * half, m);
    }
    for (int k = 0; k < nk; ++k) {
      const __m256 pk = exp2_ps(_mm256_sub_ps(_mm256_load_ps(s + 16 * k + 8 * half), m));
      lsum = _mm256_add_ps(lsum, pk);
      _mm256_store_ps(s + 16 * k + 8 * half, pk);
    }
    _mm256_storeu_ps(l + 8 * half, lsum);
  }
}

// O rows r0 .. r0 + NR - 1, dims d0 .. d0 + 15 += P V over nk keys: 2 NR
// accumulators; each key two Kf vectors times each row's probability.
template <int NR>
MLA_TARGET_AVX2 static inline void pv_block(const float* pk, const float* kf, int nk, int r0, int d0, float* O,
                                            bool first) {
  __m256 acc[NR][2];
#pragma GCC unroll 6
  for (int r = 0; r < NR; ++r) {
    acc[r][0] = first ? _mm256_setzero_ps() : _mm256_load_ps(O + (r0 + r) * kORow + d0);
    acc[r][1] = first ? _mm256_setzero_ps() : _mm256_load_ps(O + (r0 + r) * kORow + d0 + 8);
  }
  for (int k = 0; k < nk; ++k) {
    const __m256 v0 = _mm256_load_ps(kf + k * kHeadDimQK + d0), v1 = _mm256_load_ps(kf + k * kHeadDimQK + d0 + 8);
#pragma GCC unroll 6
    for (int r = 0; r < NR; ++r) {
      const __m256 b = _mm256_broadcast_ss(pk + 16 * k + r0 + r);
      acc[r][0] = _mm256_fmadd_ps(v0, b, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(v1, b, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < NR; ++r) {
    _mm256_store_ps(O + (r0 + r) * kORow + d0, acc[r][0]);
    _mm256_store_ps(O + (r0 + r) * kORow + d0 + 8, acc[r][1]);
  }
}

// O rows < nh (written, not accumulated, where first).
MLA_TARGET_AVX2 static void pv(const float* pk, const float* kf, int nk, int nh, float* O, bool first) {
  for (int d0 = 0; d0 < kHeadDimV; d0 += 16) {
    for_blocks_of_6(nh, [&](auto nr, int r0) { pv_block<decltype(nr)::value>(pk, kf, nk, r0, d0, O, first); });
  }
}

MLA_TARGET_AVX2 static void run_piece(const PieceArgs& a, const CallScales& cs) {
  const MlaDecodeParams& p = *a.p;
  Avx2Scratch& sc = thread_scratch<Avx2Scratch>();
  begin_piece_state(a, sc.m2);
  const int32_t key_end = std::min(a.key_end, a.groups[a.ng - 1].visible);
  if (key_end > a.key_begin) {
    for (int g = 0; g < a.ng; ++g) build_qt(p, a.groups[g], sc.qt + g * kHeadDimQK * 16);
    const float logit_scale_log2 = cs.qk * kLog2e;
    for (int32_t j0 = a.key_begin; j0 < key_end; j0 += kTile) {
      const int nv = std::min<int32_t>(kTile, key_end - j0);
      for (int k = 0; k < nv; ++k) decode_row(p, kv_row(p, a.b, j0 + k), sc.kf + k * kHeadDimQK);
      for (int g = a.ng - 1; g >= 0; --g) {
        const int nk = std::min<int32_t>(nv, a.groups[g].visible - j0);
        if (nk <= 0) break;
        float* O = a.O + static_cast<int64_t>(g) * kOFloats;
        qk(sc.qt + g * kHeadDimQK * 16, sc.kf, nk, sc.s);
        const bool first = j0 == a.key_begin;  // O is written, not accumulated
        softmax(nk, logit_scale_log2, sc.s, sc.m2 + g * 16, a.l + g * 16, O, first);
        pv(sc.s, sc.kf, nk, a.groups[g].nh, O, first);
      }
    }
  }
  end_piece_state(a, sc.m2);
}

}  // namespace

void piece_avx2(const PieceArgs& a, const CallScales& s) { run_piece(a, s); }

}  // namespace cpu
}  // namespace mla_decode

#else  // not x86-64 with GCC / clang

#include <c10/util/Exception.h>

namespace mla_decode {
namespace cpu {
void piece_avx2(const PieceArgs&, const CallScales&) {
  TORCH_CHECK(false, "mla_decode: the AVX2 CPU path is not part of this build.");
}
}  // namespace cpu
}  // namespace mla_decode

#endif

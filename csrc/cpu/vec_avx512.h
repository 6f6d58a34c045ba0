// The AVX-512 half of the AVX-512 and AMX paths (included by kernel_avx512.cpp
// and kernel_amx.cpp, each compiled with per-function target attributes, so
// the build needs no global -m flags).
//
// Data flow of one piece (kernel_common.h), tiles of 64 keys (AVX-512; the
// AMX path, kernel_amx.cpp, runs its own loop over 128-key tiles on the same
// helpers and layouts), decoded and scored 16 keys at a time:
//   Qt   once per piece and group: the group's 16 query rows as bf16 pairs,
//        transposed to [chunk c < 18][pair k < 16][row r < 16] dwords, i.e.
//        dword (q[r][32c+2k], q[r][32c+2k+1]). This is the B operand of the
//        AMX QK product, and the 16-row vectors the AVX-512 QK multiplies.
//   Kb   each sub-tile of 16 keys: its keys decoded in registers to bf16
//        (exact: every fp8 and E2M1 value is a bf16 value; the E8M0 scale is
//        an exponent add), row-major [key][576], one buffer that every
//        sub-tile reuses (so its lines stay in L1): the AMX QK A operand, the
//        AVX-512 broadcasts.
//        The cache lines of the sub-tile 32 keys ahead are prefetched into L1
//        during the QK of the current one (spread over its loop).
//   Vv   the same registers, keys interleaved in pairs: [pair i][d < 512 (+16 pad)]
//        dwords (V[2i][d], V[2i+1][d]): the AMX PV B operand ("VNNI" layout)
//        and the vectors of the AVX-512 PV.
//   S    per group: logits transposed, [key][16 rows] fp32 (what an AMX tile
//        with keys as rows gives; one vector holds the 16 rows of one key).
//   P    per group: exp2 of the logits in fp32, summed into l in fp32, then
//        bf16 pairs of keys: Yt [pair i][row r] (AVX-512 PV broadcasts),
//        transposed to Pa [row r][pair i] by the AMX path (its PV A operand).
//   O    per group: [16 rows][512 (+16 pad)] fp32, accumulated over the piece.
// Softmax is online in the log2 domain with a lazy rescale: a row's reference
// max moves only when a tile's max exceeds it by more than kLazyRescale (2^8),
// so probabilities stay <= 256 and O is rescaled rarely (exact all the same:
// out = O / l and lse = m + log l hold for any reference m).
// Only the fp8 tensor scale stays out of the decoded values: it is folded
// into the logit scale and into the output (CallScales).
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/addressing.h"
#include "common/formats.h"
#include "cpu/kernel_common.h"

// AVX512F: every helper without bf16 instructions (also run by avx512_fp32
// on CPUs without AVX-512 BF16); AVX512: the bf16 users.
#define MLA_TARGET_AVX512F __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi2")))
#define MLA_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2")))
#define MLA_TARGET_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2,amx-tile,amx-bf16")))

namespace mla_decode {
namespace cpu {
namespace vec {

// MLA_CPU_PROFILE (a measurement build only, e.g. CFLAGS=-DMLA_CPU_PROFILE):
// time-stamp-counter totals per phase of run_piece, printed at exit.
#ifdef MLA_CPU_PROFILE
enum Phase { kDecode, kQk, kSoftmax, kPv, kPhases };  // AMX: softmax includes the Pa transpose
inline uint64_t g_phase_ticks[2][kPhases];  // [AMX?][phase]; racy sums, good enough for a profile
#define MLA_PROFILE_START() uint64_t mla_t0_ = __rdtsc()
#define MLA_PROFILE_LAP(amx, phase)                                   \
  do {                                                                \
    const uint64_t t1_ = __rdtsc();                                   \
    g_phase_ticks[amx][phase] += t1_ - mla_t0_;                       \
    mla_t0_ = t1_;                                                    \
  } while (0)
#else
#define MLA_PROFILE_START() (void)0
#define MLA_PROFILE_LAP(amx, phase) (void)0
#endif

constexpr int kMaxTileKeys = 128;  // the largest tile of a path (AMX)
constexpr int kSubTile = 16;       // keys decoded (and scored) together
constexpr int kChunks = kHeadDimQK / 32;         // 18 chunks of 32 dims (one MX block each)
constexpr int kRowDwords = kHeadDimQK / 2;       // 288 bf16 pairs per key row
constexpr int kQtDwords = kChunks * 16 * 16;     // one group's Qt
constexpr int kVvRow = kHeadDimV + 16;           // dwords between key pairs of Vv (padded as kORow)

constexpr int kPaRow = kMaxTileKeys / 2;        // dwords between rows of Pa (AMX)

// Per-thread buffers of an AVX-512 piece (64-byte aligned; about 370 KB).
struct alignas(64) Scratch {
  uint32_t qt[kMaxGroupsPerPiece * kQtDwords];
  uint32_t kb[kSubTile * kRowDwords];  // the current sub-tile's keys (the same lines for every sub-tile)
  uint32_t vv[kMaxTileKeys / 2 * kVvRow];
  float s[kMaxGroupsPerPiece * kMaxTileKeys * 16];  // per group: [key][16 rows]
  uint32_t yt[kMaxTileKeys / 2 * 16];
  float m2[kMaxGroupsPerPiece * 16];  // reference max per row, log2 units
  const char* pf[kSubTile * 20];      // cache lines to prefetch during one sub-tile's QK
  const uint32_t* kq;                 // the sub-tile's 16 key rows for QK (kRowDwords apart): in Kb,
                                      // or the bf16 cache rows themselves
};

// ---- exp2 ------------------------------------------------------------------
// 2^x for x <= ~9: x = n + f with |f| <= 1/2, 2^f by a degree-6 polynomial
// (relative error ~2e-7), times 2^n by vscalefps. x below -200 gives 0; NaN stays NaN.
MLA_TARGET_AVX512F static inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-200.f), x);  // second operand returned for NaN
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 y = _mm512_set1_ps(1.5403530393381608e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558146428443e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076284772e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108664821580e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650695910071e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718055994531e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}

// ---- decoding one 32-element chunk of a cache row to 32 bf16 ---------------

// e4m3 (bias 7, fn) or e4m3fnuz (bias 8): normal codes by moving the bits into
// place and adding the exponent offset, subnormals from an 8-entry table, NaN
// codes to the bf16 quiet NaN.
template <bool kFnuz>
MLA_TARGET_AVX512F static inline __m512i decode_fp8_chunk(const uint8_t* src) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7F));
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8);
  const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16((kFnuz ? 119 : 120) << 7));
  // m * 2^-9 (fn) or m * 2^-10 (fnuz) for m = 0..7, as bf16 bits.
  const __m512i sub_table =
      kFnuz ? _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x3BE0, 0x3BC0,
                               0x3BA0, 0x3B80, 0x3B40, 0x3B00, 0x3A80, 0)
            : _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x3C60, 0x3C40,
                               0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0);
  const __mmask32 is_sub = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
  __m512i v = _mm512_mask_blend_epi16(is_sub, normal, _mm512_permutexvar_epi16(mag, sub_table));
  v = _mm512_or_si512(v, sign);
  const __mmask32 is_nan = kFnuz ? _mm512_cmpeq_epi16_mask(w, _mm512_set1_epi16(0x80))
                                 : _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F));
  return _mm512_mask_mov_epi16(v, is_nan, _mm512_set1_epi16(0x7FC0));
}

// One MX block: 16 bytes of E2M1 pairs (even element in the low nibble) and
// its E8M0 byte. The nibbles become bf16 by a 16-entry word permute; the
// scale 2^(e-127) is added to the exponent field of every non-zero value,
// exact while the result stays a normal bf16 (2 <= e <= 252); other blocks
// (never produced by the quantiser for finite data) take the fp32 product of
// formats.h rounded to bf16 (e = 255 gives NaN).
MLA_TARGET_AVX512F static inline __m512i decode_mxfp4_chunk(const uint8_t* src, uint8_t e) {
  if (e < 2 || e > 252) {
    alignas(64) uint16_t out[32];
    const float s = e8m0_to_float(e);
    for (int k = 0; k < 16; ++k) {
      for (int half = 0; half < 2; ++half) {
        const float f = e2m1_to_float(half ? src[k] >> 4 : src[k] & 0xF) * s;
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t h;
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
          h = 0x7FC0;
        } else {
          h = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        }
        out[2 * k + half] = h;
      }
    }
    return _mm512_load_si512(out);
  }
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  // word 2k = low nibble of byte k, word 2k+1 = its high nibble
  const __m512i nib = _mm512_or_si512(_mm512_and_si512(d, _mm512_set1_epi32(0xF)),
                                      _mm512_slli_epi32(_mm512_and_si512(d, _mm512_set1_epi32(0xF0)), 12));
  const __m512i table = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         static_cast<short>(0xC0C0), static_cast<short>(0xC080),
                                         static_cast<short>(0xC040), static_cast<short>(0xC000),
                                         static_cast<short>(0xBFC0), static_cast<short>(0xBF80),
                                         static_cast<short>(0xBF00), static_cast<short>(0x8000),
                                         0x40C0, 0x4080, 0x4040, 0x4000, 0x3FC0, 0x3F80, 0x3F00, 0);
  const __m512i v = _mm512_permutexvar_epi16(nib, table);
  const __mmask32 nonzero = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7FFF));
  return _mm512_mask_add_epi16(v, nonzero, v, _mm512_set1_epi16(static_cast<short>((static_cast<int>(e) - 127) << 7)));
}

// Chunk c of a cache row of format F (`scales`: the row's MX block scales).
template <KvFormat F>
MLA_TARGET_AVX512F static inline __m512i decode_chunk(const MlaDecodeParams& p, const uint8_t* row_ptr,
                                                     const uint8_t* scales, int c) {
  if constexpr (F == KvFormat::kBf16) {
    return _mm512_loadu_si512(row_ptr + 64 * c);
  } else if constexpr (F == KvFormat::kFp8E4M3FN) {
    return decode_fp8_chunk<false>(row_ptr + 32 * c);
  } else if constexpr (F == KvFormat::kFp8E4M3FNUZ) {
    return decode_fp8_chunk<true>(row_ptr + 32 * c);
  } else {
    return decode_mxfp4_chunk(row_ptr + 16 * c, scales[c * p.mx_scale_stride_col]);
  }
}

template <KvFormat F>
constexpr int kCacheRowBytes = F == KvFormat::kBf16 ? 2 * kHeadDimQK : F == KvFormat::kMxfp4 ? kMxfp4RowBytes : kHeadDimQK;

// Keys between a sub-tile and the one whose cache lines its QK prefetches
// (into L1, spread over the QK loop: a burst of them at decode time would hold
// the miss buffers for its whole length, and memory would idle during the
// products).
constexpr int kPrefetchAhead = 32;

// A whole row into L2 (T1), for the avx512_fp32 path (a tile ahead).
template <KvFormat F>
MLA_TARGET_AVX512F static inline void prefetch_row(const uint8_t* row_ptr) {
#pragma GCC unroll 1
  for (int off = 0; off < kCacheRowBytes<F>; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(row_ptr) + off, _MM_HINT_T1);
  }
}

// The cache lines of keys [j, min(j + kSubTile, end)) of item b into pf, each
// once (rows need not start a line, and consecutive rows share lines);
// returns their count (at most kSubTile * (kRowLines + 1)). Consecutive dense
// rows (the contiguous layouts) are one run of lines, listed without per-row
// work (the per-row list cost ~10-20 TSC ticks per key at H = 16).
template <KvFormat F>
MLA_TARGET_AVX512F static inline int list_prefetch_lines(const MlaDecodeParams& p, int32_t b, int32_t j, int32_t end,
                                                          const char** pf) {
  const char* kv = static_cast<const char*>(p.kv);
  const int32_t k_end = std::min(end, j + kSubTile);
  if (k_end <= j) return 0;
  if (p.kv_row_stride_bytes == kCacheRowBytes<F>) {
    const int64_t r0 = kv_row(p, b, j);
    bool run = true;
    for (int32_t k = j + 1; k < k_end && run; ++k) run = kv_row(p, b, k) == r0 + (k - j);
    if (run) {
      const uintptr_t first = reinterpret_cast<uintptr_t>(kv + r0 * p.kv_row_stride_bytes) >> 6;
      const uintptr_t last = (reinterpret_cast<uintptr_t>(kv + (r0 + (k_end - j)) * p.kv_row_stride_bytes) - 1) >> 6;
      const int n = static_cast<int>(last - first + 1);
      for (int i = 0; i < n; ++i) pf[i] = reinterpret_cast<const char*>((first + i) << 6);
      return n;
    }
  }
  uintptr_t last = ~uintptr_t{0};  // the line added last
  int n = 0;
  for (int32_t k = j; k < k_end; ++k) {
    const char* row = kv + kv_row(p, b, k) * p.kv_row_stride_bytes;
    const uintptr_t first_line = reinterpret_cast<uintptr_t>(row) >> 6;
    const uintptr_t last_line = (reinterpret_cast<uintptr_t>(row) + kCacheRowBytes<F> - 1) >> 6;
    for (uintptr_t line = first_line; line <= last_line; ++line) {
      if (line == last) continue;
      pf[n++] = reinterpret_cast<const char*>(line << 6);
      last = line;
    }
  }
  return n;
}

// bf16 rows are their own Kb: keys [j, j + n) of item b as rows kRowDwords
// apart in the cache itself when the format is bf16, rows are dense (stride
// 1152 bytes) and the n keys are consecutive rows; nullptr otherwise.
template <KvFormat F>
MLA_TARGET_AVX512F static inline const uint32_t* rows_in_place(const MlaDecodeParams& p, int32_t b, int32_t j,
                                                                int n) {
  if constexpr (F != KvFormat::kBf16) return nullptr;
  if (p.kv_row_stride_bytes != 4 * kRowDwords) return nullptr;
  const int64_t r0 = kv_row(p, b, j);
  for (int k = 1; k < n; ++k) {
    if (kv_row(p, b, j + k) != r0 + k) return nullptr;
  }
  return reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.kv) + r0 * p.kv_row_stride_bytes);
}

// Decodes keys [k_begin, k_end) of the tile starting at key j0 of item b
// (k_begin even; a pair's second key at or beyond nv is zero) into Vv and,
// where store_kb, into Kb (key k_begin at its first row). Sc: the path's
// scratch (members kb and vv in the layouts above).
// F is the cache format: one instantiation per format keeps the format switch
// and the MX scale addressing out of the chunk loop.
template <KvFormat F, class Sc>
MLA_TARGET_AVX512F static inline void decode_keys(const MlaDecodeParams& p, int32_t b, int32_t j0, int k_begin,
                                                  int k_end, int nv, bool store_kb, Sc& sc) {
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                          22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
  const uint8_t* kv = static_cast<const uint8_t*>(p.kv);
  const uint8_t* mx = p.mx_scale;
  for (int j = k_begin; j < k_end; j += 2) {
    const int64_t r0 = kv_row(p, b, j0 + j);
    const bool has1 = j + 1 < nv;
    const int64_t r1 = has1 ? kv_row(p, b, j0 + j + 1) : r0;
    const uint8_t* p0 = kv + r0 * p.kv_row_stride_bytes;
    const uint8_t* p1 = kv + r1 * p.kv_row_stride_bytes;
    const uint8_t* s0 = F == KvFormat::kMxfp4 ? mx + r0 * p.mx_scale_stride_row : nullptr;
    const uint8_t* s1 = F == KvFormat::kMxfp4 ? mx + r1 * p.mx_scale_stride_row : nullptr;
    uint32_t* k0 = sc.kb + (j - k_begin) * kRowDwords;
    uint32_t* k1 = k0 + kRowDwords;
    uint32_t* vrow = sc.vv + (j / 2) * kVvRow;
    for (int c = 0; c < kChunks; ++c) {
      const __m512i a = decode_chunk<F>(p, p0, s0, c);
      const __m512i bb = has1 ? decode_chunk<F>(p, p1, s1, c) : _mm512_setzero_si512();
      if (store_kb) {
        _mm512_store_si512(k0 + 16 * c, a);
        _mm512_store_si512(k1 + 16 * c, bb);
      }
      if (c < kHeadDimV / 32) {
        _mm512_store_si512(vrow + 32 * c, _mm512_permutex2var_epi16(a, lo_idx, bb));
        _mm512_store_si512(vrow + 32 * c + 16, _mm512_permutex2var_epi16(a, hi_idx, bb));
      }
    }
  }
}

// Zero V pairs from the one after key nv - 1 up to the end of its 32-key step.
template <class Sc>
MLA_TARGET_AVX512F static inline void zero_v_tail(int nv, Sc& sc) {
  const int pair_end = ((nv + 31) / 32) * 16;
  for (int i = (nv + 1) / 2; i < pair_end; ++i) {
    for (int c = 0; c < kHeadDimV / 16; ++c) _mm512_store_si512(sc.vv + i * kVvRow + 16 * c, _mm512_setzero_si512());
  }
}

// Zeroes the V of keys [from, to) of the tile (to <= the decoded count's
// 32-key step), for a group that sees fewer keys than the tile holds.
template <class Sc>
MLA_TARGET_AVX512F static inline void zero_v_keys(int from, int to, Sc& sc) {
  for (int j = from; j < to; ++j) {
    const __mmask32 half = (j & 1) ? 0xAAAAAAAAu : 0x55555555u;
    uint32_t* vrow = sc.vv + (j / 2) * kVvRow;
    for (int c = 0; c < kHeadDimV / 16; ++c) _mm512_mask_storeu_epi16(vrow + 16 * c, half, _mm512_setzero_si512());
  }
}

// Online-softmax step of one group over the tile's first nk keys (S holds
// their raw dot products; they become log2-domain logits): updates m2,
// rescales l and O where the reference max moves (O only after the piece's
// first tile: before it O holds nothing yet); returns the reference max.
MLA_TARGET_AVX512F static inline __m512 softmax_update(int nk, float logit_scale_log2, float* s, float* m2, float* l,
                                                      float* O, bool first) {
  const __m512 scale = _mm512_set1_ps(logit_scale_log2);
  __m512 bm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int k = 0; k < nk; ++k) {
    const __m512 x = _mm512_mul_ps(_mm512_load_ps(s + 16 * k), scale);
    _mm512_store_ps(s + 16 * k, x);
    bm = _mm512_max_ps(bm, x);
  }
  __m512 m = _mm512_loadu_ps(m2);
  const __mmask16 move = _mm512_cmp_ps_mask(bm, _mm512_add_ps(m, _mm512_set1_ps(kLazyRescale)), _CMP_GT_OQ);
  if (move) {
    const __m512 m_new = _mm512_mask_mov_ps(m, move, bm);
    const __m512 alpha = exp2_ps(_mm512_sub_ps(m, m_new));  // 0 where m was -inf, 1 where m stays
    _mm512_storeu_ps(l, _mm512_mul_ps(_mm512_loadu_ps(l), alpha));
    alignas(64) float al[16];
    _mm512_store_ps(al, alpha);
    for (int r = 0; r < 16 && !first; ++r) {
      if (!((move >> r) & 1)) continue;
      const __m512 ar = _mm512_set1_ps(al[r]);
      float* o = O + r * kORow;
      for (int d = 0; d < kHeadDimV; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), ar));
    }
    m = m_new;
    _mm512_storeu_ps(m2, m);
  }
  return m;
}

// p = 2^(x - m) for keys < nk, summed into l, written back into S as fp32.
MLA_TARGET_AVX512F static inline void probs_fp32(int nk, __m512 m, float* s, float* l) {
  __m512 lsum = _mm512_loadu_ps(l);
  for (int k = 0; k < nk; ++k) {
    const __m512 pk = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * k), m));
    lsum = _mm512_add_ps(lsum, pk);
    _mm512_store_ps(s + 16 * k, pk);
  }
  _mm512_storeu_ps(l, lsum);
}

// The same probabilities as bf16 key pairs in Yt, for every pair of the
// 32-key steps that hold the nk keys (zero beyond nk); l sums them in fp32.
MLA_TARGET_AVX512 static inline void probs_pairs(int nk, __m512 m, const float* s, float* l, uint32_t* yt) {
  __m512 lsum = _mm512_loadu_ps(l);
  const __m512i pair_idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                            6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int steps = (nk + 31) / 32 * 32;
  for (int k = 0; k < steps; k += 2) {
    __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
    if (k < nk) p0 = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * k), m));
    if (k + 1 < nk) p1 = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * (k + 1)), m));
    lsum = _mm512_add_ps(lsum, _mm512_add_ps(p0, p1));
    // words 0..15: p0 of rows 0..15, 16..31: p1; then interleave to (p0[r], p1[r]) dwords
    const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0));
    _mm512_store_si512(yt + 8 * k, _mm512_permutexvar_epi16(pair_idx, packed));
  }
  _mm512_storeu_ps(l, lsum);
}

// 16 x 16 dword transpose: dst[c * dst_stride + r] = rows[r][c].
MLA_TARGET_AVX512F static inline void transpose16x16_rows(const uint32_t* const* rows, uint32_t* dst, int dst_stride) {
  __m512i r[16], a[16], bq[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows[i]);
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    bq[4 * k] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
    bq[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
    bq[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
    bq[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
  }
  // bq[4k + j], 128-bit lane L: column 4L + j of rows 4k .. 4k + 3.
  for (int j = 0; j < 4; ++j) {
    const __m512i c0 = _mm512_shuffle_i32x4(bq[j], bq[4 + j], 0x44);
    const __m512i c1 = _mm512_shuffle_i32x4(bq[j], bq[4 + j], 0xEE);
    const __m512i c2 = _mm512_shuffle_i32x4(bq[8 + j], bq[12 + j], 0x44);
    const __m512i c3 = _mm512_shuffle_i32x4(bq[8 + j], bq[12 + j], 0xEE);
    _mm512_storeu_si512(dst + (0 + j) * dst_stride, _mm512_shuffle_i32x4(c0, c2, 0x88));
    _mm512_storeu_si512(dst + (4 + j) * dst_stride, _mm512_shuffle_i32x4(c0, c2, 0xDD));
    _mm512_storeu_si512(dst + (8 + j) * dst_stride, _mm512_shuffle_i32x4(c1, c3, 0x88));
    _mm512_storeu_si512(dst + (12 + j) * dst_stride, _mm512_shuffle_i32x4(c1, c3, 0xDD));
  }
}

// The same with rows src_stride dwords apart.
MLA_TARGET_AVX512F static inline void transpose16x16(const uint32_t* src, int src_stride, uint32_t* dst,
                                                    int dst_stride) {
  const uint32_t* rows[16];
  for (int i = 0; i < 16; ++i) rows[i] = src + i * src_stride;
  transpose16x16_rows(rows, dst, dst_stride);
}

// Qt of one group (rows >= nh are zero): per chunk one 16 x 16 dword
// transpose of the rows' 16 pairs.
MLA_TARGET_AVX512F static inline void build_qt(const MlaDecodeParams& p, const GroupDesc& gd, uint32_t* qt) {
  alignas(64) static const uint32_t kZeroRow[kRowDwords] = {};
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  const uint32_t* rows[16];
  for (int r = 0; r < 16; ++r) {
    rows[r] = r < gd.nh ? reinterpret_cast<const uint32_t*>(qbase + static_cast<int64_t>(gd.q_row) * p.q_stride_token +
                                                            static_cast<int64_t>(gd.h0 + r) * p.q_stride_head)
                        : kZeroRow;
  }
  for (int c = 0; c < kChunks; ++c) {
    transpose16x16_rows(rows, qt + 256 * c, 16);
    for (int r = 0; r < 16; ++r) rows[r] += 16;
  }
}

// One piece on the vector data flow above; Mm supplies the two products:
//   Mm::kTile                  keys per tile (a multiple of 32, at most kMaxTileKeys)
//   Mm::qk(sc, qt, k0, s, n_pf) S rows k0 .. k0 + 15 of one group from the 16
//                              rows at sc.kq (Kb, called right after they are
//                              decoded, while they are in L1) and the group's
//                              Qt; it also prefetches the n_pf lines of sc.pf
//   Mm::pv(sc, O, nk, nh, first) O += P V over the 32-key steps holding nk keys
//                              (O = P V where first: the piece's first tile)
//   Mm::kQkPairs               whether Mm::qk2(sc, qt0, qt1, k0, s0, s1, n_pf) scores
//                              two groups at once (consecutive groups that see the keys)
template <class Mm, KvFormat F>
MLA_TARGET_AVX512 void run_piece_format(const PieceArgs& a, const CallScales& cs) {
  static_assert(Mm::kTile % 32 == 0 && Mm::kTile <= kMaxTileKeys, "tile size");
  const MlaDecodeParams& p = *a.p;
  Scratch& sc = thread_scratch<Scratch>();
  begin_piece_state(a, sc.m2);
  const int32_t key_end = std::min(a.key_end, a.groups[a.ng - 1].visible);
  if (key_end > a.key_begin) {
    for (int g = 0; g < a.ng; ++g) build_qt(p, a.groups[g], sc.qt + g * kQtDwords);
    const float logit_scale_log2 = cs.qk * kLog2e;
    for (int32_t j0 = a.key_begin; j0 < key_end; j0 += Mm::kTile) {
      const int nv = std::min<int32_t>(Mm::kTile, key_end - j0);
      for (int k0 = 0; k0 < nv; k0 += kSubTile) {
        MLA_PROFILE_START();
        // A full sub-tile of bf16 rows in place: QK reads them straight from the cache.
        const uint32_t* in_place = k0 + kSubTile <= nv ? rows_in_place<F>(p, a.b, j0 + k0, kSubTile) : nullptr;
        const bool direct = in_place != nullptr;
        sc.kq = direct ? in_place : sc.kb;
        decode_keys<F>(p, a.b, j0, k0, std::min(nv, k0 + kSubTile), nv, !direct, sc);
        MLA_PROFILE_LAP(0, kDecode);
        int n_pf = list_prefetch_lines<F>(p, a.b, j0 + k0 + kPrefetchAhead, key_end, sc.pf);
        int g = 0;
        while (g < a.ng && a.groups[g].visible - j0 <= k0) ++g;  // groups that see none of these keys
        if constexpr (Mm::kQkPairs) {
          for (; g + 1 < a.ng; g += 2) {
            Mm::qk2(sc, sc.qt + g * kQtDwords, sc.qt + (g + 1) * kQtDwords, k0, sc.s + g * (kMaxTileKeys * 16),
                    sc.s + (g + 1) * (kMaxTileKeys * 16), n_pf);
            n_pf = 0;  // the first QK call of the sub-tile issues them
          }
        }
        for (; g < a.ng; ++g) {
          Mm::qk(sc, sc.qt + g * kQtDwords, k0, sc.s + g * (kMaxTileKeys * 16), n_pf);
          n_pf = 0;
        }
        MLA_PROFILE_LAP(0, kQk);
      }
      zero_v_tail(nv, sc);
      int valid_v = nv;  // keys of the tile whose V is still in Vv
      for (int g = a.ng - 1; g >= 0; --g) {  // latest token (most keys) first
        const int nk = std::min<int32_t>(nv, a.groups[g].visible - j0);
        if (nk <= 0) break;  // earlier groups see fewer keys still
        MLA_PROFILE_START();
        if (nk < valid_v) {
          zero_v_keys(nk, valid_v, sc);
          valid_v = nk;
        }
        float* O = a.O + static_cast<int64_t>(g) * kOFloats;
        float* s = sc.s + g * (kMaxTileKeys * 16);
        const bool first = j0 == a.key_begin;  // O is written, not accumulated
        const __m512 m_ref = softmax_update(nk, logit_scale_log2, s, sc.m2 + g * 16, a.l + g * 16, O, first);
        probs_pairs(nk, m_ref, s, a.l + g * 16, sc.yt);
        MLA_PROFILE_LAP(0, kSoftmax);
        Mm::pv(sc, O, nk, a.groups[g].nh, first);
        MLA_PROFILE_LAP(0, kPv);
      }
    }
  }
  end_piece_state(a, sc.m2);
}

template <class Mm>
MLA_TARGET_AVX512 void run_piece(const PieceArgs& a, const CallScales& cs) {
  switch (a.p->format) {
    case KvFormat::kBf16: return run_piece_format<Mm, KvFormat::kBf16>(a, cs);
    case KvFormat::kFp8E4M3FN: return run_piece_format<Mm, KvFormat::kFp8E4M3FN>(a, cs);
    case KvFormat::kFp8E4M3FNUZ: return run_piece_format<Mm, KvFormat::kFp8E4M3FNUZ>(a, cs);
    case KvFormat::kMxfp4: return run_piece_format<Mm, KvFormat::kMxfp4>(a, cs);
  }
}

}  // namespace vec
}  // namespace cpu
}  // namespace mla_decode

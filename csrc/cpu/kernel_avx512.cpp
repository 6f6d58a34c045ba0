// The AVX-512 paths. avx512: the vector data flow of vec_avx512.h with both
// products on vdpbf16ps (pairs of bf16 products summed into fp32 lanes);
// avx512_fp32 (below): the same tiles with fp32 FMA products.
//   QK: lanes are the group's 16 rows. For a sub-tile of 16 keys, 16 fp32
//       accumulators; for each of the 288 dim pairs one Qt vector (the pair of
//       every row) times the key's pair broadcast from Kb. Two groups that see
//       the sub-tile are scored together, 8 keys x 2 groups at a time (qk2).
//       The QK loop also issues the sub-tile's list of cache-line prefetches,
//       one per dim pair.
//   PV: lanes are 16 output dims. Blocks of 4 rows x 64 dims (16
//       accumulators, loaded from and stored to O once per tile, zero on the
//       piece's first tile); for each key
//       pair 4 Vv vectors times each row's probability pair broadcast from Yt.
#include "cpu/kernel_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cstdio>
#include <new>

#include "cpu/vec_avx512.h"

namespace mla_decode {
namespace cpu {
namespace {

using namespace vec;

struct Avx512Mm {
  static constexpr int kTile = 64;
  static constexpr bool kQkPairs = true;

  MLA_TARGET_AVX512 static void qk(Scratch& sc, const uint32_t* qt, int k0, float* s, int n_pf) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
    const uint32_t* kb = sc.kq;
    for (int i = 0; i < kRowDwords; ++i) {
      if (i < n_pf) _mm_prefetch(sc.pf[i], _MM_HINT_T0);  // one line per dim pair
      const __m512bh q = reinterpret_cast<__m512bh>(_mm512_load_si512(qt + 16 * i));
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        const __m512bh kk = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(kb[k * kRowDwords + i])));
        acc[k] = _mm512_dpbf16_ps(acc[k], q, kk);
      }
    }
    for (int i = kRowDwords; i < n_pf; ++i) _mm_prefetch(sc.pf[i], _MM_HINT_T0);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) _mm512_store_ps(s + 16 * (k0 + k), acc[k]);
  }

  // The same for two groups (Qt qt0, qt1; S s0, s1) in two halves of 8 keys:
  // 16 accumulators (8 keys x 2 groups), each broadcast key pair feeds both
  // groups (10 loads per 16 products instead of 17).
  MLA_TARGET_AVX512 static void qk2(Scratch& sc, const uint32_t* qt0, const uint32_t* qt1, int k0, float* s0,
                                    float* s1, int n_pf) {
    for (int h = 0; h < kSubTile; h += 8) {
      __m512 a0[8], a1[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) a0[k] = a1[k] = _mm512_setzero_ps();
      const uint32_t* kb = sc.kq + h * kRowDwords;
      for (int i = 0; i < kRowDwords; ++i) {
        const int line = 2 * i + h / 8;  // the prefetches spread over both halves
        if (line < n_pf) _mm_prefetch(sc.pf[line], _MM_HINT_T0);
        const __m512bh q0 = reinterpret_cast<__m512bh>(_mm512_load_si512(qt0 + 16 * i));
        const __m512bh q1 = reinterpret_cast<__m512bh>(_mm512_load_si512(qt1 + 16 * i));
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m512bh kk = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(kb[k * kRowDwords + i])));
          a0[k] = _mm512_dpbf16_ps(a0[k], q0, kk);
          a1[k] = _mm512_dpbf16_ps(a1[k], q1, kk);
        }
      }
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        _mm512_store_ps(s0 + 16 * (k0 + h + k), a0[k]);
        _mm512_store_ps(s1 + 16 * (k0 + h + k), a1[k]);
      }
    }
  }

  MLA_TARGET_AVX512 static void pv(Scratch& sc, float* O, int nk, int nh, bool first) {
    const int pairs = (nk + 31) / 32 * 16;
    const int rows = (nh + 3) / 4 * 4;
    for (int d0 = 0; d0 < kHeadDimV; d0 += 64) {
      for (int r0 = 0; r0 < rows; r0 += 4) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {
            acc[r][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(O + (r0 + r) * kORow + d0 + 16 * c);
          }
        }
        for (int i = 0; i < pairs; ++i) {
          const uint32_t* vrow = sc.vv + i * kVvRow + d0;
          __m512bh v[4];
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) v[c] = reinterpret_cast<__m512bh>(_mm512_load_si512(vrow + 16 * c));
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            const __m512bh pr = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(sc.yt[i * 16 + r0 + r])));
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], v[c], pr);
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) _mm512_store_ps(O + (r0 + r) * kORow + d0 + 16 * c, acc[r][c]);
        }
      }
    }
  }
};

#ifdef MLA_CPU_PROFILE
struct ProfilePrinter {
  ~ProfilePrinter() {
    static const char* names[] = {"decode", "qk", "softmax", "pv"};
    for (int amx = 0; amx < 2; ++amx) {
      fprintf(stderr, "mla_decode profile %s:", amx ? "amx" : "avx512 or avx512_fp32");
      for (int ph = 0; ph < kPhases; ++ph) fprintf(stderr, " %s %.3e", names[ph], double(g_phase_ticks[amx][ph]));
      fprintf(stderr, "\n");
    }
  }
} g_profile_printer;
#endif

// ---- the fp32 variant (avx512_fp32) ------------------------------------------
// Same tiles and softmax, products in fp32 FMA: on Intel cores vdpbf16ps
// issues at a quarter of the rate of vfmadd231ps (measured on a Sapphire
// Rapids-class Xeon: 1.7 against 0.41 TSC ticks per zmm instruction), so two
// fp32 FMAs per pair beat one bf16 dot product there; on AMD Zen 5 both take
// 0.56-0.60 and the bf16 form does twice the work. It needs no AVX-512 BF16.
//   Qtf  [d < 576][16 rows] fp32 per group; Kf [key < 32][576] fp32 (decoded as
//        bf16, widened exactly); QK lanes = rows (16 keys x 16 accumulators);
//   P    fp32 [key][16 rows] (probs_fp32); PV lanes = dims, 4 rows x 64
//        dims, each key's V row read straight from Kf (no pair layout).

constexpr int kTile32 = 32;

struct alignas(64) Scratch32 {
  float qt[kMaxGroupsPerPiece * kHeadDimQK * 16];
  float kf[kTile32 * kHeadDimQK];
  float s[kTile32 * 16];
  float m2[kMaxGroupsPerPiece * 16];
};

MLA_TARGET_AVX512F static void build_qt32(const MlaDecodeParams& p, const GroupDesc& gd, float* qt) {
  memset(qt, 0, sizeof(float) * kHeadDimQK * 16);
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  for (int r = 0; r < gd.nh; ++r) {
    const uint16_t* q = qbase + static_cast<int64_t>(gd.q_row) * p.q_stride_token +
                        static_cast<int64_t>(gd.h0 + r) * p.q_stride_head;
    for (int d = 0; d < kHeadDimQK; ++d) qt[d * 16 + r] = bf16_bits_to_float(q[d]);
  }
}

template <KvFormat F>
MLA_TARGET_AVX512F static void decode_tile32(const MlaDecodeParams& p, int32_t b, int32_t j0, int nv,
                                             int32_t prefetch_end, float* kf) {
  const uint8_t* kv = static_cast<const uint8_t*>(p.kv);
  for (int k = 0; k < nv; ++k) {
    const int32_t pj = j0 + kTile32 + k;
    if (pj < prefetch_end) prefetch_row<F>(kv + kv_row(p, b, pj) * p.kv_row_stride_bytes);
    const int64_t row = kv_row(p, b, j0 + k);
    const uint8_t* ptr = kv + row * p.kv_row_stride_bytes;
    const uint8_t* scales = F == KvFormat::kMxfp4 ? p.mx_scale + row * p.mx_scale_stride_row : nullptr;
    float* dst = kf + k * kHeadDimQK;
    for (int c = 0; c < kChunks; ++c) {
      const __m512i w = decode_chunk<F>(p, ptr, scales, c);
      const __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w)), 16);
      const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w, 1)), 16);
      _mm512_store_ps(dst + 32 * c, _mm512_castsi512_ps(lo));
      _mm512_store_ps(dst + 32 * c + 16, _mm512_castsi512_ps(hi));
    }
  }
}

MLA_TARGET_AVX512F static void qk32(const float* qt, const float* kf, int nk, float* s) {
  for (int k0 = 0; k0 < nk; k0 += 16) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
    const float* kr = kf + k0 * kHeadDimQK;
    for (int d = 0; d < kHeadDimQK; ++d) {
      const __m512 q = _mm512_load_ps(qt + 16 * d);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) acc[k] = _mm512_fmadd_ps(q, _mm512_set1_ps(kr[k * kHeadDimQK + d]), acc[k]);
    }
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) _mm512_store_ps(s + 16 * (k0 + k), acc[k]);
  }
}

MLA_TARGET_AVX512F static void pv32(const float* pk, const float* kf, int nk, int nh, float* O, bool first) {
  const int rows = (nh + 3) / 4 * 4;
  for (int d0 = 0; d0 < kHeadDimV; d0 += 64) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
      __m512 acc[4][4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          acc[r][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(O + (r0 + r) * kORow + d0 + 16 * c);
        }
      }
      for (int k = 0; k < nk; ++k) {
        __m512 v[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) v[c] = _mm512_load_ps(kf + k * kHeadDimQK + d0 + 16 * c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512 pr = _mm512_set1_ps(pk[16 * k + r0 + r]);
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(v[c], pr, acc[r][c]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) _mm512_store_ps(O + (r0 + r) * kORow + d0 + 16 * c, acc[r][c]);
      }
    }
  }
}

template <KvFormat F>
MLA_TARGET_AVX512F static void run_piece32(const PieceArgs& a, const CallScales& cs) {
  const MlaDecodeParams& p = *a.p;
  Scratch32& sc = thread_scratch<Scratch32>();
  begin_piece_state(a, sc.m2);
  const int32_t key_end = std::min(a.key_end, a.groups[a.ng - 1].visible);
  if (key_end > a.key_begin) {
    for (int g = 0; g < a.ng; ++g) build_qt32(p, a.groups[g], sc.qt + g * kHeadDimQK * 16);
    const float logit_scale_log2 = cs.qk * kLog2e;
    for (int32_t j0 = a.key_begin; j0 < key_end; j0 += kTile32) {
      const int nv = std::min<int32_t>(kTile32, key_end - j0);
      MLA_PROFILE_START();
      decode_tile32<F>(p, a.b, j0, nv, key_end, sc.kf);
      MLA_PROFILE_LAP(0, kDecode);
      for (int g = a.ng - 1; g >= 0; --g) {
        const int nk = std::min<int32_t>(nv, a.groups[g].visible - j0);
        if (nk <= 0) break;
        float* O = a.O + static_cast<int64_t>(g) * kOFloats;
        qk32(sc.qt + g * kHeadDimQK * 16, sc.kf, nk, sc.s);
        MLA_PROFILE_LAP(0, kQk);
        const bool first = j0 == a.key_begin;  // O is written, not accumulated
        const __m512 m_ref = softmax_update(nk, logit_scale_log2, sc.s, sc.m2 + g * 16, a.l + g * 16, O, first);
        probs_fp32(nk, m_ref, sc.s, a.l + g * 16);
        MLA_PROFILE_LAP(0, kSoftmax);
        pv32(sc.s, sc.kf, nk, a.groups[g].nh, O, first);
        MLA_PROFILE_LAP(0, kPv);
      }
    }
  }
  end_piece_state(a, sc.m2);
}

}  // namespace

bool vector_paths_built() { return true; }

void piece_avx512(const PieceArgs& a, const CallScales& s) { run_piece<Avx512Mm>(a, s); }
void piece_avx512_fp32(const PieceArgs& a, const CallScales& s) {
  switch (a.p->format) {
    case KvFormat::kBf16: return run_piece32<KvFormat::kBf16>(a, s);
    case KvFormat::kFp8E4M3FN: return run_piece32<KvFormat::kFp8E4M3FN>(a, s);
    case KvFormat::kFp8E4M3FNUZ: return run_piece32<KvFormat::kFp8E4M3FNUZ>(a, s);
    case KvFormat::kMxfp4: return run_piece32<KvFormat::kMxfp4>(a, s);
  }
}

}  // namespace cpu
}  // namespace mla_decode

#else  // not x86-64 with GCC / clang: only the scalar path exists

#include <c10/util/Exception.h>

namespace mla_decode {
namespace cpu {
bool vector_paths_built() { return false; }
void piece_avx512(const PieceArgs&, const CallScales&) {
  TORCH_CHECK(false, "mla_decode: the AVX-512 CPU path is not part of this build.");
}
void piece_avx512_fp32(const PieceArgs&, const CallScales&) {
  TORCH_CHECK(false, "mla_decode: the AVX-512 CPU path is not part of this build.");
}
}  // namespace cpu
}  // namespace mla_decode

#endif

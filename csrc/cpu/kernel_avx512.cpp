// The AVX-512 BF16 path: the vector data flow of vec_avx512.h with both
// products on vdpbf16ps (pairs of bf16 products summed into fp32 lanes).
//   QK: lanes are the group's 16 rows. For a block of 16 keys, 16 fp32
//       accumulators; for each of the 288 dim pairs one Qt vector (the pair of
//       every row) times the key's pair broadcast from Kb.
//   PV: lanes are 16 output dims. Blocks of 4 rows x 64 dims (16
//       accumulators, loaded from and stored to O once per tile); for each key
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
  static constexpr bool kNeedsPa = false;
  static void begin() {}
  static void end() {}

  MLA_TARGET_AVX512 static void qk(Scratch& sc, const uint32_t* qt, int nk) {
    for (int k0 = 0; k0 < nk; k0 += 16) {
      __m512 acc[16];
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
      const uint32_t* kb = sc.kb + k0 * kRowDwords;
      for (int i = 0; i < kRowDwords; ++i) {
        const __m512bh q = reinterpret_cast<__m512bh>(_mm512_load_si512(qt + 16 * i));
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) {
          const __m512bh kk = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(kb[k * kRowDwords + i])));
          acc[k] = _mm512_dpbf16_ps(acc[k], q, kk);
        }
      }
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) _mm512_store_ps(sc.s + 16 * (k0 + k), acc[k]);
    }
  }

  MLA_TARGET_AVX512 static void pv(Scratch& sc, float* O, int nk, int nh) {
    const int pairs = (nk + 31) / 32 * 16;
    const int rows = (nh + 3) / 4 * 4;
    for (int d0 = 0; d0 < kHeadDimV; d0 += 64) {
      for (int r0 = 0; r0 < rows; r0 += 4) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_load_ps(O + (r0 + r) * kORow + d0 + 16 * c);
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
    static const char* names[] = {"decode", "qk", "softmax", "transpose", "pv"};
    for (int amx = 0; amx < 2; ++amx) {
      fprintf(stderr, "mla_decode profile %s:", amx ? "amx" : "avx512");
      for (int ph = 0; ph < kPhases; ++ph) fprintf(stderr, " %s %.3e", names[ph], double(g_phase_ticks[amx][ph]));
      fprintf(stderr, "\n");
    }
  }
} g_profile_printer;
#endif

}  // namespace

bool vector_paths_built() { return true; }

void piece_avx512(const PieceArgs& a, const CallScales& s) { run_piece<Avx512Mm>(a, s); }

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
}  // namespace cpu
}  // namespace mla_decode

#endif

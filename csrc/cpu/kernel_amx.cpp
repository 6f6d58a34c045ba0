// The AMX-BF16 path: the vector data flow of vec_avx512.h (decode, softmax
// and the layouts stay AVX-512) with both products on tdpbf16ps, fp32
// accumulation in the tiles. All eight tiles are configured as 16 rows x 64
// bytes (palette 1): a bf16 operand tile is 16 x 32 values, an fp32
// accumulator 16 x 16.
// Tiles of 128 keys.
//   QK: S (keys x rows) = Kb (keys x 576) . Qt, 16 keys at a time, right
//       after they are decoded (Kb rows still in L1): one C tile of 16 keys x
//       16 rows, accumulated as four partial tiles (the chunks round-robin,
//       so consecutive products do not wait for each other), A = 16 keys x 32
//       dims of Kb, B = the chunk of Qt (pairs x rows, already in VNNI order).
//   PV: O (rows x 512) += Pa (rows x keys) . Vv. A = 16 rows x 32 keys of Pa
//       (up to four tiles for the 128 keys), B = 16 key pairs x 16 dims of Vv,
//       C = 16 rows x 16 dims of O, two at a time, loaded from and stored to O
//       once per tile (128 keys).
// Linux grants the tile state only on request (cpu_features.cpp); the
// driver runs this path only after that and after its self-test
// (decode_cpu.cpp).
#include "cpu/kernel_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <new>

#include "cpu/vec_avx512.h"
#ifdef MLA_CPU_AMX_EMULATION
#include "cpu/amx_emulation.h"
#endif

namespace mla_decode {
namespace cpu {
namespace {

using namespace vec;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

struct AmxMm {
  static constexpr int kTile = 128;
  static constexpr bool kNeedsPa = true;
  static constexpr bool kQkPairs = false;

  MLA_TARGET_AMX static void begin() {
    TileConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
  }

  MLA_TARGET_AMX static void end() { _tile_release(); }

  // S rows k0 .. k0 + 15: the 18 chunk products go round-robin into four
  // accumulators (tmm0-3, independent chains), A = 16 keys x 32 dims of Kb
  // (tmm4 / tmm5 in turn), B = the chunk of Qt (tmm6 / tmm7 in turn); the four
  // partial tiles are summed with AVX-512.
  MLA_TARGET_AMX static void qk(Scratch& sc, const uint32_t* qt, int k0, float* s, int n_pf) {
    for (int i = 0; i < n_pf; ++i) _mm_prefetch(sc.pf[i], _MM_HINT_T0);
    constexpr int kKbStride = kRowDwords * 4;  // bytes between keys of Kb
    const uint32_t* kb = sc.kq;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
#define MLA_QK_CHUNK(c, C, A, B)                        \
  _tile_loadd(A, kb + 16 * (c), kKbStride);             \
  _tile_loadd(B, qt + 256 * (c), 64);                   \
  _tile_dpbf16ps(C, A, B);
    MLA_QK_CHUNK(0, 0, 4, 6)
    MLA_QK_CHUNK(1, 1, 5, 7)
    MLA_QK_CHUNK(2, 2, 4, 6)
    MLA_QK_CHUNK(3, 3, 5, 7)
    MLA_QK_CHUNK(4, 0, 4, 6)
    MLA_QK_CHUNK(5, 1, 5, 7)
    MLA_QK_CHUNK(6, 2, 4, 6)
    MLA_QK_CHUNK(7, 3, 5, 7)
    MLA_QK_CHUNK(8, 0, 4, 6)
    MLA_QK_CHUNK(9, 1, 5, 7)
    MLA_QK_CHUNK(10, 2, 4, 6)
    MLA_QK_CHUNK(11, 3, 5, 7)
    MLA_QK_CHUNK(12, 0, 4, 6)
    MLA_QK_CHUNK(13, 1, 5, 7)
    MLA_QK_CHUNK(14, 2, 4, 6)
    MLA_QK_CHUNK(15, 3, 5, 7)
    MLA_QK_CHUNK(16, 0, 4, 6)
    MLA_QK_CHUNK(17, 1, 5, 7)
#undef MLA_QK_CHUNK
    _tile_stored(0, sc.c4 + 0 * 256, 64);
    _tile_stored(1, sc.c4 + 1 * 256, 64);
    _tile_stored(2, sc.c4 + 2 * 256, 64);
    _tile_stored(3, sc.c4 + 3 * 256, 64);
    for (int k = 0; k < 16; ++k) {
      const __m512 a = _mm512_add_ps(_mm512_load_ps(sc.c4 + 16 * k), _mm512_load_ps(sc.c4 + 256 + 16 * k));
      const __m512 b = _mm512_add_ps(_mm512_load_ps(sc.c4 + 512 + 16 * k), _mm512_load_ps(sc.c4 + 768 + 16 * k));
      _mm512_store_ps(s + 16 * (k0 + k), _mm512_add_ps(a, b));
    }
  }

  // O += Pa . Vv over `steps` 32-key steps (1..4): A tiles tmm4 .. tmm7 hold
  // Pa for keys 32s .. 32s + 31; for each pair of 16-dim chunks (n, n + 1) the
  // two C tiles (tmm0 / tmm1) are loaded from O once (zeroed instead on the
  // piece's first tile), take every step's product
  // with B = Vv pairs 16s .. 16s + 15 x 16 dims (tmm2 / tmm3), and are stored back.
  MLA_TARGET_AMX static void pv(Scratch& sc, float* O, int nk, int /*nh*/, bool first) {
    constexpr int kPaStride = kPaRow * 4;  // bytes between rows of Pa
    constexpr int kVvStride = kVvRow * 4;  // bytes between key pairs of Vv
    constexpr int kOStride = kORow * 4;
    const int steps = (nk + 31) / 32;
    const uint32_t* vv = sc.vv;
    _tile_loadd(4, sc.pa, kPaStride);
    if (steps > 1) _tile_loadd(5, sc.pa + 16, kPaStride);
    if (steps > 2) _tile_loadd(6, sc.pa + 32, kPaStride);
    if (steps > 3) _tile_loadd(7, sc.pa + 48, kPaStride);
#define MLA_PV_STEP(st, A)                                               \
  _tile_loadd(2, vv + (16 * (st)) * kVvRow + 16 * n, kVvStride);         \
  _tile_dpbf16ps(0, A, 2);                                               \
  _tile_loadd(3, vv + (16 * (st)) * kVvRow + 16 * (n + 1), kVvStride);   \
  _tile_dpbf16ps(1, A, 3);
    for (int n = 0; n < kHeadDimV / 16; n += 2) {
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
      } else {
        _tile_loadd(0, O + 16 * n, kOStride);
        _tile_loadd(1, O + 16 * (n + 1), kOStride);
      }
      MLA_PV_STEP(0, 4)
      if (steps > 1) {
        MLA_PV_STEP(1, 5)
      }
      if (steps > 2) {
        MLA_PV_STEP(2, 6)
      }
      if (steps > 3) {
        MLA_PV_STEP(3, 7)
      }
      _tile_stored(0, O + 16 * n, kOStride);
      _tile_stored(1, O + 16 * (n + 1), kOStride);
    }
#undef MLA_PV_STEP
  }
};

}  // namespace

void piece_amx(const PieceArgs& a, const CallScales& s) { run_piece<AmxMm>(a, s); }

}  // namespace cpu
}  // namespace mla_decode

#else  // not x86-64 with GCC / clang

#include <c10/util/Exception.h>

namespace mla_decode {
namespace cpu {
void piece_amx(const PieceArgs&, const CallScales&) {
  TORCH_CHECK(false, "mla_decode: the AMX CPU path is not part of this build.");
}
}  // namespace cpu
}  // namespace mla_decode

#endif

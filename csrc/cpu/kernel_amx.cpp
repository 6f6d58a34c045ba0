// The AMX-BF16 path: the vector data flow of vec_avx512.h (decode, softmax
// and the layouts stay AVX-512) with both products on tdpbf16ps, fp32
// accumulation in the tiles. All eight tiles are configured as 16 rows x 64
// bytes (palette 1): a bf16 operand tile is 16 x 32 values, an fp32
// accumulator 16 x 16.
//   QK: S (keys x rows) = Kb (keys x 576) . Qt. C tiles tmm0-3 hold the tile's
//       64 keys x 16 rows; for each of the 18 chunks of 32 dims, B = the
//       chunk of Qt (tmm5, pairs x rows, already in VNNI order) and A = 16
//       keys x 32 dims of Kb (tmm4 / tmm6 / tmm7 in turn).
//   PV: O (rows x 512) += Pa (rows x keys) . Vv. A = 16 rows x 32 keys of Pa
//       (tmm4, and tmm5 for keys 32-63), B = 16 key pairs x 16 dims of Vv
//       (tmm2 / tmm3 / tmm6 / tmm7), C = 16 rows x 16 dims of O, two at a
//       time (tmm0 / tmm1), loaded from and stored to O once per tile.
// Linux grants the tile state only on request (cpu_features.cpp); the
// driver runs this path only after that and after its self-test
// (decode_cpu.cpp).
#include "cpu/kernel_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <new>

#include "cpu/vec_avx512.h"

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
  static constexpr bool kNeedsPa = true;

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

  MLA_TARGET_AMX static void qk(Scratch& sc, const uint32_t* qt, int nk) {
    constexpr int kKbStride = kRowDwords * 4;  // bytes between keys of Kb
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint32_t* kb = sc.kb;
    if (nk > 32) {
      for (int c = 0; c < kChunks; ++c) {
        _tile_loadd(5, qt + c * 256, 64);
        _tile_loadd(4, kb + 0 * 16 * kRowDwords + 16 * c, kKbStride);
        _tile_loadd(6, kb + 1 * 16 * kRowDwords + 16 * c, kKbStride);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(7, kb + 2 * 16 * kRowDwords + 16 * c, kKbStride);
        _tile_dpbf16ps(1, 6, 5);
        _tile_loadd(4, kb + 3 * 16 * kRowDwords + 16 * c, kKbStride);
        _tile_dpbf16ps(2, 7, 5);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, sc.s + 0 * 256, 64);
      _tile_stored(1, sc.s + 1 * 256, 64);
      _tile_stored(2, sc.s + 2 * 256, 64);
      _tile_stored(3, sc.s + 3 * 256, 64);
    } else {
      for (int c = 0; c < kChunks; ++c) {
        _tile_loadd(5, qt + c * 256, 64);
        _tile_loadd(4, kb + 0 * 16 * kRowDwords + 16 * c, kKbStride);
        _tile_loadd(6, kb + 1 * 16 * kRowDwords + 16 * c, kKbStride);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 6, 5);
      }
      _tile_stored(0, sc.s + 0 * 256, 64);
      _tile_stored(1, sc.s + 1 * 256, 64);
    }
  }

  MLA_TARGET_AMX static void pv(Scratch& sc, float* O, int nk, int /*nh*/) {
    constexpr int kPaStride = kTileKeys / 2 * 4;  // bytes between rows of Pa
    constexpr int kVvStride = kVvRow * 4;  // bytes between key pairs of Vv
    constexpr int kOStride = kORow * 4;
    const uint32_t* vv = sc.vv;
    _tile_loadd(4, sc.pa, kPaStride);
    if (nk > 32) {
      _tile_loadd(5, sc.pa + 16, kPaStride);
      for (int n = 0; n < kHeadDimV / 16; n += 2) {
        _tile_loadd(0, O + 16 * n, kOStride);
        _tile_loadd(1, O + 16 * (n + 1), kOStride);
        _tile_loadd(2, vv + 16 * n, kVvStride);
        _tile_loadd(3, vv + 16 * (n + 1), kVvStride);
        _tile_dpbf16ps(0, 4, 2);
        _tile_loadd(6, vv + 16 * kVvRow + 16 * n, kVvStride);
        _tile_dpbf16ps(1, 4, 3);
        _tile_loadd(7, vv + 16 * kVvRow + 16 * (n + 1), kVvStride);
        _tile_dpbf16ps(0, 5, 6);
        _tile_dpbf16ps(1, 5, 7);
        _tile_stored(0, O + 16 * n, kOStride);
        _tile_stored(1, O + 16 * (n + 1), kOStride);
      }
    } else {
      for (int n = 0; n < kHeadDimV / 16; n += 2) {
        _tile_loadd(0, O + 16 * n, kOStride);
        _tile_loadd(1, O + 16 * (n + 1), kOStride);
        _tile_loadd(2, vv + 16 * n, kVvStride);
        _tile_loadd(3, vv + 16 * (n + 1), kVvStride);
        _tile_dpbf16ps(0, 4, 2);
        _tile_dpbf16ps(1, 4, 3);
        _tile_stored(0, O + 16 * n, kOStride);
        _tile_stored(1, O + 16 * (n + 1), kOStride);
      }
    }
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

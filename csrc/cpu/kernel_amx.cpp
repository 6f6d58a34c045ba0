// The AMX-BF16 path: the data flow of vec_avx512.h (the decode, the softmax and
// the layouts Qt, Kb, Vv, S, Pa stay AVX-512) with both products on
// tdpbf16ps, fp32 accumulation in the tiles. All eight tiles are configured
// as 16 rows x 64 bytes (palette 1): a bf16 operand tile is 16 x 32 values, an
// fp32 accumulator 16 x 16.
//
// Tiles of 128 keys (kTile), scored in blocks of 64 (kQkKeys).
//   QK: S (keys x rows) = Kb (keys x 576) . Qt. A block's 64 keys are decoded
//       into Kb (bf16: 64 consecutive cache rows are read in place),
//       then every group that sees them is scored with four accumulator tiles
//       (four independent tdpbf16ps chains, which the tile unit needs to run
//       at its rate): 4 groups x 1 sub-tile of 16 keys where 4 groups remain
//       (one A tile of Kb feeds four products), 2 x 2 for two, 1 x 4 sub-tiles
//       for the last group. Each accumulator is a whole 16 keys x 16 rows
//       block of S: stored straight into S, no partial sums.
//   PV: O (rows x 512) += Pa (rows x keys) . Vv. Per 16-dim chunk of O, the
//       C tiles of 4 (or 2) groups that see the same keys take every 32-key
//       step's product with one B tile of Vv (16 key pairs x 16 dims), so
//       each Vv tile is loaded once per group block; A = the group's Pa tile
//       of the step. A group alone (one head group, or a block whose groups
//       see different key counts) takes two 16-dim chunks at a time instead.
//       O is loaded into the C tiles and stored once per tile (zeroed
//       instead on the piece's first tile).
// The cache lines of the next block (64 keys ahead) are prefetched during a
// block's first QK call, spread over its 18 chunks (a burst would hold the
// miss buffers while the products wait), with the T0 hint: on the Xeon of
// docs/cpu-kernel.md it took 0.75-0.95x the time of T1 (L2 only) at H = 64
// and 128 and for bf16 at H = 16, 1.03-1.05x for fp8 and MXFP4 at H = 16.
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

constexpr int kTile = 128;   // keys per tile (softmax step, PV)
constexpr int kQkKeys = 64;  // keys decoded, then scored, together
constexpr int kPaGroup = 16 * kPaRow;             // dwords of one group's Pa
constexpr int kPfLines = kQkKeys * (kCacheRowBytes<KvFormat::kBf16> / 64 + 1);

// Per-thread buffers of an AMX piece (64-byte aligned; about 470 KB).
struct alignas(64) AmxScratch {
  uint32_t qt[kMaxGroupsPerPiece * kQtDwords];
  uint32_t kb[kQkKeys * kRowDwords];       // the block's decoded keys, row-major
  uint32_t vv[kTile / 2 * kVvRow];         // the tile's V in key pairs
  float s[kMaxGroupsPerPiece * kTile * 16];  // per group: [key][16 rows]
  uint32_t yt[kTile / 2 * 16];
  uint32_t pa[kMaxGroupsPerPiece * kPaGroup];  // per group: [row][key pair]
  float m2[kMaxGroupsPerPiece * 16];
  const char* pf[kPfLines];
};

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

MLA_TARGET_AMX void tiles_begin() {
  TileConfig cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// ---- QK ----------------------------------------------------------------------
// Scores `subs` sub-tiles of 16 keys (kq: their rows, kRowDwords apart) for
// `groups` groups (qt[g]: the group's Qt; so[g]: its S at the block's first
// key), subs x groups <= 4 accumulators in tmm0-3, A tiles (16 keys x 32 dims)
// in tmm4 / tmm5, B tiles (a chunk of Qt) in tmm6 / tmm7. The tile numbers
// of the intrinsics must be literals, hence one sequence per shape. pf / n_pf:
// cache lines to prefetch, spread over the chunks.
constexpr int kKbStride = kRowDwords * 4;  // bytes between key rows

MLA_TARGET_AMX void qk_tiles(int subs, int groups, const uint32_t* kq, const uint32_t* const* qt, float* const* so,
                             const char* const* pf, int n_pf) {
  const int pf_per_chunk = (n_pf + kChunks - 1) / kChunks;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
#define MLA_A(t, s) _tile_loadd(t, kq + (16 * (s)) * kRowDwords + 16 * c, kKbStride)
#define MLA_B(t, g) _tile_loadd(t, qt[g] + 256 * c, 64)
  for (int c = 0; c < kChunks; ++c) {
    for (int i = c * pf_per_chunk, e = std::min(n_pf, i + pf_per_chunk); i < e; ++i) _mm_prefetch(pf[i], _MM_HINT_T0);
    if (groups == 4) {  // one sub-tile, four groups
      MLA_A(4, 0);
      MLA_B(6, 0);
      _tile_dpbf16ps(0, 4, 6);
      MLA_B(7, 1);
      _tile_dpbf16ps(1, 4, 7);
      MLA_B(6, 2);
      _tile_dpbf16ps(2, 4, 6);
      MLA_B(7, 3);
      _tile_dpbf16ps(3, 4, 7);
    } else if (groups == 2) {  // one or two sub-tiles, two groups
      MLA_A(4, 0);
      MLA_B(6, 0);
      _tile_dpbf16ps(0, 4, 6);
      MLA_B(7, 1);
      _tile_dpbf16ps(1, 4, 7);
      if (subs == 2) {
        MLA_A(5, 1);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    } else {  // one group, one to four sub-tiles
      MLA_A(4, 0);
      MLA_B(6, 0);
      _tile_dpbf16ps(0, 4, 6);
      if (subs > 1) {
        MLA_A(5, 1);
        _tile_dpbf16ps(1, 5, 6);
      }
      if (subs > 2) {
        MLA_A(4, 2);
        _tile_dpbf16ps(2, 4, 6);
      }
      if (subs > 3) {
        MLA_A(5, 3);
        _tile_dpbf16ps(3, 5, 6);
      }
    }
  }
#undef MLA_A
#undef MLA_B
  // Accumulator (s, g) -> S of group g, keys 16 s ..
  if (groups == 4) {
    _tile_stored(0, so[0], 64);
    _tile_stored(1, so[1], 64);
    _tile_stored(2, so[2], 64);
    _tile_stored(3, so[3], 64);
  } else if (groups == 2) {
    _tile_stored(0, so[0], 64);
    _tile_stored(1, so[1], 64);
    if (subs == 2) {
      _tile_stored(2, so[0] + 256, 64);
      _tile_stored(3, so[1] + 256, 64);
    }
  } else {
    _tile_stored(0, so[0], 64);
    if (subs > 1) _tile_stored(1, so[0] + 256, 64);
    if (subs > 2) _tile_stored(2, so[0] + 512, 64);
    if (subs > 3) _tile_stored(3, so[0] + 768, 64);
  }
}

// ---- PV ----------------------------------------------------------------------
constexpr int kPaStride = kPaRow * 4;  // bytes between rows of Pa
constexpr int kVvStride = kVvRow * 4;  // bytes between key pairs of Vv
constexpr int kOStride = kORow * 4;

// O_g += Pa_g . Vv over `steps` 32-key steps for `groups` (4 or 2) groups
// that see the same keys: per 16-dim chunk n the groups' C tiles (tmm0-3) take
// each step's product with one B tile of Vv (tmm4 / tmm5 in turn), A = the
// group's Pa tile of the step (tmm6 / tmm7 in turn). Two groups take two
// chunks at a time (C tile (g, n + i) in tmm 2g + i).
MLA_TARGET_AMX void pv_groups(int groups, const AmxScratch& sc, const int* gi, float* const* O, int steps, bool first) {
  const uint32_t* vv = sc.vv;
  if (groups == 4) {
    const uint32_t* pa0 = sc.pa + gi[0] * kPaGroup;
    const uint32_t* pa1 = sc.pa + gi[1] * kPaGroup;
    const uint32_t* pa2 = sc.pa + gi[2] * kPaGroup;
    const uint32_t* pa3 = sc.pa + gi[3] * kPaGroup;
    for (int n = 0; n < kHeadDimV / 16; ++n) {
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else {
        _tile_loadd(0, O[0] + 16 * n, kOStride);
        _tile_loadd(1, O[1] + 16 * n, kOStride);
        _tile_loadd(2, O[2] + 16 * n, kOStride);
        _tile_loadd(3, O[3] + 16 * n, kOStride);
      }
      // One step: its Vv tile into tmm B, each group's Pa tile in turn into
      // tmm6 / tmm7 (the literal tile numbers are why this is a macro).
#define MLA_PV4_STEP(B, st)                                          \
  _tile_loadd(B, vv + (16 * (st)) * kVvRow + 16 * n, kVvStride);     \
  _tile_loadd(6, pa0 + 16 * (st), kPaStride);                        \
  _tile_dpbf16ps(0, 6, B);                                           \
  _tile_loadd(7, pa1 + 16 * (st), kPaStride);                        \
  _tile_dpbf16ps(1, 7, B);                                           \
  _tile_loadd(6, pa2 + 16 * (st), kPaStride);                        \
  _tile_dpbf16ps(2, 6, B);                                           \
  _tile_loadd(7, pa3 + 16 * (st), kPaStride);                        \
  _tile_dpbf16ps(3, 7, B);
      for (int st = 0; st < steps; st += 2) {
        MLA_PV4_STEP(4, st)
        if (st + 1 < steps) {
          MLA_PV4_STEP(5, st + 1)
        }
      }
#undef MLA_PV4_STEP
      _tile_stored(0, O[0] + 16 * n, kOStride);
      _tile_stored(1, O[1] + 16 * n, kOStride);
      _tile_stored(2, O[2] + 16 * n, kOStride);
      _tile_stored(3, O[3] + 16 * n, kOStride);
    }
  } else {  // two groups, chunks n and n + 1
    const uint32_t* pa0 = sc.pa + gi[0] * kPaGroup;
    const uint32_t* pa1 = sc.pa + gi[1] * kPaGroup;
    for (int n = 0; n < kHeadDimV / 16; n += 2) {
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else {
        _tile_loadd(0, O[0] + 16 * n, kOStride);
        _tile_loadd(1, O[0] + 16 * (n + 1), kOStride);
        _tile_loadd(2, O[1] + 16 * n, kOStride);
        _tile_loadd(3, O[1] + 16 * (n + 1), kOStride);
      }
      for (int st = 0; st < steps; ++st) {
        _tile_loadd(4, vv + (16 * st) * kVvRow + 16 * n, kVvStride);
        _tile_loadd(5, vv + (16 * st) * kVvRow + 16 * (n + 1), kVvStride);
        _tile_loadd(6, pa0 + 16 * st, kPaStride);
        _tile_dpbf16ps(0, 6, 4);
        _tile_dpbf16ps(1, 6, 5);
        _tile_loadd(7, pa1 + 16 * st, kPaStride);
        _tile_dpbf16ps(2, 7, 4);
        _tile_dpbf16ps(3, 7, 5);
      }
      _tile_stored(0, O[0] + 16 * n, kOStride);
      _tile_stored(1, O[0] + 16 * (n + 1), kOStride);
      _tile_stored(2, O[1] + 16 * n, kOStride);
      _tile_stored(3, O[1] + 16 * (n + 1), kOStride);
    }
  }
}

// One group: A tiles = its Pa of the steps (tmm4-7, loaded once), two 16-dim
// chunks of O at a time (tmm0 / tmm1), B = Vv (tmm2 / tmm3).
MLA_TARGET_AMX void pv_one(const uint32_t* pa, const AmxScratch& sc, float* O, int steps, bool first) {
  const uint32_t* vv = sc.vv;
  _tile_loadd(4, pa, kPaStride);
  if (steps > 1) _tile_loadd(5, pa + 16, kPaStride);
  if (steps > 2) _tile_loadd(6, pa + 32, kPaStride);
  if (steps > 3) _tile_loadd(7, pa + 48, kPaStride);
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

// ---- one piece -------------------------------------------------------------------
template <KvFormat F>
MLA_TARGET_AMX void run_piece_amx(const PieceArgs& a, const CallScales& cs) {
  static_assert(kTile <= kMaxTileKeys && kTile % kQkKeys == 0 && kQkKeys == 4 * kSubTile, "tile sizes");
  const MlaDecodeParams& p = *a.p;
  AmxScratch& sc = thread_scratch<AmxScratch>();
  begin_piece_state(a, sc.m2);
  const int32_t key_end = std::min(a.key_end, a.groups[a.ng - 1].visible);
  if (key_end <= a.key_begin) {
    end_piece_state(a, sc.m2);
    return;
  }
  for (int g = 0; g < a.ng; ++g) build_qt(p, a.groups[g], sc.qt + g * kQtDwords);
  const float logit_scale_log2 = cs.qk * kLog2e;
  tiles_begin();
  for (int32_t j0 = a.key_begin; j0 < key_end; j0 += kTile) {
    const int nv = std::min<int32_t>(kTile, key_end - j0);
    for (int kb0 = 0; kb0 < nv; kb0 += kQkKeys) {
      MLA_PROFILE_START();
      const int nb = std::min(kQkKeys, nv - kb0);
      const int subs = (nb + kSubTile - 1) / kSubTile;
      // A full block of bf16 rows in place: QK reads them straight from the cache.
      const uint32_t* in_place = nb == kQkKeys ? rows_in_place<F>(p, a.b, j0 + kb0, kQkKeys) : nullptr;
      const bool direct = in_place != nullptr;
      const uint32_t* kq = direct ? in_place : sc.kb;
      decode_keys<F>(p, a.b, j0, kb0, kb0 + nb, nv, !direct, sc);
      if (!direct) {
        // Rows past the block's keys up to its last sub-tile: zero (the
        // products of those rows are never read, but must not see garbage).
        const int decoded = (nb + 1) / 2 * 2;
        memset(sc.kb + decoded * kRowDwords, 0, sizeof(uint32_t) * (subs * kSubTile - decoded) * kRowDwords);
      }
      MLA_PROFILE_LAP(1, kDecode);
      int n_pf = 0;
      for (int k = 0; k < kQkKeys; k += kSubTile) n_pf += list_prefetch_lines<F>(p, a.b, j0 + kb0 + kQkKeys + k, key_end, sc.pf + n_pf);
      int g = 0;
      while (g < a.ng && a.groups[g].visible - j0 <= kb0) ++g;  // groups that see none of these keys
      const uint32_t* qt[4];
      float* so[4];
      for (; a.ng - g >= 4; g += 4) {
        for (int i = 0; i < 4; ++i) qt[i] = sc.qt + (g + i) * kQtDwords;
        for (int st = 0; st < subs; ++st) {
          for (int i = 0; i < 4; ++i) so[i] = sc.s + (g + i) * (kTile * 16) + 16 * (kb0 + kSubTile * st);
          qk_tiles(1, 4, kq + kSubTile * st * kRowDwords, qt, so, sc.pf, n_pf);
          n_pf = 0;  // the block's first call issues them
        }
      }
      if (a.ng - g >= 2) {
        for (int i = 0; i < 2; ++i) qt[i] = sc.qt + (g + i) * kQtDwords;
        for (int st = 0; st < subs; st += 2) {
          for (int i = 0; i < 2; ++i) so[i] = sc.s + (g + i) * (kTile * 16) + 16 * (kb0 + kSubTile * st);
          qk_tiles(std::min(2, subs - st), 2, kq + kSubTile * st * kRowDwords, qt, so, sc.pf, n_pf);
          n_pf = 0;
        }
        g += 2;
      }
      if (g < a.ng) {
        qt[0] = sc.qt + g * kQtDwords;
        so[0] = sc.s + g * (kTile * 16) + 16 * kb0;
        qk_tiles(subs, 1, kq, qt, so, sc.pf, n_pf);
      }
      MLA_PROFILE_LAP(1, kQk);
    }
    zero_v_tail(nv, sc);
    const bool first = j0 == a.key_begin;  // O is written, not accumulated
    int valid_v = nv;  // keys of the tile whose V is still in Vv
    // Groups from the latest token (most keys) down, in blocks of 4 (or 2)
    // that see the same keys of the tile and share the PV's Vv tiles.
    for (int ge = a.ng; ge > 0;) {
      const int nk_last = std::min<int32_t>(nv, a.groups[ge - 1].visible - j0);
      if (nk_last <= 0) break;  // earlier groups see fewer keys still
      int width = ge >= 4 ? 4 : ge >= 2 ? 2 : 1;
      while (width > 1 && std::min<int32_t>(nv, a.groups[ge - width].visible - j0) != nk_last) width /= 2;
      MLA_PROFILE_START();
      if (nk_last < valid_v) {
        zero_v_keys(nk_last, valid_v, sc);
        valid_v = nk_last;
      }
      int gi[4];
      float* O[4];
      for (int i = 0; i < width; ++i) {
        const int gg = ge - width + i;
        gi[i] = gg;
        O[i] = a.O + static_cast<int64_t>(gg) * kOFloats;
        float* s = sc.s + gg * (kTile * 16);
        const __m512 m_ref = softmax_update(nk_last, logit_scale_log2, s, sc.m2 + gg * 16, a.l + gg * 16, O[i], first);
        probs_pairs(nk_last, m_ref, s, a.l + gg * 16, sc.yt);
        for (int h = 0; h < (nk_last + 31) / 32 * 16; h += 16) {
          transpose16x16(sc.yt + h * 16, 16, sc.pa + gg * kPaGroup + h, kPaRow);
        }
      }
      MLA_PROFILE_LAP(1, kSoftmax);
      const int steps = (nk_last + 31) / 32;
      if (width == 1) pv_one(sc.pa + gi[0] * kPaGroup, sc, O[0], steps, first);
      else pv_groups(width, sc, gi, O, steps, first);
      MLA_PROFILE_LAP(1, kPv);
      ge -= width;
    }
  }
  _tile_release();
  end_piece_state(a, sc.m2);
}

}  // namespace

void piece_amx(const PieceArgs& a, const CallScales& s) {
  switch (a.p->format) {
    case KvFormat::kBf16: return run_piece_amx<KvFormat::kBf16>(a, s);
    case KvFormat::kFp8E4M3FN: return run_piece_amx<KvFormat::kFp8E4M3FN>(a, s);
    case KvFormat::kFp8E4M3FNUZ: return run_piece_amx<KvFormat::kFp8E4M3FNUZ>(a, s);
    case KvFormat::kMxfp4: return run_piece_amx<KvFormat::kMxfp4>(a, s);
  }
}

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

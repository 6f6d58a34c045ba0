// The split-KV kernel body for gfx950 (MI355X, CDNA4), on CDNA4's own matrix
// instructions. Included by mfma_kernel.cuh only when __gfx950__ is defined;
// gfx942 and gfx90a compile mfma_kernel.cuh's body. Same grid, block, split
// ranges, online softmax, epilogue and NaN / empty-row rules as that body
// (see its header); what differs is how the two products run:
//
//   QK  bf16 cache (and fnuz fp8, decoded to bf16 rows on the way to LDS):
//         v_mfma_f32_16x16x32_bf16, K from LDS, Q (bf16) in registers.
//       OCP fp8 / MXFP4 caches: v_mfma_scale_f32_16x16x128_f8f6f4 with the
//         cache's raw codes as matrix A (e4m3: CBSZ = 0; E2M1: CBSZ = 4, and
//         the rows' E8M0 block scales as A's scale operand) and Q as two fp8
//         e4m3 terms (BLGP = 0) with their own E8M0 scales as B's scale
//         operand. No cache value is decoded for QK.
//   PV  every format: v_mfma_f32_16x16x32_bf16, P in bf16 (as on gfx942's
//         bf16 path) and V expanded to bf16 in registers from the stage in
//         LDS: fp8 through v_cvt_scalef32_pk_bf16_fp8, E2M1 through
//         v_cvt_scalef32_pk_bf16_fp4, whose scale operand is the token's E8M0
//         block scale.
//
// Why V's block scales are folded into that convert and not into the MFMA:
// in PV the MFMA's K dimension is the token, and its scale operand attaches
// one E8M0 value to 32 consecutive K of one row of A (one value dim) or one
// column of B (one head). V's scales run the other way: one per token and
// 32-dim block of the value dim, so within any 32 tokens of one dim the scale
// changes from token to token and no scale operand can carry it. The two
// places it can go are P (P' = P 2^e, a different P' for each of the 16
// value blocks, each needing two fp8 terms to keep P's accuracy, on twice the
// MFMAs) or the bf16 expansion of V. The convert applies it exactly (E2M1
// times 2^k is a bf16 for every k the format can hold, up to overflow at
// 2^127 x 2..6), costs one VALU op per two values, and the bf16 PV MFMA runs
// at the same K rate as the two-term fp8 form would (16x16x32 in 16 cycles
// against 16x16x128 in 32 cycles, twice).
//
// Q as two fp8 terms (fp8 / MXFP4 caches). For each (head, wave) let E be
// the exponent of the largest |q| over the dims the wave multiplies, and
// x = q 2^se with se = 7 - E (so max |x| lies in [128, 256)):
//   hi = rne_e4m3(x),   lo = rne_e4m3(32 (x - hi))   (v_cvt_pk_fp8_f32),
//   B scale of hi: 2^-se (E8M0 127 - se); of lo: 2^-(se + 5) (122 - se),
// both applied by the MFMA after the block's dot product, so hi + lo / 32
// is what multiplies K. x - hi is exact in fp32; a bf16 x has 8 significant
// bits, hi keeps 4, so x - hi is a multiple of ulp_bf16(x) of magnitude at
// most half an fp8 ulp: at most 4 significant bits, and 32 (x - hi) <= 256
// is held exactly by e4m3 whenever its last bit is at or above the e4m3
// subnormal quantum 2^-9, i.e. whenever |x| >= 2^-7. Hence:
//   * every q with |q| >= 2^-14 max|q| (of its head and wave: |x| >= 2^-7
//     holds for them) enters the product exactly;
//   * smaller q err by at most half a quantum of lo, 2^-15 in x units, i.e.
//     <= 2^(E-22) <= 2^-22 max|q| absolute.
// gfx942's fp8 path (one scale, lo on hi's grid) is exact from 2^-9 max|q|
// and errs by <= 2^-17 max|q| below; this bound is tighter on both counts, so
// the scores, and the LSE, carry no Q error beyond fp32 accumulation: the LSE
// error is that of the softmax arithmetic, as on the bf16 path. se is clamped
// to [-126, 122]: only a max|q| below 2^-115 reaches the clamp (precision,
// not correctness, is then lost); inf / NaN q give NaN codes and NaN rows.
//
// Work split (4 waves, 32-token stages, as on gfx942):
//   Loads: the next stage's raw rows go to registers while this one is
//       computed; thread t takes the 16-byte chunks t % 8 + 8 s of row t / 8
//       (one row lookup and address per thread), then writes them to LDS.
//   QK  wave w: token tile nt = w & 1 (tokens 16 nt .. +15), part hh = w >> 1.
//       bf16 rows: dims [288 hh, +288) = 9 k-steps of 32.
//       fp8 / E2M1: the 576 dims are 4.5 k-steps of 128. Part 0 takes steps
//       0, 1 (dims 0..255) and the rope step, part 1 steps 2, 3 (dims
//       256..511); every main step runs twice (Q hi, Q lo). The rope step
//       puts the 64 rope dims in K positions 0..63 with Q's hi terms and
//       again in 64..127 with Q's lo terms (each block has its own B scale),
//       so hi and lo of the rope share one MFMA: 5 MFMAs for part 0, 4 for
//       part 1, 9 per 16 tokens instead of 10.
//       The two partial score tiles meet in LDS (red[hh]).
//   PV  wave w: value dims [128 w, +128) = 8 m-tiles; one k-step of 32
//       tokens. m-tile i, A row m: value dim 128 w + 8 m + i, so a lane reads
//       8 contiguous dims of each of its 8 tokens (row reads) and
//       redistributes them over the tiles (v_perm_b32, 32 per stage).
//
// Matrix layouts used (AMD, "CDNA4 Instruction Set Architecture", section
// 7.1.4 "General input and output layout", 7.1.5.1 "Dense Matrix Layouts:
// 8-bit and Smaller", 7.2.1 "MFMA with Block Exponent Scaling"); lane l,
// g = l / 16:
//   v_mfma_f32_16x16x32_bf16:  A[i][k]: lane i + 16 (k / 8), item k % 8
//     (8 bf16 = 4 VGPRs); B[k][j]: lane j + 16 (k / 8), item k % 8;
//     D[i][j]: lane j + 16 (i / 4), item i % 4.
//   v_mfma_scale_f32_16x16x128_f8f6f4, e4m3 operand (8 VGPRs):
//     A[i][k]: lane i + 16 ((k % 64) / 16), byte (k % 16) + 16 (k / 64).
//   E2M1 operand (4 VGPRs): A[i][k]: lane i + 16 (k / 32), nibble k % 32
//     (even k in the low nibble).
//   Scales: lane l supplies the E8M0 of row (A) / column (B) l % 16 for the
//     32 K values 32 g .. 32 g + 31 (byte 0 of the register: OPSEL 0).
//   D as for the bf16 instruction.
#pragma once

namespace mla_decode {
namespace cuda {
namespace mfma {
namespace gfx950 {

typedef int i32x8_t __attribute__((ext_vector_type(8)));
typedef __bf16 bf16x8_t __attribute__((ext_vector_type(8)));

// What a stage in LDS holds.
enum class Stage { kBf16Rows, kFp8Codes, kFp4Codes };

template <KvFormat F>
struct Traits {
  // fnuz fp8 cannot be read by gfx950's (OCP) fp8 MFMA: an fnuz 0x7F is 240,
  // which would be 480 in OCP units, over the OCP maximum 448. It is decoded
  // to bf16 rows (Fmt<F>::kFp8Ratio units) and takes the bf16 path.
  static constexpr Stage kStage = (F == KvFormat::kBf16 || F == KvFormat::kFp8E4M3FNUZ) ? Stage::kBf16Rows
                                  : F == KvFormat::kFp8E4M3FN                         ? Stage::kFp8Codes
                                                                                      : Stage::kFp4Codes;
  static constexpr bool kScaledQk = kStage != Stage::kBf16Rows;
  static constexpr int kRowBytes = kStage == Stage::kBf16Rows   ? 2 * kHeadDimQK
                                   : kStage == Stage::kFp8Codes ? kHeadDimQK
                                                                : kMxfp4RowBytes;
  // +16 bytes: the 16-byte A-operand reads of 8 consecutive rows at one
  // offset fall on 32 distinct banks (row strides 292, 148, 76 dwords).
  static constexpr int kRowStride = kRowBytes + 16;
  static constexpr int kFmtA = kStage == Stage::kFp4Codes ? 4 : 0;  // CBSZ: E2M1 or e4m3
};

constexpr int kScStride = 20;                // E8M0 bytes per LDS row (18 used)
constexpr int kPStride16 = kBlockN + 8;      // bf16 per P row: 20 dwords, conflict-free 16-byte reads
constexpr int kQkParts = 2;                  // partial score tiles per stage
constexpr int kBf16Steps = kHeadDimQK / 2 / 32;  // 9 k-steps of 32 per QK part (bf16 rows)
constexpr int kQkMainSteps = 2;              // k-steps of 128 per QK part besides the rope step
constexpr int kQLoShift = 5;                 // lo = rne(32 (x - hi))
constexpr int kQTopExp = 7;                  // max |x| in [2^7, 2^8)
static_assert(kBf16Steps * 32 * 2 == kHeadDimQK, "bf16 QK split");
static_assert(kQkMainSteps * 128 * 2 + 64 == kHeadDimQK, "fp8/E2M1 QK split: 4 steps of 128 + 64 rope dims");

template <Stage S>
struct alignas(16) Smem {
  uint8_t kv[kBlockN * Traits<S == Stage::kBf16Rows ? KvFormat::kBf16
                               : S == Stage::kFp8Codes ? KvFormat::kFp8E4M3FN
                                                       : KvFormat::kMxfp4>::kRowStride];
  uint8_t sc[S == Stage::kFp4Codes ? kBlockN * kScStride : 16];  // E8M0 of (token, block)
  float red[kQkParts][kTileRows][kRedStride];
  uint16_t p[kTileRows][kPStride16];
  int32_t flag[kBlockN];
  float alpha[kTileRows];
  float m[kTileRows];
  float l[kTileRows];
};
static_assert(sizeof(Smem<Stage::kBf16Rows>) <= MLA_MAX_SMEM_BYTES, "LDS budget exceeded");

__device__ __forceinline__ f32x4_t mfma_bf16_k32(u32x4_t a, u32x4_t b, f32x4_t c) {
  return __builtin_amdgcn_mfma_f32_16x16x32_bf16(__builtin_bit_cast(bf16x8_t, a), __builtin_bit_cast(bf16x8_t, b), c,
                                                 0, 0, 0);
}

// D = C + sum over the 4 K blocks of 2^(sa - 127) 2^(sb - 127) (A . B) of the
// block, A in format kFmtA (CBSZ), B e4m3 (BLGP = 0); sa / sb: this lane's
// E8M0 bytes (OPSEL 0: byte 0).
template <int kFmtA>
__device__ __forceinline__ f32x4_t mfma_scaled_k128(i32x8_t a, i32x8_t b, f32x4_t c, int sa, int sb) {
  return __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, kFmtA, 0, 0, sa, 0, sb);
}

// Two E2M1 codes (byte kByte of w) times 2^(e - 127), e the E8M0 byte, as a
// bf16 pair (low nibble in the low half). The instruction takes the exponent
// field of its float operand as the E8M0 scale, so the byte is shifted into
// place (e = 0 gives the float +0, exponent field 0: scale 2^-127).
template <int kByte>
__device__ __forceinline__ uint32_t fp4x2_to_bf16(uint32_t w, float scale) {
  return __builtin_bit_cast(uint32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(w, scale, kByte));
}
// Two OCP e4m3 codes (16-bit word kWord of w) as a bf16 pair, unscaled.
template <bool kWord>
__device__ __forceinline__ uint32_t fp8x2_to_bf16(uint32_t w) {
  return __builtin_bit_cast(uint32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(w, 1.0f, kWord));
}
__device__ __forceinline__ float e8m0_as_scale_operand(uint32_t e) { return __uint_as_float(e << 23); }

// The multiplier exponent se of a (head, wave) whose largest |q| is amax.
__device__ __forceinline__ int q_scale_exp(float amax) {
  const int e = static_cast<int>(__float_as_uint(amax) >> 23) - 127;  // floor(log2 amax); amax = 0: -127
  const int se = kQTopExp - e;
  return se < -126 ? -126 : se > 122 ? 122 : se;
}

// The Q split of two (already scaled) elements into 16-bit word kWord of
// `hi` and `lo`: hi = rne_e4m3(x), lo = rne_e4m3(32 (x - hi)), through
// v_cvt_pk_fp8_f32 (round to nearest even on the OCP grid, subnormals
// included; NaN and Inf give NaN with the kernel's FP16_OVFL = 0) and
// v_cvt_pk_f32_fp8 (exact) for hi's value.
template <bool kWord>
__device__ __forceinline__ void q_split2(float x0, float x1, int& hi, int& lo) {
  hi = __builtin_amdgcn_cvt_pk_fp8_f32(x0, x1, hi, kWord);
  const f32x2_t h = __builtin_amdgcn_cvt_pk_f32_fp8(hi, kWord);
  constexpr float kLo = static_cast<float>(1 << kQLoShift);
  lo = __builtin_amdgcn_cvt_pk_fp8_f32((x0 - h.x) * kLo, (x1 - h.y) * kLo, lo, kWord);
}

// 16 bf16 Q values (two u32x4, 8 bf16 each, element order) times qs = 2^se
// as hi codes (bytes 0..15 of `hi`) and lo codes (bytes 0..15 of `lo`).
__device__ __forceinline__ void q_split16(const u32x4_t v0, const u32x4_t v1, float qs, u32x4_t& hi, u32x4_t& lo) {
  int h[4] = {0, 0, 0, 0}, o[4] = {0, 0, 0, 0};
#pragma unroll
  for (int w = 0; w < 8; ++w) {  // bf16 word w = elements 2 w, 2 w + 1 -> byte pair 2 (w % 2) of dword w / 2
    const uint32_t bits = w < 4 ? v0[w] : v1[w - 4];
    const float x0 = __uint_as_float(bits << 16) * qs, x1 = __uint_as_float(bits & 0xffff0000u) * qs;
    if (w % 2) q_split2<true>(x0, x1, h[w / 2], o[w / 2]);
    else q_split2<false>(x0, x1, h[w / 2], o[w / 2]);
  }
  hi = u32x4_t{static_cast<uint32_t>(h[0]), static_cast<uint32_t>(h[1]), static_cast<uint32_t>(h[2]),
               static_cast<uint32_t>(h[3])};
  lo = u32x4_t{static_cast<uint32_t>(o[0]), static_cast<uint32_t>(o[1]), static_cast<uint32_t>(o[2]),
               static_cast<uint32_t>(o[3])};
}
__device__ __forceinline__ float amax16(const u32x4_t v0, const u32x4_t v1) {
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a = fmaxf(a, fmaxf(__builtin_fabsf(__uint_as_float(v0[j] << 16)), __builtin_fabsf(__uint_as_float(v0[j] & 0xffff0000u))));
    a = fmaxf(a, fmaxf(__builtin_fabsf(__uint_as_float(v1[j] << 16)), __builtin_fabsf(__uint_as_float(v1[j] & 0xffff0000u))));
  }
  return a;
}
__device__ __forceinline__ i32x8_t join8(u32x4_t lo, u32x4_t hi) {
  return i32x8_t{static_cast<int>(lo.x), static_cast<int>(lo.y), static_cast<int>(lo.z), static_cast<int>(lo.w),
                 static_cast<int>(hi.x), static_cast<int>(hi.y), static_cast<int>(hi.z), static_cast<int>(hi.w)};
}

template <KvFormat F>
__device__ __forceinline__ void split_kernel(const DecodeLaunch& args) {
  using Fm = Fmt<F>;
  using Tr = Traits<F>;
  constexpr Stage kStage = Tr::kStage;
  constexpr bool kScaled = Tr::kScaledQk;
  constexpr bool kMx = kStage == Stage::kFp4Codes;
  constexpr bool kFp8 = Fm::kFp8;
  constexpr int kStride = Tr::kRowStride;
  __shared__ Smem<kStage> smem;

  const MlaDecodeParams& p = args.p;
  const int tid = threadIdx.x;
  const int wave = tid / kWaveSize;
  const int lane = tid % kWaveSize;
  const int col = lane & 15;  // MFMA row (A) / column (B, D) of this lane
  const int g = lane >> 4;    // lane group: k range of A / B, row group of D

  const WorkItem work = locate_work<kBlockN>(args);
  const int t = work.t, h0 = work.h0, split = work.split, b = work.b;
  const bool orphan = work.orphan;
  const int kv_begin = work.kv_begin, kv_end = work.kv_end;
  const int n_tiles = ceil_div(kv_end - kv_begin, kBlockN);

  float scale_log2 = p.sm_scale * 1.4426950408889634f;  // log2(e)
  if constexpr (kFp8) scale_log2 *= *p.fp8_scale * Fm::kFp8Ratio;  // codes enter unscaled

  // ---- Q (B operand of S^T = K Q^T), registers, whole kernel --------------
  const int nt = wave & 1, hh = wave >> 1;  // QK: token tile, part
  const int qh = h0 + col;
  const bool q_valid = !orphan && qh < p.num_heads;
  const uint16_t* qrow = static_cast<const uint16_t*>(p.q) + static_cast<int64_t>(t) * p.q_stride_token +
                         static_cast<int64_t>(q_valid ? qh : 0) * p.q_stride_head;
  auto load_q8 = [&](int dim) -> u32x4_t {  // 8 bf16 from dim
    return q_valid ? *reinterpret_cast<const u32x4_t*>(qrow + dim) : u32x4_t{0u, 0u, 0u, 0u};
  };
  u32x4_t qf[kScaled ? 1 : kBf16Steps];            // bf16 rows: dims 288 hh + 32 kk + 8 g .. +7
  i32x8_t qhi[kScaled ? kQkMainSteps : 1], qlo[kScaled ? kQkMainSteps : 1], qrope;  // fp8 / E2M1
  int q_hi_e8 = 127, q_lo_e8 = 127;                // E8M0 scales of the two terms
  if constexpr (kScaled) {
    // Main step s = 2 hh + j: v0-3 = dims 128 s + 16 g .. +15, v4-7 = dims
    // 128 s + 64 + 16 g .. +15 (e4m3 B layout). Rope (part 0): dims 512 + 16 g .. +15.
    u32x4_t raw[kQkMainSteps][4], rope[2];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kQkMainSteps; ++j) {
      const int d = 128 * (kQkMainSteps * hh + j) + 16 * g;
      raw[j][0] = load_q8(d);
      raw[j][1] = load_q8(d + 8);
      raw[j][2] = load_q8(d + 64);
      raw[j][3] = load_q8(d + 72);
      amax = fmaxf(amax, fmaxf(amax16(raw[j][0], raw[j][1]), amax16(raw[j][2], raw[j][3])));
    }
    rope[0] = rope[1] = u32x4_t{0u, 0u, 0u, 0u};
    if (hh == 0) {
      rope[0] = load_q8(kHeadDimV + 16 * g);
      rope[1] = load_q8(kHeadDimV + 16 * g + 8);
      amax = fmaxf(amax, amax16(rope[0], rope[1]));
    }
    amax = fmaxf(amax, mla_shfl_xor(amax, 16));  // the 4 lanes of this head: the wave's dims
    amax = fmaxf(amax, mla_shfl_xor(amax, 32));
    const int se = q_scale_exp(amax);
    const float qs = __uint_as_float(static_cast<uint32_t>(se + 127) << 23);
    q_hi_e8 = 127 - se;
    q_lo_e8 = 127 - se - kQLoShift;
#pragma unroll
    for (int j = 0; j < kQkMainSteps; ++j) {
      u32x4_t h01, l01, h23, l23;
      q_split16(raw[j][0], raw[j][1], qs, h01, l01);
      q_split16(raw[j][2], raw[j][3], qs, h23, l23);
      qhi[j] = join8(h01, h23);
      qlo[j] = join8(l01, l23);
    }
    u32x4_t rh, rl;
    q_split16(rope[0], rope[1], qs, rh, rl);
    qrope = join8(rh, rl);  // K positions 0..63: hi terms, 64..127: lo terms
  } else {
#pragma unroll
    for (int kk = 0; kk < kBf16Steps; ++kk) qf[kk] = load_q8(288 * hh + 32 * kk + 8 * g);
  }
  // Rope step: K blocks 0, 1 carry Q's hi terms, blocks 2, 3 its lo terms;
  // lane group g supplies block g's B scale.
  const int q_rope_e8 = g < 2 ? q_hi_e8 : q_lo_e8;

  // ---- stage loader: global -> registers (prefetch), registers -> LDS ----
  const uint8_t* kv_base = static_cast<const uint8_t*>(p.kv);
  auto tile_row = [&](int tile_idx) -> int {  // -2: past the range, -1: bad index
    const int j = kv_begin + tile_idx * kBlockN + (lane & 31);
    if (j >= kv_end) return -2;
    const int64_t r = kv_row(p, b, j);
    return r < 0 ? -1 : static_cast<int>(r);
  };
  // Each thread loads 16-byte chunks of one row: row ld_n = tid / 8, chunks
  // ld_c + 8 s (8 threads per row, 128 contiguous bytes per load), so one
  // shuffle and one 64-bit row address serve all of its chunks.
  constexpr int kRowThreadsLd = kThreads / kBlockN;  // 8
  constexpr int kLdSlots = (Fm::kChunksPerRow + kRowThreadsLd - 1) / kRowThreadsLd;  // bf16 9, fp8 5, MXFP4 3
  static_assert(kRowThreadsLd * kBlockN == kThreads, "loader: whole rows per thread group");
  const int ld_n = tid / kRowThreadsLd, ld_c = tid % kRowThreadsLd;
  int pf_row = -2;
  u32x4_t raw[kLdSlots];
  uint32_t mx_e[kLdSlots];
  auto issue_tile = [&](int tile_idx) {
    pf_row = tile_row(tile_idx);
    const int r = mla_shfl(pf_row, ld_n);
    const int64_t ra = max(r, 0);  // addresses are formed for every row, loads only for r >= 0
    const uint8_t* src = kv_base + ra * p.kv_row_stride_bytes + 16 * ld_c;
    const uint8_t* ssrc = kMx ? p.mx_scale + ra * p.mx_scale_stride_row +
                                    static_cast<int64_t>(ld_c) * p.mx_scale_stride_col
                              : nullptr;
#pragma unroll
    for (int s = 0; s < kLdSlots; ++s) {
      const int ch = ld_c + kRowThreadsLd * s;
      raw[s] = u32x4_t{0u, 0u, 0u, 0u};
      mx_e[s] = 127u;  // 2^0: a zero-filled row stays +0
      if (ch < Fm::kChunksPerRow && r >= 0) {
        raw[s] = *reinterpret_cast<const u32x4_t*>(src + 16 * kRowThreadsLd * s);
        if constexpr (kMx) mx_e[s] = ssrc[static_cast<int64_t>(kRowThreadsLd * s) * p.mx_scale_stride_col];
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int s = 0; s < kLdSlots; ++s) {
      const int ch = ld_c + kRowThreadsLd * s;
      if (ch >= Fm::kChunksPerRow) continue;
      const u32x4_t w = raw[s];
      if constexpr (F == KvFormat::kFp8E4M3FNUZ) {  // 16 codes -> 16 bf16 (32 bytes)
        u32x2_t* dst = reinterpret_cast<u32x2_t*>(smem.kv + ld_n * kStride + ch * 32);
        dst[0] = fp8x4_to_bf16<F>(w.x);
        dst[1] = fp8x4_to_bf16<F>(w.y);
        dst[2] = fp8x4_to_bf16<F>(w.z);
        dst[3] = fp8x4_to_bf16<F>(w.w);
      } else {  // raw bytes
        *reinterpret_cast<u32x4_t*>(smem.kv + ld_n * kStride + ch * 16) = w;
        if constexpr (kMx) smem.sc[ld_n * kScStride + ch] = static_cast<uint8_t>(mx_e[s]);
      }
    }
    if (wave == 0 && lane < kBlockN) smem.flag[lane] = pf_row == -1 ? 1 : 0;
  };

  if (n_tiles > 0) issue_tile(0);

  f32x4_t o[kVTiles];
#pragma unroll
  for (int j = 0; j < kVTiles; ++j) o[j] = f32x4_t{0.f, 0.f, 0.f, 0.f};
  float m_run = -MLA_INF;
  float l_run = 0.f;
  const int sm_row = tid / kRowThreads;
  const int sm_col = (tid % kRowThreads) * 2;

  for (int it = 0; it < n_tiles; ++it) {
    __syncthreads();  // (A) everyone finished PV of stage it-1: the LDS tile is free
    store_tile();
    if (it + 1 < n_tiles) issue_tile(it + 1);  // in flight during this stage's math
    __syncthreads();  // (B) stage it visible

    // ---- 1. partial S^T = K Q^T (token tile nt, part hh) -------------------
    {
      f32x4_t acc = f32x4_t{0.f, 0.f, 0.f, 0.f};
      const int krow_idx = 16 * nt + col;
      const uint8_t* krow = smem.kv + krow_idx * kStride;
      if constexpr (kScaled) {
        const uint8_t* ksc = smem.sc + krow_idx * kScStride;
#pragma unroll
        for (int j = 0; j < kQkMainSteps; ++j) {
          const int s = kQkMainSteps * hh + j;
          i32x8_t a;
          int sa = 127;  // e4m3 K: unscaled (the per-tensor scale is in scale_log2)
          if constexpr (kMx) {  // block 4 s + g: 16 bytes, and its E8M0
            const u32x4_t c = *reinterpret_cast<const u32x4_t*>(krow + 16 * (4 * s + g));
            a = join8(c, u32x4_t{0u, 0u, 0u, 0u});  // E2M1: only v0-3 are read
            sa = ksc[4 * s + g];
          } else {  // dims 128 s + 16 g .. +15 and 128 s + 64 + 16 g .. +15
            a = join8(*reinterpret_cast<const u32x4_t*>(krow + 128 * s + 16 * g),
                      *reinterpret_cast<const u32x4_t*>(krow + 128 * s + 64 + 16 * g));
          }
          acc = mfma_scaled_k128<Tr::kFmtA>(a, qhi[j], acc, sa, q_hi_e8);
          acc = mfma_scaled_k128<Tr::kFmtA>(a, qlo[j], acc, sa, q_lo_e8);
        }
        if (hh == 0) {  // rope dims 512..575, twice (hi and lo terms of Q)
          i32x8_t a;
          int sa = 127;
          if constexpr (kMx) {  // K block position g = rope block g & 1
            const u32x4_t c = *reinterpret_cast<const u32x4_t*>(krow + kHeadDimV / 2 + 16 * (g & 1));
            a = join8(c, u32x4_t{0u, 0u, 0u, 0u});
            sa = ksc[kHeadDimV / kMxBlock + (g & 1)];
          } else {  // positions 0..63 and 64..127: the same 64 rope bytes
            const u32x4_t c = *reinterpret_cast<const u32x4_t*>(krow + kHeadDimV + 16 * g);
            a = join8(c, c);
          }
          acc = mfma_scaled_k128<Tr::kFmtA>(a, qrope, acc, sa, q_rope_e8);
        }
      } else {
        const uint8_t* kq = krow + 2 * (288 * hh + 8 * g);
#pragma unroll
        for (int kk = 0; kk < kBf16Steps; ++kk) {
          acc = mfma_bf16_k32(*reinterpret_cast<const u32x4_t*>(kq + 64 * kk), qf[kk], acc);
        }
      }
      // D: tokens 16 nt + 4 g .. +3 of head col.
      *reinterpret_cast<f32x4_t*>(&smem.red[hh][col][16 * nt + 4 * g]) = acc;
    }
    __syncthreads();  // (C) partial scores visible

    // ---- 2. online softmax: 16 threads per row, 2 tokens each --------------
    {
      float sv[2] = {0.f, 0.f};
#pragma unroll
      for (int w = 0; w < kQkParts; ++w) {
        const f32x2_t x = *reinterpret_cast<const f32x2_t*>(&smem.red[w][sm_row][sm_col]);
        sv[0] += x.x;
        sv[1] += x.y;
      }
      float pv[2];
      const float alpha = softmax_step<kRowThreads>(sv, kv_begin + it * kBlockN + sm_col, kv_end,
                                                    &smem.flag[sm_col], scale_log2, pv, m_run, l_run);
      *reinterpret_cast<uint32_t*>(&smem.p[sm_row][sm_col]) = mla_pack_bf16x2(pv[0], pv[1]);
      if (tid % kRowThreads == 0) smem.alpha[sm_row] = alpha;
    }
    __syncthreads();  // (D) P and alpha visible

    // ---- 3. O^T = alpha O^T + V^T P^T over this wave's 128 value dims -------
    {
      const float alpha = smem.alpha[col];
#pragma unroll
      for (int j = 0; j < kVTiles; ++j) o[j] *= alpha;
      // x[e][j]: bf16 pair of dims 128 wave + 8 col + 2 j, +1 of token 8 g + e.
      const int dim0 = kVDimsPerWave * wave + 8 * col;
      uint32_t x[8][4];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint8_t* row = smem.kv + (8 * g + e) * kStride;
        if constexpr (kStage == Stage::kBf16Rows) {
          const u32x4_t v = *reinterpret_cast<const u32x4_t*>(row + 2 * dim0);
          x[e][0] = v.x;
          x[e][1] = v.y;
          x[e][2] = v.z;
          x[e][3] = v.w;
        } else if constexpr (kStage == Stage::kFp8Codes) {
          const u32x2_t v = *reinterpret_cast<const u32x2_t*>(row + dim0);
          x[e][0] = fp8x2_to_bf16<false>(v.x);
          x[e][1] = fp8x2_to_bf16<true>(v.x);
          x[e][2] = fp8x2_to_bf16<false>(v.y);
          x[e][3] = fp8x2_to_bf16<true>(v.y);
        } else {
          const uint32_t v = *reinterpret_cast<const uint32_t*>(row + dim0 / 2);
          const float sc = e8m0_as_scale_operand(smem.sc[(8 * g + e) * kScStride + dim0 / kMxBlock]);
          x[e][0] = fp4x2_to_bf16<0>(v, sc);
          x[e][1] = fp4x2_to_bf16<1>(v, sc);
          x[e][2] = fp4x2_to_bf16<2>(v, sc);
          x[e][3] = fp4x2_to_bf16<3>(v, sc);
        }
      }
      // B: P of head col, tokens 8 g .. +7.
      const u32x4_t pb = *reinterpret_cast<const u32x4_t*>(&smem.p[col][8 * g]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // m-tile 2 j + half, row col = dim 128 wave + 8 col + 2 j + half;
          // register r: tokens 8 g + 2 r (low half), 8 g + 2 r + 1 (high half).
          const uint32_t sel = half ? 0x07060302u : 0x05040100u;
          const u32x4_t a = u32x4_t{perm_bytes(x[1][j], x[0][j], sel), perm_bytes(x[3][j], x[2][j], sel),
                                    perm_bytes(x[5][j], x[4][j], sel), perm_bytes(x[7][j], x[6][j], sel)};
          o[2 * j + half] = mfma_bf16_k32(a, pb, o[2 * j + half]);
        }
      }
    }
  }

  // ---- epilogue --------------------------------------------------------------
  if (tid % kRowThreads == 0) {
    smem.m[sm_row] = m_run;
    smem.l[sm_row] = l_run;
  }
  __syncthreads();
  const int h = h0 + col;
  if (h >= p.num_heads) return;
  float out_scale = 1.f;
  if constexpr (kFp8) out_scale = *p.fp8_scale * Fm::kFp8Ratio;
  store_head_outputs<true>(args, t, h, split, wave, g, o, smem.m[col], smem.l[col], out_scale, orphan);
}

}  // namespace gfx950
}  // namespace mfma
}  // namespace cuda
}  // namespace mla_decode

// Host emulation of the small part of HIP that the (hipified) mla_decode
// kernels use, so that scripts/hip_check.sh can *run* the AMD kernel code on a
// machine without an AMD GPU and compare it with a float64 reference.
//
// Not a HIP implementation: just enough for these kernels.
//   * A workgroup runs as blockDim.x cooperative fibers (ucontext for the
//     first entry, _setjmp/_longjmp afterwards) in one OS thread;
//     __syncthreads() is a workgroup barrier, every cross-lane operation
//     (__shfl, __shfl_xor, MFMA) is a barrier of the lanes of the wave. As
//     with an exec mask, a lane that has returned, or that waits at
//     __syncthreads while others of its wave run a cross-lane operation in a
//     branch, does not take part (its slot keeps its last value). Divergent
//     branches that both use cross-lane operations are not modelled. Waves
//     are scheduled in random subsets (HIP_EMU_SEED) so that a missing
//     __syncthreads shows up as a wrong result.
//   * __shared__ becomes `static`: workgroups run one after another.
//   * Every instruction builtin is computed from AMD's documented semantics,
//     never from the kernels' code:
//       - v_mfma_f32_16x16x16bf16_1k (gfx90a / gfx942) and
//         v_mfma_f32_16x16x32_fp8_fp8 (gfx942: fnuz; gfx950: OCP) from their
//         lane layouts (A row l%16 k 4(l/16)..+3, resp. 8(l/16)..+7; D col
//         l%16 rows 4(l/16)..+3), exact products accumulated in double;
//       - v_cvt_pk_f32_fp8 as the target's flavour, v_perm_b32 (CDNA3 ISA);
//       - gfx950 only (CDNA4 ISA; the sections are listed at that block):
//         v_mfma_scale_f32_16x16x128_f8f6f4 and its unscaled opcode,
//         v_mfma_f32_16x16x32_bf16, v_cvt_scalef32_pk_bf16_fp4 / _fp8 and
//         v_cvt_pk_fp8_f32.
//     The small-float decoders here are written independently of
//     csrc/common/formats.h, against which emu_main.cpp tests them.
// Compile the hipified sources as C++ with -I<this dir> ahead of any real HIP
// include path, and -D__HIPCC__ -D__HIP_PLATFORM_AMD__=1 -D__gfx942__ (or
// -D__gfx950__). Needs clang (ext_vector_type).
#pragma once

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef int hipError_t;
constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorInvalidValue = 1;
constexpr hipError_t hipErrorInvalidConfiguration = 9;
typedef struct emu_stream_t* hipStream_t;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
template <typename T>
inline T __ldg(const T* p) { return *p; }

namespace emu {

constexpr int kWave = 64;
constexpr size_t kStackBytes = 256 * 1024;

struct Idx { unsigned x, y, z; };

struct Fiber {
  jmp_buf jb;
  ucontext_t uc;
  bool started = false;
  bool done = false;
  Idx tid{0, 0, 0};
  std::vector<char> stack;
};

struct Barrier {
  int expected = 0;
  int arrived = 0;
  uint64_t gen = 0;
};

// Per-thread exchange slot: the largest operand set a cross-lane operation
// publishes (the scaled MFMA: two 32-byte operands and two scale registers).
typedef std::array<uint64_t, 10> Slot;

struct State {
  std::vector<int> cta_waiting;  // per wave: lanes blocked at __syncthreads
  std::vector<Fiber> fibers;
  int cur = -1;
  jmp_buf sched;
  Idx block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
  Barrier cta;
  std::vector<Barrier> waves;
  std::vector<Slot> xfer;  // one exchange slot per thread for cross-lane ops
  uint64_t progress = 0;
  const std::function<void()>* body = nullptr;
  uint64_t blocks_run = 0;
};

inline State& state() {
  static State s;
  return s;
}

inline void yield() {
  State& s = state();
  if (!_setjmp(s.fibers[s.cur].jb)) _longjmp(s.sched, 1);
}

// Releases wave w's barrier when every live lane of the wave is either in it
// or blocked at __syncthreads (those are masked off for the operation).
inline void try_release_wave(int w) {
  State& s = state();
  Barrier& b = s.waves[w];
  if (b.arrived > 0 && b.arrived + s.cta_waiting[w] >= b.expected) {
    b.arrived = 0;
    ++b.gen;
  }
}

inline int lane_id() { return state().cur % kWave; }
inline int wave_id() { return state().cur / kWave; }

inline void wave_barrier() {
  State& s = state();
  const int w = wave_id();
  Barrier& b = s.waves[w];
  ++s.progress;
  const uint64_t g = b.gen;
  ++b.arrived;
  try_release_wave(w);
  while (b.gen == g) yield();
}

inline void cta_barrier() {
  State& s = state();
  Barrier& b = s.cta;
  ++s.progress;
  const uint64_t g = b.gen;
  if (++b.arrived >= b.expected) {
    b.arrived = 0;
    ++b.gen;
    std::fill(s.cta_waiting.begin(), s.cta_waiting.end(), 0);  // all released at once
    return;
  }
  const int w = wave_id();
  ++s.cta_waiting[w];
  try_release_wave(w);
  while (b.gen == g) yield();
}

// Value of `v` at lane `src` (0..63) of the caller's wave.
template <typename T>
inline T exchange(const T& v, int src) {
  static_assert(sizeof(T) <= sizeof(Slot), "exchange slot");
  State& s = state();
  memcpy(s.xfer[s.cur].data(), &v, sizeof(T));
  wave_barrier();
  T r;
  memcpy(&r, s.xfer[wave_id() * kWave + (src & (kWave - 1))].data(), sizeof(T));
  wave_barrier();
  return r;
}

[[noreturn]] inline void fiber_exit() {
  State& s = state();
  Fiber& f = s.fibers[s.cur];
  f.done = true;
  ++s.progress;
  const int w = s.cur / kWave;
  --s.waves[w].expected;
  try_release_wave(w);
  if (--s.cta.expected > 0 && s.cta.arrived > 0 && s.cta.arrived >= s.cta.expected) {
    s.cta.arrived = 0;
    ++s.cta.gen;
    std::fill(s.cta_waiting.begin(), s.cta_waiting.end(), 0);
  }
  _longjmp(s.sched, 1);
}

inline void fiber_entry() {
  (*state().body)();
  fiber_exit();
}

inline void run_block(const std::function<void()>& body, int threads) {
  State& s = state();
  if (static_cast<int>(s.fibers.size()) < threads) s.fibers.resize(threads);
  s.xfer.assign(threads, {});
  const int nwaves = (threads + kWave - 1) / kWave;
  s.waves.assign(nwaves, Barrier{});
  s.cta_waiting.assign(nwaves, 0);
  for (int w = 0; w < nwaves; ++w) s.waves[w].expected = std::min(kWave, threads - w * kWave);
  s.cta = Barrier{};
  s.cta.expected = threads;
  s.body = &body;
  for (int i = 0; i < threads; ++i) {
    Fiber& f = s.fibers[i];
    f.started = false;
    f.done = false;
    f.tid = Idx{static_cast<unsigned>(i), 0, 0};
    if (f.stack.empty()) f.stack.resize(kStackBytes);
  }
  // Scheduling: in two rounds out of three only a random subset of the waves
  // runs, so that some waves get far ahead of others (up to the next
  // __syncthreads) and a missing workgroup barrier shows up as wrong results.
  // Deadlock is judged on the full rounds. Deterministic (HIP_EMU_SEED).
  static const uint64_t seed = getenv("HIP_EMU_SEED") ? strtoull(getenv("HIP_EMU_SEED"), nullptr, 0) : 1;
  uint64_t rng = seed * 0x9E3779B97F4A7C15ull + s.blocks_run + 1;
  auto next = [&rng]() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int alive = threads;
  while (alive > 0) {
    const uint64_t before = s.progress;
    const bool full = next() % 3 == 0;
    uint64_t run_waves = full ? ~0ull : next();
    if (!full && (run_waves & ((1ull << nwaves) - 1)) == 0) run_waves = 1ull << (next() % nwaves);
    for (int i = 0; i < threads; ++i) {
      Fiber& f = s.fibers[i];
      if (f.done || !((run_waves >> (i / kWave)) & 1)) continue;
      s.cur = i;
      if (!_setjmp(s.sched)) {
        if (!f.started) {
          f.started = true;
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = f.stack.data();
          f.uc.uc_stack.ss_size = f.stack.size();
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, fiber_entry, 0);
          setcontext(&f.uc);
        } else {
          _longjmp(f.jb, 1);
        }
      }
      if (f.done) --alive;
    }
    if (full && alive > 0 && s.progress == before) {
      fprintf(stderr, "hip_emu: deadlock in block (%u, %u): %d threads wait at barriers nobody else reaches\n",
              s.block_idx.x, s.block_idx.y, alive);
      abort();
    }
  }
  s.cur = -1;
  ++s.blocks_run;
}

template <typename... P, typename... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, A&&... a) {
  if (block.y != 1 || block.z != 1 || grid.z != 1) {
    fprintf(stderr, "hip_emu: only 1-D blocks and 2-D grids are emulated\n");
    abort();
  }
  std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
  const std::function<void()> body = [&]() { std::apply(kernel, args); };
  State& s = state();
  s.grid_dim = Idx{grid.x, grid.y, 1};
  s.block_dim = Idx{block.x, 1, 1};
  for (unsigned y = 0; y < grid.y; ++y) {
    for (unsigned x = 0; x < grid.x; ++x) {
      s.block_idx = Idx{x, y, 0};
      run_block(body, static_cast<int>(block.x));
    }
  }
}

// ---- gfx90a / gfx942 matrix and conversion instructions ---------------------
typedef short bf16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef float f32x2 __attribute__((ext_vector_type(2)));

inline double bf16_to_double(short h) {
  const uint32_t u = static_cast<uint32_t>(static_cast<uint16_t>(h)) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// One 16x16xK MFMA of a wave, in double precision: every lane publishes its
// A and B operands (`Operands`, one register each of kPerLane elements), then
// lane l computes D[i][j] = C + sum_k A[i][k] B[k][j] for its four elements
// i = 4 (l / 16) + r, j = l % 16. A[i][k] is element k % kPerLane of lane
// i + 16 (k / kPerLane)'s A register, B[k][j] of lane j + 16 (k / kPerLane)'s
// B register; `element(reg, e)` decodes element e of a register to double.
template <int kK, int kPerLane, typename Operands, typename Element>
inline f32x4 mfma_16x16(const Operands& mine, f32x4 c, int cbsz, int abid, int blgp, Element element) {
  static_assert(sizeof(Operands) <= sizeof(Slot), "operands fit the exchange slot");
  if (cbsz != 0 || abid != 0 || blgp != 0) {
    fprintf(stderr, "hip_emu: MFMA broadcast modifiers are not emulated\n");
    abort();
  }
  State& s = state();
  memcpy(s.xfer[s.cur].data(), &mine, sizeof(Operands));
  wave_barrier();
  const int l = lane_id(), base = wave_id() * kWave;
  f32x4 d;
  for (int r = 0; r < 4; ++r) {
    const int i = 4 * (l / 16) + r, j = l % 16;
    double acc = c[r];
    for (int k = 0; k < kK; ++k) {
      Operands la, lb;
      memcpy(&la, s.xfer[base + i + 16 * (k / kPerLane)].data(), sizeof(Operands));
      memcpy(&lb, s.xfer[base + j + 16 * (k / kPerLane)].data(), sizeof(Operands));
      acc += element(la.a, k % kPerLane) * element(lb.b, k % kPerLane);
    }
    d[r] = static_cast<float>(acc);
  }
  wave_barrier();
  return d;
}

// v_mfma_f32_16x16x16bf16_1k: A, B are 4 bf16 per lane.
inline f32x4 mfma_f32_16x16x16bf16_1k(bf16x4 a, bf16x4 b, f32x4 c, int cbsz, int abid, int blgp) {
  struct AB { bf16x4 a, b; };
  return mfma_16x16<16, 4>(AB{a, b}, c, cbsz, abid, blgp,
                           [](const bf16x4& v, int e) { return bf16_to_double(v[e]); });
}

inline float fp8_decode(uint32_t v) {
  const int sign = (v >> 7) & 1, e = (v >> 3) & 15, m = v & 7;
#if defined(__gfx950__)  // OCP e4m3fn: bias 7, S.1111.111 is NaN
  if (e == 15 && m == 7) return NAN;
  const float mag = e == 0 ? ldexpf(m / 8.f, -6) : ldexpf(1.f + m / 8.f, e - 7);
#elif defined(__gfx942__)  // e4m3fnuz: bias 8, 0x80 is the only NaN
  if (v == 0x80) return NAN;
  const float mag = e == 0 ? ldexpf(m / 8.f, -7) : ldexpf(1.f + m / 8.f, e - 8);
#else
#error "hip_emu: define __gfx942__ or __gfx950__"
#endif
  return sign ? -mag : mag;
}

// v_mfma_f32_16x16x32_fp8_fp8 (CDNA3 / CDNA4): D = A (16x32) B (32x16) + C,
// A[i][k] = byte k % 8 of lane i + 16 (k / 8), B[k][j] = byte k % 8 of lane
// j + 16 (k / 8), D[i][j] = element i % 4 of lane j + 16 (i / 4).
inline f32x4 mfma_f32_16x16x32_fp8_fp8(long a, long b, f32x4 c, int cbsz, int abid, int blgp) {
  struct AB { uint64_t a, b; };
  return mfma_16x16<32, 8>(AB{static_cast<uint64_t>(a), static_cast<uint64_t>(b)}, c, cbsz, abid, blgp,
                           [](uint64_t v, int e) { return static_cast<double>(fp8_decode((v >> (8 * e)) & 0xff)); });
}

inline f32x2 cvt_pk_f32_fp8(int src, bool word_sel) {
  const uint32_t w = static_cast<uint32_t>(src) >> (word_sel ? 16 : 0);
  return f32x2{fp8_decode(w & 0xff), fp8_decode((w >> 8) & 0xff)};
}

// v_perm_b32 (CDNA3 ISA): byte i of the result is byte_permute({s0, s1}, sel.byte[i]):
// 0-7 a byte of s0:s1 (s1 = bytes 0-3), 8-11 the sign of byte 1/3/5/7 replicated,
// 12 zero, 13+ 0xFF.
inline uint32_t perm(uint32_t s0, uint32_t s1, uint32_t sel) {
  const uint64_t q = (static_cast<uint64_t>(s0) << 32) | s1;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = (sel >> (8 * i)) & 0xff;
    uint32_t b;
    if (c >= 13) b = 0xff;
    else if (c == 12) b = 0;
    else if (c >= 8) b = ((q >> ((c - 8) * 16 + 15)) & 1) ? 0xff : 0;
    else b = (q >> (8 * c)) & 0xff;
    d |= b << (8 * i);
  }
  return d;
}

#if defined(__gfx950__)
// ---- gfx950 (CDNA4) instructions ---------------------------------------------
// Written from AMD, "AMD Instinct CDNA4 Instruction Set Architecture" (reference
// guide, August 2025), not from the kernels:
//   * 7.1.4   General input and output layout (A[i][k] in item k % K_L of lane
//             i + M (k / K_L); D[i][j] in item i % 4 of lane j + 16 (i / 4) for
//             16 x 16 outputs);
//   * 7.1.5   8-bit and smaller operations: CBSZ[2:0] / BLGP[2:0] select the A / B
//             format (0 E4M3, 1 E5M2, 2 E2M3, 3 E3M2, 4 E2M1), denorms kept on
//             input and output, RNE, no broadcast; ABID[0] = 0 (the unscaled
//             opcode) forces every scale to 1.0;
//   * 7.1.5.1 Dense layouts: E4M3 / E5M2 16x16x128: lane group g (lanes 16 g ..
//             16 g + 15 = rows / columns 0..15) holds k = 16 g .. 16 g + 15 in
//             v0-v3 and 64 + 16 g .. 64 + 16 g + 15 in v4-v7; E2M3 / E3M2 / E2M1:
//             k = 32 g .. 32 g + 31 (items 0..31 densely packed: 6 VGPRs / 4
//             VGPRs); BF16 16x16x32: k = 8 g .. 8 g + 7 in v0-v3;
//   * 7.2, 7.2.1 Block scaling: one E8M0 (bias 127, 0xFF = NaN) per 32 K of a
//             row of A / column of B, lane l supplying row / column l % 16 for
//             K = 32 (l / 16) .. +31, OPSEL choosing the byte of the register;
//             "the scales are applied after the normal dot product prior to
//             output / accumulation";
//   * 7.3 Table 30 (small float formats: biases, NaN / Inf codes, maxima),
//     7.4 (types narrower than 32 bits never flush denormals);
//   * 12.11 V_CVT_PK_FP8_F32 (opcode 674), see cvt_pk_fp8_f32 below;
//   * 12.11 V_CVT_SCALEF32_PK_BF16_FP4 (opcode 593) and _PK_BF16_FP8 (617):
//     scale = exponent field of the float operand, taken as an E8M0 value;
//     OPSEL[1:0] (FP4: the source byte) / OPSEL[0] (FP8: the source word);
//     element 0 to bits 15:0.
// Products of these formats are exact in double and a K block of 32 of them
// sums exactly; the emulation rounds once, to fp32 (RNE), after the scaled
// block sums and C are added (in double). The hardware's internal
// accumulation order is not documented: results may differ in the last bits.
// Not documented, and not reached by the kernels' data: the converts' result
// for a value beyond the bf16 range (here: +-inf).

typedef int i32x8 __attribute__((ext_vector_type(8)));
// bf16 operands and results travel as raw bits: the host compiler moves
// __bf16 vector elements through float conversions (quieting NaN payloads).
typedef std::array<uint16_t, 8> Bf16x8Bits;
struct Bf16x2Bits { uint32_t bits; };  // what __builtin_bit_cast(uint32_t, ...) of the result reads
template <typename V>
inline Bf16x8Bits bf16x8_bits(const V& v) {
  static_assert(sizeof(V) == 16, "8 bf16");
  Bf16x8Bits r;
  memcpy(r.data(), &v, 16);
  return r;
}

// Small float codes to double (Table 30). E4M3: bias 7, S.1111.111 NaN, no
// Inf; E5M2: bias 15, exponent 31 is Inf (mantissa 0) / NaN; E2M3: bias 1;
// E3M2: bias 3; E2M1: bias 1; subnormals (exponent field 0) are
// mantissa / 2^mbits * 2^(1 - bias).
inline double small_float(uint32_t code, int ebits, int mbits, int bias, bool e4m3_nan, bool ieee_special) {
  const uint32_t m = code & ((1u << mbits) - 1), e = (code >> mbits) & ((1u << ebits) - 1);
  const bool neg = (code >> (ebits + mbits)) & 1;
  double v;
  if (e4m3_nan && e == (1u << ebits) - 1 && m == (1u << mbits) - 1) return NAN;
  if (ieee_special && e == (1u << ebits) - 1) {
    if (m != 0) return NAN;
    v = INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mbits), static_cast<int>(e) - bias);
  }
  return neg ? -v : v;
}
// Format fmt (CBSZ / BLGP code) of `code` (tabulated once per format).
inline double f8f6f4_value(int fmt, uint32_t code) {
  struct Tables {
    double v[5][256];
    Tables() {
      for (uint32_t c = 0; c < 256; ++c) {
        v[0][c] = small_float(c, 4, 3, 7, true, false);         // E4M3 (OCP FP8)
        v[1][c] = small_float(c, 5, 2, 15, false, true);        // E5M2 (BF8)
        v[2][c] = small_float(c & 0x3f, 2, 3, 1, false, false); // E2M3 (FP6)
        v[3][c] = small_float(c & 0x3f, 3, 2, 3, false, false); // E3M2 (BF6)
        v[4][c] = small_float(c & 0xf, 2, 1, 1, false, false);  // E2M1 (FP4)
      }
    }
  };
  static const Tables t;
  if (fmt < 0 || fmt > 4) {
    fprintf(stderr, "hip_emu: f8f6f4 format %d is not defined (7.1.5)\n", fmt);
    abort();
  }
  return t.v[fmt][code & 0xff];
}
// E8M0 (7.2): 2^(e - 127), 0xFF NaN.
inline double e8m0_value(uint32_t e) { return e == 0xff ? NAN : std::ldexp(1.0, static_cast<int>(e) - 127); }

// Element k (0..127) of the 16x128 A (or 128x16 B) operand of format fmt for
// row (column) rc, from the 64 lanes' 8-register operands (7.1.5.1).
inline double f8f6f4_element(const uint32_t (*regs)[8], int fmt, int rc, int k) {
  if (fmt <= 1) {  // 8-bit: two 64-K halves, 16 K per lane group in each
    const int lane = rc + 16 * ((k % 64) / 16), byte = (k % 16) + 16 * (k / 64);
    return f8f6f4_value(fmt, (regs[lane][byte / 4] >> (8 * (byte % 4))) & 0xff);
  }
  const int lane = rc + 16 * (k / 32), item = k % 32, bits = fmt == 4 ? 4 : 6;
  const int bit = item * bits;  // densely packed little-endian items
  const uint64_t lo = regs[lane][bit / 32], hi = bit / 32 + 1 < 8 ? regs[lane][bit / 32 + 1] : 0;
  const uint32_t code = static_cast<uint32_t>(((hi << 32 | lo) >> (bit % 32)) & ((1u << bits) - 1));
  return f8f6f4_value(fmt, code);
}

// V_MFMA_SCALE_F32_16X16X128_F8F6F4 (scaled = true) and its unscaled opcode
// V_MFMA_F32_16X16X128_F8F6F4 (scaled = false: every scale 1.0).
inline f32x4 mfma_scale_f32_16x16x128_f8f6f4(i32x8 a, i32x8 b, f32x4 c, int fmt_a, int fmt_b, int opsel_a,
                                             int scale_a, int opsel_b, int scale_b, bool scaled) {
  struct Ops { uint32_t a[8], b[8], sa, sb; };
  static_assert(sizeof(Ops) <= sizeof(Slot), "scaled MFMA operands fit the exchange slot");
  if (opsel_a < 0 || opsel_a > 3 || opsel_b < 0 || opsel_b > 3) {
    fprintf(stderr, "hip_emu: scale OPSEL is a 2-bit byte select (7.2.1)\n");
    abort();
  }
  Ops mine;
  for (int r = 0; r < 8; ++r) {
    mine.a[r] = static_cast<uint32_t>(a[r]);
    mine.b[r] = static_cast<uint32_t>(b[r]);
  }
  mine.sa = static_cast<uint32_t>(scale_a);
  mine.sb = static_cast<uint32_t>(scale_b);
  State& s = state();
  memcpy(s.xfer[s.cur].data(), &mine, sizeof(Ops));
  wave_barrier();
  const int l = lane_id(), base = wave_id() * kWave;
  static thread_local uint32_t ra[kWave][8], rb[kWave][8], sa[kWave], sb[kWave];
  for (int q = 0; q < kWave; ++q) {
    Ops o;
    memcpy(&o, s.xfer[base + q].data(), sizeof(Ops));
    memcpy(ra[q], o.a, sizeof o.a);
    memcpy(rb[q], o.b, sizeof o.b);
    sa[q] = (o.sa >> (8 * opsel_a)) & 0xff;
    sb[q] = (o.sb >> (8 * opsel_b)) & 0xff;
  }
  f32x4 d;
  const int j = l % 16;
  for (int r = 0; r < 4; ++r) {
    const int i = 4 * (l / 16) + r;
    double acc = c[r];
    for (int kb = 0; kb < 4; ++kb) {
      double blk = 0;
      for (int k = 32 * kb; k < 32 * kb + 32; ++k) {
        blk += f8f6f4_element(ra, fmt_a, i, k) * f8f6f4_element(rb, fmt_b, j, k);
      }
      const double scale = scaled ? e8m0_value(sa[i + 16 * kb]) * e8m0_value(sb[j + 16 * kb]) : 1.0;
      acc += blk * scale;
    }
    d[r] = static_cast<float>(acc);
  }
  wave_barrier();
  return d;
}

// V_MFMA_F32_16X16X32_BF16: A, B are 8 bf16 per lane (k = 8 (l / 16) + item).
inline f32x4 mfma_f32_16x16x32_bf16(Bf16x8Bits a, Bf16x8Bits b, f32x4 c, int cbsz, int abid, int blgp) {
  struct AB { Bf16x8Bits a, b; };
  return mfma_16x16<32, 8>(AB{a, b}, c, cbsz, abid, blgp,
                           [](const Bf16x8Bits& v, int e) { return bf16_to_double(static_cast<short>(v[e])); });
}

// double -> bf16 bits, round to nearest even (through fp32: exact for the
// short significands converted here), NaN -> 0x7FC0.
inline uint16_t bf16_bits(double v) {
  if (std::isnan(v)) return 0x7fc0;
  const float f = static_cast<float>(v);
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline Bf16x2Bits bf16_pair(double lo, double hi) {
  return Bf16x2Bits{bf16_bits(lo) | (static_cast<uint32_t>(bf16_bits(hi)) << 16)};
}
inline uint32_t scale_operand_e8m0(float scale) {  // "exponent(S1.f32)"
  uint32_t u;
  memcpy(&u, &scale, 4);
  return (u >> 23) & 0xff;
}

// V_CVT_SCALEF32_PK_BF16_FP4: byte `opsel` of src, low nibble -> bits 15:0.
inline Bf16x2Bits cvt_scalef32_pk_bf16_fp4(uint32_t src, float scale, int opsel) {
  const double sc = e8m0_value(scale_operand_e8m0(scale));
  const uint32_t byte = (src >> (8 * (opsel & 3))) & 0xff;
  return bf16_pair(f8f6f4_value(4, byte & 0xf) * sc, f8f6f4_value(4, byte >> 4) * sc);
}
// V_CVT_SCALEF32_PK_BF16_FP8: 16-bit word `word_sel` of src, byte 0 -> bits 15:0.
inline Bf16x2Bits cvt_scalef32_pk_bf16_fp8(uint32_t src, float scale, bool word_sel) {
  const double sc = e8m0_value(scale_operand_e8m0(scale));
  const uint32_t w = (src >> (word_sel ? 16 : 0)) & 0xffff;
  return bf16_pair(f8f6f4_value(0, w & 0xff) * sc, f8f6f4_value(0, w >> 8) * sc);
}

// V_CVT_PK_FP8_F32 (12.11, opcode 674; Table 31: RNE): S0 -> bits 7:0, S1 ->
// bits 15:8 of the low (word_sel false) or high 16 bits of the destination,
// the other half kept. FP8 is OCP E4M3 on gfx950 (Table 30). With FP16_OVFL
// = 0 (the kernels' descriptors: .amdhsa_fp16_overflow 0), NaN, +-Inf and
// magnitudes above the E4M3 maximum 448 give NaN (7.3, the FP16_OVFL table).
// Rounding to nearest even over the E4M3 values, subnormals included: the
// nearest of the 127 finite non-negative codes, ties to the even code.
inline uint32_t f32_to_e4m3(float x) {
  if (std::isnan(x) || std::fabs(x) > 448.f) return std::signbit(x) ? 0xff : 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  uint32_t best = 0;
  for (uint32_t c = 1; c < 0x7f; ++c) {
    const double d = std::fabs(f8f6f4_value(0, c) - a), db = std::fabs(f8f6f4_value(0, best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return (std::signbit(x) ? 0x80u : 0u) | best;
}
inline int cvt_pk_fp8_f32(float s0, float s1, int old, bool word_sel) {
  const uint32_t pair = f32_to_e4m3(s0) | (f32_to_e4m3(s1) << 8);
  const uint32_t o = static_cast<uint32_t>(old);
  return static_cast<int>(word_sel ? (o & 0xffffu) | (pair << 16) : (o & 0xffff0000u) | pair);
}
#endif  // __gfx950__

}  // namespace emu

#define __builtin_amdgcn_perm ::emu::perm
#define threadIdx (::emu::state().fibers[::emu::state().cur].tid)
#define blockIdx (::emu::state().block_idx)
#define blockDim (::emu::state().block_dim)
#define gridDim (::emu::state().grid_dim)
#define __syncthreads() ::emu::cta_barrier()
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k ::emu::mfma_f32_16x16x16bf16_1k
#define __builtin_amdgcn_cvt_pk_f32_fp8 ::emu::cvt_pk_f32_fp8
#define __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8 ::emu::mfma_f32_16x16x32_fp8_fp8
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) ::emu::launch(kernel, grid, block, __VA_ARGS__)
#if defined(__gfx950__)
// clang lowers the scaled builtin with both scales the constant 0 (and OPSEL 0)
// to the unscaled opcode V_MFMA_F32_16X16X128_F8F6F4 (seen in its gfx950
// assembly), whose scales are 1.0 (7.1.5, ABID[0] = 0); any other scale
// operand, a runtime 0 included, is the E8M0 value it holds.
#define __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, fa, fb, oa, sa, ob, sb)                  \
  ::emu::mfma_scale_f32_16x16x128_f8f6f4(a, b, c, fa, fb, oa, sa, ob, sb,                                 \
                                         !(__builtin_constant_p(sa) && __builtin_constant_p(sb) &&        \
                                           (sa) == 0 && (sb) == 0 && (oa) == 0 && (ob) == 0))
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, cbsz, abid, blgp) \
  ::emu::mfma_f32_16x16x32_bf16(::emu::bf16x8_bits(a), ::emu::bf16x8_bits(b), c, cbsz, abid, blgp)
#define __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4 ::emu::cvt_scalef32_pk_bf16_fp4
#define __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8 ::emu::cvt_scalef32_pk_bf16_fp8
#define __builtin_amdgcn_cvt_pk_fp8_f32 ::emu::cvt_pk_fp8_f32
#endif

template <typename T>
inline T __shfl(T v, int src, int width = 64) {
  const int self = ::emu::lane_id();
  return ::emu::exchange(v, src + (self & ~(width - 1)));
}
template <typename T>
inline T __shfl_xor(T v, int lane_mask, int width = 64) {
  const int self = ::emu::lane_id();
  int index = self ^ lane_mask;
  index = index >= ((self + width) & ~(width - 1)) ? self : index;
  return ::emu::exchange(v, index);
}
inline hipError_t hipGetLastError() { return hipSuccess; }

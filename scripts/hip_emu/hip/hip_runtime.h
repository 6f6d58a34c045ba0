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
//   * The MFMA builtin is computed from the lane layout documented in
//     csrc/kernels/cdna/mfma_kernel.cuh (A row l%16 k 4(l/16)..+3, B col l%16
//     k 4(l/16)..+3, D col l%16 rows 4(l/16)..+3), accumulating in double.
//   * The fp8 MFMA builtin (v_mfma_f32_16x16x32_fp8_fp8) is computed from its
//     documented lane layout (A row l%16 k 8(l/16)..+7 in bytes 0..7, B col
//     l%16 k 8(l/16)..+7, D as above), decoding fp8 as the target does (fnuz
//     on gfx942, OCP e4m3fn on gfx950, subnormals included, NaN codes give
//     NaN), exact products accumulated in double.
//   * __builtin_amdgcn_cvt_pk_f32_fp8 decodes e4m3fnuz when __gfx942__ is
//     defined and OCP e4m3fn when __gfx950__ is, with decoders written here
//     independently of csrc/mla_decode/formats.h; __builtin_amdgcn_perm is
//     v_perm_b32 as the CDNA3 ISA defines it.
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

struct State {
  std::vector<int> cta_waiting;  // per wave: lanes blocked at __syncthreads
  std::vector<Fiber> fibers;
  int cur = -1;
  jmp_buf sched;
  Idx block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
  Barrier cta;
  std::vector<Barrier> waves;
  std::vector<std::array<uint64_t, 4>> xfer;  // one 32-byte slot per thread for cross-lane ops
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
  static_assert(sizeof(T) <= 32, "exchange slot");
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

// ---- MFMA and fp8 conversion (the two AMD builtins the kernels use) -------
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
  static_assert(sizeof(Operands) <= sizeof(std::array<uint64_t, 4>), "operands fit the 32-byte exchange slot");
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

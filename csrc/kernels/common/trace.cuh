// Opt-in timeline probes for the CUDA kernels (a measurement tool, not part of
// any normal build; the mma.sync split kernel and the combine kernel carry
// TraceProbe, the wide kernel TileTrace, the Hopper split kernels CtaPhases).
// Built with -DMLA_DECODE_TRACE (setup.py adds it when MLA_DECODE_TRACE=1 is
// set at build time). TraceProbe (scripts/trace_timeline.py reads its output):
// thread 0 of a few CTAs records %globaltimer (ns, one clock for every SM and
// kernel) at named points and prints one line at the end:
//   TRACE <kernel> <blockIdx.x> <blockIdx.y> <t0> <t1 - t0> <t2 - t0> ...
// (-1 for points not reached). Without the macro every probe compiles to
// nothing.
#pragma once

#include <cstdint>

#if defined(MLA_DECODE_TRACE) && !defined(__HIPCC__)
#include <cstdio>
#define MLA_TRACE_ENABLED 1
#else
#define MLA_TRACE_ENABLED 0
#endif

namespace mla_decode {
namespace cuda {

template <int kMaxPoints>
struct TraceProbe {
#if MLA_TRACE_ENABLED
  unsigned long long t[kMaxPoints];
  int n = 0;
  bool on = false;
  __device__ __forceinline__ void start(bool enabled) {
    on = enabled && threadIdx.x == 0;
    mark();
  }
  __device__ __forceinline__ void mark() {
    if (on && n < kMaxPoints) {
      unsigned long long v;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v)::"memory");
      t[n++] = v;
    }
  }
  // Prints "TRACE name x y t0 d1 d2 ..." with d_i = t_i - t0 (ns).
  __device__ __forceinline__ void print(const char* name) const {
    if (!on) return;
    printf("TRACE %s %d %d %llu %lld %lld %lld %lld %lld %lld\n", name, static_cast<int>(blockIdx.x),
           static_cast<int>(blockIdx.y), t[0], n > 1 ? static_cast<long long>(t[1] - t[0]) : -1LL,
           n > 2 ? static_cast<long long>(t[2] - t[0]) : -1LL, n > 3 ? static_cast<long long>(t[3] - t[0]) : -1LL,
           n > 4 ? static_cast<long long>(t[4] - t[0]) : -1LL, n > 5 ? static_cast<long long>(t[5] - t[0]) : -1LL,
           n > 6 ? static_cast<long long>(t[6] - t[0]) : -1LL);
  }
#else
  __device__ __forceinline__ void start(bool) {}
  __device__ __forceinline__ void mark() {}
  __device__ __forceinline__ void print(const char*) const {}
#endif
};

// Per-tile event clocks of one thread (a measurement tool like TraceProbe):
// clock64() (SM cycles: comparable between the warpgroups of one CTA) at
// kEvents points of the tiles [first, first + kTiles), and at start() and
// done(), written to `dst` (kWords) at the end. No printf here: a call in a kernel makes ptxas serialise its
// wgmmas (C7510), so the launcher of a trace build prints the buffer with a
// second kernel (print_tile_trace).
template <int kEvents, int kTiles>
struct TileTrace {
  static constexpr int kWords = kTiles * kEvents + 3;
#if MLA_TRACE_ENABLED
  long long c[kTiles][kEvents];
  long long t_start = -1, t_done = -1;
  int first = 0;
  bool on = false;
  __device__ __forceinline__ void start(bool enabled, int first_tile) {
    on = enabled;
    first = first_tile;
    for (int i = 0; i < kTiles; ++i)
      for (int e = 0; e < kEvents; ++e) c[i][e] = -1;
    if (on) t_start = clock64();
  }
  __device__ __forceinline__ void done() {
    if (on) t_done = clock64();
  }
  __device__ __forceinline__ void mark(int tile, int event) {
    const int i = tile - first;
    if (on && i >= 0 && i < kTiles) c[i][event] = clock64();
  }
  __device__ __forceinline__ void write(long long* dst) const {
    if (!on) return;
    for (int i = 0; i < kTiles; ++i)
      for (int e = 0; e < kEvents; ++e) dst[i * kEvents + e] = c[i][e];
    dst[kTiles * kEvents] = first;
    dst[kTiles * kEvents + 1] = t_start;
    dst[kTiles * kEvents + 2] = t_done;
  }
#else
  __device__ __forceinline__ void start(bool, int) {}
  __device__ __forceinline__ void done() {}
  __device__ __forceinline__ void mark(int, int) {}
  __device__ __forceinline__ void write(long long*) const {}
#endif
};

// Phase clocks of every CTA (a measurement tool like TileTrace): thread 0
// (role 0) and thread 128 (role 1) of each of the first `max_ctas` CTAs in
// grid order record clock64() at kPoints points (point 0 at start(), the last
// at finish()), %globaltimer at start() and finish() (ns, one clock for every
// SM: where the CTAs' spans lie against each other), its SM and one count the
// kernel supplies (the Hopper split kernels: the CTA's tiles). Each value is stored to the
// role's kWords in global memory as it is taken (no registers held across the
// kernel; no printf: see TileTrace). A point not reached stays -1. Where
// TileTrace shows the tile loop of one CTA, this shows the start-up, loop and
// epilogue of all of them (launch skew, the start-up burst, the tail).
template <int kPoints>
struct CtaPhases {
  static constexpr int kWords = kPoints + 4;  // clocks, SM, globaltimer at start and finish, count
#if MLA_TRACE_ENABLED
  long long* dst = nullptr;
  __device__ __forceinline__ static long long globaltimer() {
    unsigned long long v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v)::"memory");
    return static_cast<long long>(v);
  }
  // buffer: max_ctas x 2 roles x kWords, CTA-major.
  __device__ __forceinline__ void start(long long* buffer, int max_ctas) {
    const int cta = blockIdx.y * gridDim.x + blockIdx.x;
    const bool on = (threadIdx.x == 0 || threadIdx.x == 128) && cta < max_ctas;
    dst = on ? buffer + (2 * static_cast<long long>(cta) + threadIdx.x / 128) * kWords : nullptr;
    if (!dst) return;
    dst[kPoints + 1] = globaltimer();
    dst[0] = clock64();
    for (int i = 1; i < kPoints; ++i) dst[i] = -1;
    dst[kPoints + 2] = -1;
  }
  __device__ __forceinline__ void mark(int point) {
    if (dst) dst[point] = clock64();
  }
  __device__ __forceinline__ void finish(long long count) {
    if (!dst) return;
    dst[kPoints - 1] = clock64();
    dst[kPoints + 2] = globaltimer();
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    dst[kPoints] = sm;
    dst[kPoints + 3] = count;
  }
#else
  __device__ __forceinline__ void start(long long*, int) {}
  __device__ __forceinline__ void mark(int) {}
  __device__ __forceinline__ void finish(long long) {}
#endif
};

#if MLA_TRACE_ENABLED
// Prints the CtaPhases buffers of `ctas` CTAs x `roles` roles (CTA-major, as
// the kernel wrote them; CTA i is blockIdx (i % grid_x, i / grid_x)), clocks
// relative to the role's point 0 (scripts/cta_phases.py reads them):
//   PHASES <kernel> <role> <x> <y> <sm> <count> <g_start> <g_finish> <c1 - c0> <c2 - c0> ...
enum class PhaseKernel : int { kWide, kNarrow, kNarrowRegisterV };
template <int kPoints>
__global__ void print_cta_phases(PhaseKernel which, const long long* buf, int ctas, int roles, int grid_x) {
  constexpr int kWords = CtaPhases<kPoints>::kWords;
  const char* kernel = which == PhaseKernel::kWide     ? "wide"
                       : which == PhaseKernel::kNarrow ? "narrow"
                                                       : "narrow_register_v";
  for (int i = 0; i < ctas; ++i) {
    for (int r = 0; r < roles; ++r) {
      const long long* b = buf + (static_cast<long long>(i) * roles + r) * kWords;
      printf("PHASES %s %d %d %d %lld %lld %lld %lld", kernel, r, i % grid_x, i / grid_x, b[kPoints], b[kPoints + 3],
             b[kPoints + 1], b[kPoints + 2]);
      for (int k = 1; k < kPoints; ++k) printf(" %lld", (b[k] < 0 || b[0] < 0) ? -1LL : b[k] - b[0]);
      printf("\n");
    }
  }
}

// After a launch of `grid` whose CtaPhases buffer is the __device__ array
// `symbol` (max_ctas CTAs): print its lines on the same stream.
template <int kPoints, typename Symbol>
void print_cta_phases_after(const Symbol& symbol, PhaseKernel which, dim3 grid, int max_ctas, cudaStream_t stream) {
  void* buf = nullptr;
  if (cudaGetSymbolAddress(&buf, symbol) != cudaSuccess) return;
  const long long ctas = static_cast<long long>(grid.x) * grid.y;
  print_cta_phases<kPoints><<<1, 1, 0, stream>>>(which, static_cast<const long long*>(buf),
                                                 static_cast<int>(ctas < max_ctas ? ctas : max_ctas), 2,
                                                 static_cast<int>(grid.x));
}

// Prints `roles` TileTrace buffers of kEvents x kTiles (+ the first tile, the
// start and done clocks), each clock minus role 0's start clock:
//   TILES <role> <tile> <c0> <c1> ...
//   SPAN <role> <start> <done>
template <int kEvents, int kTiles>
__global__ void print_tile_trace(const long long* buf, int roles) {
  constexpr int kWords = TileTrace<kEvents, kTiles>::kWords;
  const long long t0 = buf[kTiles * kEvents + 1];
  for (int r = 0; r < roles; ++r) {
    const long long* b = buf + r * kWords;
    for (int i = 0; i < kTiles; ++i) {
      printf("TILES %d %lld", r, b[kTiles * kEvents] + i);
      for (int e = 0; e < kEvents; ++e) printf(" %lld", b[i * kEvents + e] < 0 ? -1LL : b[i * kEvents + e] - t0);
      printf("\n");
    }
    printf("SPAN %d %lld %lld\n", r, b[kTiles * kEvents + 1] - t0, b[kTiles * kEvents + 2] < 0 ? -1LL : b[kTiles * kEvents + 2] - t0);
  }
}
#endif

}  // namespace cuda
}  // namespace mla_decode

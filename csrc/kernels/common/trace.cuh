// Opt-in timeline probes for the CUDA kernels (a measurement tool, not part of
// any normal build; the mma.sync split kernel and the combine kernel carry
// TraceProbe, the wide kernel TileTrace). Built with -DMLA_DECODE_TRACE
// (setup.py adds it when MLA_DECODE_TRACE=1 is set at build time; scripts/trace_timeline.py reads the output), thread 0
// of a few CTAs records %globaltimer (ns, one clock for every SM and kernel)
// at named points and prints one line at the end:
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

#if MLA_TRACE_ENABLED
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

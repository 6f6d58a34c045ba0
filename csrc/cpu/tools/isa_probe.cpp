// Instruction probes behind the CPU kernel's choices (docs/cpu-kernel.md):
// TSC ticks per instruction of vfmadd231ps / vdpbf16ps (16 independent
// accumulators), tdpbf16ps, tileloadd, and the store / tile-load hand-offs, on
// one thread. Not part of the extension (setup.py compiles csrc/cpu/*.cpp
// only). Build and run on one core:
//   g++ -O2 -o /tmp/isa_probe csrc/cpu/tools/isa_probe.cpp && taskset -c 2 /tmp/isa_probe
// The AMX probes need AMX-BF16 (the process asks Linux for the tile state
// first); on other CPUs the program stops with SIGILL after the AVX-512 lines.
#include <immintrin.h>
#include <x86intrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/syscall.h>
#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16"), noinline))
static const long N = 20000000;
T double dp_reg() {
  __m512 a[16]; for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(i);
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3f003f00);
  uint64_t t0 = __rdtsc();
  for (long n = 0; n < N; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  uint64_t t1 = __rdtsc(); float s = 0; for (int i = 0; i < 16; ++i) s += _mm512_reduce_add_ps(a[i]);
  if (s == 1.f) printf("!"); return double(t1 - t0) / (N * 16.0);
}
T double fma_reg() {
  __m512 a[16]; for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(i);
  __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  uint64_t t0 = __rdtsc();
  for (long n = 0; n < N; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  uint64_t t1 = __rdtsc(); float s = 0; for (int i = 0; i < 16; ++i) s += _mm512_reduce_add_ps(a[i]);
  if (s == 1.f) printf("!"); return double(t1 - t0) / (N * 16.0);
}
T double dp_bcast(const uint32_t* kb) {
  __m512 a[16]; for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  uint64_t t0 = __rdtsc();
  for (long n = 0; n < N; ++n) {
    const uint32_t* k = kb + (n & 255);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, (__m512bh)_mm512_set1_epi32(k[i * 288]));
  }
  uint64_t t1 = __rdtsc(); float s = 0; for (int i = 0; i < 16; ++i) s += _mm512_reduce_add_ps(a[i]);
  if (s == 1.f) printf("!"); return double(t1 - t0) / (N * 16.0);
}
struct alignas(64) Cfg { uint8_t p, s, r[14]; uint16_t c[16]; uint8_t rows[16]; };
T void cfg() { Cfg c; memset(&c, 0, 64); c.p = 1; for (int t = 0; t < 8; ++t) { c.c[t] = 64; c.rows[t] = 16; } _tile_loadconfig(&c); }
T double tdp(const void* buf) {
  cfg(); _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
  long M = N / 10; uint64_t t0 = __rdtsc();
  for (long n = 0; n < M; ++n) { _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 6, 5); _tile_dpbf16ps(2, 4, 7); _tile_dpbf16ps(3, 6, 7); }
  uint64_t t1 = __rdtsc(); _tile_release(); return double(t1 - t0) / (M * 4.0);
}
T double tload(const char* buf, long stride) {
  cfg(); long M = N / 10; uint64_t t0 = __rdtsc();
  for (long n = 0; n < M; ++n) { _tile_loadd(0, buf, stride); _tile_loadd(1, buf + 64, stride); _tile_loadd(2, buf + 128, stride); _tile_loadd(3, buf + 192, stride); }
  uint64_t t1 = __rdtsc(); _tile_release(); return double(t1 - t0) / (M * 4.0);
}
T double tload_tdp(const char* buf, long stride) {  // one load per tdp, as in PV
  cfg(); _tile_zero(0); _tile_zero(1); _tile_loadd(4, buf, 64);
  long M = N / 10; uint64_t t0 = __rdtsc();
  for (long n = 0; n < M; ++n) { _tile_loadd(2, buf + 64 * (n & 7), stride); _tile_dpbf16ps(0, 4, 2); _tile_loadd(3, buf + 64 * ((n + 1) & 7), stride); _tile_dpbf16ps(1, 4, 3); }
  uint64_t t1 = __rdtsc(); _tile_release(); return double(t1 - t0) / (M * 2.0);
}
T double tstore_vload(float* buf) {  // tile store, then 16 vector loads of it
  cfg(); _tile_zero(0); long M = N / 100; __m512 acc = _mm512_setzero_ps(); uint64_t t0 = __rdtsc();
  for (long n = 0; n < M; ++n) { _tile_stored(0, buf, 64); for (int r = 0; r < 16; ++r) acc = _mm512_add_ps(acc, _mm512_load_ps(buf + 16 * r)); }
  uint64_t t1 = __rdtsc(); _tile_release(); if (_mm512_reduce_add_ps(acc) == 1.f) printf("!"); return double(t1 - t0) / M;
}
T double vstore_tload(float* buf) {  // 16 vector stores, then a tile load of them
  cfg(); _tile_zero(2); long M = N / 100; __m512 v = _mm512_set1_ps(1.f); uint64_t t0 = __rdtsc();
  for (long n = 0; n < M; ++n) { for (int r = 0; r < 16; ++r) _mm512_store_ps(buf + 16 * r, v); _tile_loadd(0, buf, 64); _tile_dpbf16ps(1, 0, 2); }
  uint64_t t1 = __rdtsc(); _tile_release(); return double(t1 - t0) / M;
}
T double cfg_release() { long M = 100000; uint64_t t0 = __rdtsc(); for (long n = 0; n < M; ++n) { cfg(); _tile_zero(0); _tile_release(); } return double(__rdtsc() - t0) / M; }
int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no AMX permission\n"); }
  uint32_t* kb = (uint32_t*)aligned_alloc(64, 1 << 20); memset(kb, 0x3f, 1 << 20);
  char* buf = (char*)aligned_alloc(64, 1 << 22); memset(buf, 0, 1 << 22);
  printf("TSC ticks per instruction (one thread)\n");
  printf("vfmadd231ps zmm, 16 acc:            %.3f\n", fma_reg());
  printf("vdpbf16ps zmm, 16 acc, regs:        %.3f\n", dp_reg());
  printf("vdpbf16ps zmm {1to16} bcast mem:    %.3f\n", dp_bcast(kb));
  printf("tdpbf16ps 16x16x32 (4 C tiles):     %.3f\n", tdp(buf));
  printf("tileloadd 1KB stride 64 (L1):       %.3f\n", tload(buf, 64));
  printf("tileloadd 1KB stride 2048:          %.3f\n", tload(buf, 2048));
  printf("tileloadd 1KB stride 2112:          %.3f\n", tload(buf, 2112));
  printf("tileloadd+tdp pairs stride 2112:    %.3f per tdp\n", tload_tdp(buf, 2112));
  printf("tilestored then 16 vector loads:    %.1f per round\n", tstore_vload((float*)buf));
  printf("16 vector stores then tileloadd+tdp:%.1f per round\n", vstore_tload((float*)(buf + 8192)));
  printf("ldtilecfg+tilezero+tilerelease:     %.1f\n", cfg_release());
  return 0;
}

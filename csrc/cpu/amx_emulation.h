// A test build only (CFLAGS=-DMLA_CPU_AMX_EMULATION): the AMX tile
// intrinsics that kernel_amx.cpp uses, emulated in scalar C++ (eight tiles of
// 16 rows x 64 bytes per thread, TDPBF16PS as in the ISA: fp32 accumulation
// of bf16 pair products, bf16 denormals read as zero), so the AMX path's
// layouts and loops can be run and tested on any CPU with AVX-512 BF16. With
// it the driver skips the AMX feature and permission checks (decode_cpu.cpp).
// Thousands of times slower than the tiles; never part of a release build.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
namespace amx_emu {
struct Tile { alignas(64) uint8_t b[16][64]; };
inline thread_local Tile t[8];
inline thread_local bool configured = false;
inline void loadconfig(const void*) { configured = true; }
inline void release() { configured = false; }
inline void zero(int i) { if (!configured) __builtin_trap(); memset(t[i].b, 0, sizeof(t[i].b)); }
inline void loadd(int i, const void* base, long stride) {
  if (!configured) __builtin_trap();
  for (int r = 0; r < 16; ++r) memcpy(t[i].b[r], (const char*)base + r * stride, 64);
}
inline void stored(int i, void* base, long stride) {
  for (int r = 0; r < 16; ++r) memcpy((char*)base + r * stride, t[i].b[r], 64);
}
inline float bf(const uint8_t* p) {
  uint16_t h; memcpy(&h, p, 2); uint32_t u = (uint32_t)h << 16;
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;  // DAZ
  float f; memcpy(&f, &u, 4); return f;
}
inline void dpbf16ps(int c, int a, int b) {
  if (c == a || c == b || a == b) __builtin_trap();  // the instruction's #UD
  for (int m = 0; m < 16; ++m) for (int n = 0; n < 16; ++n) {
    float acc; memcpy(&acc, &t[c].b[m][4 * n], 4);
    for (int k = 0; k < 16; ++k) {
      acc += bf(&t[a].b[m][4 * k]) * bf(&t[b].b[k][4 * n]) + bf(&t[a].b[m][4 * k + 2]) * bf(&t[b].b[k][4 * n + 2]);
    }
    memcpy(&t[c].b[m][4 * n], &acc, 4);
  }
}
}
#define _tile_loadconfig(p) amx_emu::loadconfig(p)
#define _tile_release() amx_emu::release()
#define _tile_zero(i) amx_emu::zero(i)
#define _tile_loadd(i, base, stride) amx_emu::loadd(i, base, stride)
#define _tile_stored(i, base, stride) amx_emu::stored(i, (void*)(base), stride)
#define _tile_dpbf16ps(c, a, b) amx_emu::dpbf16ps(c, a, b)

#include "cpu/cpu_features.h"

#include <cstring>
#include <mutex>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MLA_CPU_X86 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define MLA_CPU_X86 0
#endif

namespace mla_decode {
namespace cpu {
namespace {

#if MLA_CPU_X86
// XCR0: the register states the OS saves and restores.
unsigned long long read_xcr0() {
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  f.x86_64 = true;
  unsigned int a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) f.intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  const unsigned long long xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;            // SSE + AVX
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;          // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG + XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = (b >> 5) & 1, bmi2 = (b >> 8) & 1;
  const bool avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1,
             avx512vl = (b >> 31) & 1;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  unsigned int a1 = 0, b1, c1, d1;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const bool avx512bf16 = (a1 >> 5) & 1;
  f.avx2_fma = ymm_state && avx2 && fma && f16c && bmi2;  // what the AVX2 and AVX-512 paths are compiled for
  f.avx512_f = zmm_state && avx512f && avx512dq && avx512bw && avx512vl && f.avx2_fma;
  f.avx512_bf16 = f.avx512_f && avx512bf16;
  f.amx_bf16 = f.avx512_bf16 && amx_tile && amx_bf16 && tile_state;
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const char* amx_permission() {
  static const char* result = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
#if MLA_CPU_X86 && defined(__linux__)
    if (!cpu_features().amx_bf16) {
      result = "the CPU lacks AMX-BF16 (or the OS does not enable the tile state)";
      return;
    }
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
      result = "Linux refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
    }
#elif MLA_CPU_X86
    result = "AMX needs Linux (the tile-data permission request is arch_prctl)";
#else
    result = "not an x86-64 build";
#endif
  });
  return result;
}

const char* cpu_brand() {
  static char brand[49] = {0};
  static std::once_flag once;
  std::call_once(once, [] {
#if MLA_CPU_X86
    unsigned int a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000004u) return;
    unsigned int regs[12];
    for (unsigned int i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    }
    std::memcpy(brand, regs, 48);
    brand[48] = 0;
#endif
  });
  return brand;
}

}  // namespace cpu
}  // namespace mla_decode

// What this CPU (and the OS) lets the CPU kernel use, detected once per
// process from cpuid and xgetbv; the AMX permission request lives here too.
#pragma once

namespace mla_decode {
namespace cpu {

struct CpuFeatures {
  bool x86_64 = false;   // an x86-64 build (the vector paths exist at all)
  bool avx2_fma = false;  // AVX2 + FMA (and F16C, BMI2), with the OS saving ymm state
  bool avx512_bf16 = false;  // AVX-512 F/BW/VL/DQ + BF16, with the OS saving zmm state
  bool amx_bf16 = false;  // AMX-TILE + AMX-BF16 in cpuid and the tile state in XCR0
  bool avx512_f = false;  // AVX-512 F/BW/VL/DQ (with or without BF16), with the OS saving zmm state
  bool intel = false;     // cpuid vendor GenuineIntel
};

// Detected on the first call, constant afterwards.
const CpuFeatures& cpu_features();

// Asks Linux once per process for the AMX tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); nullptr when
// granted, else the reason. Without the grant the first tile instruction
// raises SIGILL.
const char* amx_permission();

// The CPU's brand string from cpuid (e.g. "Intel(R) Xeon(R) Platinum 8480+"),
// "" where there is none.
const char* cpu_brand();

}  // namespace cpu
}  // namespace mla_decode

// The C++ CPU kernel of the mla_decode operators.
#pragma once

#include <stdint.h>

#include <string>

#include "common/params.h"

namespace mla_decode {

// The implementations of the CPU kernel. kAuto takes the fastest one this
// CPU supports: AMX (only after its one-time self-test passed), else
// AVX-512 (the BF16 form, except on Intel cores, where vdpbf16ps is slow, and
// on CPUs without AVX-512 BF16: the fp32 form), else AVX2, else scalar. The
// others are for tests and A/B runs (an explicit override of the private
// operator, never an environment variable).
//   kScalar      portable C++, fp32 on dequantised rows (any CPU)
//   kAvx2        AVX2 + FMA, fp32 products (x86-64 from Haswell / Zen 1)
//   kAvx512      AVX-512 BF16 dot products (vdpbf16ps), fp32 accumulation
//   kAmx         AMX-BF16 tiles for QK and PV, AVX-512 for decode and softmax
//   kAvx512Fp32  AVX-512 F/BW/VL/DQ, fp32 FMA products
enum class CpuPath : uint8_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3, kAmx = 4, kAvx512Fp32 = 5 };

struct CpuOptions {
  CpuPath path = CpuPath::kAuto;
};

// "auto", "scalar", "avx2", "avx512", "amx", "avx512_fp32"; cpu_path_from_name returns
// false for an unknown name.
const char* cpu_path_name(CpuPath path);
bool cpu_path_from_name(const char* name, CpuPath* path);

// nullptr when `path` can run on this CPU, else the reason it cannot (e.g.
// "the CPU lacks AVX-512 BF16"). For kAmx this requests the tile permission
// from Linux and runs the AMX self-test, once per process.
const char* cpu_path_unavailable(CpuPath path);

// The path kAuto runs on this CPU (never kAuto).
CpuPath cpu_auto_path();

// Runs decode on the host for every (query row, head) of `p`. All pointers
// must be host pointers and every index must already be range-checked
// (check_index_values). Raises (TORCH_CHECK) if `opt.path` cannot run here.
void decode_cpu(const MlaDecodeParams& p, const CpuOptions& opt = {});

// What decode_cpu would run for `p` (for mla_decode.explain), as
// "key=value;..." fields: kernel=cpu_<path>;splits=<most pieces of one
// head-group set>;pieces=<all pieces>;threads=<threads the pieces run on>;
// parallel=at-parallel-for|serial-build (ATen's OpenMP parallel_for compiled
// without -fopenmp runs serially);why=<the rule>, and error=<reason> when a
// forced path cannot run here.
std::string describe_cpu_plan(const MlaDecodeParams& p, const CpuOptions& opt);

}  // namespace mla_decode
